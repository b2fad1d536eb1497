"""The `strata` command: help with no set-up, flags refused in one line before anything loads (exit 2), the
activity record that `strata ps` reads, the console line that says what was loaded."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, fake_argv, model_path

STARTUP_S = 30.0


def _cli(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "strata_cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_help_answers_without_set_up(tmp_path):
    shutil.copy(os.path.join(ROOT, "strata"), tmp_path / "strata")
    shutil.copytree(os.path.join(ROOT, "strata_cli"), tmp_path / "strata_cli")
    for args in (["--help"], ["serve", "--help"], ["plan", "--help"], ["ps", "-h"]):
        r = subprocess.run([str(tmp_path / "strata"), *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "usage: strata" in r.stdout, (args, r.stderr)
    assert "examples:" in r.stdout
    r = subprocess.run([str(tmp_path / "strata")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert sorted(os.listdir(tmp_path)) == ["strata", "strata_cli"]   # no .venv, no build/


def test_top_help_lists_every_command_with_one_line_and_each_help_has_examples():
    from strata_cli import COMMANDS, HELP_LINE_MAX
    out = _cli("--help", env={"COLUMNS": "80"}).stdout.splitlines()
    for name, (line, _) in COMMANDS.items():
        assert len(line) <= HELP_LINE_MAX and f"    {name:<9} {line}" in out, name   # whole, on one line
        sub = _cli(name, "--help")
        assert sub.returncode == 0 and "examples:" in sub.stdout, name
        assert sum(x.startswith(f"  strata {name}") for x in sub.stdout.splitlines()) >= 2, name


def _busy_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


@pytest.mark.parametrize("flags, says", [
    (["--port", "99999"], "--port 99999: ports are 0..65535"),
    (["--threads", "0"], "--threads 0: this machine has"),
    (["--threads", str((os.cpu_count() or 1) + 1)], "CPUs; use 1.."),
    (["--ctx", "0"], "--ctx 0: a context is"),
    (["--replicas", "0"], "--replicas 0: at least 1"),
    (["--max-loaded", "0"], "--max-loaded 0: 1..64 models at once"),
    (["--models-ram-budget", "-1"], "--models-ram-budget -1.0: a size in GB above 0"),
])
def test_bad_flags_are_one_line_and_exit_2(tmp_path, flags, says):
    r = _cli("serve", "--tokenizer", "bytes", "--engine", " ".join(fake_argv(tmp_path)), *flags)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [f"strata: {r.stderr.strip()[8:]}"]
    assert says in r.stderr


def test_a_busy_port_is_said_before_anything_loads(tmp_path):
    rec = tmp_path / "rec.txt"
    with _busy_port() as s:
        port = s.getsockname()[1]
        r = _cli("serve", "--tokenizer", "bytes", "--engine", " ".join(fake_argv(tmp_path, {"record": str(rec)})),
                 "--port", str(port))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert f"couldn't bind HTTP server socket 127.0.0.1:{port}" in r.stderr
    assert not rec.exists()   # no engine was started


def test_a_context_over_the_models_is_refused_with_the_numbers():
    if model_path() is None or not os.access(os.path.join(ROOT, "build", "strata-engine"), os.X_OK):
        pytest.skip("needs the default model and the built engine")
    r = _cli("serve", "--port", "0", "--ctx", "100000")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("strata: --ctx 100000: ")
    assert "256..8192" in r.stderr


def _spawn(tmp_path, env, *extra):
    cmd = [sys.executable, "-m", "strata_cli", "serve", "--tokenizer", "bytes", "--quiet", "--port", "0",
           "--engine", " ".join(fake_argv(tmp_path)), "--log", str(tmp_path / "engine.log"), *extra]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env})


def _read_until(proc, prefix, lines):
    end = time.monotonic() + STARTUP_S
    while time.monotonic() < end:
        line = proc.stdout.readline()
        assert line or proc.poll() is None, "the server ended: " + "".join(lines)
        lines.append(line)
        if line.startswith(prefix):
            return line
    raise AssertionError("no line " + prefix)


def test_activity_record_ps_and_the_loaded_line(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {"XDG_RUNTIME_DIR": str(run_dir)}
    proc = _spawn(tmp_path, env)
    lines = []
    try:
        loaded = _read_until(proc, "strata: loaded ", lines)
        assert "fake-model (fake): context 2048, threads" in loaded and "lanes 1" in loaded
        assert "kernels" in loaded and "engine RAM" in loaded
        port = int(_read_until(proc, "strata: listening on ", lines).rsplit(":", 1)[1])
        [record] = [f for f in os.listdir(run_dir / "strata") if f.endswith(".json")]
        rec = json.loads((run_dir / "strata" / record).read_text())
        assert (rec["pid"], rec["port"], rec["model"]) == (proc.pid, port, "fake-model")
        assert oct(os.stat(run_dir / "strata" / record).st_mode & 0o777) == "0o600"
        ps = json.loads(_cli("ps", "--json", env=env).stdout)["servers"]
        assert [(s["pid"], s["loaded"], s["lanes"]) for s in ps] == [(proc.pid, "fake-model", 1)]
        assert ps[0]["ram_bytes"] > 0
        r = _cli("unload", env=env)
        assert r.returncode == 0 and "fake-model: unloaded" in r.stdout
        assert json.loads(_cli("ps", "--json", env=env).stdout)["servers"][0]["loaded"] == "none"
        assert _cli("load", "fake-model", env=env).returncode == 0
        r = _cli("load", "nope", env=env)
        assert r.returncode == 1 and "404" in r.stderr and "known: fake-model" in r.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert os.listdir(run_dir / "strata") == []   # record and token file removed
    finally:
        if proc.poll() is None:
            proc.kill()


def test_lazy_serves_health_before_any_engine_starts(tmp_path):
    from strata_cli.client import Server
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    proc = _spawn(tmp_path, env, "--lazy")
    lines = []
    try:
        port = int(_read_until(proc, "strata: listening on ", lines).rsplit(":", 1)[1])
        assert not any(line.startswith("strata: loaded") for line in lines)
        status, health = Server("127.0.0.1", port).call("GET", "/health")
        assert status == 200 and health["loaded"] is False
        status, reply = Server("127.0.0.1", port).call("POST", "/v1/chat/completions",
                                                       {"messages": [{"role": "user", "content": "hi"}]})
        assert status == 200 and reply["choices"][0]["message"]["content"]
        _read_until(proc, "strata: loaded fake-model", lines)
        assert Server("127.0.0.1", port).call("GET", "/health")[1]["loaded"] is True
    finally:
        proc.terminate()
        proc.wait(20)


def test_ps_url_reads_a_server_on_another_host(tmp_path):
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    proc = _spawn(tmp_path, env, "--host-name", "h5")
    lines = []
    try:
        port = int(_read_until(proc, "strata: listening on ", lines).rsplit(":", 1)[1])
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead = s.getsockname()[1]   # nothing listens there once closed
        r = _cli("ps", "--json", "--url", f"127.0.0.1:{port}", "--url", f"http://127.0.0.1:{dead}")
        assert r.returncode == 1   # one of them did not answer
        alive, gone = json.loads(r.stdout)["servers"]
        assert (alive["host_name"], alive["loaded"], alive["lanes"], alive["in_flight"]) == ("h5", "fake-model", 1, 0)
        assert gone["loaded"] == "not answering" and gone["host_name"] is None
        r = _cli("ps", "--url", f"127.0.0.1:{port}")
        assert r.returncode == 0 and "HOST" in r.stdout and "h5" in r.stdout and "fake-model" in r.stdout
    finally:
        proc.kill()
        proc.wait(10)

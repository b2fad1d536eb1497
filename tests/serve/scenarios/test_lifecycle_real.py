"""The lifecycle with the real engine: the default model under two names (a second file in --models-dir),
switched by the request's `model`; only the named file's engine runs; idle unload gives the engine's RAM back;
with --max-loaded 2 both stay loaded, each on its own engine, and `strata ps` lists both."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from strata_cli.client import Server
from tests.conftest import ENGINE_EXE, ROOT, model_path

pytestmark = pytest.mark.skipif(model_path() is None or not os.access(ENGINE_EXE, os.X_OK),
                                reason="needs the default model and the built engine")


def _engines(pid):
    """The command lines of the server's live engines (one that has ended and awaits its reaping is gone)."""
    import psutil
    out = []
    for c in psutil.Process(pid).children(recursive=True):
        try:
            if "--serve" in c.cmdline():
                out.append(c.cmdline())
        except psutil.Error:   # ZombieProcess, NoSuchProcess: ended
            pass
    return out


def _engine_rss(pid):
    import psutil
    return sum(c.memory_info().rss for c in psutil.Process(pid).children(recursive=True))


def _second_model(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    second = models / "smollm2-second.Q4_1.gguf"
    try:
        os.link(model_path(), second)
    except OSError:
        shutil.copy(model_path(), second)
    return models, second


def _serve(tmp_path, *flags):
    """`strata serve` on a free port -> (process, its port)."""
    proc = subprocess.Popen([sys.executable, "-m", "strata_cli", "serve", "--port", "0", "--quiet", "--ctx", "2048",
                             *flags], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)})
    while True:
        line = proc.stdout.readline()
        assert line, "the server ended"
        if line.startswith("strata: listening on"):
            return proc, int(line.strip().rsplit(":", 1)[1])


def test_two_names_of_the_default_model_switch_by_model(tmp_path):
    models, second = _second_model(tmp_path)
    proc, port = _serve(tmp_path, "--models-dir", str(models), "--idle-unload", "2")
    try:
        s = Server("127.0.0.1", port)
        import psutil
        server_rss = {"start": psutil.Process(proc.pid).memory_info().rss}
        listed = s.call("GET", "/v1/models")[1]["data"]
        assert {m["id"]: m["status"]["value"] for m in listed} == {"smollm2-135m-instruct": "loaded",
                                                                   "smollm2-second": "unloaded"}
        assert all(m["details"]["architecture"] == "llama" and m["details"]["quant"] == "Q4_1" for m in listed)
        ask = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 24,
               "temperature": 0}
        answers = {}
        for name in ("smollm2-second", "smollm2-135m-instruct", "smollm2-second"):
            status, body = s.call("POST", "/v1/chat/completions", {**ask, "model": name}, timeout_s=300)
            assert status == 200 and body["model"] == name
            answers.setdefault(name, body["choices"][0]["message"]["content"])
            [cmd] = _engines(proc.pid)   # one engine at a time, on the named file
            assert cmd[cmd.index("--model") + 1] == (str(second) if name == "smollm2-second" else model_path())
        assert answers["smollm2-second"] == answers["smollm2-135m-instruct"]   # the same weights, greedy
        assert "Paris" in answers["smollm2-second"]
        rss = _engine_rss(proc.pid)
        server_rss["switched"] = psutil.Process(proc.pid).memory_info().rss
        deadline = time.monotonic() + 60
        while _engines(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _engines(proc.pid) == [] and _engine_rss(proc.pid) == 0 and rss > 50 << 20
        health = s.call("GET", "/health")[1]
        assert health["loaded"] is False
        server_rss["unloaded"] = psutil.Process(proc.pid).memory_info().rss
        print(json.dumps({"engine_rss_mib_before_idle_unload": rss >> 20,
                          "server_rss_mib": {k: v >> 20 for k, v in server_rss.items()}}))
    finally:
        proc.terminate()
        proc.wait(30)


def test_two_models_stay_loaded_together_with_max_loaded(tmp_path):
    models, second = _second_model(tmp_path)
    proc, port = _serve(tmp_path, "--models-dir", str(models), "--max-loaded", "2", "--parallel", "1")
    try:
        s = Server("127.0.0.1", port)
        ask = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16,
               "temperature": 0}
        answers = [s.call("POST", "/v1/chat/completions", {**ask, "model": name}, timeout_s=300)
                   for name in ("smollm2-second", "smollm2-135m-instruct", "smollm2-second")]
        assert [a[0] for a in answers] == [200, 200, 200]
        assert answers[0][1]["choices"][0]["message"]["content"] == answers[1][1]["choices"][0]["message"]["content"]
        engines = sorted(cmd[cmd.index("--model") + 1] for cmd in _engines(proc.pid))
        assert engines == sorted([str(second), model_path()])    # both engines run, one per file
        listed = s.call("GET", "/v1/models")[1]["data"]
        assert {m["id"]: m["status"]["value"] for m in listed} == {"smollm2-135m-instruct": "loaded",
                                                                   "smollm2-second": "loaded"}
        ps = subprocess.run([sys.executable, "-m", "strata_cli", "ps", "--json"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)})
        [row] = [r for r in json.loads(ps.stdout)["servers"] if r["pid"] == proc.pid]
        assert sorted(row["loaded"].split(", ")) == ["smollm2-135m-instruct", "smollm2-second"]
    finally:
        proc.terminate()
        proc.wait(30)

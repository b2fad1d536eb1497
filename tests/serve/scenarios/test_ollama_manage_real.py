"""Ollama's model management with the official `ollama` client against `strata serve` on the real engine: a
model made from the default GGUF uploaded as a blob, with a system prompt and parameters, is listed, answers on
its own engine (the blob's file), is copied and deleted; `keep_alive: 0` ends its engine (its RAM given back);
a restart over the same store still serves the copy."""
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ENGINE_EXE, ROOT, model_path

pytestmark = pytest.mark.skipif(model_path() is None or not os.access(ENGINE_EXE, os.X_OK),
                                reason="needs the default model and the built engine")
ollama = pytest.importorskip("ollama", reason="the ollama client is a test-only dependency (requirements-test.txt)")


def _engines(pid):
    """The --model of each live engine of the server."""
    import psutil
    out = []
    for c in psutil.Process(pid).children(recursive=True):
        try:
            cmd = c.cmdline()
            if "--serve" in cmd:
                out.append(cmd[cmd.index("--model") + 1])
        except (psutil.Error, ValueError):
            pass
    return out


def _serve(tmp_path, store):
    """`strata serve` on a free port with its own empty models folder and `store` -> (process, port)."""
    (tmp_path / "models").mkdir(exist_ok=True)
    log = open(tmp_path / f"serve-{time.monotonic_ns()}.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "strata_cli", "serve", "--port", "0", "--quiet", "--ctx", "1024",
                             "--parallel", "1", "--models-dir", str(tmp_path / "models"), "--model-store", str(store)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)})
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        log.seek(0)
        for line in log.read().splitlines():
            if line.startswith("strata: listening on"):
                return proc, int(line.strip().rsplit(":", 1)[1])
        assert proc.poll() is None, "the server ended"
        time.sleep(0.2)
    raise AssertionError("the server did not start")


def _wait(check, timeout_s=60.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.2)
    return False


def test_the_ollama_client_creates_uses_copies_deletes_and_stops_a_model(tmp_path):
    store = tmp_path / "store"
    proc, port = _serve(tmp_path, store)
    try:
        client = ollama.Client(host=f"http://127.0.0.1:{port}", timeout=300)
        digest = client.create_blob(model_path())
        blob = store / "blobs" / digest.replace(":", "-")
        assert blob.stat().st_size == os.path.getsize(model_path())
        client.create(model="oneword", files={"smol.gguf": digest}, system="Answer with one word only.",
                      parameters={"temperature": 0, "num_predict": 8})
        assert "oneword:latest" in [m.model for m in client.list().models]
        reply = client.chat(model="oneword", messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert reply.message.content.strip() and reply.eval_count <= 8
        assert _engines(proc.pid) == [str(blob)]   # its own engine, on the uploaded file
        client.copy("oneword", "oneword-copy")
        shown = client.show("oneword-copy")
        assert 'SYSTEM "Answer with one word only."' in shown.modelfile and "num_predict" in shown.parameters
        client.delete("oneword")
        names = [m.model for m in client.list().models]
        assert "oneword-copy:latest" in names and "oneword:latest" not in names
        again = client.chat(model="oneword-copy", messages=[{"role": "user",
                                                             "content": "What is the capital of France?"}])
        assert again.message.content == reply.message.content   # the same file, settings and greedy sampling
        assert [m.model for m in client.ps().models] == ["oneword-copy:latest"]
        stopped = client.generate(model="oneword-copy", prompt="", keep_alive=0)
        assert stopped.done_reason == "unload"
        assert _wait(lambda: _engines(proc.pid) == []) and client.ps().models == []
    finally:
        proc.terminate()
        proc.wait(30)
    proc, port = _serve(tmp_path, store)
    try:
        client = ollama.Client(host=f"http://127.0.0.1:{port}", timeout=300)
        names = [m.model for m in client.list().models]
        assert "oneword-copy:latest" in names and "oneword:latest" not in names
        assert 'SYSTEM "Answer with one word only."' in client.show("oneword-copy").modelfile
    finally:
        proc.terminate()
        proc.wait(30)

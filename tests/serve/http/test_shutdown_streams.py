"""SIGTERM during any stream (chat, completions, messages; on a one-slot engine and alone on a two-slot engine
under --parallel 2) ends it with the shutdown error event, never a normal finish (issue 10, Faults)."""
import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, fake_argv
from tests.serve.conftest import FAKE_SLOTS

ONE_SLOT = {"turns": [{"ids": [97 + i % 26 for i in range(50000)], "token_delay_s": 0.005}]}
SLOTS = {"repeat": 5000, "token_delay_s": 0.005, "step_delay_s": 0.005}
CHAT = {"messages": [{"role": "user", "content": "tell me everything"}], "stream": True}
STREAMS = {"chat": ("/v1/chat/completions", CHAT),
           "completions": ("/v1/completions", {"prompt": "tell me everything", "stream": True}),
           "messages": ("/v1/messages", {**CHAT, "max_tokens": 1500})}


def _spawn(tmp_path, engine_argv, extra):
    cmd = [sys.executable, "-m", "strata_cli", "serve", "--tokenizer", "bytes", "--quiet", "--port", "0",
           "--engine", " ".join(engine_argv), "--log", str(tmp_path / "engine.log"), *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        line = proc.stdout.readline().decode()
        if line.startswith("strata: listening on http://"):
            return proc, int(line.rsplit(":", 1)[1])
        assert line or proc.poll() is None, "the server ended before it listened"
    proc.kill()
    raise AssertionError("no listening line")


def _stream_then_sigterm(proc, port, path, body) -> str:
    sock = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(body).encode()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    got = b""
    sock.settimeout(20)
    while got.count(b"data: ") < 6:   # the reply is under way
        part = sock.recv(4096)
        assert part, got.decode("utf-8", "replace")
        got += part
    proc.send_signal(signal.SIGTERM)
    while True:
        part = sock.recv(65536)
        if not part:
            break
        got += part
    sock.close()
    return got.decode("utf-8", "replace")


@pytest.mark.parametrize("api", list(STREAMS))
@pytest.mark.parametrize("engine", ["one-slot", "slots"])
def test_sigterm_ends_every_stream_with_the_shutdown_event(tmp_path, api, engine):
    if engine == "one-slot":
        argv, extra = fake_argv(tmp_path, ONE_SLOT), ["--parallel", "1"]
    else:  # one request alone on a two-slot engine
        (tmp_path / "slots.json").write_text(json.dumps(SLOTS))
        argv, extra = [sys.executable, FAKE_SLOTS, "--script", str(tmp_path / "slots.json")], ["--parallel", "2"]
    proc, port = _spawn(tmp_path, argv, extra)
    try:
        path, body = STREAMS[api]
        text = _stream_then_sigterm(proc, port, path, body)
        assert "shutting down" in text, text[-400:]
        assert '"finish_reason": "stop"' not in text and '"finish_reason": "length"' not in text
        assert "message_stop" not in text and "end_turn" not in text
        if api != "messages":
            # HTTP/1.1: chunked, and the cut stream ends after its last data chunk, without the empty last chunk
            assert text.endswith("data: [DONE]\n\n\r\n") and not text.endswith("0\r\n\r\n"), text[-200:]
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()

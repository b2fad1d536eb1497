"""Faults, with the fake engine: death, silence, bad bytes, clients that leave or never read, signals."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, fake_argv
from tests.serve.conftest import chat

HELLO = {"text": "Hello from the fake engine."}


def _stop_sent(rec):
    if not os.path.exists(rec):
        return False
    return any(line.split(" ", 1)[1].strip() == "BSTOP 0" for line in open(rec) if " " in line)


def test_engine_dies_mid_stream_then_next_request_restarts(server, tmp_path):
    s = server({"state": str(tmp_path / "st"), "starts": [{"turns": [{"text": "abcdef", "die_after": 3}]}, {}]})
    status, events, raw = s.stream(chat())
    assert status == 200 and raw.endswith("data: [DONE]\n\n")
    err = events[-1]["error"]
    assert "exit code 3" in err["message"] and "next request restarts it" in err["message"]
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1]) == "abc"
    status, body, _ = s.post("/v1/chat/completions", chat())
    assert status == 200 and body["choices"][0]["message"]["content"] == "Hello from the fake engine."


def test_dead_engine_before_headers_is_503_with_the_death_note(server, tmp_path):
    s = server({"state": str(tmp_path / "st"), "starts": [{"turns": [{"text": "ab", "die_after": 1}]},
                                                           {"exit_before_ready": 9}]})
    s.post("/v1/chat/completions", chat())  # kills the engine mid-answer
    status, body, _ = s.post("/v1/chat/completions", chat())  # the restart fails too
    assert status == 503 and "exit code 9" in body["error"]["message"]


def test_silent_engine_is_ended_after_the_allowance(server, monkeypatch, tmp_path):
    monkeypatch.setenv("STRATA_ENGINE_STALL_S", "0")
    s = server({"state": str(tmp_path / "st"), "starts": [{"turns": [{"text": "abc", "silent_after": 1}]}, {}]},
               silence_s=0.3)
    t0 = time.monotonic()
    status, events, _ = s.stream(chat())
    assert status == 200 and "silent" in events[-1]["error"]["message"] and time.monotonic() - t0 < 5
    assert s.post("/v1/chat/completions", chat())[0] == 200


def test_invalid_utf8_bytes_become_replacement_chars(server):
    s = server({"raw_start": ["INFO odd=\xff"], "turns": [{"ids": [0xFF, 65, 0xC3, 66], "raw": ["WARN \xfe\xfd"]}]})
    status, body, _ = s.post("/v1/chat/completions", chat())
    assert status == 200 and body["choices"][0]["message"]["content"] == "\ufffdA\ufffdB"
    _, events, _ = s.stream(chat())
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == "\ufffdA\ufffdB"


def _raw_request(port, body, rcvbuf=None):
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock


def test_disconnect_mid_stream_sends_stop_and_frees_the_engine(server, tmp_path):
    rec = str(tmp_path / "rec.txt")
    s = server({"record": rec, "turns": [{"ids": _random_letters(50000), "token_delay_s": 0.002}, HELLO]})
    sock = _raw_request(s.port, chat(stream=True))
    got = b""
    while got.count(b"data: ") < 5:
        got += sock.recv(4096)
    sock.close()
    t0 = time.monotonic()
    while not _stop_sent(rec):
        assert time.monotonic() - t0 < 1.0, "no BSTOP within a second of the disconnect"
        time.sleep(0.02)
    status, body, _ = s.post("/v1/chat/completions", chat(), timeout=5)
    assert status == 200 and body["choices"][0]["message"]["content"] == "Hello from the fake engine."
    assert s.svc.history[0]["finish"] in ("cancel", "error") and s.svc.history[0]["output_tokens"] < 100000


def test_disconnect_while_not_streaming_stops_the_engine(server, tmp_path):
    rec = str(tmp_path / "rec.txt")
    s = server({"record": rec, "turns": [{"text": "x", "first_delay_s": 60}, HELLO]})
    sock = _raw_request(s.port, chat())
    time.sleep(0.3)
    sock.close()
    t0 = time.monotonic()
    while not _stop_sent(rec):
        assert time.monotonic() - t0 < 1.0
        time.sleep(0.02)


def test_client_that_never_reads_is_cut_after_the_write_limit(server, tmp_path, monkeypatch):
    monkeypatch.setenv("STRATA_STREAM_WRITE_TIMEOUT_S", "0.5")
    rec = str(tmp_path / "rec.txt")
    s = server({"record": rec, "turns": [{"text": "abcdefghij" * 5, "repeat": 40000}, HELLO]}, ctx=4 << 20)
    t0 = time.monotonic()
    sock = _raw_request(s.port, chat(stream=True), rcvbuf=4096)  # then never reads
    try:
        while not _stop_sent(rec):
            assert time.monotonic() - t0 < 20, "the stalled stream was never cut"
            time.sleep(0.05)
        status, body, _ = s.post("/v1/chat/completions", chat(), timeout=5)
        assert status == 200 and body["choices"][0]["message"]["content"] == "Hello from the fake engine."
    finally:
        sock.close()


def _random_letters(n):
    """Token ids with no short cycle (the loop guard would end a periodic answer early)."""
    import random
    rnd = random.Random(6)
    return [rnd.randrange(97, 123) for _ in range(n)]


def _free_port():
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def _spawn(tmp_path, script=None, extra=(), env=None, stdout=subprocess.PIPE, stderr=subprocess.STDOUT):
    cmd = [sys.executable, "-m", "strata_cli", "serve", "--tokenizer", "bytes", "--quiet",
           "--engine", " ".join(fake_argv(tmp_path, script)), "--log", str(tmp_path / "engine.log"), *extra]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=stdout, stderr=stderr, env={**os.environ, **(env or {})})


def _listening_port(proc, timeout_s=20):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        line = proc.stdout.readline().decode()
        if line.startswith("strata: listening on http://"):
            return int(line.rsplit(":", 1)[1])
        assert line or proc.poll() is None, "the server ended before it listened"
    raise AssertionError("no listening line")


def test_port_0_listening_line_and_sigterm_during_a_stream(tmp_path):
    rec = str(tmp_path / "rec.txt")
    proc = _spawn(tmp_path, {"record": rec, "turns": [{"ids": _random_letters(50000), "token_delay_s": 0.005}]},
                  ["--port", "0"])
    try:
        port = _listening_port(proc)
        sock = _raw_request(port, chat(stream=True))
        got = b""
        while got.count(b"data: ") < 3:
            got += sock.recv(4096)
        proc.send_signal(signal.SIGTERM)
        sock.settimeout(10)
        while True:
            part = sock.recv(65536)
            if not part:
                break
            got += part
        text = got.decode()
        # chunked (HTTP/1.1), cut short: the last data chunk, then the close without the empty last chunk
        assert "shutting down" in text and text.endswith("data: [DONE]\n\n\r\n")
        assert proc.wait(15) == 0
        engine_pid = int(open(rec).readline().split()[0])
        with pytest.raises(ProcessLookupError):
            os.kill(engine_pid, 0)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_health_is_503_while_loading_then_200(tmp_path):
    import http.client
    port = _free_port()
    proc = _spawn(tmp_path, {"ready_delay_s": 1.5}, ["--port", str(port)])
    try:
        seen = []
        end = time.monotonic() + 20
        while time.monotonic() < end and 200 not in seen:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                seen.append(c.getresponse().status)
            except OSError:
                pass
            time.sleep(0.1)
        assert 503 in seen and seen[-1] == 200
    finally:
        proc.terminate()
        proc.wait(15)


def test_parent_pid_gone_ends_the_server(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc = _spawn(tmp_path, None, ["--port", "0", "--parent-pid", str(parent.pid)])
    try:
        _listening_port(proc)
        parent.kill()
        parent.wait()
        assert proc.wait(10) == 0
    finally:
        for p in (parent, proc):
            if p.poll() is None:
                p.kill()


def test_console_that_never_reads_does_not_block_the_server(tmp_path):
    port = _free_port()
    # STRATA_DEBUG=1 echoes every engine line: ~1 MB of console text that nobody reads
    proc = _spawn(tmp_path, {"turns": [{"ids": _random_letters(20000)}]}, ["--port", str(port), "--ctx", "200000"],
                  env={"STRATA_DEBUG": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    import http.client
    try:
        end = time.monotonic() + 20
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < end
            time.sleep(0.1)
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("POST", "/v1/chat/completions", body=json.dumps(chat(max_tokens=20000)))
        r = c.getresponse()
        body = json.loads(r.read())
        assert r.status == 200 and body["usage"]["completion_tokens"] == 20000
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# ------------------------------------------------------------------ issue 10: self-heal, load failure, bad lines
def _health(s):
    try:
        return s.request("GET", "/health", timeout=2)[0]
    except OSError:
        return None


def test_an_engine_that_dies_while_idle_is_restarted_and_health_returns_by_itself(server, monkeypatch):
    from serve.engine_client import supervisor
    monkeypatch.setattr(supervisor, "POLL_S", 0.05)
    monkeypatch.setattr(supervisor, "BACKOFF_FIRST_S", 0.05)
    s = server()
    s.svc.start_engine()  # running already: this starts its supervisor
    try:
        pid = s.svc.engine.current().popen.pid
        os.kill(pid, signal.SIGKILL)
        end, seen = time.monotonic() + 15, []
        while time.monotonic() < end and not (seen and seen[-1] == 200 and s.svc.engine.current().popen.pid != pid):
            seen.append(_health(s))
            time.sleep(0.05)
        assert seen[-1] == 200 and s.svc.engine.current().popen.pid != pid, seen[-5:]
        assert s.svc.supervisor.restarts == 1  # no request was sent: the supervisor did it
        s.svc.engine.close()  # closed on purpose (shutdown, unload): not brought back
        time.sleep(0.3)
        assert not s.svc.engine.alive() and s.svc.supervisor.restarts == 1
    finally:
        s.svc.stop_engine()


def test_the_supervisor_gives_up_after_its_limit(server, monkeypatch, tmp_path):
    from serve.engine_client import supervisor
    monkeypatch.setattr(supervisor, "POLL_S", 0.02)
    monkeypatch.setattr(supervisor, "BACKOFF_FIRST_S", 0.02)
    monkeypatch.setattr(supervisor, "RESTARTS_MAX", 2)
    s = server({"state": str(tmp_path / "st"), "starts": [{}, {"exit_before_ready": 3}]})
    lines = []
    s.svc.start_engine()
    s.svc.supervisor.log = lines.append
    try:
        s.svc.engine.current().popen.kill()
        end = time.monotonic() + 15
        while time.monotonic() < end and not s.svc.supervisor.gave_up:
            time.sleep(0.02)
        assert s.svc.supervisor.gave_up and s.svc.supervisor.failures == 2
        assert "giving up" in lines[-1] and _health(s) == 503
    finally:
        s.svc.stop_engine()


def test_a_model_that_cannot_load_ends_the_server_with_one_line(tmp_path):
    proc = _spawn(tmp_path, {"exit_before_ready": 3}, ["--port", "0"])
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = out.decode().strip().splitlines()
    assert proc.returncode == 1, lines
    said = [ln for ln in lines if ln.startswith("strata: the engine did not start:")]
    assert len(said) == 1 and "exit code 3" in said[0], lines
    assert not any("listening on" in ln for ln in lines)


@pytest.mark.parametrize("bad", ["BT 0 notanumber", "BT 0 99999", "BT 0 -1"])
def test_a_malformed_engine_line_is_a_502_engine_error(server, bad, tmp_path):
    s = server({"state": str(tmp_path / "st"), "starts": [{"turns": [{"raw": [bad]}]}, {"turns": [HELLO]}]})
    status, body, _ = s.post("/v1/chat/completions", chat(), timeout=10)
    assert status == 502 and body["error"]["type"] == "engine_error", body
    assert "malformed" in body["error"]["message"]
    status, body, _ = s.post("/v1/chat/completions", chat(), timeout=10)  # a new process answers
    assert status == 200 and body["choices"][0]["message"]["content"] == HELLO["text"]


def test_a_malformed_engine_line_mid_stream_ends_it_with_an_error_event(server):
    s = server({"turns": [{"ids": [97, 98], "raw": ["BT 0 98", "BT 0 x"]}, HELLO]})
    status, events, text = s.stream(chat())
    assert status == 200 and "malformed" in text and text.endswith("data: [DONE]\n\n")


def test_a_cancelled_request_keeps_its_engine_figures(server):
    """A client that hangs up mid-stream: its tokens come with their time (the figures of the BSTOP's BDONE),
    so the decode rate is not tokens over nothing."""
    s = server({"turns": [{"ids": _random_letters(3000), "token_delay_s": 0.002}]})
    sock = _raw_request(s.port, chat(stream=True))
    got = b""
    while got.count(b"data: ") < 20:
        got += sock.recv(4096)
    sock.close()
    end = time.monotonic() + 10
    while time.monotonic() < end and not s.svc.history:
        time.sleep(0.02)
    rec = s.svc.history[-1]
    assert rec["finish"] == "cancel", rec
    fig = rec["figures"]
    assert fig["decode_ms"] > 0 and fig["generated"] >= 19 and fig["prompt_ms"] is not None, fig
    assert s.svc.totals["decode_ms"] > 0

"""The socket side of the server (serve/http/guard.py), over raw sockets: read deadlines, the connection cap,
the accept loop on EMFILE, chunked bodies, deep JSON, http.server's own errors, a stream nobody reads."""
import errno
import json
import os
import random
import select
import socket
import time

import pytest

from tests.serve.conftest import chat

WAIT_S = 20.0   # how long a test waits for the server to act (generous: the machine is shared)


def _connect(port, rcvbuf=None):
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(WAIT_S)
    sock.connect(("127.0.0.1", port))
    return sock


def _read_all(sock):
    """Everything until the server closes (a socket timeout here fails the test: the server never closed)."""
    out = b""
    while True:
        try:
            got = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not got:
            return out
        out += got


def _answer(raw):
    """(status, headers dict, parsed JSON body) of a whole HTTP answer; status None without a status line."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not lines[0].startswith("HTTP/1."):
        return None, {}, raw
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    parsed = json.loads(body) if "json" in headers.get("content-type", "") else body
    return int(lines[0].split()[1]), headers, parsed


def _exchange(port, data):
    sock = _connect(port)
    try:
        sock.sendall(data)
        return _answer(_read_all(sock))
    finally:
        sock.close()


def _post_raw(body_part, headers="Content-Type: application/json\r\n"):
    # Connection: close: the answer is read to the end of the connection
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{headers}\r\n").encode() + body_part


# ---------------------------------------------------------------- deadlines
def test_idle_connection_is_closed_without_an_answer(server, monkeypatch):
    monkeypatch.setenv("STRATA_IDLE_TIMEOUT_S", "0.3")
    s = server()
    sock = _connect(s.port)
    try:
        assert _read_all(sock) == b""  # closed by the server (a hang here is a socket timeout)
    finally:
        sock.close()


def test_slow_loris_headers_get_408_and_are_closed(server, monkeypatch):
    monkeypatch.setenv("STRATA_HEADER_TIMEOUT_S", "1")
    s = server()
    sock = _connect(s.port)
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        end = time.monotonic() + WAIT_S
        while not select.select([sock], [], [], 0.1)[0]:  # one header byte every 0.1 s, never the blank line
            assert time.monotonic() < end, "the trickling client was never cut"
            sock.sendall(b"X")
        status, _, body = _answer(_read_all(sock))
        assert status == 408 and body["error"]["type"] == "timeout_error"
        assert "STRATA_HEADER_TIMEOUT_S" in body["error"]["message"]
    finally:
        sock.close()


def test_short_body_gets_408_and_a_body_that_ends_early_400(server, monkeypatch):
    monkeypatch.setenv("STRATA_BODY_TIMEOUT_S", "0.5")
    monkeypatch.setenv("STRATA_STREAM_WRITE_TIMEOUT_S", "5")
    s = server()
    sock = _connect(s.port)
    try:
        sock.sendall(_post_raw(b'{"messages": [', "Content-Type: application/json\r\nContent-Length: 100\r\n"))
        status, _, body = _answer(_read_all(sock))  # the client holds the connection open, sending nothing
        assert status == 408 and "body" in body["error"]["message"]
    finally:
        sock.close()
    sock = _connect(s.port)
    try:
        sock.sendall(_post_raw(b'{"messages": [', "Content-Type: application/json\r\nContent-Length: 100\r\n"))
        sock.shutdown(socket.SHUT_WR)
        status, _, body = _answer(_read_all(sock))
        assert status == 400 and "ended after 14 of its 100 bytes" in body["error"]["message"]
    finally:
        sock.close()
    assert s.post("/v1/chat/completions", chat())[0] == 200


# ---------------------------------------------------------------- connections
def test_connections_past_the_cap_get_503_and_their_threads_are_freed(server, monkeypatch):
    monkeypatch.setenv("STRATA_MAX_CONNECTIONS", "2")
    s = server()
    held = [_connect(s.port), _connect(s.port)]  # two idle connections hold both handler threads
    try:
        end = time.monotonic() + WAIT_S
        while True:  # the two are accepted before a later connection (one accept queue, in order)
            status, headers, body = _exchange(s.port, b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            if status == 503 or time.monotonic() > end:
                break
            time.sleep(0.05)
        assert status == 503 and headers["content-type"] == "application/json"
        assert "STRATA_MAX_CONNECTIONS" in body["error"]["message"] and body["error"]["code"] == 503
    finally:
        for sock in held:
            sock.close()
    end = time.monotonic() + WAIT_S
    while s.request("GET", "/health")[0] != 200:  # the closed connections give their threads back
        assert time.monotonic() < end
        time.sleep(0.05)


class _ListenerOutOfFds:
    """Stands in for the listening socket: the same descriptor (so the selector still sees the waiting
    connection), but every accept fails with EMFILE, as when the process is out of file descriptors."""

    def __init__(self, real):
        self.real, self.accepts = real, 0

    def fileno(self):
        return self.real.fileno()

    def accept(self):
        self.accepts += 1
        raise OSError(errno.EMFILE, "Too many open files")

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_accept_loop_backs_off_on_emfile(server):
    s = server()
    fake = _ListenerOutOfFds(s.httpd.socket)
    s.httpd.socket = fake
    waiting = _connect(s.port)  # stays in the accept queue: the listening socket is readable all along
    try:
        time.sleep(1.0)
        n = fake.accepts
    finally:
        s.httpd.socket = fake.real
        waiting.close()
    assert 1 <= n <= 50, f"{n} accept calls in 1 s: the accept loop spins"


def test_out_of_descriptors_the_waiting_client_gets_503_and_the_server_stays_idle(tmp_path):
    """A real server process limited to 64 descriptors, flooded by idle connections: the accept loop sheds
    the waiting connections with a 503 (a spare descriptor) instead of spinning while they wait."""
    import resource
    import subprocess
    import sys
    psutil = pytest.importorskip("psutil")
    from tests.conftest import ROOT, fake_argv
    cmd = [sys.executable, "-m", "strata_cli", "serve", "--tokenizer", "bytes", "--quiet", "--port", "0",
           "--engine", " ".join(fake_argv(tmp_path)), "--log", str(tmp_path / "engine.log")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)))
    held = []
    try:
        line = proc.stdout.readline().decode()
        assert line.startswith("strata: listening on http://"), line
        port = int(line.rsplit(":", 1)[1])
        held = [_connect(port) for _ in range(80)]  # more than the process can hold: some wait in the queue
        status, _, body = _exchange(port, b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert status == 503 and "file descriptors" in body["error"]["message"]
        server = psutil.Process(proc.pid)
        before = sum(server.cpu_times()[:2])
        time.sleep(2.0)
        assert sum(server.cpu_times()[:2]) - before < 0.5, "the accept loop spins while out of descriptors"
    finally:
        for sock in held:
            sock.close()
        proc.terminate()
        proc.wait(30)


# ---------------------------------------------------------------- bodies
def _chunked(*chunks, tail=b"0\r\n\r\n"):
    return _post_raw(b"".join(chunks) + tail, "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n")


def test_chunked_sizes_are_strict_and_the_limit_holds(server, monkeypatch):
    monkeypatch.setenv("STRATA_MAX_BODY_MIB", "0.01")
    s = server()
    body = json.dumps(chat()).encode()
    status, _, out = _exchange(s.port, _chunked(b"%x\r\n%s\r\n" % (len(body), body)))
    assert status == 200 and out["choices"][0]["message"]["content"] == "Hello from the fake engine."
    for size in (b"-5", b"zz", b"0x10", b"+a", b"a_b", b"1" + b"0" * 16):  # negative, non-hex, over 16 digits
        status, _, out = _exchange(s.port, _chunked(size + b"\r\n" + body + b"\r\n"))
        assert status == 400 and "chunk size" in out["error"]["message"], (size, status, out)
    status, _, out = _exchange(s.port, _chunked(b"ffffffffffff\r\n" + body + b"\r\n"))  # 16 digits, huge
    assert status == 413 and "limit" in out["error"]["message"]
    piece = b"x" * 4000
    status, _, out = _exchange(s.port, _chunked(*[b"fa0\r\n" + piece + b"\r\n"] * 4))  # 16,000 > 10,485 bytes
    assert status == 413
    status, _, out = _exchange(s.port, _chunked(b"5\r\n" + b"x" * 9 + b"\r\n"))  # more data than its size
    assert status == 400 and "longer than its size" in out["error"]["message"]


def test_deeply_nested_json_is_400(server):
    s = server()
    for raw in (b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 100_000 + b"1" + b"}" * 100_000):
        status, out, _ = s.post("/v1/chat/completions", raw, headers={"Content-Type": "application/json"})
        assert status == 400 and "nested too deeply" in out["error"]["message"]
    assert s.post("/v1/chat/completions", chat())[0] == 200


# ---------------------------------------------------------------- http.server's own errors
@pytest.mark.parametrize("raw, status", [
    (b"garbage\r\n\r\n", 400),                                      # bad request line
    (b"GET / HTTP/1.x\r\n\r\n", 400),                               # bad version
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),          # request line too long
    (b"GET / HTTP/1.1\r\nX-Big: " + b"b" * 70_000 + b"\r\n\r\n", 431),  # header line too long
    (b"GET / HTTP/1.1\r\n" + b"X-H: 1\r\n" * 120 + b"\r\n", 431),    # too many headers
    (b"BREW /pot HTTP/1.1\r\n\r\n", 501),                           # unknown method
    (b"GET / HTTP/3.0\r\n\r\n", 505),                               # unknown HTTP version
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),                     # an HTTP/2 preface
    (b"GET /health\r\n", 505),                                      # HTTP/0.9 (no status line otherwise)
])
def test_http_servers_own_errors_are_openai_json_with_a_status_line(server, raw, status):
    s = server()
    got, headers, body = _exchange(s.port, raw)
    assert got == status, body
    assert headers["content-type"] == "application/json"
    assert body["error"]["code"] == status and body["error"]["message"] and body["error"]["type"]


# ---------------------------------------------------------------- a stream nobody reads
def _stop_sent(rec):
    return os.path.exists(rec) and any(ln.split(" ", 1)[1].strip() == "BSTOP 0" for ln in open(rec) if " " in ln)


def test_stream_nobody_reads_is_cut_and_its_engine_request_stopped(server, tmp_path, monkeypatch):
    """4,000 tokens (about 1 MB of SSE events) fit in what the kernel buffers for a socket left to grow its
    own send buffer (measured 2-2.9 MB on loopback, SO_SNDBUF up to 4 MB): without a moderate SO_SNDBUF the
    engine ran to the end for a client that read nothing. With it about 210 KB are buffered."""
    monkeypatch.setenv("STRATA_STREAM_WRITE_TIMEOUT_S", "1")
    rec = str(tmp_path / "rec.txt")
    rnd = random.Random(6)
    letters = [rnd.randrange(97, 123) for _ in range(4000)]  # no cycle for the loop guard
    s = server({"record": rec, "turns": [{"ids": letters}, {"text": "Hello from the fake engine."}]}, ctx=16384)
    sock = _connect(s.port)
    try:
        body = json.dumps(chat(stream=True, max_tokens=4000)).encode()
        sock.sendall(_post_raw(body, f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"))
        end = time.monotonic() + 60
        while not _stop_sent(rec):  # then never reads
            assert time.monotonic() < end, "the stream was never cut"
            ended = [r.get("finish") for r in list(s.svc.history)]
            assert ended in ([], ["cancel"]), f"the engine ran to the end for a client that read nothing: {ended}"
            time.sleep(0.05)
    finally:
        sock.close()
    status, body, _ = s.post("/v1/chat/completions", chat(), timeout=10)
    assert status == 200 and body["choices"][0]["message"]["content"] == "Hello from the fake engine."

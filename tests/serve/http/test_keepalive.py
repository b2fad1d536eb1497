"""HTTP/1.1 persistent connections (serve/http/keepalive.py): reuse under load, chunked streams, the close rules.

Every answer is checked against its own request: the fake engine's `echo` turn answers with the `#N#` marker
found in the prompt, so a reply that went to the wrong request (or a stream parsed from the wrong place of a
reused connection) shows. The server's `counts` give the connections and requests it saw.
"""
import http.client
import json
import random
import socket
import threading
import time

import pytest

from serve.http import keepalive
from tests.serve.conftest import chat

ECHO = {"turns": [{"echo": "#[0-9]+#"}]}
N_REQUESTS = 1000
N_CONNECTIONS = 32


def _sse_data(text):
    """Each event's data (an `event:` line may come first, as Anthropic's do)."""
    lines = [line for b in text.split("\n\n") for line in b.split("\n")]
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]


# each kind: (method, path, body for marker m, expected status, how the answer's text is read from the body)
def _openai(m, stream):
    return "POST", "/v1/chat/completions", chat(f"say {m}", stream=stream), 200


def _request(kind, m, big):
    if kind == "chat":
        return _openai(m, False)
    if kind == "chat-stream":
        return _openai(m, True)
    if kind == "messages":
        return "POST", "/v1/messages", {"max_tokens": 20, "messages": [{"role": "user", "content": f"say {m}"}]}, 200
    if kind == "messages-stream":
        return "POST", "/v1/messages", {"max_tokens": 20, "stream": True,
                                        "messages": [{"role": "user", "content": f"say {m}"}]}, 200
    if kind == "ollama-stream":
        return "POST", "/api/chat", {"model": "m", "messages": [{"role": "user", "content": f"say {m}"}]}, 200
    if kind == "ollama":
        return "POST", "/api/chat", {"model": "m", "stream": False,
                                     "messages": [{"role": "user", "content": f"say {m}"}]}, 200
    if kind == "llama-stream":
        return "POST", "/completion", {"prompt": f"say {m}", "n_predict": 20, "stream": True}, 200
    if kind == "bad-json":
        return "POST", "/v1/chat/completions", f'{{"messages": {m}', 400
    if kind == "not-found":
        return "GET", f"/v1/nothing/{m.strip('#')}", None, 404
    if kind == "too-large":
        return "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": m + "x" * big}]}, 413
    raise AssertionError(kind)


def _answer_text(kind, status, raw):
    """What the reply says: the echoed marker for a generation, the error message for an error."""
    text = raw.decode()
    if status != 200:
        return json.loads(text)["error"]["message"]
    if kind == "chat":
        return json.loads(text)["choices"][0]["message"]["content"]
    if kind == "chat-stream":
        return "".join(e["choices"][0]["delta"].get("content") or "" for e in _sse_data(text) if e["choices"])
    if kind == "messages":
        return json.loads(text)["content"][0]["text"]
    if kind == "messages-stream":
        return "".join(e["delta"].get("text", "") for e in _sse_data(text) if e.get("type") == "content_block_delta")
    if kind == "ollama-stream":
        return "".join(json.loads(line)["message"]["content"] for line in text.splitlines() if line)
    if kind == "ollama":
        return json.loads(text)["message"]["content"]
    if kind == "llama-stream":
        return "".join(e.get("content", "") for e in _sse_data(text))
    raise AssertionError(kind)


KINDS = ["chat", "chat-stream", "messages", "messages-stream", "ollama", "ollama-stream", "llama-stream",
         "bad-json", "not-found", "too-large"]
WEIGHTS = [20, 20, 8, 8, 8, 8, 8, 8, 10, 2]   # mostly generations; a few 413s (each ends its connection)


def test_a_thousand_requests_over_32_reused_connections(server, monkeypatch):
    monkeypatch.setenv("STRATA_MAX_BODY_MIB", "0.01")   # 10 KiB: a 413 needs only a small body
    s = server(ECHO)
    before = s.httpd.counts.snapshot()
    rng = random.Random(30)
    plan = [(i, rng.choices(KINDS, WEIGHTS)[0]) for i in range(N_REQUESTS)]
    failures, seen = [], []
    seen_lock = threading.Lock()   # guards seen (status, kind) and failures

    def client(share):
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        try:
            for i, kind in share:
                m = f"#{i}#"
                method, path, body, want = _request(kind, m, 12 << 10)
                data = body if isinstance(body, str) or body is None else json.dumps(body)
                conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                raw = r.read()   # IncompleteRead here would be a stream cut short
                got = _answer_text(kind, r.status, raw)
                ok = r.status == want and (got == m if want == 200 else bool(got))
                with seen_lock:
                    seen.append((kind, r.status, r.getheader("Connection")))
                    if not ok:
                        failures.append((i, kind, r.status, got[:200]))
        except Exception as e:   # noqa: BLE001 - reported below with the request it happened on
            with seen_lock:
                failures.append(("exception", repr(e)))
        finally:
            conn.close()

    shares = [plan[k::N_CONNECTIONS] for k in range(N_CONNECTIONS)]
    threads = [threading.Thread(target=client, args=(share,)) for share in shares]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    elapsed_s = time.monotonic() - t0
    assert not any(t.is_alive() for t in threads)
    assert not failures, failures[:5]
    assert len(seen) == N_REQUESTS
    after = s.httpd.counts.snapshot()
    n_connections = after["connections"] - before["connections"]
    n_closing = sum(1 for kind, status, conn in seen if conn == "close")
    n_413 = sum(1 for kind, status, _ in seen if status == 413)
    # only the 413s (their body is not read) end a connection; every other answer leaves it open for the next
    assert n_closing == n_413 and all(c == "close" for k, st, c in seen if st == 413)
    assert n_connections == N_CONNECTIONS + n_closing, (n_connections, n_closing)
    assert n_connections < N_REQUESTS / 10
    assert after["requests"] - before["requests"] == N_REQUESTS
    print(f"\n{N_REQUESTS} requests, {n_connections} connections ({n_413} closed by a 413), {elapsed_s:.1f} s")


def test_the_openai_sdk_reuses_its_pooled_connection(server):
    openai = pytest.importorskip("openai")
    s = server(ECHO)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="unused", max_retries=0, timeout=30)
    before = s.httpd.counts.snapshot()
    try:
        for i in range(20):
            got = client.chat.completions.create(model="fake", messages=[{"role": "user", "content": f"#{i}#"}]
                                                 ).choices[0].message.content
            assert got == f"#{i}#"
        mid = s.httpd.counts.snapshot()
        assert mid["requests"] - before["requests"] == 20
        assert mid["connections"] - before["connections"] == 1   # one pooled connection carried all 20 calls
        # a streamed call rides the pooled connection too; the SDK stops reading at `data: [DONE]` and closes
        # the response before its parser has seen the last chunk, so httpx drops that connection afterwards
        # (client side: the server kept it open), and the next call opens one
        for i in range(4):
            stream = client.chat.completions.create(model="fake", stream=True,
                                                    messages=[{"role": "user", "content": f"#{100 + i}#"}])
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == f"#{100 + i}#"
            got = client.chat.completions.create(model="fake", messages=[{"role": "user", "content": f"#{i}#"}]
                                                 ).choices[0].message.content
            assert got == f"#{i}#"
    finally:
        client.close()
    after = s.httpd.counts.snapshot()
    assert after["requests"] - mid["requests"] == 8
    assert after["connections"] - mid["connections"] == 4   # one per streamed call, none per plain call


def test_a_stream_cut_by_the_engines_death_ends_without_the_last_chunk(server, tmp_path):
    s = server({"state": str(tmp_path / "st"), "starts": [{"turns": [{"text": "abcdef", "die_after": 3}]},
                                                          {"turns": [{"text": "fine"}]}]})
    conn = s.conn()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(chat(stream=True)))
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("Transfer-Encoding") == "chunked"
    with pytest.raises(http.client.IncompleteRead) as cut:
        r.read()
    text = cut.value.partial.decode()
    assert "exit code 3" in text and text.endswith("data: [DONE]\n\n")   # the error event, then no end marker
    assert r.getheader("Connection") is None   # decided after the headers: the close itself says it
    conn.close()
    # a clean stream on a kept connection ends with the last chunk, and the connection carries the next request
    conn = s.conn()
    for _ in range(2):
        conn.request("POST", "/v1/chat/completions", body=json.dumps(chat(stream=True)))
        r = conn.getresponse()
        raw = r.read()
        assert r.status == 200 and raw.endswith(b"data: [DONE]\n\n") and _answer_text("chat-stream", 200, raw) == "fine"
    conn.close()


def _raw(port, data, timeout=10):
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(data)
    return sock


class _SharedFile:
    """One buffered reader for several http.client responses (pipelined answers on one socket)."""

    def __init__(self, f):
        self.f = f

    def makefile(self, *args, **kwargs):
        return self

    def close(self):
        pass

    def __getattr__(self, name):
        return getattr(self.f, name)


def _post(path, body, extra=""):
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def _responses(sock, n):
    shared = _SharedFile(sock.makefile("rb"))
    out = []
    for _ in range(n):
        r = http.client.HTTPResponse(shared, method="POST")
        r.begin()
        out.append((r.status, r.getheader("Connection"), r.read()))
    return out


def test_pipelined_requests_are_answered_in_order(server):
    s = server(ECHO)
    sock = _raw(s.port, b"".join(_post("/v1/chat/completions", chat(f"say #{i}#", stream=i % 2 == 1))
                                 for i in range(4)))
    answers = _responses(sock, 4)
    for i, (status, conn, raw) in enumerate(answers):
        kind = "chat-stream" if i % 2 else "chat"
        assert status == 200 and conn is None and _answer_text(kind, status, raw) == f"#{i}#"
    sock.close()


def test_the_connection_closes_when_asked_for_http_10_and_after_an_unread_body(server, monkeypatch):
    s = server(ECHO)
    # Connection: close
    sock = _raw(s.port, _post("/v1/chat/completions", chat("say #1#"), "Connection: close\r\n"))
    [(status, conn, raw)] = _responses(sock, 1)
    assert status == 200 and conn == "close" and sock.recv(1) == b""
    sock.close()
    # HTTP/1.0, even with Connection: keep-alive: no chunked stream, ended by the close
    data = json.dumps(chat("say #2#", stream=True)).encode()
    sock = _raw(s.port, b"POST /v1/chat/completions HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: "
                + str(len(data)).encode() + b"\r\n\r\n" + data)
    got = b""
    while part := sock.recv(65536):
        got += part
    sock.close()
    head, _, body = got.partition(b"\r\n\r\n")
    assert b"Connection: close" in head and b"chunked" not in head.lower()
    assert _answer_text("chat-stream", 200, body) == "#2#"
    # a body left unread (a 404 before the body is read): the connection ends, so nothing is parsed from it
    sock = _raw(s.port, _post("/v1/nothing", chat("say #3#")) + _post("/v1/chat/completions", chat("say #4#")))
    [(status, conn, _)] = _responses(sock, 1)
    assert status == 404 and conn == "close" and sock.recv(1) == b""
    sock.close()


def test_a_connection_serves_at_most_its_request_limit(server, monkeypatch):
    monkeypatch.setattr(keepalive, "MAX_REQUESTS_PER_CONNECTION", 3)
    s = server(ECHO)
    sock = _raw(s.port, b"".join(_post("/v1/chat/completions", chat(f"say #{i}#")) for i in range(4)))
    answers = _responses(sock, 3)
    assert [conn for _, conn, _ in answers] == [None, None, "close"]
    assert [_answer_text("chat", st, raw) for st, _, raw in answers] == ["#0#", "#1#", "#2#"]
    assert sock.recv(1) == b""   # the fourth request is never read
    sock.close()


def test_idle_and_header_deadlines_apply_again_between_requests(server, monkeypatch):
    monkeypatch.setenv("STRATA_IDLE_TIMEOUT_S", "0.5")
    monkeypatch.setenv("STRATA_HEADER_TIMEOUT_S", "0.5")
    s = server(ECHO)
    sock = _raw(s.port, _post("/v1/chat/completions", chat("say #1#")))
    assert _responses(sock, 1)[0][0] == 200
    t0 = time.monotonic()
    assert sock.recv(1) == b""   # idle after the first answer: closed without an answer
    assert 0.3 < time.monotonic() - t0 < 5
    sock.close()
    # a second request's headers that never finish: 408 on the kept connection, then the close
    sock = _raw(s.port, _post("/v1/chat/completions", chat("say #2#")))
    assert _responses(sock, 1)[0][0] == 200
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n")
    [(status, conn, raw)] = _responses(sock, 1)
    assert status == 408 and conn == "close" and b"headers" in raw
    sock.close()


def test_stopping_ends_idle_kept_connections_at_once(server):
    s = server(ECHO)
    sock = _raw(s.port, _post("/v1/chat/completions", chat("say #1#")))
    assert _responses(sock, 1)[0][0] == 200
    t0 = time.monotonic()
    s.httpd.begin_stop()
    assert sock.recv(1) == b"" and time.monotonic() - t0 < 5   # not the 30 s idle timeout
    sock.close()


def _metric(text, name):
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith(name + " "))


def test_metrics_count_connections_and_reused_requests(server):
    s = server(ECHO)
    conn = s.conn()
    for i in range(5):   # five requests on one kept connection: four of them reused it
        conn.request("POST", "/v1/chat/completions", body=json.dumps(chat(f"say #{i}#")),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["choices"][0]["message"]["content"] == f"#{i}#"
    conn.request("GET", "/metrics")
    r = conn.getresponse()
    text = r.read().decode()
    assert r.status == 200
    assert _metric(text, "strata:http_connections_accepted_total") == 1
    assert _metric(text, "strata:http_requests_total") == 6
    assert _metric(text, "strata:http_requests_reused_total") == 5
    assert _metric(text, "strata:http_connections_open") == 1   # this one, still open
    conn.close()
    status, text, _ = s.request("GET", "/metrics")   # a new connection; the first has closed (within ~1 s)
    deadline = time.monotonic() + 5
    while _metric(text, "strata:http_connections_open") != 1:
        assert time.monotonic() < deadline, text
        time.sleep(0.05)
        status, text, _ = s.request("GET", "/metrics")
    assert _metric(text, "strata:http_connections_accepted_total") >= 2
    assert _metric(text, "strata:http_requests_reused_total") == 5


def test_x_strata_host_names_the_host_on_every_answer(server):
    s = server(ECHO, host_name="h7")
    plain, errors = s.post("/v1/chat/completions", chat("say #1#")), s.request("GET", "/v1/nothing")
    streamed = s.post("/v1/chat/completions", chat("say #2#", stream=True))
    assert plain[0] == 200 and plain[2].getheader("X-Strata-Host") == "h7"
    assert errors[0] == 404 and errors[2].getheader("X-Strata-Host") == "h7"
    assert streamed[0] == 200 and streamed[1].endswith("data: [DONE]\n\n") and \
        streamed[2].getheader("X-Strata-Host") == "h7"
    conn = s.conn()
    conn.request("GET", "/health")
    assert conn.getresponse().getheader("X-Strata-Host") == "h7"
    unnamed = server(ECHO)
    assert unnamed.request("GET", "/health")[2].getheader("X-Strata-Host") is None   # opt-in: no name, no header

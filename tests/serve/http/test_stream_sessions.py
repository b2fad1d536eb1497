"""Resumable streams (X-Conversation-Id, GET/DELETE /v1/stream, POST /v1/streams/lookup) on the fake engine:
a finished reply replays byte for byte from any offset; a reply whose client hung up runs to its end and a
follower reads it live; DELETE stops the engine request and forgets the session; a second request with the
same id replaces the first; the store's bounds (bytes, age, count) hold; bad input is a 400 naming the field."""
import json
import socket
from urllib.parse import quote

import pytest

from serve.http.stream_sessions import OffsetLost, SessionStore
from tests.serve.conftest import chat
from tests.serve.conftest import wait_until as _wait

CONV = "conv-1::org/model:Q8_0"          # slashes and colons, as llama.cpp's web UI makes them
QS = "conv_id=" + quote(CONV, safe="")
HDR = {"X-Conversation-Id": CONV}


def test_finished_reply_replays_from_any_offset_then_delete_forgets_it(server):
    s = server({"turns": [{"text": "Hello there"}]})
    status, events, raw = s.stream(chat("hi"), headers=HDR)
    assert status == 200 and "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                                     if e["choices"]) == "Hello there"
    status, replay, r = s.request("GET", f"/v1/stream?{QS}&from=0")
    assert status == 200 and r.getheader("Content-Type").startswith("text/event-stream") and replay == raw
    assert s.request("GET", f"/v1/stream?{QS}")[1] == raw          # from defaults to 0
    assert s.request("GET", f"/v1/stream?{QS}&from=10")[1] == raw.encode()[10:].decode()
    status, found, _ = s.post("/v1/streams/lookup", {"conversation_ids": ["conv-1", "other"]})
    assert status == 200 and len(found) == 1
    assert found[0]["conversation_id"] == CONV and found[0]["is_done"] is True
    assert found[0]["total_bytes"] == len(raw.encode()) and found[0]["completed_at"] >= found[0]["started_at"]
    assert s.post("/v1/streams/lookup", {"conversation_ids": []})[1] == []   # nothing is listed unasked
    assert s.request("DELETE", f"/v1/stream?{QS}")[0] == 204
    assert s.request("GET", f"/v1/stream?{QS}&from=0")[0] == 404
    assert s.request("DELETE", f"/v1/stream?{QS}")[0] == 204            # idempotent


def _start_and_hang_up(s, body, path="/v1/chat/completions"):
    """Sends a streamed request with the conversation header, reads its first bytes, hangs up."""
    data = json.dumps({**body, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"X-Conversation-Id: {CONV}\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    first = sock.recv(4096)
    sock.close()
    assert b"200" in first.split(b"\r\n", 1)[0]


def test_reply_outlives_its_client_and_a_follower_reads_it_live(server):
    s = server({"turns": [{"text": "abcdefghijklmnopqrst", "token_delay_s": 0.05}]})
    _start_and_hang_up(s, chat("hi"))
    status, replay, _ = s.request("GET", f"/v1/stream?{QS}&from=0", timeout=30)   # follows to the end
    assert status == 200 and replay.rstrip().endswith("data: [DONE]")
    text = "".join((json.loads(b[6:])["choices"] or [{"delta": {}}])[0]["delta"].get("content") or ""
                   for b in replay.split("\n\n") if b.startswith("data: {"))
    assert text == "abcdefghijklmnopqrst"
    assert _wait(lambda: s.svc.history and s.svc.history[-1].get("finish") == "stop")  # never cancelled


def test_delete_stops_a_running_reply(server):
    s = server({"turns": [{"text": "x", "repeat": 400, "token_delay_s": 0.02}]})
    _start_and_hang_up(s, chat("hi"))
    assert _wait(lambda: s.post("/v1/streams/lookup", {"conversation_ids": ["conv-1"]})[1])
    assert s.request("DELETE", f"/v1/stream?{QS}")[0] == 204
    assert _wait(lambda: s.svc.history and s.svc.history[-1].get("finish") == "cancel")
    assert s.svc.history[-1]["output_tokens"] < 400
    assert s.request("GET", f"/v1/stream?{QS}&from=0")[0] == 404


def test_same_id_replaces_and_stops_the_older_reply(server):
    s = server({"turns": [{"text": "y", "repeat": 400, "token_delay_s": 0.02}, {"text": "second"}]})
    _start_and_hang_up(s, chat("one"))
    assert _wait(lambda: s.post("/v1/streams/lookup", {"conversation_ids": [CONV]})[1])
    status, _, raw = s.stream(chat("two"), headers=HDR)
    assert status == 200 and "second" in raw
    assert _wait(lambda: len(s.svc.history) == 2)
    assert sorted(h.get("finish") for h in s.svc.history) == ["cancel", "stop"]
    assert s.request("GET", f"/v1/stream?{QS}&from=0")[1] == raw


def test_other_stream_routes_resume_and_plain_replies_open_no_session(server):
    s = server({"turns": [{"text": "done"}]})
    status, _, raw = s.stream({"prompt": "hi", "n_predict": 8}, path="/completion", headers=HDR)
    assert status == 200 and s.request("GET", f"/v1/stream?{QS}")[1] == raw
    s.request("DELETE", f"/v1/stream?{QS}")
    assert s.post("/v1/chat/completions", chat("hi"), headers=HDR)[0] == 200   # not a stream: nothing kept
    assert s.request("GET", f"/v1/stream?{QS}")[0] == 404


def test_bad_input_names_the_field(server):
    s = server({"turns": [{"text": "ok"}]})
    for path, param in (("/v1/stream", "conv_id"), (f"/v1/stream?{QS}&from=-1", None),
                        (f"/v1/stream?{QS}&from=abc", None)):
        status, body, _ = s.request("GET", path)
        assert status in (400, 404), path
    s.stream(chat("hi"), headers=HDR)
    status, body, _ = s.request("GET", f"/v1/stream?{QS}&from=abc")
    assert status == 400 and body["error"]["param"] == "from"
    status, body, _ = s.request("GET", "/v1/stream")
    assert status == 400 and body["error"]["param"] == "conv_id"
    assert s.request("DELETE", "/v1/stream")[0] == 400
    status, body, _ = s.post("/v1/streams/lookup", {"conversation_ids": "conv-1"})
    assert status == 400 and body["error"]["param"] == "conversation_ids"
    status, body, _ = s.post("/v1/chat/completions", chat("hi", stream=True),
                             headers={"X-Conversation-Id": "c" * 513})
    assert status == 400 and body["error"]["param"] == "X-Conversation-Id"


class _Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_store_bounds_bytes_age_and_count():
    clock = _Clock()
    store = SessionStore(max_sessions=2, ttl_s=300.0, max_bytes=10, clock=clock)
    a = store.open("a")
    a.append(b"0123456789abcdef")             # over the cap: the oldest bytes go
    assert a.read(6, 0.0) == (b"6789abcdef", False)
    with pytest.raises(OffsetLost):
        a.read(5, 0.0)
    assert a.view()["total_bytes"] == 16
    b = store.open("b")
    assert store.open("c") is None            # two kept and both running: the third is not resumable
    assert store.get("c") is None
    a.finish()
    c = store.open("c")                       # the oldest finished one makes room
    assert c is not None and store.get("a") is None and store.get("b") is b
    b.finish()
    clock.t += 299.0
    assert store.get("b") is b
    clock.t += 1.0                            # SESSION_TTL_S after its end it expires
    assert store.get("b") is None and store.get("c") is c   # a running one never expires
    assert [v["conversation_id"] for v in store.lookup(["c"])] == ["c"]
    store.discard(c)
    assert store.get("c") is None and c.read(0, 0.0) == (b"", True)


def test_a_cut_reply_replays_cut_and_a_whole_one_whole(server, tmp_path):
    # HTTP/1.1 chunked streams: the replay of a reply cut short (the engine died) ends without the last chunk
    # as the reply did, and a whole reply's replay ends with it (serve/http/keepalive.py)
    s = server({"state": str(tmp_path / "st"), "starts": [{"turns": [{"text": "abcdef", "die_after": 3}]},
                                                          {"turns": [{"text": "whole"}]}]})
    status, _, r = s.post("/v1/chat/completions", chat("hi", stream=True), headers=HDR)
    assert status == 200 and r.cut_short
    status, replay, r = s.request("GET", f"/v1/stream?{QS}&from=0")
    assert status == 200 and r.cut_short and "exit code 3" in replay
    status, _, r = s.post("/v1/chat/completions", chat("hi", stream=True), headers=HDR)
    assert status == 200 and not r.cut_short
    status, replay, r = s.request("GET", f"/v1/stream?{QS}&from=0")
    events = [json.loads(b[6:]) for b in replay.split("\n\n") if b.startswith("data: ") and b != "data: [DONE]"]
    assert status == 200 and not r.cut_short and replay.endswith("data: [DONE]\n\n")
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) == "whole"

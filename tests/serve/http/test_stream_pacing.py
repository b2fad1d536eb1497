"""Paced stream writes (serve/http/pacing.py): frames held until the engine client waits, at most one write per
interval, written only by the request's own thread; and end to end over the slot fake engine, a stream that is
still a stream (its first token long before its end) but written in bursts no closer than the interval."""
import json
import socket
import threading
import time

import pytest

from serve.http import guard as http_guard
from serve.ops.live_figures import LiveFigures
from serve.http.pacing import HOLD_MAX_BYTES, StreamPacer
from tests.serve.conftest import chat


class Sink:
    def __init__(self, fail=False):
        self.writes, self.at, self.fail = [], [], fail

    def send(self, data):
        if self.fail:
            raise BrokenPipeError("gone")
        self.writes.append(data)
        self.at.append(time.monotonic())


def test_frames_wait_for_the_engine_clients_wait_and_go_in_one_write():
    sink = Sink()
    p = StreamPacer(sink.send, 0.0)
    p.hold(b"a")
    p.hold(b"b")
    assert sink.writes == []          # nothing goes out while the thread is still making frames
    p.on_wait()
    assert sink.writes == [b"ab"] and p.writes == 1
    p.on_wait()                       # nothing held: no empty write
    assert sink.writes == [b"ab"]


def test_at_most_one_write_per_interval_after_the_opening():
    sink = Sink()
    p = StreamPacer(sink.send, 0.08)
    for frame in (b"role", b"first token", b"2", b"3"):
        p.hold(frame)
        p.on_wait()
    assert sink.writes == [b"role", b"first token", b"2", b"3"]
    gaps = [b - a for a, b in zip(sink.at, sink.at[1:])]
    assert gaps[0] < 0.079 <= min(gaps[1:]), gaps   # the opening and the first token are never delayed


def test_only_the_owner_thread_writes():
    sink = Sink()
    p = StreamPacer(sink.send, 0.0)
    p.hold(b"x")
    t = threading.Thread(target=p.on_wait)   # a choice's thread in an n > 1 merge
    t.start()
    t.join()
    assert sink.writes == []
    p.on_wait()
    assert sink.writes == [b"x"]


def test_finish_runs_before_last_first_then_writes_the_rest():
    order = []
    p = StreamPacer(lambda data: order.append(("write", data)), 0.0)
    p.hold(b"a")
    p.on_wait()
    p.hold(b"end")
    p.finish(lambda: order.append(("release",)))
    assert order == [("write", b"a"), ("release",), ("write", b"end")]


def test_a_failed_write_marks_gone_and_never_raises_into_the_engine_client():
    p = StreamPacer(Sink(fail=True).send, 0.05)
    p.hold(b"a")
    t0 = time.monotonic()
    p.on_wait()                      # no exception here: the engine client's read loop goes on to its cancel check
    assert p.gone
    p.hold(b"b")
    assert p.held == []
    p.on_wait()
    assert time.monotonic() - t0 < 0.05   # and no rest for a gone client
    with pytest.raises(OSError):
        p.finish()


def test_a_large_burst_goes_out_but_keeps_the_newest_frame():
    sink = Sink()
    p = StreamPacer(sink.send, 1.0)
    big = b"x" * (HOLD_MAX_BYTES // 2 + 1)
    p.hold(big)
    p.hold(b"small")
    assert sink.writes == []
    p.hold(big)                       # over the limit: what came before goes out, the newest frame stays
    assert sink.writes == [big + b"small"] and p.held == [big]


def test_interval_bounds():
    assert http_guard.stream_interval_s(-5) == 0.0
    assert http_guard.stream_interval_s(1e9) == 1.0
    assert http_guard.stream_interval_s(float("nan")) == http_guard.STREAM_INTERVAL_MS / 1e3
    assert http_guard.stream_interval_s(25) == 0.025


def _reads(port, body):
    """A streamed chat read raw (HTTP/1.1, so chunked: the pacer's writes go through the chunked writer):
    [(arrival, bytes)] of every recv after the headers; `_unchunk` joins them into the body."""
    data = json.dumps({**body, "stream": True}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Connection: close\r\nContent-Length: {len(data)}\r\n\r\n").encode()
    out, seen_head, buf = [], False, b""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(head + data)
        while chunk := s.recv(1 << 16):
            if not seen_head:
                buf += chunk
                if b"\r\n\r\n" not in buf:
                    continue
                seen_head, chunk = True, buf.partition(b"\r\n\r\n")[2]
                if not chunk:
                    continue
            out.append((time.monotonic(), chunk))
    return out


def _unchunk(reads) -> str:
    """The body of a chunked answer read by `_reads`; it must end with the empty last chunk."""
    raw, body = b"".join(c for _, c in reads), b""
    while True:
        size_line, _, raw = raw.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            assert raw == b"\r\n", raw[:40]
            return body.decode()
        body, raw = body + raw[:size], raw[size + 2:]


def test_a_paced_stream_is_still_a_stream_written_in_bursts(slot_server):  # noqa: F811
    # 120 one-byte tokens, a slot step (a token) every 5 ms: ~0.6 s of decode
    s = slot_server({"repeat": 40, "step_delay_s": 0.005}, stream_interval_ms=60)
    reads = _reads(s.port, chat("w"))
    text = _unchunk(reads)
    events = [json.loads(b[6:]) for b in text.split("\n\n") if b.startswith("data: ") and b != "data: [DONE]"]
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) == "<w>" * 40
    content = [t for t, c in reads if b'"content"' in c]
    assert content[-1] - content[0] > 0.3          # the first tokens came long before the last: not held to the end
    span = reads[-1][0] - reads[0][0]
    assert len(reads) <= span / 0.06 + 3, (len(reads), span)   # writes at least the interval apart
    assert len(events) > 3 * len(reads)            # several frames to a write


def test_a_one_slot_engine_is_paced_too(server):
    # --parallel 1 (the one-slot fake): its slot's reads call on_wait as several slots' do
    s = server({"turns": [{"text": "<w>", "repeat": 40, "token_delay_s": 0.005}]}, stream_interval_ms=60)
    reads = _reads(s.port, chat("w"))
    content = [t for t, c in reads if b'"content"' in c]
    assert content[-1] - content[0] > 0.3
    assert len(reads) <= (reads[-1][0] - reads[0][0]) / 0.06 + 3


def test_interval_zero_writes_each_burst_at_once(slot_server):  # noqa: F811
    s = slot_server({"repeat": 10, "step_delay_s": 0.01}, stream_interval_ms=0)
    reads = _reads(s.port, chat("w"))
    # 30 tokens, one every 10 ms, no interval: one write a token (a few may share one on a busy host); the
    # default interval (20 ms) would give about half as many
    assert len([1 for _, c in reads if b'"content"' in c]) >= 20


def test_inter_token_latency_spreads_a_burst_over_its_tokens():
    # the engine writes a slot's tokens an interval at a time: 4 tokens that arrive together 20 ms after the
    # one before were made ~5 ms apart; vllm:inter_token_latency_seconds shows that pace, not 20, 0, 0, 0 ms
    lf = LiveFigures()
    tr = lf.begin(0.0)
    for t in (1.0, 1.0200, 1.0201, 1.0202, 1.0203, 1.05):
        tr.token(t)
    tr.end({"finish": "stop"}, 1.06)
    itl = lf.snapshot()["itl"]
    assert itl.count == 5 and itl.sum == pytest.approx(0.05)
    below = dict(itl.cumulative())
    assert below[0.01] == 4 and below[0.025] == 4 and below[0.05] == 5   # 4 x ~5 ms, then 29.7 ms alone

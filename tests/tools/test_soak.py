"""tools/soak.py: its verdicts (a crossed reply, a stream without its end, a bad body not refused are each
counted) and short soaks on the slot fake engine with kills, on one server and on three behind HAProxy: 0 lost,
0 crossed, 0 hung."""
import argparse
import json
import shutil

import pytest

from tools import soak


def _args(fake=True):
    return argparse.Namespace(fake=fake, max_tokens=64, hang_s=30.0)


def _sse(*objs, done=True):
    body = "".join(f"data: {json.dumps(o)}\n\n" for o in objs) + ("data: [DONE]\n\n" if done else "")
    return b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + body.encode()


def _delta(text):
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


def test_the_verdicts():
    tally = soak.Tally()
    mine = soak.fake_answer("chat", "zq000001")
    soak.judge("chat_stream", 1, "zq000001", "/v1/chat/completions", _sse(_delta(mine[:10]), _delta(mine[10:])),
               _args(), tally)
    assert tally.counts == {"ok": 1}
    soak.judge("chat_stream", 1, "zq000001", "/v1/chat/completions", _sse(_delta("<zq000002>")), _args(), tally)
    assert tally.counts["crossed"] == 1
    soak.judge("chat_stream", 1, "zq000001", "/v1/chat/completions", _sse(_delta(mine), done=False), _args(), tally)
    assert tally.counts["lost"] == 1
    soak.judge("chat", 1, "zq000001", "/v1/chat/completions", b"", _args(), tally)
    assert tally.counts["lost"] == 2
    soak.judge("bad_body", 1, "zq000001", "/v1/chat/completions",
               b'HTTP/1.0 500 Internal Server Error\r\n\r\n{"error": {}}', _args(), tally)
    assert tally.counts["wrong"] == 1 and tally.counts["5xx"] == 1
    msg = {"content": [{"type": "text", "text": "?"}]}
    soak.judge("messages", 1, "zq000001", "/v1/messages",
               b"HTTP/1.0 200 OK\r\n\r\n" + json.dumps(msg).encode(), _args(), tally)
    assert tally.counts["wrong"] == 2   # the fake never answers "?" to its own question


def test_a_short_soak_with_kills_loses_nothing(capsys):
    rc = soak.main(["--fake", "--requests", "150", "--clients", "16", "--kill-every", "0.5", "--hang-s", "60"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "lost 0  crossed 0  hung 0" in out and "kills 0" not in out


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="no haproxy binary (Debian package haproxy)")
def test_a_short_soak_through_haproxy_loses_nothing(capsys):
    rc = soak.main(["--fake", "--hosts", "3", "--requests", "300", "--clients", "16", "--kill-every", "0.5",
                    "--hang-s", "60"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "hosts 3 (HAProxy)" in out and "lost 0  crossed 0  hung 0" in out and "kills 0" not in out

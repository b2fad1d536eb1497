"""deploy/haproxy.cfg + deploy/strata_affinity.lua in front of three in-process servers on loopback (skipped
without the `haproxy` binary): one conversation stays on one host whatever the order of its JSON fields, the
hosts share the conversations, X-Conversation-Id and `user` win, streams pass chunked, and a host that fails
/health leaves the ring."""
import http.client
import json
import os
import shutil
import socket
import subprocess
import time

import pytest

from tests.conftest import ROOT
from tests.serve.conftest import stop_http

HAPROXY = shutil.which("haproxy")
NAMES = ("one", "two", "three")
pytestmark = pytest.mark.skipif(HAPROXY is None, reason="no haproxy binary (Debian package haproxy)")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def cluster(server, tmp_path):
    hosts = [server({"turns": [{"text": name}]}, host_name=name) for name in NAMES]
    port = _free_port()
    env = {**os.environ, "STRATA_LUA": os.path.join(ROOT, "deploy", "strata_affinity.lua"),
           "STRATA_BIND": f"127.0.0.1:{port}", "STRATA_H1": f"127.0.0.1:{hosts[0].port}",
           "STRATA_H2": f"127.0.0.1:{hosts[1].port}", "STRATA_H3": f"127.0.0.1:{hosts[2].port}"}
    proc = subprocess.Popen([HAPROXY, "-db", "-f", os.path.join(ROOT, "deploy", "haproxy.cfg")], env=env,
                            stdout=open(tmp_path / "haproxy.log", "w"), stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield port, hosts
    finally:
        proc.terminate()
        proc.wait(10)


def _ask(conn, body, headers=None, path="/v1/chat/completions"):
    conn.request("POST", path, body=body if isinstance(body, str) else json.dumps(body),
                 headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    raw = r.read().decode()
    assert r.status == 200, raw
    if "data: " in raw:
        text = "".join(json.loads(b[6:])["choices"][0]["delta"].get("content") or "" for b in raw.split("\n\n")
                       if b.startswith("data: ") and b != "data: [DONE]" and json.loads(b[6:])["choices"])
    else:
        text = json.loads(raw)["choices"][0]["message"]["content"]
    assert r.getheader("X-Strata-Host") == text   # each host answers with its name, and names itself
    return text


def test_a_conversation_stays_on_its_host(cluster):
    port, hosts = cluster
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    first = {"role": "user", "content": "conversation alpha: hello"}
    turns = [
        {"messages": [first]},
        {"stream": True, "messages": [{"role": "system", "content": "be brief"}, first,
                                      {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]},
        # the same conversation, fields in another order (content before role, messages before everything)
        '{"messages": [{"content": "be brief", "role": "system"}, {"content": "conversation alpha: hello", '
        '"role": "user"}, {"content": "hi", "role": "assistant"}, {"content": "again", "role": "user"}], '
        '"temperature": 0.5, "model": "any"}',
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "conversation alpha: hello"}]}]},
    ]
    answers = {_ask(conn, body) for body in turns}
    assert len(answers) == 1 and answers <= set(NAMES)
    # many conversations spread over both hosts, each one always to the same host
    seen = {}
    for i in range(16):
        for _ in range(2):
            seen.setdefault(i, set()).add(_ask(conn, {"messages": [{"role": "user", "content": f"topic {i}"}]}))
    assert all(len(v) == 1 for v in seen.values())
    assert {h for v in seen.values() for h in v} == set(NAMES)
    # X-Conversation-Id and `user` decide over the messages
    by_id = {_ask(conn, {"messages": [{"role": "user", "content": f"other {i}"}]}, {"X-Conversation-Id": "c-7"})
             for i in range(6)}
    by_user = {_ask(conn, {"user": "u-3", "messages": [{"role": "user", "content": f"other {i}"}]})
               for i in range(6)}
    assert len(by_id) == 1 and len(by_user) == 1
    conn.close()
    # the kept client connection and HAProxy's upstream reuse: far fewer server connections than requests
    counts = [h.httpd.counts.snapshot() for h in hosts]
    assert sum(c["requests"] for c in counts) > 3 * sum(c["connections"] for c in counts) / 2


def test_a_host_that_fails_health_leaves_the_ring(cluster):
    port, hosts = cluster
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = {"messages": [{"role": "user", "content": "conversation beta"}]}
    home = _ask(conn, body)
    victim = hosts[NAMES.index(home)]
    stop_http(victim)
    deadline = time.monotonic() + 20
    while True:   # check inter 2s, fall 2: within ~6 s the conversation moves to the other host
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            if _ask(conn, body) != home:
                break
        except (AssertionError, OSError, http.client.HTTPException):
            pass
        assert time.monotonic() < deadline, "the conversation never moved"
        time.sleep(0.5)
    assert {_ask(conn, {"messages": [{"role": "user", "content": f"topic {i}"}]}) for i in range(8)} <= \
        set(NAMES) - {home}


def test_the_openai_sdk_pool_and_haproxy_reuse_connections(cluster, tmp_path):
    """The SDK keeps one pooled connection to HAProxy (one client port in HAProxy's request log), and HAProxy
    keeps its connections to the host (the host reads far more requests than it accepts connections)."""
    openai = pytest.importorskip("openai")
    port, hosts = cluster
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=30)
    first = {"role": "user", "content": "a pooled conversation"}
    try:
        answers = {client.chat.completions.create(model="m", messages=[first, {"role": "user", "content": f"{i}"}])
                   .choices[0].message.content for i in range(20)}
    finally:
        client.close()
    assert len(answers) == 1   # one conversation, one host
    host = hosts[NAMES.index(answers.pop())]
    counts = host.httpd.counts.snapshot()
    assert counts["reused"] >= 15 and counts["connections"] <= counts["requests"] // 3
    deadline = time.monotonic() + 5
    while True:   # HAProxy writes the request lines as they end
        lines = [line for line in open(tmp_path / "haproxy.log") if '"POST /v1/chat/completions' in line]
        if len(lines) >= 20 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(lines) == 20 and len({line.split()[0] for line in lines}) == 1   # one client address:port

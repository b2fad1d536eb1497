"""The batch path end to end: the HTTP server and Service over the slot fake engine (and over two replicas).
Interleaved streaming and plain clients, some leaving early: 0 crossed or empty replies."""
import json
import threading
import time


from tests.serve.conftest import chat


def _clients(s, n_clients, n_each):
    bad = []

    def client(c):
        for k in range(n_each):
            word = f"client{c}-turn{k}"
            if (c + k) % 2:
                status, events, _ = s.stream(chat(word))
                text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
            else:
                status, body, _ = s.post("/v1/chat/completions", chat(word))
                text = body["choices"][0]["message"]["content"] if status == 200 else body
            if status != 200 or text != f"<{word}>" * 3:
                bad.append((word, status, text))

    ts = [threading.Thread(target=client, args=(c,)) for c in range(n_clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return bad


def test_interleaved_http_clients_with_canaries(slot_server):
    s = slot_server({"slots": 4, "repeat": 3, "step_delay_s": 0.002, "token_delay_s": 0.001})
    assert s.svc.engine.batched()
    assert not _clients(s, 6, 4)
    st = s.svc.engine.batch.stats()
    assert st["busy"] == 0 and st["waiting"] == 0 and not s.svc.engine.ctl.locked()
    assert s.svc.totals["requests"] == 24 and s.svc.totals["errors"] == 0
    status, m, _ = s.request("GET", "/metrics?format=json")
    assert status == 200 and [v["state"] for v in m["live"]["slots"]] == ["idle"] * 4
    assert m["live"]["batch"]["slots"] == 4 and m["live"]["batch"]["stale_frames"] == 0
    assert s.request("GET", "/v1/status")[1]["concurrency"]["serving"] == 4  # the engine's slots


def test_interleaved_http_clients_over_two_replicas(slot_server):
    s = slot_server({"slots": 2, "repeat": 3, "step_delay_s": 0.002, "token_delay_s": 0.001}, replicas=2)
    assert not _clients(s, 4, 4)
    assert sum(r["routed"] for r in s.svc.engine.live()) == 16
    status, m, _ = s.request("GET", "/metrics?format=json")
    assert status == 200 and [r["replica"] for r in m["live"]["replicas"]] == [0, 1]
    assert s.request("GET", "/v1/status")[1]["concurrency"]["serving"] == 4  # 2 replicas x 2 slots


def test_clients_that_leave_do_not_cross_the_next_replies(slot_server):
    s = slot_server({"slots": 2, "repeat": 200, "step_delay_s": 0.003, "token_delay_s": 0.001,
                     "rules": [{"match": "turn", "repeat": 3}]})
    leavers = []
    for i in range(3):  # streams read for a moment, then the socket is closed
        c = s.conn()
        c.request("POST", "/v1/chat/completions", json.dumps({**chat(f"leaver{i}"), "stream": True}),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        r.fp.read(200)
        leavers.append(c)
    for c in leavers:
        c.close()
    assert not _clients(s, 3, 3)


def test_status_counts_every_request_in_flight(slot_server):
    """/v1/status's activity counts the requests being answered and waiting (it once said 0 or 1)."""
    s = slot_server({"slots": 2, "repeat": 400, "step_delay_s": 0.005, "token_delay_s": 0.001})
    ts = [threading.Thread(target=s.post, args=("/v1/chat/completions", chat(f"busy{i}"))) for i in range(4)]
    for t in ts:
        t.start()
    seen = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        act = s.request("GET", "/v1/status")[1]["activity"]
        seen.append(act)
        if act["in_flight"] == 4 and act["waiting"] == 2 and act["slots_busy"] == 2:
            break
        time.sleep(0.05)
    for t in ts:
        t.join(60)
    assert seen[-1]["in_flight"] == 4 and seen[-1]["waiting"] == 2, seen[-3:]
    assert seen[-1]["slots_total"] == 2
    assert _until_idle(s)["in_flight"] == 0


def _until_idle(s):
    for _ in range(100):
        act = s.request("GET", "/v1/status")[1]["activity"]
        if act["in_flight"] == 0:
            return act
        time.sleep(0.05)
    return act

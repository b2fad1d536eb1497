"""serve/lifecycle/ through HTTP, over fake engines: lazy load, idle unload, load/unload (409 while busy),
switching by the request's model under concurrent clients, unknown models, the resource lease, /config."""
import json
import os
import threading
import time


from tests.serve.conftest import chat
from tests.serve.conftest import WAIT_S, engine_pid, process_gone, wait_until



def _answer(run, model=None, **kw):
    status, body, _ = run.post("/v1/chat/completions", chat(**({"model": model} if model else {}), **kw))
    return status, (body["choices"][0]["message"]["content"] if status == 200 else body)


def test_lazy_load_health_says_not_loaded_until_the_first_request(lifecycle_server):
    run = lifecycle_server()
    status, body, _ = run.request("GET", "/health")
    assert status == 200 and body["loaded"] is False and run.svc.loads == 0
    assert not os.path.exists(run.rec("alpha"))   # no engine was started
    assert _answer(run) == (200, "I am alpha.")
    status, body, _ = run.request("GET", "/health")
    assert status == 200 and body["loaded"] is True and run.svc.loads == 1


def test_idle_unload_ends_the_engine_process(lifecycle_server):
    from serve.ops import telemetry
    run = lifecycle_server(idle_s=0.5)
    run.svc.start_idle_thread()
    assert _answer(run, "alpha")[0] == 200
    pid = engine_pid(run.rec("alpha"))
    assert not process_gone(pid)
    engines_before = telemetry.process_rss()[1]   # the RSS of this process's children: the engine
    assert engines_before > 1 << 20
    assert wait_until(lambda: process_gone(pid) and not run.svc.switching()), "the idle engine was not unloaded"
    assert wait_until(lambda: telemetry.process_rss()[1] == 0)   # its RAM is given back: no engine RSS left
    status, body, _ = run.request("GET", "/health")
    assert status == 200 and body["loaded"] is False and run.svc.unloads == 1
    assert pid not in [c.pid for c in __import__("psutil").Process().children(recursive=True)]
    assert _answer(run, "alpha") == (200, "I am alpha.") and run.svc.loads == 2   # loaded again on demand


def test_idle_time_counts_from_the_load(lifecycle_server):
    run = lifecycle_server(lazy=False, idle_s=60)
    assert run.svc.tick() is None and run.svc.loaded()   # loaded at boot, never used: not idle yet
    run.svc.clock = lambda: time.monotonic() + 61
    assert run.svc.tick() == "unloaded (idle)" and not run.svc.loaded()


def test_load_and_unload_are_409_while_a_request_runs(lifecycle_server):
    run = lifecycle_server(turn={"text": "slow " * 40, "token_delay_s": 0.02}, lazy=False)
    done = []
    t = threading.Thread(target=lambda: done.append(_answer(run, "alpha")))
    t.start()
    assert wait_until(lambda: run.svc.entries[0].in_flight == 1)
    for path, body in (("/v1/unload", {}), ("/v1/load", {"model": "beta"})):
        status, err, _ = run.post(path, body)
        assert status == 409 and err["error"]["code"] == "model_busy" and "alpha" in err["error"]["message"]
    t.join(WAIT_S)
    assert done and done[0][0] == 200
    pid = engine_pid(run.rec("alpha"))
    status, body, _ = run.post("/v1/unload", {})
    assert status == 200 and body == {"model": "alpha", "status": "unloaded", "was_loaded": True}
    assert wait_until(lambda: process_gone(pid))
    status, body, _ = run.post("/v1/load", {"model": "beta-alias"})
    assert (status, body) == (200, {"model": "beta", "status": "loaded"})
    models = {m["id"]: m["status"]["value"] for m in run.request("GET", "/v1/models")[1]["data"]}
    assert models == {"alpha": "unloaded", "beta": "loaded"}


def test_switching_under_concurrent_clients_never_crosses_replies(lifecycle_server):
    run = lifecycle_server(names=("alpha", "beta", "gamma"), turn=None)
    results, errors = [], []

    def client(i):
        for j in range(4):
            name = ("alpha", "beta", "gamma")[(i + j) % 3]
            try:
                status, text = _answer(run, name if j % 2 else f"{name}-alias")
                results.append((name, status, text))
            except Exception as e:   # noqa: BLE001 - reported below
                errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(results) == 24
    crossed = [r for r in results if r[1:] != (200, f"I am {r[0]}.")]
    assert crossed == []
    assert run.svc.loads >= 3 and sum(e.in_flight for e in run.svc.entries) == 0


def test_unknown_model_is_a_404_listing_the_known_ones(lifecycle_server):
    run = lifecycle_server()
    status, body, _ = run.post("/v1/chat/completions", chat(model="nope"))
    assert status == 404 and body["error"]["param"] == "model"
    assert "alpha, alpha-alias, beta, beta-alias" in body["error"]["message"]
    status, body, _ = run.post("/v1/messages", {"model": "nope", "max_tokens": 5,
                                                "messages": [{"role": "user", "content": "hi"}]})
    assert status == 404 and body["type"] == "error"
    assert run.svc.loads == 0


def test_one_model_answers_a_request_naming_any_model(lifecycle_server):
    # llama-server with one model serves clients that send "gpt-3.5-turbo" and the like (llama.cpp's own suite
    # does); /v1/load keeps the strict names
    run = lifecycle_server(names=("alpha",))
    status, body, _ = run.post("/v1/chat/completions", chat(model="gpt-3.5-turbo"))
    assert status == 200 and body["choices"][0]["message"]["content"] == "I am alpha."
    status, body, _ = run.post("/v1/load", {"model": "nope"})
    assert status == 404 and body["error"]["param"] == "model"


def test_routes_of_the_lifecycle_are_404_on_a_single_service_server(server):
    run = server()
    assert run.post("/v1/load", {})[0] == 404 and run.request("GET", "/v1/lease")[0] == 404


def test_lease_needs_the_key_or_the_token(lifecycle_server):
    run = lifecycle_server(lazy=False)
    assert run.post("/v1/lease", {"seconds": 5, "reason": "game"})[0] == 401
    assert run.post("/v1/lease", {"seconds": 5, "reason": "game"},
                    headers={"Authorization": "Bearer wrong"})[0] == 401
    keyed = lifecycle_server(lazy=False, api_keys=["k1"])
    for auth in ("k1", "the-token"):
        status, body, _ = keyed.post("/v1/lease", {"seconds": 5, "reason": "game"},
                                     headers={"Authorization": f"Bearer {auth}"})
        assert status == 200 and body["id"].startswith("lease_")
    assert keyed.post("/v1/lease", {"seconds": 5, "reason": "x"}, headers={"X-Api-Key": "nope"})[0] == 401


def test_lease_grant_unloads_refuses_renews_releases_and_expires(lifecycle_server):
    run = lifecycle_server(lazy=False)
    auth = {"Authorization": "Bearer the-token"}
    assert _answer(run) == (200, "I am alpha.")   # the engine writes its record file on its first command
    pid = engine_pid(run.rec("alpha"))
    status, err, _ = run.post("/v1/lease", {"seconds": 0, "reason": "game"}, headers=auth)
    assert status == 400 and err["error"]["param"] == "seconds"
    status, lease, _ = run.post("/v1/lease", {"seconds": 30, "reason": "a game"}, headers=auth)
    assert status == 200 and lease["loaded"] is False and wait_until(lambda: process_gone(pid))
    status, err = _answer(run)
    assert status == 503 and "leased (a game) until" in err["error"]["message"]
    assert run.request("GET", "/health")[1]["leased"][0]["reason"] == "a game"
    status, renewed, _ = run.post("/v1/lease", {"id": lease["id"], "seconds": 60}, headers=auth)
    assert status == 200 and renewed["seconds_left"] > 30
    assert run.post("/v1/lease", {"id": "lease_x", "seconds": 60}, headers=auth)[0] == 404
    assert run.post("/v1/lease/release", {"id": lease["id"]}, headers=auth)[1]["status"] == "released"
    assert wait_until(lambda: run.svc.loaded() and run.request("GET", "/health")[1].get("loaded"))  # reloaded
    assert _answer(run) == (200, "I am alpha.")
    status, short, _ = run.post("/v1/lease", {"seconds": 30, "reason": "brief"}, headers=auth)
    assert _answer(run)[0] == 503
    run.svc.clock = lambda: time.monotonic() + 31   # the lease's time has passed (no waiting on the clock)
    assert run.svc.tick() == "lease ended" and run.svc.leases_view() == {"leases": []}
    assert wait_until(lambda: run.request("GET", "/health")[1].get("loaded") is True)   # reloaded by itself
    assert _answer(run) == (200, "I am alpha.")


def test_config_edit_is_validated_own_page_only_and_keeps_a_bak(lifecycle_server, tmp_path):
    path = tmp_path / "strata-alpha.json"
    path.write_text(json.dumps({"threads": 2, "idle_unload_s": 60}))
    run = lifecycle_server(config_path=str(path))
    status, view, _ = run.request("GET", "/config")
    assert status == 200 and view["config"] == {"idle_unload_s": 60} and "sampling" in view["editable"]
    js = {"Content-Type": "application/json"}
    status, err, _ = run.post("/config", {"changes": {"idle_unload_s": -1}}, headers=js)
    assert status == 400 and "idle_unload_s" in err["error"]["message"]
    status, err, _ = run.post("/config", {"changes": {"threads": 8}}, headers=js)
    assert status == 400 and "'threads' cannot be changed here" in err["error"]["message"]
    assert run.post("/config", {"changes": {"idle_unload_s": 5}},
                    headers={**js, "Origin": "http://evil.example"})[0] == 403
    status, saved, _ = run.post("/config", {"changes": {"idle_unload_s": 5, "aliases": ["a"]}}, headers=js)
    assert status == 200 and saved["config"] == {"idle_unload_s": 5, "aliases": ["a"]}
    assert json.loads(path.read_text()) == {"threads": 2, "idle_unload_s": 5, "aliases": ["a"]}
    assert json.loads((tmp_path / "strata-alpha.json.bak").read_text()) == {"threads": 2, "idle_unload_s": 60}


def test_a_finished_reply_frees_its_model_before_the_client_reads_the_end(lifecycle_server):
    run = lifecycle_server()
    for _ in range(5):   # the client's next call never finds its own finished request running
        status, events, text = run.stream(chat(model="alpha"))
        assert status == 200 and text.endswith("data: [DONE]\n\n")
        assert run.post("/v1/unload", {})[0] == 200
        assert _answer(run, "alpha")[0] == 200
        assert run.post("/v1/unload", {})[0] == 200


def test_with_lease_wait_a_request_waits_for_the_lease_to_end(lifecycle_server):
    run = lifecycle_server(lazy=False, lease_wait=True)
    auth = {"Authorization": "Bearer the-token"}
    status, lease, _ = run.post("/v1/lease", {"seconds": 60, "reason": "training"}, headers=auth)
    assert status == 200
    got = []
    t = threading.Thread(target=lambda: got.append(_answer(run)))
    t.start()
    t.join(1.0)
    assert t.is_alive() and got == []    # waiting, not refused
    run.post("/v1/lease/release", {"id": lease["id"]}, headers=auth)
    t.join(WAIT_S)
    assert got == [(200, "I am alpha.")]

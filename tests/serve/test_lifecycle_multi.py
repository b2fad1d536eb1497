"""Several models loaded at once (serve/lifecycle/ `max_loaded`, `ram_budget_bytes`) over fake engines: each
model keeps its own engine, replies never cross under concurrent clients, the least recently used (idle before
busy) is unloaded first, a model over the RAM budget is refused with the numbers, idle unload per model, and
a lease unloads them all."""
import threading
import time

import pytest

from serve.bootstrap import model_limits
from tests.serve.conftest import chat
from tests.serve.conftest import engine_pid, lifecycle_servers, process_gone, wait_until


@pytest.fixture
def lifecycle_server(tmp_path):
    yield from lifecycle_servers(tmp_path)


MIB = 1 << 20
CLIENT_TIMEOUT_S = 120.0   # a request may wait for a reply, an engine close and a start (slow on a shared machine)


def _answer(run, model):
    status, body, _ = run.post("/v1/chat/completions", chat(model=model), timeout=CLIENT_TIMEOUT_S)
    return status, (body["choices"][0]["message"]["content"] if status == 200 else body)


def _loaded(run):
    return sorted(m["id"] for m in run.request("GET", "/v1/models")[1]["data"]
                  if m["status"]["value"] == "loaded" and not m["id"].endswith("-alias"))


def _clients(run, names, n_clients=6, per_client=4):
    """n_clients threads asking models in turn (by name or alias) -> (results, errors); a watcher samples how
    many engines are alive meanwhile -> the largest count seen is run.max_alive."""
    results, errors, stop, alive = [], [], threading.Event(), [0]

    def client(i):
        for j in range(per_client):
            name = names[(i + j) % len(names)]
            try:
                status, text = _answer(run, name if j % 2 else f"{name}-alias")
                results.append((name, status, text))
            except Exception as e:   # noqa: BLE001 - reported by the test
                errors.append(repr(e))

    def watch():
        while not stop.is_set():
            alive[0] = max(alive[0], sum(e.svc is not None and e.svc.engine.alive() for e in run.svc.entries))
            time.sleep(0.005)

    w = threading.Thread(target=watch)
    w.start()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    w.join()
    run.max_alive = alive[0]
    return results, errors


def test_two_models_stay_loaded_together_and_never_cross(lifecycle_server):
    run = lifecycle_server(names=("alpha", "beta"), max_loaded=2)
    results, errors = _clients(run, ("alpha", "beta"))
    assert not errors and len(results) == 24
    assert [r for r in results if r[1:] != (200, f"I am {r[0]}.")] == []   # 0 crossed replies
    assert run.svc.loads == 2 and run.svc.unloads == 0    # both loaded once, neither switched out
    assert _loaded(run) == ["alpha", "beta"]
    pids = [engine_pid(run.rec(n)) for n in ("alpha", "beta")]
    assert len(set(pids)) == 2 and not any(process_gone(p) for p in pids)   # one engine process per model


def test_three_models_two_at_a_time_under_concurrent_clients(lifecycle_server):
    run = lifecycle_server(names=("alpha", "beta", "gamma"), max_loaded=2)
    results, errors = _clients(run, ("alpha", "beta", "gamma"))
    assert not errors and len(results) == 24
    assert [r for r in results if r[1:] != (200, f"I am {r[0]}.")] == []
    assert run.max_alive <= 2 and len(_loaded(run)) <= 2   # never more engines than max_loaded
    assert sum(e.in_flight for e in run.svc.entries) == 0 and run.svc.loads >= 3


def test_the_least_recently_used_model_is_unloaded_first(lifecycle_server):
    run = lifecycle_server(names=("alpha", "beta", "gamma"), max_loaded=2)
    for name in ("alpha", "beta", "alpha"):
        assert _answer(run, name) == (200, f"I am {name}.")
    beta = engine_pid(run.rec("beta"))
    assert _answer(run, "gamma") == (200, "I am gamma.")     # beta was used longest ago
    assert _loaded(run) == ["alpha", "gamma"] and wait_until(lambda: process_gone(beta))
    assert _answer(run, "beta") == (200, "I am beta.")       # alpha (used before gamma) goes now
    assert _loaded(run) == ["beta", "gamma"]
    status, body, _ = run.post("/v1/load", {"model": "alpha"})   # /v1/load follows the same order
    assert status == 200 and _loaded(run) == ["alpha", "beta"]


def test_an_idle_model_goes_before_a_busy_older_one_whose_reply_finishes(lifecycle_server):
    slow = {"text": "slow " * 20, "token_delay_s": 0.04}
    run = lifecycle_server(names=("alpha", "beta", "gamma"), max_loaded=2, turn={"alpha": slow})
    assert _answer(run, "alpha")[0] == 200 and _answer(run, "beta")[0] == 200
    got = []
    t = threading.Thread(target=lambda: got.append(_answer(run, "alpha")))
    t.start()
    assert wait_until(lambda: run.svc.entries[0].in_flight == 1)
    assert _answer(run, "gamma") == (200, "I am gamma.")     # beta (idle) made room, not alpha (busy)
    t.join(CLIENT_TIMEOUT_S)
    assert got == [(200, slow["text"])] and _loaded(run) == ["alpha", "gamma"]


def test_when_every_loaded_model_is_busy_the_oldest_drains_first(lifecycle_server):
    slow = {"text": "slow " * 20, "token_delay_s": 0.04}
    run = lifecycle_server(names=("alpha", "beta"), max_loaded=1, turn={"alpha": slow})
    got = {}
    first = threading.Thread(target=lambda: got.__setitem__("first", _answer(run, "alpha")))
    first.start()
    assert wait_until(lambda: run.svc.entries[0].in_flight == 1)
    switch = threading.Thread(target=lambda: got.__setitem__("beta", _answer(run, "beta")))
    switch.start()
    assert wait_until(lambda: run.svc.entries[0].draining)
    late = threading.Thread(target=lambda: got.__setitem__("late", _answer(run, "alpha")))
    late.start()        # arrives for the draining model: waits, is not admitted on it
    time.sleep(0.2)
    assert run.svc.entries[0].in_flight == 1
    for t in (first, switch, late):
        t.join(CLIENT_TIMEOUT_S)
    assert got == {"first": (200, slow["text"]), "beta": (200, "I am beta."), "late": (200, slow["text"])}


def test_the_ram_budget_unloads_by_size_and_refuses_a_model_that_alone_does_not_fit(lifecycle_server):
    info = {"alpha": {"ram_bytes": 300 * MIB}, "beta": {"ram_bytes": 300 * MIB},
            "gamma": {"ram_bytes": 700 * MIB}, "huge": {"ram_bytes": 2000 * MIB}}
    run = lifecycle_server(names=("alpha", "beta", "gamma", "huge"), max_loaded=4, ram_budget_bytes=1000 * MIB,
                           info=info)
    for name in ("alpha", "beta"):
        assert _answer(run, name)[0] == 200
    assert _loaded(run) == ["alpha", "beta"]                  # 600 MiB of 1000
    assert _answer(run, "gamma") == (200, "I am gamma.")     # 600 + 700 > 1000: alpha (the LRU) goes
    assert _loaded(run) == ["beta", "gamma"]                  # 300 + 700 = 1000 fits
    status, err = _answer(run, "huge")
    assert status == 503 and err["error"]["code"] == "over_ram_budget"
    assert "needs 2000 MiB" in err["error"]["message"] and "budget is 1000 MiB" in err["error"]["message"]
    status, err, _ = run.post("/v1/load", {"model": "huge"})
    assert status == 503 and "needs 2000 MiB" in err["error"]["message"]
    assert _loaded(run) == ["beta", "gamma"] and run.svc.unloads == 1   # nothing unloaded for it


def test_idle_unload_is_per_model(lifecycle_server):
    run = lifecycle_server(names=("alpha", "beta"), max_loaded=2, idle_s=0, info={"alpha": {"idle_unload_s": 60}})
    assert _answer(run, "alpha")[0] == 200 and _answer(run, "beta")[0] == 200
    run.svc.clock = lambda: time.monotonic() + 61
    assert run.svc.tick() == "unloaded (idle)" and _loaded(run) == ["beta"]   # beta has no idle limit
    assert run.svc.tick() is None


def test_a_lease_unloads_every_loaded_model_and_reloads_them_after(lifecycle_server):
    run = lifecycle_server(names=("alpha", "beta", "gamma", "delta"), max_loaded=3, lazy=False)
    auth = {"Authorization": "Bearer the-token"}
    for name in ("alpha", "beta", "gamma"):
        assert _answer(run, name)[0] == 200
    pids = [engine_pid(run.rec(n)) for n in ("alpha", "beta", "gamma")]
    status, lease, _ = run.post("/v1/lease", {"seconds": 30, "reason": "a game"}, headers=auth)
    assert status == 200 and wait_until(lambda: all(process_gone(p) for p in pids)) and _loaded(run) == []
    assert _answer(run, "delta")[0] == 503
    run.post("/v1/lease/release", {"id": lease["id"]}, headers=auth)
    assert wait_until(lambda: _loaded(run) == ["alpha", "beta", "gamma"])   # what the lease unloaded


def test_unload_without_a_model_unloads_every_loaded_one(lifecycle_server):
    run = lifecycle_server(names=("alpha", "beta"), max_loaded=2)
    assert _answer(run, "alpha")[0] == 200 and _answer(run, "beta")[0] == 200
    status, body, _ = run.post("/v1/unload", {"model": "beta"})
    assert status == 200 and body["was_loaded"] and _loaded(run) == ["alpha"]
    assert _answer(run, "beta")[0] == 200
    status, body, _ = run.post("/v1/unload", {})
    assert status == 200 and body["models"] == ["alpha", "beta"] and _loaded(run) == []


def test_model_limits_from_the_flags():
    assert model_limits(None, None, 5) == (1, None)            # one at a time, as before
    assert model_limits(1, None, 5) == (1, None)
    assert model_limits(3, None, 5, free_ram_bytes=10 * 1024 * MIB) == (3, int(10 * 1024 * MIB * 0.9))
    assert model_limits(None, 8, 5) == (5, 8 << 30)             # a budget alone: as many as it holds
    assert model_limits(2, 0.5, 5) == (2, 512 * MIB)

"""ReplicaEngine over two slot fake engines (one with one slot, one with two): hand-off of a conversation between
replicas (forced and routed), early closes, prefix-aware routing, per-caller figures, heal(), each replica
on its own share of the cores (and none when they cannot be shared fairly)."""
import json
import os
import sys
import threading
import time

import psutil
import pytest

from serve.engine_client import replicas as replicas_mod
from serve.engine_client.engine import StrataEngine
from serve.engine_client.replicas import BLOCK_TOKENS, ReplicaEngine, block_hashes
from tests.serve.conftest import FAKE_SLOTS, answer, text_of


@pytest.fixture
def pair(tmp_path):
    made = []

    def make(slots=(1, 2), **script):
        engines = []
        for i, n in enumerate(slots):
            path = tmp_path / f"r{i}.json"
            path.write_text(json.dumps({"slots": n, "ctx": 16384, "step_delay_s": 0.001, **script}))
            engines.append(StrataEngine([sys.executable, FAKE_SLOTS, "--script", str(path)], []))
        rep = ReplicaEngine(engines)
        rep.start()
        made.append(rep)
        return rep

    yield make
    for rep in made:
        rep.close()


def _turn(history, question):
    return history + [257] + list(question.encode()) + [10]


def _ask(rep, ids, res=None, replica=None, stop_after=None):
    out = []
    g = rep.generate(ids, 400, result=res, replica=replica)
    for t in g:
        if t is None:
            continue
        out.append(t)
        if stop_after is not None and len(out) >= stop_after:
            g.close()
            break
    return out


def _conversation(rep, n, forced, name, bad):
    history = []
    for k in range(n):
        question = f"{name}-{k}"
        ids = _turn(history, question)
        early = k % 3 == 2
        res = {}
        out = _ask(rep, ids, res, replica=(k % 2) if forced else None, stop_after=3 if early else None)
        want = answer(question) + (b"" if early else b"")
        got = text_of(out)
        if not out or (early and not want.startswith(got)) or (not early and got != want):
            bad.append((question, got, res.get("replica")))
        history = ids + out


def test_forced_hand_off_30_back_to_back(pair):
    rep = pair()
    bad = []
    _conversation(rep, 30, True, "f", bad)
    assert not bad, bad[:3]
    assert [r["routed"] for r in rep.live()] == [15, 15] and all(r["running"] == 0 for r in rep.live())


def test_routed_hand_off_60_back_to_back_with_three_clients(pair):
    rep = pair()
    bad = []
    ts = [threading.Thread(target=_conversation, args=(rep, 20, False, f"c{c}", bad)) for c in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not bad, bad[:3]
    live = rep.live()
    assert sum(r["routed"] for r in live) == 60 and all(r["running"] == 0 for r in live)


def test_routing_prefers_the_replica_holding_the_prefix_unless_it_is_loaded(pair):
    rep = pair()
    long_ctx = [257] + [65 + k % 20 for k in range(3 * BLOCK_TOKENS)] + [10]
    _ask(rep, long_ctx, replica=1)
    follow = long_ctx + list(b"<...>") + [257] + list(b"more\n")
    assert rep.pick(follow).index == 1
    assert rep.replicas[1].held(block_hashes(follow)) == 3 * BLOCK_TOKENS
    rep.load_tokens = 10  # a running request costs less than the uncached blocks: still replica 1
    rep.replicas[1].running = 1
    assert rep.pick(follow).index == 1
    rep.load_tokens = 3000  # ... and more than them: the idle replica
    assert rep.pick(follow).index == 0
    rep.replicas[1].running = 0


def test_each_caller_gets_its_own_figures(pair):
    rep = pair()
    res = [{}, {}]
    ts = [threading.Thread(target=_ask, args=(rep, _turn([], f"q{i}"), res[i])) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert res[0] is not res[1] and {res[0]["replica"], res[1]["replica"]} <= {0, 1}
    assert res[0]["generated"] == len(answer("q0")) + 1 and res[1]["generated"] == len(answer("q1")) + 1


def test_heal_restarts_a_dead_replica_in_the_background(pair, monkeypatch):
    monkeypatch.setattr(replicas_mod, "HEAL_EVERY_S", 0.0)
    rep = pair()
    rep.replicas[0].engine._cur.popen.kill()
    deadline = time.monotonic() + 5
    while rep.replicas[0].engine.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert text_of(_ask(rep, _turn([], "while-down"))) == answer("while-down")  # routed to the live one
    deadline = time.monotonic() + 10
    while not rep.replicas[0].engine.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rep.replicas[0].engine.alive() and rep.replicas[0].blocks == {}


def test_serve_flags_parallel_clamped_and_replicas(tmp_path, capsys):
    from serve.bootstrap import build
    from strata_cli import parser
    ns = parser().parse_args(["serve", "--tokenizer", "bytes", "--engine", f"{sys.executable} {FAKE_SLOTS}",
                              "--parallel", "12", "--replicas", "2", "--log", str(tmp_path / "e.log")])
    svc, _ = build(ns)
    assert "lanes are 1..8; using 8" in capsys.readouterr().err
    assert isinstance(svc.engine, ReplicaEngine) and len(svc.engine.replicas) == 2
    args = svc.engine.replicas[0].engine.args
    assert args[args.index("--batch") + 1] == "8" and "--threads" in args
    assert svc.engine.replicas[1].engine.log_path.endswith("e.log.r1")
    ns = parser().parse_args(["serve", "--tokenizer", "bytes", "--engine", f"{sys.executable} {FAKE_SLOTS}",
                              "--parallel", "3", "--log", str(tmp_path / "e.log")])
    svc, _ = build(ns)
    assert isinstance(svc.engine, StrataEngine) and svc.engine.args[-2:] == ["--batch", "3"]


def _affinity_replicas(tmp_path, n, **kw):
    engines = []
    for i in range(n):
        path = tmp_path / f"aff{i}.json"
        path.write_text(json.dumps({"slots": 2, "ctx": 4096, "report_affinity": True}))
        engines.append(StrataEngine([sys.executable, FAKE_SLOTS, "--script", str(path)], ["--threads", "64"]))
    return ReplicaEngine(engines, **kw)


def _cpus(text):
    return [int(c) for c in str(text).split(",")]


def test_each_replica_runs_on_its_own_share_of_the_cores(tmp_path, monkeypatch, capsys):
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs 2 cores")
    monkeypatch.setattr(replicas_mod, "HEAL_EVERY_S", 0.0)
    mine = os.sched_getaffinity(0)
    rep = _affinity_replicas(tmp_path, 2)
    try:
        rep.start()
        k = len(cores) // 2
        want = [cores[:k], cores[k:2 * k]]
        assert "replica 0 on core" in capsys.readouterr().err
        for r, share in zip(rep.replicas, want):
            assert _cpus(r.engine.info["affinity"]) == share          # what the child itself sees
            assert sorted(psutil.Process(r.engine._cur.popen.pid).cpu_affinity()) == share
            assert r.engine.info["threads_arg"] == k                  # --threads 64 lowered to its share
        assert os.sched_getaffinity(0) == mine                        # the server's threads keep theirs
        assert [r["cores"] for r in rep.live()] == [replicas_mod._cpu_list(s) for s in want]
        for i, again in ((0, rep.restart), (1, rep.heal)):             # restart(), then heal(), keep it
            proc = rep.replicas[i].engine._cur
            proc.popen.kill()
            proc.pump.join(5)
            again()
            deadline = time.monotonic() + 10
            while not rep.replicas[i].engine.alive() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert rep.replicas[i].engine._cur is not proc
        for r, share in zip(rep.replicas, want):
            assert _cpus(r.engine.info["affinity"]) == share
            assert sorted(psutil.Process(r.engine._cur.popen.pid).cpu_affinity()) == share
        assert os.sched_getaffinity(0) == mine
    finally:
        rep.close()


def test_no_pinning_when_the_cores_cannot_be_shared_fairly(tmp_path, capsys):
    mine = sorted(os.sched_getaffinity(0))
    rep = _affinity_replicas(tmp_path, 2, cores=mine[:1])  # 2 engines, 1 core to share
    try:
        rep.start()
        assert "not pinned (fewer cores than engines)" in capsys.readouterr().err
        for r in rep.replicas:
            assert _cpus(r.engine.info["affinity"]) == mine and r.engine.info["threads_arg"] == 64
        assert [r["cores"] for r in rep.live()] == [None, None]
    finally:
        rep.close()


def test_core_shares():
    assert replicas_mod.core_shares(2, range(16)) == [list(range(8)), list(range(8, 16))]
    assert replicas_mod.core_shares(3, [0, 1, 2, 3, 4, 5, 6]) == [[0, 1], [2, 3], [4, 5]]  # 6 left over
    assert replicas_mod.core_shares(3, [0, 1]) is None and replicas_mod.core_shares(1, range(8)) is None
    assert replicas_mod._cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"

"""serve/engine_client/protocol.py alone: the pump's routing (a slot line reaches its owner only after the owner's
BACC, in the order the engine wrote; otherwise it is dropped and counted), and the parsers (a broken line
is EngineBadLine, an engine fault; unknown figures stay None)."""
import queue
import threading

import pytest

from serve.engine_client.protocol import (
    EngineBadLine, EngineProcess, parse_bdone, parse_done, parse_progress, parse_token, slot_of)
from serve.engine_client.slot_table import SlotTable


def _proc(n=2):
    p = EngineProcess(popen=None, gen=1, cv=threading.Condition(), n_vocab=100)
    p.slots = SlotTable(n)
    return p


def test_a_slot_line_reaches_its_owner_only_after_the_owners_bacc():
    p = _proc()
    p.slots.owner[1] = "req"
    p.admissions.append(1)                     # its BGEN was written
    p.route("BDONE 1 3 stop 1.0 5 1.0 0 5")   # stale: written before this owner's admission was answered
    p.route("BT 1 7")
    assert p.slots.q[1].empty() and p.slots.stale_frames == 2
    p.route("BACC 1 0")
    p.route("BT 1 8")
    p.route("BT 0 9")                          # nobody owns slot 0
    p.route("BT 5 9")                          # no such slot
    assert [p.slots.q[1].get_nowait() for _ in range(2)] == ["BACC 1 0", "BT 1 8"]
    assert p.slots.stale_frames == 4 and p.lines.empty() and not p.admissions
    p.route("WARN x")
    p.route("ERR for nobody")                  # no admission waits: a control command's answer
    assert [p.lines.get_nowait() for _ in range(2)] == ["WARN x", "ERR for nobody"]


def test_pipelined_admissions_get_their_own_answers_in_order():
    p = _proc(3)
    for b in (2, 0, 1):
        p.slots.owner[b] = f"req{b}"
        p.admissions.append(b)
    p.route("BACC 2 0")
    p.route("ERR BGEN: refused")               # the answer to the oldest one waiting: slot 0's
    p.route("BACC 1 5")
    assert p.slots.q[2].get_nowait() == "BACC 2 0" and p.slots.q[0].get_nowait() == "ERR BGEN: refused"
    assert p.slots.q[1].get_nowait() == "BACC 1 5"
    assert p.slots.open == [False, True, True] and p.lines.empty()


def test_the_end_of_a_process_reaches_every_queue():
    p = _proc()
    p.ended_now()
    assert p.lines.get_nowait() is None and all(q.get_nowait() is None for q in p.slots.q)
    assert p.ended


def test_parsers():
    assert slot_of("BT 3 5") == 3 and slot_of("BPP 1 2 3 4 5") == 1 and slot_of("T 5") is None
    assert slot_of("BT x 5") == -1
    d = parse_bdone("BDONE 0 4 length 12.5 30 8.0 10 20")
    assert d == {"generated": 4, "finish": "length", "decode_ms": 12.5, "prompt": 30, "prompt_ms": 8.0,
                 "reused": 10, "prompt_read": 20}
    assert parse_done("DONE 1 5 2.0 - stop - - 0 - - - - - 5 - chunk=4")["decode_ms"] is None
    assert parse_progress(["5", "9", "1.0", "300.5"], "") == (5, 9, 300.5)
    assert parse_token("42", 100, "") == 42
    for word in ("x", "100", "-1", ""):
        with pytest.raises(EngineBadLine):
            parse_token(word, 100, f"T {word}")
    for bad in ("BDONE 0 x stop 1.0", "BDONE 0"):
        with pytest.raises(EngineBadLine):
            parse_bdone(bad)
    with pytest.raises(EngineBadLine):
        parse_progress(["a"], "BPP 0 a")


def test_token_lines_with_logprobs():
    t = parse_token("7 lp=-0.5 top=7:-0.5,3:-1.25", 100, "")
    assert t == 7 and t.logprob == -0.5 and t.top == [(7, -0.5), (3, -1.25)]
    t = parse_token("7 lp=-inf", 100, "")
    assert t.logprob == float("-inf") and t.top == []
    assert type(parse_token("7 later=1", 100, "")) is int  # a key this side does not know is skipped
    for word in ("7 lp=x", "7 lp=0.5", "7 lp=-1 top=300:-1", "7 lp=-1 top=3:nan", "7 lp=-1 top=3"):
        with pytest.raises(EngineBadLine):
            parse_token(word, 100, f"T {word}")


def test_both_engines_offer_what_service_needs():
    from serve.engine_client.engine import StrataEngine
    from serve.engine_client.protocol import EngineClient
    from serve.engine_client.replicas import ReplicaEngine
    needed = [n for n in dir(EngineClient) if not n.startswith("_")] + list(EngineClient.__annotations__)
    one = StrataEngine(["x"], [])
    for engine in (one, ReplicaEngine([one], pin=False)):
        missing = [n for n in needed if not hasattr(engine, n)]
        assert not missing, (type(engine).__name__, missing)

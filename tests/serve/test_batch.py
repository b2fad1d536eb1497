"""The batch path (serve/batch.py) on the slot fake engine: canaries, order, yields, promotion, solo again,
accounting, pick_slot. The schedules that went wrong are forced (slow reads, hooked conditions)."""
import json
import os
import sys
import threading
import time

import pytest

from serve import batch
from serve.batch import BatchPath, _Request, _Slots, pick_slot, prefill_leg_stats, request_stats
from serve.engine import StrataEngine
from tests.conftest import ROOT

FAKE_SLOTS = os.path.join(ROOT, "tests", "fake_engine_slots.py")


def q(text):
    return [257] + list(text.encode()) + [10]


def answer(text, repeat=1):
    return f"<{text}>".encode() * repeat


def text_of(ids):
    return bytes(t for t in ids if t < 256)


@pytest.fixture
def slots_engine(tmp_path):
    made = []

    def make(script=None, **kw):
        script = dict(script or {})
        script.setdefault("record", str(tmp_path / "rec.txt"))
        script.setdefault("ctx", 8192)
        path = tmp_path / f"slots-{len(made)}.json"
        path.write_text(json.dumps(script))
        e = StrataEngine([sys.executable, FAKE_SLOTS, "--script", str(path)], [], **kw)
        e.start()
        e.record = tmp_path / "rec.txt"
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def run(e, text, max_new=1000, res=None, cancelled=None, firsts=None, name=None):
    res = {} if res is None else res
    out = []
    for t in e.generate(q(text), max_new, cancelled=cancelled, result=res):
        if t is None:
            continue
        if firsts is not None and not out:
            firsts[text if name is None else name] = time.monotonic()
        out.append(t)
    return out


def commands(e):
    return [ln.split(" ", 1)[1] for ln in e.record.read_text().splitlines()] if e.record.exists() else []


def test_interleaved_clients_get_their_own_replies(slots_engine):
    e = slots_engine({"slots": 4, "repeat": 4, "step_delay_s": 0.002, "token_delay_s": 0.001,
                      "stray": ["BT 2 65", "BDONE 3 1 stop 1.0"]})
    bad = []

    def client(c):
        for k in range(4):
            word = f"c{c}-r{k}-" + "x" * (c * 7 % 23)
            got = text_of(run(e, word))
            if got != answer(word, 4):
                bad.append((word, got))

    ts = [threading.Thread(target=client, args=(c,)) for c in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert not bad, bad[:3]
    st = e.batch.stats()
    assert st["stale_frames"] == 2 and st["busy"] == 0 and st["waiting"] == 0
    assert any(c.startswith("BGEN") for c in commands(e))


def test_promotion_solo_to_slot_when_another_arrives(slots_engine):
    e = slots_engine({"slots": 2, "repeat": 30, "token_delay_s": 0.01, "step_delay_s": 0.002})
    res, out = {}, {}
    t = threading.Thread(target=lambda: out.setdefault("a", run(e, "first", res=res)))
    t.start()
    time.sleep(0.25)
    b = run(e, "second")
    t.join(10)
    assert text_of(out["a"]) == answer("first", 30) and text_of(b) == answer("second", 30)
    cmds = [c.split()[0] for c in commands(e)]
    assert cmds[:3] == ["GEN", "STOP", "BGEN"]
    assert res["segments"] == 2 and res["generated"] == len(out["a"]) and res["reused"] == 0
    assert res["prompt"] == len(q("first"))  # the request's prompt, not the promoted one


def test_solo_again_when_left_alone(slots_engine):
    e = slots_engine({"slots": 2, "repeat": 40, "step_delay_s": 0.004, "token_delay_s": 0.001,
                      "bstop_lag_steps": 2, "rules": [{"match": "short", "repeat": 1}]})
    out = {}
    ta = threading.Thread(target=lambda: out.setdefault("a", run(e, "long-one")))
    tb = threading.Thread(target=lambda: out.setdefault("b", run(e, "short")))
    ta.start()
    time.sleep(0.05)
    tb.start()
    ta.join(10)
    tb.join(10)
    assert text_of(out["a"]) == answer("long-one", 40) and text_of(out["b"]) == answer("short")
    cmds = [c.split()[0] for c in commands(e)]
    assert "BSTOP" in cmds and cmds[cmds.index("BSTOP") + 1] == "GEN"  # went solo again


def test_short_first_then_arrival_order(slots_engine, monkeypatch):
    for short_first, expect in ((True, ["busy", "short", "long"]), (False, ["busy", "long", "short"])):
        monkeypatch.setenv("STRATA_ADMIT_SHORT_FIRST", "1" if short_first else "0")
        e = slots_engine({"slots": 4, "pp_chunk": 64, "pp_delay_s": 0.0, "step_delay_s": 0.002,
                          "rules": [{"match": "busy", "pp_delay_s": 0.1}]})
        e.record.unlink(missing_ok=True)
        ts = [threading.Thread(target=run, args=(e, "busy" + "b" * 300))]
        ts[0].start()
        time.sleep(0.15)
        for word in ("long" + "l" * 1100, "short"):
            ts.append(threading.Thread(target=run, args=(e, word)))
            ts[-1].start()
            time.sleep(0.05)
        for t in ts:
            t.join(20)
        order = [text_of([int(x) for x in c.split()[-1].split(",")])[:5].decode()
                 for c in commands(e) if c.startswith(("GEN", "BGEN"))]
        seen = []
        for w in order:
            w = w[:4] if w.startswith("long") or w.startswith("busy") else w
            if w not in seen:
                seen.append(w)
        assert seen == expect, (short_first, order)
        e.close()


def test_two_yields_then_the_long_read_finishes(slots_engine):
    e = slots_engine({"slots": 4, "pp_chunk": 32, "step_delay_s": 0.002,
                      "rules": [{"match": "LONG", "pp_delay_s": 0.05}]})
    long_word = "LONG" + "z" * 600
    res, out, firsts = {}, {}, {}
    tl = threading.Thread(target=lambda: out.setdefault("L", run(e, long_word, res=res, firsts=firsts,
                                                                 name="L")))
    tl.start()
    shorts = []
    for i in range(3):
        time.sleep(0.25)
        shorts.append(threading.Thread(target=lambda i=i: out.setdefault(i, run(e, f"s{i}", firsts=firsts,
                                                                                  name=i))))
        shorts[-1].start()
    for t in [tl, *shorts]:
        t.join(20)
    assert text_of(out["L"]) == answer(long_word)
    for i in range(3):
        assert text_of(out[i]) == answer(f"s{i}")
    assert sum(c.startswith("BYIELD") for c in commands(e)) == 2  # YIELDS_MAX: the third short waits
    assert firsts[0] < firsts["L"] and firsts[1] < firsts["L"] and firsts[2] > firsts["L"]
    n = len(q(long_word))
    assert res["legs"] == 3 and res["reused"] == 0 and res["prompt_read"] == n and res["prompt"] == n


@pytest.mark.parametrize("n_yields", [1, 2])
def test_cancel_after_yields(slots_engine, n_yields):
    e = slots_engine({"slots": 2, "pp_chunk": 32, "step_delay_s": 0.002,
                      "rules": [{"match": "LONG", "pp_delay_s": 0.05}, {"match": "s", "repeat": 20,
                                                                         "step_delay_s": 0.02}]})
    flag = threading.Event()
    res, out = {}, {}
    tl = threading.Thread(target=lambda: out.setdefault("L", run(e, "LONG" + "z" * 600, res=res,
                                                                 cancelled=flag.is_set)))
    tl.start()
    ts = []
    for i in range(n_yields):
        time.sleep(0.25)
        ts.append(threading.Thread(target=lambda i=i: out.setdefault(i, run(e, f"s{i}"))))
        ts[-1].start()
    deadline = time.monotonic() + 5
    while sum(c.startswith("BYIELD") for c in commands(e)) < n_yields and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.02)
    flag.set()
    cut = len(commands(e))
    for t in [tl, *ts]:
        t.join(20)
    assert not tl.is_alive() and res["finish"] == "cancel"
    for i in range(n_yields):
        assert text_of(out[i]) == answer(f"s{i}", 20)
    later = commands(e)[cut:]
    assert not any(c.startswith(("BGEN", "GEN")) and "LONG" in text_of(
        [int(x) for x in c.split()[-1].split(",")]).decode() for c in later if c.startswith(("BGEN", "GEN")))
    assert e.batch.stats()["busy"] == 0 and not e.ctl.locked()
    assert text_of(run(e, "after")) == answer("after")  # every slot is usable again


def test_early_close_quarantines_the_slot_until_bdone(slots_engine):
    e = slots_engine({"slots": 2, "repeat": 200, "step_delay_s": 0.003, "token_delay_s": 0.002,
                      "rules": [{"match": "next", "repeat": 3}]})
    ta = threading.Thread(target=run, args=(e, "b-keeps"))  # keeps a slot busy: no solo leg for the next
    ta.start()
    time.sleep(0.05)
    g = e.generate(q("leaver"), 500)
    got = [t for _, t in zip(range(30), g) if t is not None]
    g.close()
    ta.join(10)
    assert got and "BSTOP" in " ".join(commands(e))
    deadline = time.monotonic() + 3
    while e.batch.stats()["busy"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert e.batch.stats()["busy"] == 0 and e.alive()
    assert text_of(run(e, "next")) == answer("next", 3)


def test_accounting_keeps_unknown_and_sums_legs_once():
    legs = [{"reused": 5, "prompt_read": 100, "prompt_ms": 10.0, "hits": None, "chunk": 32, "generated": 0,
             "finish": "cancel", "prompt": 200},
            {"reused": 105, "prompt_read": 95, "prompt_ms": 12.5, "hits": None, "chunk": 32, "generated": 1,
             "finish": "length", "prompt": 200}]
    read = prefill_leg_stats(legs)
    assert read["reused"] == 5 and read["prompt_read"] == 195 and read["prompt_ms"] == 22.5
    assert read["hits"] is None and read["generated"] == 1 and read["legs"] == 2
    seg2 = {"reused": 210, "prompt_read": 1, "prompt_ms": 1.0, "generated": 7, "decode_ms": 30.0,
            "finish": "stop", "prompt": 211, "chunk": 32}
    tot = request_stats([{**read, "generated": 10, "decode_ms": 50.0}, seg2])
    assert tot["reused"] == 5 and tot["prompt_read"] == 195 and tot["prompt"] == 200
    assert tot["prompt_ms"] == 23.5 and tot["decode_ms"] == 80.0 and tot["generated"] == 17
    assert tot["finish"] == "stop" and tot["hits"] is None and tot["file_mb"] is None


def test_pick_slot_prefix_checkpoint_shared_boundary_and_busy():
    s = _Slots(4, 1)
    sys_p = [257, 1, 2, 3, 258]
    s.held[0] = sys_p + [257, 11, 12, 258, 257, 13]          # conversation A
    s.held[1] = sys_p + [257, 21, 22, 258, 257, 23, 24]      # conversation B
    s.used = [1.0, 2.0, 3.0, 0.5]
    a_next = sys_p + [257, 11, 12, 258, 257, 13, 99, 258, 257, 5]
    assert pick_slot(s, a_next, 257) == 0                     # A's stream is a start of A's next turn
    b_edit = sys_p + [257, 21, 22, 258, 257, 77]               # B's last turn edited: B's checkpoint
    assert pick_slot(s, b_edit, 257) == 1
    new_chat = sys_p + [257, 40, 41]                          # only the shared system prompt: no owner
    assert pick_slot(s, new_chat, 257) == 3                   # empty slots first, least recently used
    s.owner[0] = "busy"
    assert pick_slot(s, a_next, 257) in (2, 3)                # never a busy slot
    s.owner = ["x"] * 4
    assert pick_slot(s, a_next, 257) is None
    g = _Slots(4, 2)                                           # two groups of 2: order 0, 2, 1, 3
    assert g.order == [0, 2, 1, 3]
    g.owner[1] = "busy"                                        # hole below slot 1 in group 0
    assert pick_slot(g, [1, 2], 257) == 0


class _HookedCondition(threading.Condition):
    """A Condition that runs `hook()` before the n-th enter from the thread named `who`."""

    def __init__(self, who, n, hook):
        super().__init__()
        self.who, self.n, self.hook, self.count = who, n, hook, 0

    def __enter__(self):
        if threading.current_thread().name == self.who:
            self.count += 1
            if self.count == self.n:
                self.hook()
        return super().__enter__()


class _StubEngine:
    def __init__(self):
        self.ctl = threading.Lock()
        self.starting = False
        self.info = {}
        self._cur = None

    def alive(self):
        return True


def test_take_control_sees_a_turn_that_changed_just_before_its_wait(monkeypatch):
    """Lost notification: the turn check must be made under slot_cv's lock, right before waiting."""
    monkeypatch.setattr(batch, "WAIT_STEP_S", 3.0)
    bp = BatchPath(_StubEngine())
    first = batch._Waiter(10, 0.0, None)  # a short waiter ahead of ours

    def first_takes_its_turn_elsewhere():
        def leave():
            with bp.cv:
                bp.waiting.pop(first.seq, None)
                bp.cv.notify_all()
        t = threading.Thread(target=leave)
        t.start()
        t.join(2)

    bp.cv = _HookedCondition("W", 2, first_takes_its_turn_elsewhere)
    bp.waiting[first.seq] = first
    req = _Request(list(range(2000)), 5, "", None)
    got = {}

    def w():
        t0 = time.monotonic()
        for _ in bp._take_control(req, 2000):
            pass
        got["s"] = time.monotonic() - t0

    t = threading.Thread(target=w, name="W")
    t.start()
    t.join(10)
    assert req.has_ctl and got["s"] < 1.0, got


def test_a_waiter_that_leaves_lets_the_next_one_go(monkeypatch):
    """A waiter that gives up its place (its client left) notifies: the next one must not sleep a step."""
    monkeypatch.setattr(batch, "WAIT_STEP_S", 1.0)
    monkeypatch.setattr(batch, "HEARTBEAT_S", 0.0)
    bp = BatchPath(_StubEngine())
    ahead = batch._Waiter(5, 0.0, None)     # a short waiter ahead of both (it never proceeds)
    bp.waiting[ahead.seq] = ahead
    short, long_ = _Request([1] * 10, 5, "", None), _Request([1] * 5000, 5, "", None)
    long_.arrival = short.arrival + 1
    g_short = bp._take_control(short, 10)
    assert next(g_short) is None            # registered, not its turn, one step waited, heartbeat
    waiting_now = threading.Event()

    class Cond(threading.Condition):
        def wait(self, timeout=None):
            if threading.current_thread().name == "L":
                waiting_now.set()
            return super().wait(timeout)

    cond = Cond()
    with bp.cv:
        bp.cv = cond
    got = {}
    tl = threading.Thread(target=lambda: (list(bp._take_control(long_, 5000)),
                                          got.setdefault("t", time.monotonic())), name="L")
    tl.start()
    assert waiting_now.wait(3)
    time.sleep(0.05)                         # it now sleeps a fresh 1 s step on the condition
    with bp.cv:
        bp.waiting.pop(ahead.seq)            # the one ahead went (its own notify is not what we test)
    t0 = time.monotonic()
    g_short.close()                          # the short one's client left: it must wake the long one
    tl.join(5)
    assert long_.has_ctl and got["t"] - t0 < 0.5, got["t"] - t0


def test_conversation_slots_known_before_ready():
    e = StrataEngine(["strata-engine"], ["--model", "m.gguf", "--batch", "12"])
    assert batch.conversation_slots(e) == 8  # from the flag, clamped to the engine's 1..8
    e.info = {"batch_slots": 3}
    assert batch.conversation_slots(e) == 3  # READY's INFO wins
    assert batch.conversation_slots(StrataEngine(["x"], [])) == 0

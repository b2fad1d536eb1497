"""The batch path (serve/engine_client/batch.py) on the slot fake engine: canaries, the engine's schedule (a short question
overtakes a long read), admission order for a free slot, cancel and early close (figures kept, quarantine),
pick_slot. The schedules that went wrong are forced (slow reads, hooked conditions)."""
import threading
import time


from serve.engine_client import batch
from serve.engine_client.batch import BatchPath, _SlotRequest
from serve.engine_client.slot_table import SlotTable, pick_slot
from serve.engine_client.engine import StrataEngine
from tests.serve.conftest import answer, commands, long_q, q, run, text_of

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


def test_a_short_question_overtakes_a_long_read(slots_engine):
    """The engine schedules: a short prompt admitted while a long one is read gets its first token first."""
    e = slots_engine({"slots": 4, "step_tokens": 32, "step_delay_s": 0.01})
    long_word, long_ids = "LONG", long_q("LONG", 1200)
    res, out, firsts = {}, {}, {}
    tl = threading.Thread(target=lambda: out.setdefault("L", run(e, long_word, res=res, firsts=firsts,
                                                                 name="L", ids=long_ids)))
    tl.start()
    time.sleep(0.1)
    shorts = [threading.Thread(target=lambda i=i: out.setdefault(i, run(e, f"s{i}", firsts=firsts, name=i)))
              for i in range(3)]
    for t in shorts:
        t.start()
        time.sleep(0.02)
    for t in [tl, *shorts]:
        t.join(20)
    assert text_of(out["L"]) == answer(long_word)
    for i in range(3):
        assert text_of(out[i]) == answer(f"s{i}") and firsts[i] < firsts["L"]
    n = len(long_ids)
    assert res["reused"] == 0 and res["prompt_read"] == n and res["prompt"] == n and res["finish"] == "stop"
    assert [c.split()[0] for c in commands(e)] == ["BGEN"] * 4  # no yields, no promotion: one BGEN each


def test_short_first_then_arrival_order_for_a_free_slot(slots_engine, monkeypatch):
    for short_first, expect in ((True, ["busy", "short", "long"]), (False, ["busy", "long", "short"])):
        monkeypatch.setenv("STRATA_ADMIT_SHORT_FIRST", "1" if short_first else "0")
        e = slots_engine({"slots": 1, "repeat": 20, "step_delay_s": 0.01})
        e.record.unlink(missing_ok=True)
        ts = [threading.Thread(target=run, args=(e, "busy"))]
        ts[0].start()
        time.sleep(0.1)
        for word in ("long" + "l" * 1100, "short"):
            ts.append(threading.Thread(target=run, args=(e, word)))
            ts[-1].start()
            time.sleep(0.05)
        for t in ts:
            t.join(20)
        order = [text_of([int(x) for x in c.split()[-1].split(",")])[:4].decode()
                 for c in commands(e) if c.startswith("BGEN")]
        assert [w if w != "shor" else "short" for w in order] == expect, (short_first, order)
        e.close()


def test_cancel_while_reading_keeps_the_figures_and_frees_the_slot(slots_engine):
    e = slots_engine({"slots": 2, "step_tokens": 16, "step_delay_s": 0.01})
    flag = threading.Event()
    res = {}
    t = threading.Thread(target=run, args=(e, "LONG" + "z" * 800), kwargs={"res": res, "cancelled": flag.is_set})
    t.start()
    deadline = time.monotonic() + 5
    while res.get("prompt_reached", 0) < 64 and time.monotonic() < deadline:
        time.sleep(0.01)
    flag.set()
    t.join(10)
    n = len(q("LONG" + "z" * 800))
    assert res["finish"] == "cancel" and res["generated"] == 0 and 0 < res["prompt_read"] < n
    assert res["prompt"] == n and res["prompt_ms"] > 0 and res["decode_ms"] == 0.0
    assert "BSTOP 0" in commands(e) and e.batch.stats()["busy"] == 0 and not e.ctl.locked()
    assert text_of(run(e, "after")) == answer("after")


def test_a_cancelled_reply_keeps_its_engine_figures(slots_engine):
    """Issue 10: a cancelled request's tokens come with their decode time (no tokens without time)."""
    e = slots_engine({"slots": 2, "repeat": 100, "step_delay_s": 0.005})
    res, got = {}, []
    g = e.generate(q("talk"), 1000, result=res)
    for t in g:
        if t is not None:
            got.append(t)
        if len(got) == 20:
            break
    g.close()
    assert res["finish"] == "cancel" and res["generated"] >= 20 and res["decode_ms"] > 0
    assert res["prompt_read"] == len(q("talk")) and res["prompt_ms"] > 0


def test_early_close_quarantines_the_slot_until_bdone(slots_engine, monkeypatch):
    monkeypatch.setattr(batch, "LEAVE_WAIT_S", 0.1)
    e = slots_engine({"slots": 2, "repeat": 200, "step_delay_s": 0.003, "hang_after_bstop": 0.6,
                      "hang_steps": True, "rules": [{"match": "next", "repeat": 3}]})
    g = e.generate(q("leaver"), 500)
    got = [t for _, t in zip(range(30), g) if t is not None]
    g.close()
    assert got and "BSTOP 0" in commands(e)
    assert e.batch.stats()["busy"] == 1 and e.batch.stats()["quarantines"] == 1  # claimed until its BDONE
    deadline = time.monotonic() + 3
    while e.batch.stats()["busy"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert e.batch.stats()["busy"] == 0 and e.alive()
    assert text_of(run(e, "next")) == answer("next", 3)


def test_pick_slot_prefix_checkpoint_shared_boundary_and_busy():
    s = SlotTable(4)
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


class _StubProc:
    def __init__(self, n):
        self.slots, self.ended = SlotTable(n), False


class _StubEngine:
    def __init__(self, n_slots=1):
        self.ctl = threading.Lock()
        self.slot_cv = threading.Condition()
        self.starting = False
        self.info = {}
        self.proc = _StubProc(n_slots)

    def current(self):
        return self.proc

    def alive(self):
        return True

    def gone(self, proc):
        return "gone"


def test_a_claim_sees_a_turn_that_changed_just_before_its_wait(monkeypatch):
    """Lost notification: the turn check must be made under slot_cv's lock, right before waiting."""
    monkeypatch.setattr(batch, "SLOT_WAIT_STEP_S", 3.0)
    bp = BatchPath(_StubEngine())
    first = batch._Waiter(10, 0.0)  # a short waiter ahead of ours

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
    req = _SlotRequest(list(range(2000)), 5, "", None)
    got = {}

    def w():
        t0 = time.monotonic()
        got["claimed"] = list(bp._claim(req)) == [] and req.slot is not None
        got["s"] = time.monotonic() - t0

    t = threading.Thread(target=w, name="W")
    t.start()
    t.join(10)
    assert got["claimed"] and got["s"] < 1.0, got


def test_a_waiter_that_leaves_lets_the_next_one_go(monkeypatch):
    """A waiter that gives up its place (its client left) notifies: the next one must not sleep a step."""
    monkeypatch.setattr(batch, "SLOT_WAIT_STEP_S", 1.0)
    monkeypatch.setattr(batch, "HEARTBEAT_S", 0.0)
    bp = BatchPath(_StubEngine())
    ahead = batch._Waiter(5, 0.0)     # a short waiter ahead of both (it never proceeds)
    bp.waiting[ahead.seq] = ahead
    short, long_ = _SlotRequest([1] * 10, 5, "", None), _SlotRequest([1] * 5000, 5, "", None)
    long_.arrival = short.arrival + 1
    g_short = bp._claim(short)
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
    tl = threading.Thread(target=lambda: (list(bp._claim(long_)), got.setdefault("t", time.monotonic())),
                          name="L")
    tl.start()
    assert waiting_now.wait(3)
    time.sleep(0.05)                         # it now sleeps a fresh 1 s step on the condition
    with bp.cv:
        bp.waiting.pop(ahead.seq)            # the one ahead went (its own notify is not what we test)
    t0 = time.monotonic()
    g_short.close()                          # the short one's client left: it must wake the long one
    tl.join(5)
    assert long_.slot is not None and got["t"] - t0 < 0.5, got["t"] - t0


def test_conversation_slots_known_before_ready():
    e = StrataEngine(["strata-engine"], ["--model", "m.gguf", "--batch", "12"])
    assert batch.conversation_slots(e) == 8  # from the flag, clamped to the engine's 1..8
    e.info = {"batch_slots": 3}
    assert batch.conversation_slots(e) == 3  # READY's INFO wins
    assert batch.conversation_slots(StrataEngine(["x"], [])) == 0

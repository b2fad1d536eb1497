"""The batch path when things go wrong: a restart while requests are attached, the engine ending while a
request waits for a free slot (it was sent nowhere: it keeps its place and runs once on the replacement; EngineDied
at once when the engine was closed on purpose, or when no replacement comes in time), a BSTOP that is never
answered, while reading or decoding (the limit counts from the engine's last line, another slot's lines
included; past it the engine is ended, so the slot is never given to another request while its lines may
still come)."""
import threading
import time

import pytest

from serve.engine_client import batch
from serve.engine_client.engine import EngineDied
from tests.serve.conftest import answer, long_q, q, run, text_of


def _pids(e):
    return [ln.split(" ", 1) for ln in e.record.read_text().splitlines()]


def test_restart_while_requests_are_attached(slots_engine):
    e = slots_engine({"slots": 2, "repeat": 400, "step_delay_s": 0.01, "token_delay_s": 0.002,
                      "rules": [{"match": "fresh", "repeat": 2}, {"match": "c-waits", "repeat": 3}]})
    errors, outs = {}, {}

    def client(name):
        try:
            outs[name] = run(e, name, max_new=3000)
        except EngineDied as ex:
            errors[name] = str(ex)

    ts = []
    for name in ("a-one", "b-two", "c-waits"):
        ts.append(threading.Thread(target=client, args=(name,)))
        ts[-1].start()
        time.sleep(0.15)
    deadline = time.monotonic() + 3
    while e.batch.stats()["waiting"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert e.batch.stats()["waiting"] == 1  # c waits for a slot, bound to this process
    old_pid = e.current().popen.pid
    e.restart(tries=1)
    for t in ts:
        t.join(10)
    assert set(errors) == {"a-one", "b-two"}, (errors, list(outs))  # sent: they end with the process
    assert text_of(outs["c-waits"]) == answer("c-waits", 3)         # sent nowhere: it runs on the new one
    new_pid = e.current().popen.pid
    on_new = [c for pid, c in _pids(e) if int(pid) == new_pid]
    assert on_new == _sent_for(e, "c-waits", new_pid) and len(on_new) == 1, on_new  # only c, once
    assert len(_sent_for(e, "c-waits")) == 1 and e.batch.stats()["requeued"] == 1
    assert text_of(run(e, "fresh")) == answer("fresh", 2)
    assert int(_pids(e)[0][0]) == old_pid


@pytest.mark.parametrize("tick", [False, True])
def test_stopped_slot_limit_counts_from_the_last_line(slots_engine, monkeypatch, tick):
    monkeypatch.setattr(batch, "QUARANTINE_S", 0.4)
    monkeypatch.setattr(batch, "LEAVE_WAIT_S", 0.1)
    script = {"slots": 2, "repeat": 60, "step_delay_s": 0.004, "token_delay_s": 0.002, "hang_after_bstop": 1.2,
              "rules": [{"match": "next", "repeat": 3}]}
    if tick:
        script["tick_s"] = 0.1
    e = slots_engine(script)
    keeper = {}
    tk = threading.Thread(target=lambda: keeper.setdefault("r", _catch(lambda: run(e, "keeper", max_new=3000))))
    tk.start()
    time.sleep(0.1)
    g = e.generate(q("leaver"), 2000)
    got = _take(g, 40)
    assert len(got) == 40 and e.current().slots.owner.count(None) == 0  # both slots decode
    g.close()  # BSTOP; the engine then writes nothing (or only WARN ticks) for 1.2 s
    if not tick:  # past the limit: the engine is ended, the slot is never reused on that process
        deadline = time.monotonic() + 1.0
        while e.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not e.alive() and "never finished" in e.death_note()
        tk.join(10)
        assert isinstance(keeper["r"], EngineDied)
        e.restart(tries=1)
    else:  # every line restarts the limit: the slot is freed at its BDONE, the engine keeps running
        time.sleep(1.5)
        assert e.alive()
    assert text_of(run(e, "next")) == answer("next", 3)
    if tick:
        tk.join(20)
        assert text_of(keeper["r"]) == answer("keeper", 60)


def _catch(fn):
    try:
        return fn()
    except EngineDied as ex:
        return ex


def _take(g, n):
    got = []
    for t in g:
        if t is not None:
            got.append(t)
            if len(got) == n:
                return got
    return got


class _HookedLock:
    """engine.ctl stand-in: runs `hook()` once, right after the n-th successful acquire by thread `who`."""

    def __init__(self, who, n, hook):
        self.lock, self.who, self.n, self.hook, self.count = threading.Lock(), who, n, hook, 0

    def acquire(self, blocking=True, timeout=-1):
        ok = self.lock.acquire(blocking, timeout)
        if ok and threading.current_thread().name == self.who:
            self.count += 1
            if self.count == self.n:
                self.hook()
        return ok

    def release(self):
        self.lock.release()

    def locked(self):
        return self.lock.locked()


def test_a_request_never_goes_on_on_a_restarted_process(slots_engine):
    """The engine restarts right after a request claimed its slot and took the control lines: EngineDied,
    nothing sent to the new process."""
    e = slots_engine({"slots": 2, "rules": [{"match": "fresh", "repeat": 2}]})
    e.ctl = _HookedLock("L", 1, lambda: e.restart(tries=1))
    errors = {}

    def one():
        try:
            run(e, "late-one")
        except EngineDied as ex:
            errors["L"] = str(ex)

    tl = threading.Thread(target=one, name="L")
    tl.start()
    tl.join(10)
    assert "L" in errors, "the request went on on the new process"
    assert not _sent_for(e, "late-one")
    assert text_of(run(e, "fresh")) == answer("fresh", 2)


# ------------------------------------------------------------------ the engine ends while a request waits for a slot
def _hold_the_only_slot(e, g, tw, deadline_s=5.0):
    """Drive `g` (this thread) to its first token, start `tw`, drive on until `tw` waits for a free slot;
    then `g` pauses in its slot."""
    got, deadline = [], time.monotonic() + deadline_s
    for t in g:
        if t is not None:
            got.append(t)
            break
    tw.start()
    for t in g:
        if t is not None:
            got.append(t)
        if e.batch.stats()["waiting"] == 1 or time.monotonic() > deadline:
            break
    assert e.batch.stats()["waiting"] == 1 and e.current().slots.owner[0] is not None, "no one waits for a slot"
    return got


def _sent_for(e, word, pid=None):
    out = []
    for p, c in _pids(e):
        if c.startswith(("GEN", "BGEN")) and (pid is None or int(p) == pid):
            if word in text_of([int(x) for x in c.split()[-1].split(",")]).decode("latin-1"):
                out.append(c)
    return out


@pytest.mark.parametrize("how", ["killed", "restarted", "closed", "never replaced"])
def test_a_request_waiting_for_a_slot_when_the_engine_ends(slots_engine, how):
    """The only slot's holder is paused (its client reads slowly), so that slot is never freed; the engine
    then ends. The holder was sent: it never goes on. The waiter was sent nowhere: it must not wait for the
    holder; it runs once on the replacement process (killed: the restart comes later, as the supervisor's
    does), or gets EngineDied at once when the engine was closed on purpose, or after `requeue_wait_s`."""
    e = slots_engine({"slots": 1, "repeat": 400, "step_delay_s": 0.005, "token_delay_s": 0.002,
                      "rules": [{"match": "fresh", "repeat": 2}, {"match": "waiter", "repeat": 3}]})
    e.batch.requeue_wait_s = 1.0 if how == "never replaced" else 30.0
    g = e.generate(q("holder"), 3000)
    got = {}

    def waiter():
        try:
            got["out"] = (run(e, "waiter"), time.monotonic())
        except EngineDied as ex:
            got["err"] = (ex, time.monotonic())

    tw = threading.Thread(target=waiter, name="W")
    try:
        _hold_the_only_slot(e, g, tw)
        old_pid = e.current().popen.pid
        t0 = time.monotonic()
        if how == "restarted":
            e.restart(tries=1)
        elif how == "closed":
            e.close()
        else:
            e.current().popen.kill()
            time.sleep(0.5)
            assert tw.is_alive() and not got, f"the waiter did not wait for the replacement ({got})"
            if how == "killed":
                e.restart(tries=1)
        tw.join(5)
        if how in ("killed", "restarted"):
            assert "out" in got, f"the waiter was not answered on the new process ({got})"
            assert text_of(got["out"][0]) == answer("waiter", 3)
            new_pid = e.current().popen.pid
            assert len(_sent_for(e, "waiter")) == 1 and len(_sent_for(e, "waiter", new_pid)) == 1
        else:
            assert "err" in got, f"the waiter did not get EngineDied ({got})"
            assert got["err"][1] - t0 < (0.5 if how == "closed" else 2.5)
            assert not _sent_for(e, "waiter"), "the waiter was sent"
    finally:
        g.close()
        if tw.is_alive() or tw.ident:
            tw.join(10)
    if how in ("closed", "never replaced"):
        e.restart(tries=1)
    assert e.current().popen.pid != old_pid
    assert text_of(run(e, "fresh")) == answer("fresh", 2)
    assert len(_sent_for(e, "holder")) == 1


class _HookedEnter(threading.Condition):
    """slot_cv stand-in: runs `hook()` once, before the n-th enter by thread `who` made while `when()`."""

    def __init__(self, who, n, when, hook):
        super().__init__()
        self.who, self.n, self.when, self.hook, self.count = who, n, when, hook, 0

    def __enter__(self):
        if threading.current_thread().name == self.who and self.when():
            self.count += 1
            if self.count == self.n:
                self.hook()
        return super().__enter__()


def test_an_engine_end_just_before_the_slot_wait_is_not_slept_through(slots_engine, monkeypatch):
    """The engine ends (and the pump has notified) between the waiter's look at `ended` and its wait on
    slot_cv: the look must be made under the lock, else the waiter sleeps a whole SLOT_WAIT_STEP_S."""
    monkeypatch.setattr(batch, "SLOT_WAIT_STEP_S", 3.0)
    e = slots_engine({"slots": 1, "repeat": 400, "step_delay_s": 0.005, "token_delay_s": 0.002})
    fired, paused = {}, threading.Event()

    def end_the_engine():
        assert paused.wait(3)  # the holder's client has stopped reading (its slot stays taken)
        proc = e.current()
        proc.popen.kill()
        proc.pump.join(3)  # EOF seen: `ended` set and proc_ended's notify_all done (nobody waited yet)
        fired["t"] = time.monotonic()

    # the waiter's enters once it is registered as waiting: the 1st is its look before the slot wait
    e.batch.cv = _HookedEnter("W", 1, lambda: len(e.batch.waiting) == 1, end_the_engine)
    e.batch.requeue_wait_s = 0.0  # no replacement is awaited: EngineDied as soon as the end is seen
    g = e.generate(q("holder"), 3000)
    got = {}

    def waiter():
        try:
            run(e, "waiter")
        except EngineDied as ex:
            got["t"] = time.monotonic()

    tw = threading.Thread(target=waiter, name="W")
    try:
        _hold_the_only_slot(e, g, tw)
        paused.set()
        tw.join(6)
        assert "t" in fired and "t" in got, (fired, got)
        assert got["t"] - fired["t"] < 1.0, f"slept {got['t'] - fired['t']:.1f} s through the engine's end"
    finally:
        g.close()
        if tw.is_alive() or tw.ident:
            tw.join(10)


# ------------------------------------------------------------------ drain limits that other slots' lines restart
def _check_engine_ended(e, res, tn, tk):
    """Past the limit with no line: the engine was ended and the keeper with it; the waiting "next", sent
    nowhere (never given the quarantined slot), waits for the replacement and runs once on it."""
    tk.join(10)
    assert isinstance(res["keeper"], EngineDied)
    assert "next" not in res and not _sent_for(e, "next")
    e.restart(tries=1)
    tn.join(10)
    assert text_of(res["next"]) == answer("next", 3)
    assert len(_sent_for(e, "next")) == 1 and _sent_for(e, "next", e.current().popen.pid)


def _check_drained(e, res, firsts, tk, since, old_pid):
    """Other slots' lines kept the engine alive: "next" ran on the same process, only after `since` (the
    drain's end), and the keeper finished whole."""
    assert text_of(res["next"]) == answer("next", 3) and firsts["next"] > since
    assert _sent_for(e, "next", old_pid)
    tk.join(20)
    assert text_of(res["keeper"]) == answer("keeper", 100)


@pytest.mark.parametrize("phase", ["reading", "decoding"])
@pytest.mark.parametrize("others", ["silent", "decoding"])
def test_cancelled_slot_bstop_limit_counts_from_every_line(slots_engine, monkeypatch, others, phase):
    """A request is cancelled while its prompt is read or while it decodes: BSTOP, then its slot writes
    nothing for 1.2 s. With no line at all the engine is ended after QUARANTINE_S and a request waiting for a
    slot runs on the replacement (never on that slot); while the other slot's lines come, the limit restarts and the slot
    is reused after its BDONE."""
    monkeypatch.setattr(batch, "QUARANTINE_S", 0.4)
    script = {"slots": 2, "repeat": 100, "step_delay_s": 0.005, "hang_after_bstop": 1.2, "step_tokens": 16,
              "rules": [{"match": "next", "repeat": 3}, {"match": "leaver", "repeat": 300}]}
    if others == "decoding":
        script["hang_steps"] = True
    e = slots_engine(script)
    res, firsts, flag, ended = {}, {}, threading.Event(), {}
    tk = threading.Thread(target=lambda: res.setdefault("keeper", _catch(lambda: run(e, "keeper", 3000))))
    tk.start()
    time.sleep(0.1)

    ids = long_q("leaver", 4000) if phase == "reading" else None

    def leaver():
        res["leaver"] = _catch(lambda: run(e, "leaver", 3000, cancelled=flag.is_set, firsts=firsts, ids=ids))
        ended["t"] = time.monotonic()

    tl = threading.Thread(target=leaver)
    tl.start()
    deadline = time.monotonic() + 3
    while (e.batch.stats()["busy"] < 2 or ("leaver" not in firsts and phase == "decoding")
           or (e.progress[0] < 64 and phase == "reading")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert e.batch.stats()["busy"] == 2
    old_pid = e.current().popen.pid
    tn = threading.Thread(target=lambda: res.setdefault("next", _catch(lambda: run(e, "next", firsts=firsts))))
    tn.start()
    deadline = time.monotonic() + 2
    while e.batch.stats()["waiting"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert e.batch.stats()["waiting"] == 1  # "next" waits for a slot
    flag.set()  # the leaver's client went: BSTOP at its next token; the engine then hangs on that slot
    tl.join(5)
    if others == "silent":
        assert isinstance(res["leaver"], EngineDied) and "never finished" in e.death_note()
        _check_engine_ended(e, res, tn, tk)
    else:
        tn.join(10)
        assert e.alive() and not isinstance(res["leaver"], Exception)
        _check_drained(e, res, firsts, tk, ended["t"], old_pid)

"""The batch path when things go wrong: a restart while requests are attached, a stopped slot or a STOP that
is never answered (the limits count from the engine's last line; past them the engine is ended, so the slot
is never given to another request while its lines may still come)."""
import threading
import time

import pytest

from serve import batch
from serve.engine import EngineDied
from tests.serve.test_batch import answer, commands, q, run, slots_engine, text_of  # noqa: F401 (fixture)


def _pids(e):
    return [ln.split(" ", 1) for ln in e.record.read_text().splitlines()]


def test_restart_while_requests_are_attached(slots_engine):
    e = slots_engine({"slots": 2, "repeat": 400, "step_delay_s": 0.01, "token_delay_s": 0.002,
                      "rules": [{"match": "fresh", "repeat": 2}]})
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
    while e.batch.stats()["admitting"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert e.batch.stats()["admitting"] == 1  # c waits for a slot, bound to this process
    old_pid = e._cur.popen.pid
    e.restart(tries=1)
    for t in ts:
        t.join(10)
    assert set(errors) == {"a-one", "b-two", "c-waits"}, (errors, list(outs))
    new_pid = e._cur.popen.pid
    assert not [c for pid, c in _pids(e) if int(pid) == new_pid]  # nothing of theirs reached the new one
    assert text_of(run(e, "fresh")) == answer("fresh", 2)
    assert int(_pids(e)[0][0]) == old_pid


@pytest.mark.parametrize("tick", [False, True])
def test_stopped_slot_limit_counts_from_the_last_line(slots_engine, monkeypatch, tick):
    monkeypatch.setattr(batch, "QUARANTINE_S", 0.4)
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
    assert len(got) == 40 and e._cur.slots.owner.count(None) == 0  # both slots decode
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


@pytest.mark.parametrize("tick", [False, True])
def test_stop_drain_limit_counts_from_the_last_line(slots_engine, monkeypatch, tick):
    monkeypatch.setattr(batch, "DRAIN_TIMEOUT_S", 0.4)
    script = {"slots": 2, "repeat": 300, "token_delay_s": 0.003, "hang_on_stop": 1.2,
              "rules": [{"match": "next", "repeat": 3}]}
    if tick:
        script["tick_s"] = 0.1
    e = slots_engine(script)
    g = e.generate(q("solo-leaver"), 2000)
    got = _take(g, 20)
    t0 = time.monotonic()
    g.close()  # STOP, then drain to DONE while ctl is held
    took = time.monotonic() - t0
    if not tick:
        assert took < 1.0 and not e.alive() and "STOP" in e.death_note()
        e.restart(tries=1)
    else:
        assert took >= 1.1 and e.alive()
    assert len(got) == 20 and not e.ctl.locked()
    assert text_of(run(e, "next")) == answer("next", 3)


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
    """Going solo again, the request re-takes ctl; the engine restarts just then: EngineDied, nothing sent to
    the new process."""
    e = slots_engine({"slots": 2, "repeat": 60, "step_delay_s": 0.004, "token_delay_s": 0.002,
                      "rules": [{"match": "short", "repeat": 1}, {"match": "fresh", "repeat": 2}]})
    e.ctl = _HookedLock("L", 2, lambda: e.restart(tries=1))
    errors = {}

    def long_one():
        try:
            run(e, "long-one")
        except EngineDied as ex:
            errors["L"] = str(ex)

    tl = threading.Thread(target=long_one, name="L")
    tl.start()
    time.sleep(0.05)
    assert text_of(run(e, "short")) == answer("short")   # promotes L into a slot; L then goes solo again
    tl.join(10)
    assert "L" in errors, "the request went on on the new process"
    new_pid = e._cur.popen.pid
    assert not [c for pid, c in _pids(e) if int(pid) == new_pid]
    assert text_of(run(e, "fresh")) == answer("fresh", 2)

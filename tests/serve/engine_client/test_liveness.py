"""serve/engine_client/liveness.py: the heartbeat's rules on a clock the test owns (when it pings, when a
missing PONG ends the process, what a whole command (BSAVE) and a late tick change), `write_nowait` on a real pipe
that nobody reads, the pump's PONG routing, and the bad schedule the heartbeat must survive: a writer
blocked on the full pipe of a frozen engine, holding `ctl` and `wlock`."""
import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from serve.engine_client.liveness import Heartbeat, timing
from serve.engine_client.protocol import EngineDied, EngineProcess
from tests.serve.conftest import long_q, process_gone, q, run, wait_until

STALL_S = 4.0


class _Proc(SimpleNamespace):
    """What the heartbeat uses of an EngineProcess, with the writes and the kill recorded."""

    def __init__(self, pipe_ok=True):
        super().__init__(ended=False, heard=0.0, pong=0, whole_since=None, admissions=[], gen=1, writes=[],
                         note=None, pipe_ok=pipe_ok)

    def write_nowait(self, line, lock_wait_s):
        if self.pipe_ok:
            self.writes.append(line)
        return self.pipe_ok

    def kill(self, note):
        self.note, self.ended = note, True


def _beat(proc):
    return Heartbeat(proc, STALL_S)


def _ticks(hb, start, end, step=0.1):
    """Ticks from start to end (every `step` s, as the thread would); the time of the first True, else None."""
    t = start
    while t <= end + 1e-9:
        if hb.check(round(t, 3)):
            return round(t, 3)
        t += step
    return None


def test_timing_judges_within_the_stall_limit():
    every, pong_wait, tick = timing(4.0)
    assert (every, pong_wait, tick) == (2.0, 2.0, 0.4)
    assert timing(90.0)[0] == 5.0 and timing(90.0)[2] == 0.5  # an idle engine is pinged every 5 s at most


def test_a_quiet_engine_is_pinged_and_ended_when_no_pong_comes():
    p = _Proc()
    hb = _beat(p)
    assert _ticks(hb, 0.1, 1.9) is None and p.writes == []   # quiet under every_s (2 s)
    assert not hb.check(2.0) and p.writes == ["PING 1"]
    p.pong, p.heard = 1, 2.05                                # answered: nothing owed
    assert _ticks(hb, 2.1, 4.0) is None and hb.owed_since is None and p.writes == ["PING 1"]
    assert not hb.check(4.1) and p.writes[-1] == "PING 2"    # quiet again: the next PING (frozen now)
    assert _ticks(hb, 4.2, 8.0) == 6.1                       # the last line was at 2.05: 4 s later
    assert p.ended and "froze" in p.note and "STRATA_ENGINE_STALL_S=4" in p.note
    assert p.writes == ["PING 1", "PING 2"]                  # one PING owed at a time


def test_lines_keep_it_alive_but_waiting_admissions_still_ping():
    p = _Proc()
    hb = _beat(p)
    for t in (0.4, 0.8, 1.2):
        p.heard = t                                          # lines flow (tokens): no PING needed
        assert not hb.check(t)
    assert p.writes == []
    p.admissions.append(0)                                   # a BGEN waits for its BACC: ping at once
    assert not hb.check(1.3) and p.writes == ["PING 1"]
    p.heard = 3.0                                            # a line after it (another slot's token)
    assert _ticks(hb, 1.4, 9.0) == 7.0 and p.ended           # owed, frozen only 4 s after that line


def test_a_whole_command_suspends_the_pong_it_would_delay():
    p = _Proc()
    hb = _beat(p)
    p.whole_since = 0.5                                       # a BSAVE runs whole (its own clock watches it)
    assert _ticks(hb, 0.1, 3.0) is None and p.writes == []   # no PING during it
    p.whole_since = None
    assert not hb.check(3.1) and p.writes == ["PING 1"]      # BSAVE over, quiet: PING
    p.whole_since, p.heard = 3.2, 3.3                         # another control command right after the PING
    assert _ticks(hb, 3.2, 9.0) == 7.3 and p.ended           # PING 1 came before it: it still counts


def test_a_ping_written_during_a_whole_command_counts_from_its_end():
    p = _Proc()
    hb = _beat(p)
    p.whole_since = 0.0
    hb.owed_since, hb.sent, hb.last_ping = 1.0, 1, 1.0       # PING 1 went out while the BSAVE ran
    p.heard = 0.5
    assert _ticks(hb, 1.0, 60.0, step=0.4) is None           # silent as long as it likes: its clock rules
    p.whole_since, p.heard = None, 60.0                       # SAVED at 60 s: the PONG is owed from then
    assert _ticks(hb, 60.1, 70.0) == 64.0 and p.ended


def test_a_ping_the_pipe_would_not_take_is_owed_from_the_first_try():
    p = _Proc(pipe_ok=False)                                 # the engine reads nothing: its pipe is full
    hb = _beat(p)
    assert not hb.check(2.0) and hb.owed_since == 2.0 and p.writes == []
    assert _ticks(hb, 2.1, 6.0) == 4.0 and p.ended           # quiet 4 s, owed 2 s: frozen


def test_a_late_tick_restarts_the_clock():
    p = _Proc()
    hb = _beat(p)
    assert _ticks(hb, 0.1, 2.5) is None and hb.owed_since == 2.0
    assert not hb.check(30.0)                                # we ourselves were stopped: it gets its time
    assert _ticks(hb, 30.1, 40.0) == 32.0 and p.ended


def test_stall_zero_starts_no_thread():
    hb = Heartbeat(_Proc(), 0)
    hb.start()
    assert hb._thread is None


def test_the_pump_routes_pong_to_the_heartbeat_only():
    p = EngineProcess(popen=None, gen=1, cv=threading.Condition(), n_vocab=100)
    p.route("PONG 7")
    p.route("PONG 3")   # an older one: the highest stays
    p.route("PONG x")   # malformed: ignored
    assert p.pong == 7 and p.lines.empty()


def test_write_nowait_never_blocks_on_a_pipe_nobody_reads():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, bufsize=0)
    try:
        p = EngineProcess(child, 1, threading.Condition())
        t0 = time.monotonic()
        n = 0
        while p.write_nowait("PING %d" % n, lock_wait_s=0.1):
            n += 1
            assert n < 100000
        assert n > 100 and time.monotonic() - t0 < 5       # the pipe filled, then a plain False
        with p.wlock:                                      # a writer holds the lock (blocked elsewhere)
            t0 = time.monotonic()
            assert not p.write_nowait("PING 0", lock_wait_s=0.2)
            assert 0.15 < time.monotonic() - t0 < 2
    finally:
        child.kill()
        child.wait()


def test_a_writer_blocked_on_a_frozen_engines_full_pipe_is_freed(slots_engine, monkeypatch):
    """The bad schedule: the engine is stopped, a request's BGEN (a line far over the pipe's 64 KiB) blocks
    in its write holding `ctl` and `wlock`; the heartbeat cannot write its PING, yet ends the engine within
    the stall limit, and the blocked writer gets EngineDied."""
    monkeypatch.setenv("STRATA_ENGINE_STALL_S", "2")
    e = slots_engine({"ctx": 200000})
    pid = e.current().popen.pid
    os.kill(pid, signal.SIGSTOP)
    box = {}

    def request():
        try:
            run(e, "big", ids=long_q("big", 60000), max_new=4)
        except EngineDied as err:
            box["err"] = err

    t0 = time.monotonic()
    t = threading.Thread(target=request, daemon=True)
    t.start()
    try:
        t.join(2.0 + 5)
        assert not t.is_alive(), "the request is still blocked"
        assert "err" in box and time.monotonic() - t0 < 2.0 + 5
        assert "froze" in e.death_note() and wait_until(lambda: process_gone(pid), 5)
        e.restart(tries=1)
        assert bytes(x for x in run(e, "next") if x < 256) == b"<next>"
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_the_fake_freezes_itself_mid_stream(slots_engine, monkeypatch):
    """The fake's own freeze (`freeze_after_steps`): a slot's stream ends with EngineDied within the limit."""
    monkeypatch.setenv("STRATA_ENGINE_STALL_S", "2")
    e = slots_engine({"freeze_after_steps": 5, "repeat": 50})
    pid = e.current().popen.pid
    got = []
    t0 = time.monotonic()
    with pytest.raises(EngineDied):
        for tok in e.generate(q("a"), 500):
            if tok is not None:
                got.append(tok)
    assert 0 < len(got) < 300 and time.monotonic() - t0 < 2.0 + 5
    assert wait_until(lambda: process_gone(pid), 5)

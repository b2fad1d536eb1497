"""The heartbeat of one engine process: a frozen engine is caught, idle, at admission or mid-stream (issue 25).

Role: a process that exists but makes no progress (SIGSTOP, a swapped-out or throttled host, a deadlock) writes
nothing and reads nothing; the pump then waits forever and so would every request bound to it. One daemon
thread per started process (`Heartbeat`) sends `PING <n>` when the engine has written no line for `every_s`
(and, while admissions wait for their answer, at least that often) and expects `PONG <n>` (docs/PROTOCOL.md:
the engine's loop answers when it takes the line: at once when idle, between two slot steps). A PING
unanswered for `pong_wait_s` while the engine wrote no line for `stall_s` (STRATA_ENGINE_STALL_S) is a
frozen engine: the heartbeat ends the process (SIGKILL works on a stopped one) with a short note. Its pump
then sees EOF and ends every queue of the process, so each request bound to it ends with EngineDied (the
dialect's error, a stream's error event), `alive()` is False (`/health` 503 with the note), and the
supervisor (or the next request) starts a new process.

So a freeze is caught within `stall_s` of the engine's last line (plus one tick), whatever waits on it: a
slot claim, an admission's BACC, a stream's next token, an embedding, a control command, or nobody.

A control command (BSAVE, BRESTORE, VRAM) runs whole before the engine takes a PING; while one runs
(`EngineProcess.whole_since`) the heartbeat sends no PING and judges none written after it: the request's own
clock (serve/engine_client/protocol.py `Allowance`: silence and no CPU/IO growth for `stall_s`) watches it,
and a PONG owed from before the command still counts. A tick that comes far later than due means this
server was itself stopped (the whole process group, a Ctrl+Z): the owed PING's clock starts again.

Locks: it writes only through `EngineProcess.write_nowait` (under `wlock`, taken with a limit, and only when
the pipe has room): a PING never blocks behind a writer stuck on a full pipe, and that writer is freed when
the process is killed. Its own fields are touched by its thread only.

Public surface: `Heartbeat(proc, stall_s, waiting=None)`, `.start()`, `.check(now)` (one tick; the thread's
body, and what tests drive with their own clock), `.sent`, `.verdict`; `timing(stall_s)`.
"""
from __future__ import annotations

import threading
import time

PING_EVERY_MAX_S = 5.0   # an idle engine is pinged at least this often (one short line each way)
TICK_MAX_S = 0.5         # how often the heartbeat looks; at most a tenth of the stall limit
LATE_TICKS = 4           # a tick this many ticks late: this server itself was stopped, the clock restarts


def timing(stall_s: float) -> tuple[float, float, float]:
    """(every_s, pong_wait_s, tick_s) for a stall limit: a PING after half of it quiet, its PONG owed within
    the other half, so a freeze is judged within `stall_s` of the last line the engine wrote."""
    every_s = min(PING_EVERY_MAX_S, stall_s / 2)
    return every_s, stall_s / 2, min(TICK_MAX_S, stall_s / 10)


class Heartbeat:
    """PING/PONG for one EngineProcess; ends it when it is frozen. `waiting()`: whether requests wait for
    an answer of this process other than a running whole command's (default: admissions not yet answered)."""

    def __init__(self, proc, stall_s: float, waiting=None):
        self.proc = proc
        self.stall_s = float(stall_s)
        self.every_s, self.pong_wait_s, self.tick_s = timing(self.stall_s)
        self.waiting = waiting or (lambda: bool(proc.admissions))
        self.sent = 0                 # the number of the last PING written (0: none yet)
        self.owed_since: float | None = None  # when the owed PING was first tried (None: none is owed)
        self.last_ping = float("-inf")  # when the last PING was written
        self.last_tick: float | None = None
        self.verdict: str | None = None  # why the process was ended, once it was
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.stall_s <= 0:
            return  # STRATA_ENGINE_STALL_S=0: off
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"engine-heartbeat-{self.proc.gen}")
        self._thread.start()

    def _run(self) -> None:
        while not self.proc.ended:
            time.sleep(self.tick_s)
            if self.check(time.monotonic()):
                return

    def check(self, now: float) -> bool:
        """One tick: note a PONG, judge an owed PING, send one when due. True once the process is ended
        (by us or anyone): the thread then leaves."""
        proc = self.proc
        if proc.ended:
            return True
        if self.last_tick is not None and now - self.last_tick > LATE_TICKS * max(self.tick_s, 0.05) \
                and self.owed_since is not None:
            self.owed_since = now  # we were stopped ourselves: the engine gets its full time again
        self.last_tick = now
        if self.owed_since is not None and proc.pong >= self.sent:
            self.owed_since = None
        whole = proc.whole_since
        if self.owed_since is not None:
            if whole is not None and self.owed_since >= whole:
                return False  # written during a whole command: answered after it (the request's clock rules)
            quiet = now - proc.heard  # after a whole command: counted from its last line
            if now - self.owed_since >= self.pong_wait_s and quiet >= self.stall_s:
                self.verdict = (f"the engine froze: no answer to PING in {now - self.owed_since:.1f} s, no line "
                                f"in {quiet:.1f} s (STRATA_ENGINE_STALL_S={self.stall_s:g}); it was ended")
                proc.kill(self.verdict)
                return True
            if self.last_ping < self.owed_since:
                self._ping(now)  # the write did not go through yet (a full pipe, a busy writer): again
            return False
        if whole is not None:
            return False
        if now - proc.heard >= self.every_s or (self.waiting() and now - self.last_ping >= self.every_s):
            self.sent += 1
            self.owed_since = now
            self._ping(now)
        return False

    def _ping(self, now: float) -> None:
        if self.proc.write_nowait(f"PING {self.sent}", lock_wait_s=self.tick_s):
            self.last_ping = now

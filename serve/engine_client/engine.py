"""StrataEngine: the one owner of the engine child process (docs/PROTOCOL.md).

Role: start `strata-engine --serve <args>`, wait for READY, and turn token-id prompts into a stream of token
ids. Each started process is an `EngineProcess` (serve/engine_client/protocol.py: its pipes, its pump, its queues);
a request is bound to the process it was sent on and reads only that process's queues. Every request runs in
a decode slot through serve/engine_client/batch.py (one path: `--parallel 1` is one slot, as llama.cpp's
`n_parallel = 1`). Each process gets a Heartbeat (serve/engine_client/liveness.py) that ends it when it is
frozen (no PONG and no line for `stall_s`); a control command, which the engine's loop runs whole, is marked on
its process (`EngineProcess.runs_whole`) so its own clock judges it meanwhile. It knows nothing of HTTP, templates or
text.

Locks: `ctl` the control lines (one BGEN write or one control command); `slot_cv` the slot tables and
admission queues (batch.py); `_state` the fields it names; `_life` start / restart / close; each process's
`wlock` its stdin (every writer, the heartbeat's non-blocking PING included).

Public surface (implements serve.core.engine_api.EngineClient):
- `StrataEngine(argv, args, log_path=None, env=None, cwd=None, silence_s=..., on_line=None)`; `start()` (spawn
  + READY handshake), `restart(tries)`, `ensure_running()` (restart a dead engine once, not while one starts),
  `close()` (QUIT -> terminate -> kill; `closed` until the next start), `kill_now()`, `alive()`, `death_note()`, `current()` (the process),
  `info`, `max_context`, `known_ctx`, `can_stop`, `progress`, `prefill_tok_s`, `gen`, `batch`.
- `generate(ids, max_new, keys, cancelled, result)`: yields token ids, and `None` as a heartbeat; `result` (a
  dict the caller owns) gets the figures. Closing it early stops the request (BSTOP) and drains its slot, so
  the next request never reads this one's lines.
- `vram(reserve_mib)`, `control(line, accept)`: control commands under `ctl`.
- Exceptions (serve/engine_client/protocol.py, re-exported): EngineDied, EngineSilent, EngineStarting, EngineBadLine,
  EngineNonFinite, EngineStuck, EngineRefused.
"""
from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time

from serve.engine_client.batch import BatchPath
from serve.engine_client.liveness import Heartbeat
from serve.engine_client.protocol import (
    ENGINE_SILENCE_S, MAX_LINE_BYTES, POLL_S, Allowance, EngineBadLine, EngineDied, EngineNonFinite,  # noqa: F401
    EngineProcess, EngineRefused, EngineSilent, EngineStarting, EngineStuck, parse_kv, start_pump)
from serve.engine_client.slot_table import SlotTable


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


ENGINE_READY_S = 900.0       # a large model on a slow disk can take minutes; env STRATA_ENGINE_READY_S, 0 = forever
ENGINE_STALL_S = 90.0        # frozen: no PONG and no line this long (serve/engine_client/liveness.py), or during a
#                              control command silent AND using no CPU/IO this long; env STRATA_ENGINE_STALL_S, 0 = off
CLOSE_WAIT_S = 20.0          # each of QUIT, terminate, kill gets this long
RESTART_RETRY_S = 15.0       # pause between start attempts
LOG_TAIL_LINES = 20          # log lines quoted when a start fails
CONTROL_WAIT_S = 300.0       # a control command waits this long for the control lines


class StrataEngine:
    """The engine child: spawn, handshake, requests (through its BatchPath), control commands, life cycle."""

    def __init__(self, argv: list[str], args: list[str], log_path: str | None = None,
                 env: dict | None = None, cwd: str | None = None, silence_s: float = ENGINE_SILENCE_S,
                 on_line=None):
        self.argv = list(argv)
        self.args = list(args)
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self.silence_s = float(silence_s)
        self.on_line = on_line          # debug hook: called with every stdout line (pump thread)
        self.ready_s = _env_float("STRATA_ENGINE_READY_S", ENGINE_READY_S)
        self.stall_s = _env_float("STRATA_ENGINE_STALL_S", ENGINE_STALL_S)
        self.ctl = threading.Lock()     # the control lines: one BGEN exchange or one control command
        self.slot_cv = threading.Condition()  # every process's slot table and the admission queue (batch.py)
        self._state = threading.Lock()  # guards _cur, gen, starting, info, max_context, known_ctx
        self._life = threading.Lock()   # one start / restart / close at a time
        self._cur: EngineProcess | None = None
        self.gen = 0
        self.starting = False
        self.info: dict = {}
        self.max_context = 0
        self.known_ctx = 0
        self.can_stop = False
        self.progress = (0, 0)          # (reached, total) of the last PP/BPP line (for /metrics)
        self.prefill_tok_s = None
        self.closed = False             # close() was called (no supervisor restarts it); a start clears it
        self._log_start = 0
        self._log = None
        self.batch = BatchPath(self)

    # ---------------------------------------------------------------- life cycle
    def current(self) -> EngineProcess | None:
        return self._cur

    def alive(self) -> bool:
        p = self._cur
        return p is not None and not p.ended and p.popen.poll() is None

    def engines(self) -> list:
        """The single engines behind this client (serve.core.engine_api.EngineClient): this one."""
        return [self]

    def live(self) -> None:
        """Per-replica figures: a single engine has none."""
        return None

    def batched(self) -> bool:
        """Whether the current process has decode slots (every engine Strata starts has: `--batch N`, one
        slot by default; a process without any is refused each request)."""
        p = self._cur
        return p is not None and p.slots is not None

    def start(self) -> None:
        """Spawn one process and wait for READY; on failure that process is cleaned up, EngineDied raised."""
        with self._life:
            self._set_starting(True)
            try:
                self._start_once()
            finally:
                self._set_starting(False)

    def _set_starting(self, value: bool) -> None:
        with self._state:
            self.starting = value

    def _open_log(self):
        if not self.log_path:
            return subprocess.DEVNULL
        os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
        log = open(self.log_path, "ab")
        self._log_start = log.tell()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"[strata] {stamp} engine started: {' '.join(self.argv)} --serve "
                  f"{' '.join(self.args)}\n".encode())
        log.flush()
        return log

    def _start_once(self) -> None:
        self.closed = False
        log = self._open_log()
        cmd = [*self.argv, "--serve", *self.args]
        try:
            popen = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                     cwd=self.cwd, env=self.env, bufsize=0)
        except OSError as e:
            if log is not subprocess.DEVNULL:
                log.close()
            raise EngineDied(f"the engine could not be started ({cmd[0]}: {e})") from None
        with self._state:
            self.gen += 1
            proc = EngineProcess(popen, self.gen, self.slot_cv)
        try:
            info, ctx, can_stop = self._handshake(proc)
        except BaseException:
            self._end_process(proc, polite=False)  # the process of *this* start, never the current one
            if log is not subprocess.DEVNULL:
                log.close()
            raise
        proc.n_vocab = int(info.get("n_vocab") or 0)
        n_slots = max(0, min(8, int(info.get("batch_slots") or 0)))
        if n_slots:
            proc.slots = SlotTable(n_slots)
        with self._state:
            self.info.update(info)
            self.max_context = ctx
            self.known_ctx = ctx
            self.can_stop = can_stop
            self._log = log if log is not subprocess.DEVNULL else None
            self._cur = proc
        start_pump(proc, self.on_line)
        proc.heartbeat = Heartbeat(proc, self.stall_s)
        proc.heartbeat.start()
        with self.slot_cv:
            self.slot_cv.notify_all()

    def _handshake(self, proc: EngineProcess):
        """INFO lines then `READY <ctx> [stop]`, read on a helper thread within `ready_s`."""
        box: dict = {}

        def read():
            info = {}
            try:
                while True:
                    raw = proc.out.readline(MAX_LINE_BYTES)
                    if not raw:
                        box["eof"] = True
                        return
                    line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                    if line.startswith("INFO "):
                        info.update(parse_kv(line.split()[1:]))
                    elif line.startswith("READY"):
                        words = line.split()
                        box["ready"] = (info, int(words[1]), "stop" in words[2:])
                        return
            except (ValueError, IndexError, OSError) as e:
                box["error"] = f"a malformed start line ({e})"

        t = threading.Thread(target=read, daemon=True, name=f"engine-ready-{proc.gen}")
        t.start()
        t.join(self.ready_s if self.ready_s > 0 else None)
        if "ready" in box:
            return box["ready"]
        if t.is_alive():
            why = f"did not report READY within {self.ready_s:g} s (STRATA_ENGINE_READY_S)"
        elif "error" in box:
            why = box["error"]
        else:
            code = proc.popen.wait(timeout=CLOSE_WAIT_S)
            why = f"exited before READY (exit code {code})"
        raise EngineDied(f"the engine {why}{self._log_tail()}")

    def _log_tail(self) -> str:
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_start)
                text = f.read()[-65536:].decode("utf-8", errors="replace")
        except OSError:
            return ""
        lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("[strata]")]
        return ("; log: " + " | ".join(lines[-LOG_TAIL_LINES:])) if lines else ""

    def restart(self, tries: int = 3, retry_s: float = RESTART_RETRY_S) -> None:
        """close() the old process, then up to `tries` starts `retry_s` apart."""
        with self._life:
            self._set_starting(True)
            try:
                self._close()
                err = None
                for i in range(max(1, tries)):
                    if i:
                        time.sleep(retry_s)
                    try:
                        self._start_once()
                        return
                    except EngineDied as e:
                        err = e
                raise err
            finally:
                self._set_starting(False)

    def ensure_running(self) -> None:
        """A dead engine is started again (once; never while another start runs)."""
        if self.alive() or self.starting:
            return
        if not self._life.acquire(timeout=POLL_S):
            return  # a start, restart or close is under way
        self._life.release()
        if not self.alive() and not self.starting:
            self.restart(tries=1)

    def _end_process(self, proc: EngineProcess, polite: bool = True) -> None:
        """QUIT (closing stdin), then terminate, then kill; each waits CLOSE_WAIT_S."""
        p = proc.popen
        proc.ended = True
        if polite and p.poll() is None:
            with contextlib.suppress(EngineDied):
                proc.write("QUIT")
        with contextlib.suppress(OSError, ValueError):
            p.stdin.close()
        for step in (None, p.terminate, p.kill):
            if step is not None and p.poll() is None:
                with contextlib.suppress(OSError):
                    step()
                    if step is p.terminate:
                        p.send_signal(signal.SIGCONT)  # a stopped process acts on SIGTERM only once it runs
            if step is None and not polite:
                continue
            try:
                p.wait(timeout=CLOSE_WAIT_S)
                break
            except subprocess.TimeoutExpired:
                continue
        if p.poll() is None:
            raise EngineStuck("the engine is still releasing memory; retry after it exits")
        if proc.pump is not None and proc.pump is not threading.current_thread():
            proc.pump.join(timeout=CLOSE_WAIT_S)
        with contextlib.suppress(OSError):
            p.stdout.close()

    def close(self) -> None:
        """End the current process (QUIT -> terminate -> kill); safe to call twice. A closed engine stays
        down until start()/restart() (the supervisor leaves it alone)."""
        with self._life:
            self.closed = True
            self._close()

    def _close(self) -> None:
        with self._state:
            proc, self._cur = self._cur, None
            self.max_context = 0
            self.progress = (0, 0)
        if proc is not None:
            self._end_process(proc)
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None

    def kill_now(self) -> None:
        """Last resort (a second Ctrl+C): kill without waiting for QUIT."""
        proc = self._cur
        if proc is not None and proc.popen.poll() is None:
            with contextlib.suppress(OSError):
                proc.popen.kill()

    def death_note(self) -> str:
        """Why the current (or last) process is not running, in one sentence."""
        proc = self._cur
        if proc is None:
            return "the engine is not running"
        if proc.note:
            return proc.note
        code = proc.popen.poll()
        if code is None and proc.ended:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = proc.popen.wait(timeout=1.0)  # stdout closed; the exit follows at once
        if code is None:
            return "the engine is running"
        if proc.last_err:
            return f"the engine stopped (exit code {code}) after: {proc.last_err}"
        tail = self._log_tail()
        if code == -9:
            return f"the engine was killed (signal 9; out of memory?){tail}"
        return f"the engine stopped unexpectedly (exit code {code}){tail}"

    def gone(self, proc: EngineProcess) -> str:
        """Why a request bound to `proc` cannot go on."""
        return ("the engine stopped while this request ran (it restarts for the next one)"
                if proc is not self._cur else self.death_note())

    # ---------------------------------------------------------------- requests
    def generate(self, ids: list[int], max_new: int, keys: str = "", cancelled=None,
                 result: dict | None = None, embed: bool = False, on_wait=None, closing=None):
        """Yields token ids, and None as heartbeats; `result` gets the figures. `embed`: an embedding (BEMB:
        no tokens; `result["embedding"]` gets the vector's `<n_embd> <base64>`). `on_wait()` is called on this
        thread right before each wait for the engine with nothing to read (serve/http/pacing.py). `closing()`
        True: a constrained request ends with its grammar's shortest completion (BCLOSE). Every request runs
        in a decode slot (serve/engine_client/batch.py): `--parallel 1` is one slot."""
        result = {} if result is None else result
        if not self.alive():
            raise EngineDied("the engine is unavailable; this request was not sent")
        yield from self.batch.generate(ids, max_new, keys, cancelled, result, embed, on_wait, closing)

    # ---------------------------------------------------------------- control commands
    @contextlib.contextmanager
    def _exclusive_control(self, timeout_s: float = CONTROL_WAIT_S):
        """Hold the control lines for one command; no request's lines can be taken meanwhile."""
        if not self.ctl.acquire(timeout=timeout_s):
            raise EngineDied("the engine stayed busy; the command was not sent")
        try:
            proc = self._cur
            if proc is None or proc.ended:
                raise EngineDied("the engine is unavailable; the command was not sent")
            end = time.monotonic() + timeout_s
            while proc.admissions and time.monotonic() < end:  # an ERR then answers this command alone
                time.sleep(POLL_S / 10)
            if proc.admissions:
                raise EngineDied("admissions stayed unanswered; the command was not sent")
            with proc.runs_whole():
                yield proc
        finally:
            self.ctl.release()

    def _read_control(self, proc: EngineProcess, deadline_s: float, accept):
        """Lines until `accept(line)` returns a value; ERR -> EngineRefused; EOF -> EngineDied. Silent past
        `deadline_s` (INFO / WARN / SESSION lines renew it), or frozen (silent, no CPU/IO, `stall_s`): the
        process is ended, EngineSilent."""
        clock = Allowance(deadline_s, 0, self.stall_s, proc.popen.pid)
        while True:
            try:
                line = proc.lines.get(timeout=POLL_S)
            except queue.Empty:
                why = clock.expired(time.monotonic())
                if why:
                    why = f"the engine did not answer a control command: {why}"
                    proc.kill(why)
                    raise EngineSilent(why) from None
                continue
            if line is None:
                raise EngineDied(self.death_note())
            if line.startswith("ERR "):
                raise EngineRefused(line[4:])
            value = accept(line)
            if value is not None:
                return value
            if line.startswith(("INFO", "WARN", "SESSION")):
                clock.heard(time.monotonic())

    def vram(self, reserve_mib: int | None = None) -> dict:
        with self._exclusive_control() as proc:
            proc.write("VRAM" if reserve_mib is None else f"VRAM {int(reserve_mib)}")
            figures = self._read_control(
                proc, 120.0, lambda ln: parse_kv(ln.split()[1:]) if ln.startswith("VRAM") else None)
            self.info["vram"] = figures
            return figures

    def control(self, line: str, accept, deadline_s: float | None = None):
        """One control command: hold the control lines, write `line`, read the control lines until
        `accept(line)` returns a value (ERR -> EngineRefused); silent past `deadline_s` (default: the engine's
        silence allowance, at least 60 s) -> EngineSilent. For the batch path's slot files (batch_files.py)."""
        with self._exclusive_control() as proc:
            proc.write(line)
            return self._read_control(proc, deadline_s or max(self.silence_s, 60.0), accept)

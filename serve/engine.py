"""StrataEngine: the one owner of the engine child process and its pipes (docs/PROTOCOL.md).

Role: start `strata-engine --serve <args>`, wait for READY, and turn token-id prompts into a stream of token
ids. Only this class writes the child's stdin (under `_wlock`); only the pump thread of a process reads that
process's stdout. It knows nothing of HTTP, templates or text.

Public surface:
- `StrataEngine(argv, args, log_path=None, ...)`; `start()` (spawn + READY handshake), `restart(tries)`,
  `close()` (QUIT -> terminate -> kill), `alive()`, `death_note()`, `info`, `max_context`, `known_ctx`,
  `can_stop`, `progress`, `gen` (a number per started process).
- `generate(ids, max_new, keys, cancelled, result)`: the solo path. Yields token ids, and `None` as a
  heartbeat (every `HEARTBEAT_S` of quiet and after each PP line). `result` (a dict the caller owns) gets the
  parsed RESUME / PP / DONE figures. The generator's `finally` sends `STOP` and drains to `DONE`/`ERR` when
  the consumer leaves early, so the next request never reads this one's lines.
- `vram(reserve_mib)`, `session_file("SAVE"|"RESTORE", path)`: control commands run under
  `_exclusive_control()`, so they never take a request's lines.
- Exceptions: `EngineDied` (gone / not started / out of step), `EngineSilent` (we ended it: silent, frozen or
  a STOP never answered), `EngineStarting`, `EngineNonFinite`, `EngineStuck`, `EngineRefused` (an `ERR` line:
  the request was refused; the HTTP layer makes it a 400).

Structure for the batch path (issue 3): one pump thread per process with per-process queues (`_Proc`);
requests are tagged with the `_Proc` they were admitted on, so an old pump can never mark its successor
dead and a restart's lines never reach a request of the old process. `ctl` is the control-lines lock; the
solo path holds it for a whole request.
"""
from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import threading
import time
from dataclasses import dataclass, field

try:
    import psutil
except ImportError:  # the frozen-engine check is then off; everything else works
    psutil = None


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


ENGINE_READY_S = 900.0       # a large model on a slow disk can take minutes; env STRATA_ENGINE_READY_S, 0 = forever
ENGINE_STALL_S = 90.0        # silent AND not using CPU/IO this long = frozen; env STRATA_ENGINE_STALL_S, 0 = off
ENGINE_SILENCE_S = 300.0     # no protocol line this long during a request = ended (config engine_silence_s)
STALL_CPU_S = 0.5            # CPU seconds a live engine spends in a stall window, at least
STALL_IO_BYTES = 1 << 20     # or I/O bytes it moves
POLL_S = 0.5                 # each wait on the line queue; also how often `cancelled()` is checked
HEARTBEAT_S = 10.0           # quiet time between heartbeats (None) to the caller
PROMPT_TOK_PER_S_FLOOR = 50  # first-line allowance: silence + prompt tokens / this rate
PROMPT_ALLOWANCE_CAP = 32768  # tokens counted in that allowance
CLOSE_WAIT_S = 20.0          # each of QUIT, terminate, kill gets this long
RESTART_RETRY_S = 15.0       # pause between start attempts
LOG_TAIL_LINES = 20          # log lines quoted when a start fails
MAX_LINE_BYTES = 4 << 20     # the protocol's line limit
LINE_QUEUE_MAX = 1 << 16     # lines buffered per process; a full queue makes the engine wait on its pipe
CTX_SLACK = 8                # the engine refuses n + max_new + CTX_SLACK > context
FATAL_PREFIXES = ("ERR verify: timed out at layer ", "ERR verify batch: timed out at layer ",
                  "ERR verify: an earlier window never finished",
                  "ERR verify batch: an earlier window never finished", "FATAL ")


class EngineDied(RuntimeError):
    """The engine is gone, was never started, or the two sides lost step."""


class EngineSilent(EngineDied):
    """We ended the engine: it was silent past its allowance, frozen, or never answered STOP."""


class EngineStarting(EngineDied):
    """The engine is (re)starting; its context is not known yet."""


class EngineNonFinite(ValueError):
    """The engine's logits were NaN/inf (finish `nonfinite`)."""


class EngineStuck(RuntimeError):
    """The engine process could not be ended."""


class EngineRefused(ValueError):
    """The engine answered `ERR`: the command was refused; no DONE follows."""


def parse_kv(fields) -> dict:
    """`k=v` words -> dict; values that are (optionally negative) digit strings become ints."""
    out = {}
    for word in fields:
        if "=" not in word:
            continue
        k, v = word.split("=", 1)
        out[k] = int(v) if v.lstrip("-").isdigit() and v not in ("", "-") else v
    return out


_DONE_FIELDS = ("generated", "prompt", "prompt_ms", "decode_ms", "finish", "drafts_acc", "drafts_off",
                "reused", "hits", "lookups", "ram_blobs", "file_blobs", "file_mb", "prompt_read",
                "offloaded")


def parse_done(line: str) -> dict:
    """A DONE line -> dict. `-` fields stay None (unknown, never 0); extra k=v pairs are merged."""
    words = line.split()[1:]
    if len(words) < 5:
        raise EngineDied(f"the engine sent a malformed DONE line: {line[:200]!r}")
    out: dict = {}
    positional = [w for w in words if "=" not in w]
    for name, word in zip(_DONE_FIELDS, positional):
        if name == "finish":
            out[name] = word
        elif word == "-":
            out[name] = None
        else:
            try:
                out[name] = float(word) if ("." in word or name.endswith("_ms") or name == "file_mb") \
                    else int(word)
            except ValueError:
                raise EngineDied(f"the engine sent a malformed DONE line: {line[:200]!r}") from None
    out.update(parse_kv(w for w in words if "=" in w))
    return out


@dataclass(eq=False)
class _Proc:
    """One started engine process and everything that belongs only to it."""
    popen: subprocess.Popen
    gen: int
    lines: queue.Queue = field(default_factory=lambda: queue.Queue(LINE_QUEUE_MAX))
    pump: threading.Thread | None = None
    ended: bool = False          # set by its pump at EOF / fatal line, or by us when we end it
    last_err: str | None = None  # an ERR that was the last line before EOF
    note: str | None = None      # our own reason, when we ended it


class StrataEngine:
    """The engine child: spawn, handshake, pump, the solo path, control commands, life cycle."""

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
        self.ctl = threading.Lock()     # the control lines: one solo request or control command at a time
        self._wlock = threading.Lock()  # guards writes to the current process's stdin
        self._state = threading.Lock()  # guards _cur, gen, starting, info, max_context, known_ctx
        self._cur: _Proc | None = None
        self.gen = 0
        self.starting = False
        self.info: dict = {}
        self.max_context = 0
        self.known_ctx = 0
        self.can_stop = False
        self.progress = (0, 0)          # (reached, total) of the last PP line (for /metrics)
        self.prefill_tok_s = None
        self._log_start = 0
        self._log = None
        self.batch = None               # serve.batch.BatchPath once an engine reports batch_slots > 0

    # ---------------------------------------------------------------- life cycle
    def alive(self) -> bool:
        p = self._cur
        return p is not None and not p.ended and p.popen.poll() is None

    def start(self) -> None:
        """Spawn one process and wait for READY; on failure that process is cleaned up, EngineDied raised."""
        with self._state:
            self.starting = True
        try:
            self._start_once()
        finally:
            with self._state:
                self.starting = False

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
            proc = _Proc(popen, self.gen)
        try:
            info, ctx, can_stop = self._handshake(proc)
        except BaseException:
            self._end_process(proc, polite=False)  # the process of *this* start, never the current one
            if log is not subprocess.DEVNULL:
                log.close()
            raise
        proc.pump = threading.Thread(target=self._pump, args=(proc,), daemon=True,
                                     name=f"engine-pump-{proc.gen}")
        if int(info.get("batch_slots") or 0) > 0:  # issue 3: slot queues of this process, before its pump
            if self.batch is None:
                from serve.batch import BatchPath
                self.batch = BatchPath(self)
            self.batch.attach(proc, info)
        with self._state:
            self.info.update(info)
            self.max_context = ctx
            self.known_ctx = ctx
            self.can_stop = can_stop
            self._log = log if log is not subprocess.DEVNULL else None
            self._cur = proc
        proc.pump.start()

    def _handshake(self, proc: _Proc):
        """INFO lines then `READY <ctx> [stop]`, read on a helper thread within `ready_s`."""
        box: dict = {}

        def read():
            info = {}
            try:
                while True:
                    raw = proc.popen.stdout.readline(MAX_LINE_BYTES)
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
        with self._state:
            self.starting = True
        try:
            self.close()
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
            with self._state:
                self.starting = False

    def _end_process(self, proc: _Proc, polite: bool = True) -> None:
        """QUIT (closing stdin), then terminate, then kill; each waits CLOSE_WAIT_S."""
        p = proc.popen
        proc.ended = True
        if polite and p.poll() is None:
            try:
                with self._wlock:
                    p.stdin.write(b"QUIT\n")
                    p.stdin.flush()
            except (OSError, ValueError):
                pass
        with contextlib.suppress(OSError, ValueError):
            p.stdin.close()
        for step in (None, p.terminate, p.kill):
            if step is not None and p.poll() is None:
                with contextlib.suppress(OSError):
                    step()
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
        """End the current process (QUIT -> terminate -> kill); safe to call twice."""
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
        if code < 0 and code in (-9,):
            return f"the engine was killed (signal {-code}; out of memory?){tail}"
        return f"the engine stopped unexpectedly (exit code {code}){tail}"

    # ---------------------------------------------------------------- the pump
    def _pump(self, proc: _Proc) -> None:
        out = proc.popen.stdout
        last = None
        try:
            while True:
                raw = out.readline(MAX_LINE_BYTES)
                if not raw:
                    break
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if self.on_line is not None:
                    self.on_line(line)
                if line.startswith(FATAL_PREFIXES):
                    proc.note = f"the engine reported a fatal error: {line[:300]}"
                    proc.ended = True
                    with contextlib.suppress(OSError):
                        proc.popen.terminate()
                    break
                last = line
                if self.batch is not None and self.batch.route(proc, line):
                    continue  # BT/BDONE: to that slot's claimant (or dropped as stale)
                proc.lines.put(line)
        except (OSError, ValueError):
            pass
        if last is not None and last.startswith("ERR "):
            proc.last_err = last[4:]
        proc.ended = True  # only this process's flag: a successor has its own _Proc
        proc.lines.put(None)
        if self.batch is not None:
            self.batch.proc_ended(proc)

    # ---------------------------------------------------------------- writing
    def _write(self, proc: _Proc, line: str) -> None:
        try:
            with self._wlock:
                proc.popen.stdin.write(line.encode() + b"\n")
                proc.popen.stdin.flush()
        except (OSError, ValueError):
            code = proc.popen.poll()
            raise EngineDied(f"the engine stopped unexpectedly (exit code {code})") from None

    def _kill(self, proc: _Proc, note: str) -> None:
        proc.note = note
        proc.ended = True
        with contextlib.suppress(OSError):
            proc.popen.kill()

    # ---------------------------------------------------------------- the solo path
    def generate(self, ids: list[int], max_new: int, keys: str = "", cancelled=None,
                 result: dict | None = None):
        """Solo request: yields token ids, and None as heartbeats; `result` gets the figures."""
        result = {} if result is None else result
        if not self.alive():
            raise EngineDied("the engine is unavailable; this request was not sent")
        if self.batched():
            yield from self.generate_batched(ids, max_new, keys, cancelled, result)
            return
        acquired = False
        while not acquired:
            acquired = self.ctl.acquire(timeout=POLL_S)
            if not acquired:
                if cancelled is not None and cancelled():
                    result["finish"] = "cancel"
                    return
                yield None
        try:
            yield from self._solo(self._cur, ids, max_new, keys, cancelled, result)
        finally:
            self.ctl.release()

    def batched(self) -> bool:
        """Whether the current process has decode slots (then requests run concurrently)."""
        return self.batch is not None and getattr(self._cur, "slots", None) is not None

    def generate_batched(self, ids, max_new, keys="", cancelled=None, result=None):
        """The batch path (serve/batch.py): same contract as generate()."""
        return self.batch.generate(ids, max_new, keys, cancelled, result)

    def _solo(self, proc, ids, max_new, keys, cancelled, result):
        if proc is None or proc.ended:
            raise EngineDied("the engine is unavailable; this request was not sent")
        keys = (" " + keys.strip()) if keys and keys.strip() else ""
        self._write(proc, f"GEN {max_new}{keys} {','.join(map(str, ids))}")
        clock = _Allowance(self.silence_s, len(ids), self.stall_s, proc.popen.pid)
        done = False
        try:
            last_beat = time.monotonic()
            while True:
                try:
                    line = proc.lines.get(timeout=POLL_S)
                except queue.Empty:
                    line = ""
                now = time.monotonic()
                if line is None:
                    done = True
                    raise EngineDied(self.death_note() if proc is self._cur else "the engine stopped")
                if not line:
                    if cancelled is not None and cancelled():
                        result["finish"] = "cancel"
                        return
                    why = clock.expired(now)
                    if why:
                        done = True
                        self._kill(proc, why)
                        raise EngineSilent(why)
                    if now - last_beat >= HEARTBEAT_S:
                        last_beat = now
                        yield None
                    continue
                clock.heard(now)
                kind, _, rest = line.partition(" ")
                if kind == "T":
                    clock.token(now)
                    yield int(rest)
                    if cancelled is not None and cancelled():
                        result["finish"] = "cancel"
                        return
                elif kind == "PP":
                    words = rest.split()
                    reached, total = int(words[0]), int(words[1])
                    rate = float(words[3]) if len(words) > 3 else 0.0
                    clock.chunk(now, reached, rate)
                    self.progress = (reached, total)
                    if rate > 0:
                        self.prefill_tok_s = rate
                    result["prompt_reached"] = reached
                    last_beat = now
                    yield None
                    if cancelled is not None and cancelled():
                        result["finish"] = "cancel"
                        return
                elif kind == "RESUME":
                    result["reused"] = int(rest.split()[0])
                    clock.chunk(now, result["reused"], 0.0)
                elif kind == "DONE":
                    done = True
                    result.update(parse_done(line))
                    if result.get("finish") == "nonfinite":
                        raise EngineNonFinite("the engine produced non-finite logits")
                    return
                elif kind == "ERR":
                    done = True
                    raise EngineRefused(rest)
                # INFO / WARN / anything else: log-like, ignored
        finally:
            if not done:
                self._drain(proc, clock, result)

    def _drain(self, proc: _Proc, clock, result: dict) -> None:
        """The consumer left early: STOP, then read to DONE/ERR so the next request starts clean."""
        if proc.ended or proc.popen.poll() is not None:
            return
        try:
            if self.can_stop:
                self._write(proc, "STOP")
        except EngineDied:
            return
        clock.heard(time.monotonic())
        while True:
            try:
                line = proc.lines.get(timeout=POLL_S)
            except queue.Empty:
                why = clock.expired(time.monotonic())
                if why:
                    self._kill(proc, "the engine did not answer STOP; " + why)
                    return
                continue
            if line is None:
                return
            clock.heard(time.monotonic())
            if not self.can_stop:
                clock.token(time.monotonic())
            if line.startswith("DONE"):
                with contextlib.suppress(EngineDied):
                    figures = parse_done(line)
                    figures["finish"] = "cancel"
                    result.update(figures)
                return
            if line.startswith("ERR"):
                return

    # ---------------------------------------------------------------- control commands
    @contextlib.contextmanager
    def _exclusive_control(self, timeout_s: float = 300.0):
        """Hold the control lines for one command; no request's lines can be taken meanwhile."""
        if not self.ctl.acquire(timeout=timeout_s):
            raise EngineDied("the engine stayed busy; the command was not sent")
        try:
            proc = self._cur
            if proc is None or proc.ended:
                raise EngineDied("the engine is unavailable; the command was not sent")
            yield proc
        finally:
            self.ctl.release()

    def _read_control(self, proc: _Proc, deadline_s: float, accept):
        """Lines until `accept(line)` returns a value; ERR -> EngineRefused; EOF -> EngineDied."""
        end = time.monotonic() + deadline_s
        while True:
            left = end - time.monotonic()
            if left <= 0:
                self._kill(proc, "the engine did not answer a control command")
                raise EngineSilent("the engine did not answer a control command")
            try:
                line = proc.lines.get(timeout=min(POLL_S, left))
            except queue.Empty:
                continue
            if line is None:
                raise EngineDied(self.death_note())
            if line.startswith("ERR "):
                raise EngineRefused(line[4:])
            value = accept(line)
            if value is not None:
                return value
            if line.startswith(("INFO", "WARN", "SESSION")):
                end = time.monotonic() + deadline_s

    def vram(self, reserve_mib: int | None = None) -> dict:
        with self._exclusive_control() as proc:
            self._write(proc, "VRAM" if reserve_mib is None else f"VRAM {int(reserve_mib)}")
            figures = self._read_control(
                proc, 120.0, lambda ln: parse_kv(ln.split()[1:]) if ln.startswith("VRAM") else None)
            self.info["vram"] = figures
            return figures

    def session_file(self, action: str, path: str) -> dict:
        if action not in ("SAVE", "RESTORE") or any(c in path for c in "\r\n\0"):
            raise ValueError("a session file action is SAVE or RESTORE with a plain path")
        answer = "SAVED" if action == "SAVE" else "RESTORED"

        def accept(line):
            words = line.split()
            if words[0] == "SERR":
                raise EngineRefused(" ".join(words[1:]))
            if words[0] == answer and len(words) == 4:
                return {"tokens": int(words[1]), "bytes": int(words[2]), "ms": float(words[3])}
            return None

        with self._exclusive_control() as proc:
            self._write(proc, f"{action} {path}")
            return self._read_control(proc, max(self.silence_s, 60.0), accept)


class _Allowance:
    """How long the engine may stay silent now (PROTOCOL / UPSTREAM 4.3 steps 3-4)."""

    def __init__(self, silence_s: float, n_prompt: int, stall_s: float, pid: int):
        self.silence_s = silence_s
        self.allow_s = silence_s + min(n_prompt, PROMPT_ALLOWANCE_CAP) / PROMPT_TOK_PER_S_FLOOR
        self.last = time.monotonic()
        self.chunk_from = 0
        self.stall_s = stall_s
        self.pid = pid
        self.base = None   # (time, cpu_s, io_bytes) taken soon after the last line
        self.warned = False

    def heard(self, now):
        self.last = now
        self.base = None

    def token(self, now):
        self.allow_s = self.silence_s

    def chunk(self, now, reached, rate):
        if rate > 0:
            self.allow_s = max(self.silence_s, 3.0 * max(1, reached - self.chunk_from) / rate)
        self.chunk_from = reached

    def _usage(self):
        try:
            p = psutil.Process(self.pid)
            cpu = sum(p.cpu_times()[:2])
            try:
                io = p.io_counters()
                moved = io.read_bytes + io.write_bytes
            except (AttributeError, psutil.AccessDenied):
                moved = 0
            return cpu, moved
        except (psutil.Error, OSError):
            return None

    def expired(self, now) -> str | None:
        quiet = now - self.last
        if self.silence_s > 0 and quiet > self.allow_s:
            return f"the engine was silent for {quiet:.0f} s (allowance {self.allow_s:.0f} s); it was ended"
        if self.stall_s <= 0 or psutil is None:
            return None
        if self.base is None:
            usage = self._usage()
            if usage is not None:
                self.base = (now, *usage)
            return None
        if now - self.base[0] < self.stall_s:
            return None
        usage = self._usage()
        if usage is None:
            return None
        cpu_grew, io_grew = usage[0] - self.base[1], usage[1] - self.base[2]
        self.base = (now, *usage)
        if cpu_grew <= STALL_CPU_S and io_grew <= STALL_IO_BYTES:
            return (f"the engine was frozen: silent for {quiet:.0f} s using no CPU "
                    f"(STRATA_ENGINE_STALL_S={self.stall_s:g}); it was ended")
        return None

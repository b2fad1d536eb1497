"""The engine line protocol, client side (docs/PROTOCOL.md): its vocabulary, parsing, and one engine process.

Role: everything the engine's owner (serve/engine_client/engine.py: start, control commands, supervision) and
the slot path (serve/engine_client/batch.py: `BGEN`) share, so neither reaches into the other. `EngineProcess` is one started `strata-engine --serve`: its pipes, the only
writer of its stdin (`write`, under `wlock`) and its pump thread, the only reader of its stdout, which routes
every slot line (`BPP`/`BT`/`BDONE <slot>`) to the queue of the request that owns that slot (or drops and
counts it when nobody does), a `PONG <n>` to `pong` (the heartbeat's, serve/engine_client/liveness.py) and every
other line to the control queue `lines`. A request thread reads only the queues of the process it was admitted
on. It knows nothing of HTTP, templates or text.

Writers of stdin: every line goes through `write` (blocking, under `wlock`), except the heartbeat's `PING`,
which goes through `write_nowait` (under `wlock` too, taken with a limit, and only when the pipe has room), so a
frozen engine whose pipe is full never blocks the heartbeat.

Public surface: the exceptions; `EngineClient` (serve/core/engine_api.py's, named here too);
`EngineProcess`, `start_pump`; `parse_kv`, `parse_done`, `parse_bdone`, `parse_token` (and its `Sampled`), `parse_progress`;
`Allowance`; the constants below.
"""
from __future__ import annotations

import collections
import contextlib
import io
import os
import queue
import select
import subprocess
import threading
import time
from dataclasses import dataclass, field

try:
    import psutil
except ImportError:  # the frozen-engine check is then off; everything else works
    psutil = None

from serve.core.engine_api import EngineClient  # noqa: F401 (named here too)
from serve.engine_client.slot_table import SlotTable

ENGINE_SILENCE_S = 300.0     # no protocol line this long during a request = ended (config engine_silence_s)
STALL_CPU_S = 0.5            # CPU seconds a live engine spends in a stall window, at least
STALL_IO_BYTES = 1 << 20     # or I/O bytes it moves
POLL_S = 0.5                 # each wait on a line queue; also how often `cancelled()` is checked
HEARTBEAT_S = 10.0           # quiet time between heartbeats (None) to the caller
PROMPT_TOK_PER_S_FLOOR = 50  # first-line allowance: silence + prompt tokens / this rate
PROMPT_ALLOWANCE_CAP = 32768  # tokens counted in that allowance
MAX_LINE_BYTES = 4 << 20     # the protocol's line limit
LINE_QUEUE_MAX = 1 << 16     # control lines buffered per process; a full queue makes the engine wait on its pipe
CTX_SLACK = 8                # the engine refuses n + max_new + CTX_SLACK > context
SLOTS_MAX = 8                # the engine's limit (--batch 1..8)
SLOT_WORDS = ("BPP", "BT", "BVEC", "BDONE")  # lines that name a slot: routed to its owner's queue
FATAL_PREFIXES = ("ERR verify: timed out at layer ", "ERR verify batch: timed out at layer ",
                  "ERR verify: an earlier window never finished",
                  "ERR verify batch: an earlier window never finished", "FATAL ")


class EngineDied(RuntimeError):
    """The engine is gone, was never started, or the two sides lost step."""


class EngineSilent(EngineDied):
    """We ended the engine: it was silent past its allowance, frozen, or never answered STOP."""


class EngineStarting(EngineDied):
    """The engine is (re)starting; its context is not known yet."""


class EngineBadLine(EngineDied):
    """The engine wrote a line that breaks the protocol (a malformed number, a token id outside the
    vocabulary); the process was ended. An engine fault (502), never the client's."""


class EngineNonFinite(ValueError):
    """The engine's logits were NaN/inf (finish `nonfinite`)."""


class EngineStuck(RuntimeError):
    """The engine process could not be ended."""


class EngineRefused(ValueError):
    """The engine answered `ERR`: the command was refused; no DONE follows."""


# ---------------------------------------------------------------------------------------------- parsing
def parse_kv(fields) -> dict:
    """`k=v` words -> dict; values that are (optionally negative) digit strings become ints."""
    out = {}
    for word in fields:
        if "=" not in word:
            continue
        k, v = word.split("=", 1)
        out[k] = int(v) if v.lstrip("-").isdigit() and v not in ("", "-") else v
    return out


def _number(name: str, word: str, line: str):
    if word == "-":
        return None  # not measured: unknown, never 0
    try:
        return float(word) if ("." in word or name.endswith("_ms") or name == "file_mb") else int(word)
    except ValueError:
        raise EngineBadLine(f"the engine sent a malformed line: {line[:200]!r}") from None


_DONE_FIELDS = ("generated", "prompt", "prompt_ms", "decode_ms", "finish", "drafts_acc", "drafts_off",
                "reused", "hits", "lookups", "ram_blobs", "file_blobs", "file_mb", "prompt_read",
                "offloaded")
_BDONE_FIELDS = ("generated", "finish", "decode_ms", "prompt", "prompt_ms", "reused", "prompt_read")


def _parse_fields(names, words, line) -> dict:
    out: dict = {}
    positional = [w for w in words if "=" not in w]
    for name, word in zip(names, positional):
        out[name] = word if name == "finish" else _number(name, word, line)
    out.update(parse_kv(w for w in words if "=" in w))
    return out


def parse_done(line: str) -> dict:
    """A DONE line -> dict. `-` fields stay None (unknown, never 0); extra k=v pairs are merged."""
    words = line.split()[1:]
    if len(words) < 5:
        raise EngineBadLine(f"the engine sent a malformed DONE line: {line[:200]!r}")
    return _parse_fields(_DONE_FIELDS, words, line)


def parse_bdone(line: str) -> dict:
    """`BDONE <slot> <generated> <finish> <decode_ms> <prompt> <prompt_ms> <reused> <prompt_read>` -> dict
    (without the slot); fields an older engine leaves out are absent."""
    words = line.split()[2:]
    if len(words) < 2:
        raise EngineBadLine(f"the engine sent a malformed BDONE line: {line[:200]!r}")
    return _parse_fields(_BDONE_FIELDS, words, line)


class Sampled(int):
    """A token id whose T/BT line carried log-probabilities (the request's `logprobs=K`): `logprob`, the
    sampled token's (float; -inf where its bias was -inf), and `top`, [(id, logprob)] best first (K of them).
    It is an int everywhere else, so paths that know nothing of log-probabilities pass it through."""
    logprob: float
    top: list


def _logprob(word: str, n_vocab: int, line: str) -> float:
    try:
        value = float(word)
    except ValueError:
        value = float("nan")
    if value != value or value > 1e-3:  # NaN, or a probability over 1
        raise EngineBadLine(f"the engine sent a malformed token line: {line[:200]!r}")
    return value


def _sampled(tid: int, words: list[str], n_vocab: int, line: str) -> int:
    """`lp=<f> [top=<id>:<f>,...]` after a token id -> Sampled; other k=v words are skipped."""
    out = tid
    for word in words:
        key, _, value = word.partition("=")
        if key == "lp":
            out = Sampled(tid)
            out.logprob, out.top = _logprob(value, n_vocab, line), []
        elif key == "top" and isinstance(out, Sampled):
            for item in value.split(","):
                i, _, v = item.partition(":")
                out.top.append((parse_token(i, n_vocab, line), _logprob(v, n_vocab, line)))
    return out


def parse_token(word: str, n_vocab: int, line: str) -> int:
    """The token id of a T/BT line (`word`: what follows the command word, and the slot's); anything but an
    id of the vocabulary is a broken engine line. Log-probabilities after it (docs/PROTOCOL.md, `logprobs=`)
    make it a `Sampled`."""
    head, *more = word.split(" ")
    try:
        tid = int(head)
    except ValueError:
        tid = -1
    if not 0 <= tid < (n_vocab or (1 << 31)):
        raise EngineBadLine(f"the engine sent a malformed token line: {line[:200]!r}")
    return _sampled(tid, more, n_vocab, line) if more else tid


def parse_progress(words: list[str], line: str) -> tuple[int, int, float]:
    """`<reached> <total> <ms> <tok_s>` of a PP/BPP line -> (reached, total, tok_s)."""
    try:
        return int(words[0]), int(words[1]), (float(words[3]) if len(words) > 3 else 0.0)
    except (ValueError, IndexError):
        raise EngineBadLine(f"the engine sent a malformed progress line: {line[:200]!r}") from None


def slot_of(line: str) -> int | None:
    """The slot a BPP/BT/BDONE line names, else None (a control line)."""
    word, _, rest = line.partition(" ")
    if word not in SLOT_WORDS:
        return None
    try:
        return int(rest.split(" ", 1)[0])
    except ValueError:
        return -1  # a slot line naming no slot: nobody's


# ---------------------------------------------------------------------------------------------- one process
@dataclass(eq=False)
class EngineProcess:
    """One started engine process and everything that belongs only to it. `slots` (batch engines) is its
    slot table, guarded by `cv` (the engine's slot_cv), except `heard`, a float the pump stores."""
    popen: subprocess.Popen
    gen: int
    cv: threading.Condition
    n_vocab: int = 0
    slots: SlotTable | None = None
    lines: queue.Queue = field(default_factory=lambda: queue.Queue(LINE_QUEUE_MAX))
    admissions: collections.deque = field(default_factory=collections.deque)  # slots of BGENs not yet
    #   answered, in the order written (guarded by cv): the engine answers each, in order, BACC or ERR
    wlock: threading.Lock = field(default_factory=threading.Lock)  # guards writes to stdin
    pump: threading.Thread | None = None
    ended: bool = False          # set by its pump at EOF / fatal line, or by us when we end it
    last_err: str | None = None  # an ERR that was the last line before EOF
    note: str | None = None      # our own reason, when we ended it
    heard: float = field(default_factory=time.monotonic)  # the last line it wrote (any kind)
    out: io.BufferedReader | None = None  # its stdout, buffered: the handshake's and then the pump's reader
    heartbeat: object | None = None  # its Heartbeat (serve/engine_client/liveness.py), once started
    pong: int = 0                # the number of the last `PONG <n>` (stored by the pump, read by the heartbeat)
    whole_since: float | None = None  # when the holder of `ctl` wrote a command the engine's loop runs whole
    #   before it takes a PING (BSAVE, BRESTORE, VRAM); None when none runs. Set and cleared only by
    #   that holder (`runs_whole()`); a PING written after it is answered after it (docs/PROTOCOL.md)

    def __post_init__(self):
        # popen's pipes are unbuffered (bufsize=0: each write reaches the engine at once); a raw readline
        # would read one byte per system call, 12 a token line, so lines are read through one buffer, always
        # by this reader (the handshake's thread, then the pump), never by two at once.
        if self.out is None and self.popen is not None and self.popen.stdout is not None:
            self.out = io.BufferedReader(self.popen.stdout, 1 << 16)

    def write(self, line: str) -> None:
        try:
            with self.wlock:
                self.popen.stdin.write(line.encode() + b"\n")
                self.popen.stdin.flush()
        except (OSError, ValueError):
            raise EngineDied(f"the engine stopped unexpectedly (exit code {self.popen.poll()})") from None

    def write_nowait(self, line: str, lock_wait_s: float) -> bool:
        """Write one short line (under PIPE_BUF bytes: all or nothing) without ever blocking on the engine:
        False when `wlock` stayed taken for `lock_wait_s` (a writer is blocked on a full pipe), when the pipe
        has no room (the engine reads nothing), or when the process is gone."""
        data = line.encode() + b"\n"
        if not self.wlock.acquire(timeout=lock_wait_s):
            return False
        try:
            fd = self.popen.stdin.fileno()
            if not select.select([], [fd], [], 0)[1]:
                return False
            return os.write(fd, data) == len(data)
        except (OSError, ValueError):
            return False
        finally:
            self.wlock.release()

    @contextlib.contextmanager
    def runs_whole(self):
        """Around a command the engine's loop runs whole (a control command: BSAVE, BRESTORE, VRAM): the heartbeat
        then waits for its end before it asks for a PONG (the request's own clock watches it meanwhile)."""
        self.whole_since = time.monotonic()
        try:
            yield
        finally:
            self.whole_since = None

    def kill(self, note: str) -> None:
        self.note = note
        self.ended = True
        with contextlib.suppress(OSError):
            self.popen.kill()

    def admit(self, slot: int, line: str) -> None:
        """Write a BGEN for `slot` and note it as waiting for its answer (BACC or ERR, routed to that slot's
        queue by the pump). Admissions are pipelined: several may wait for answers at once."""
        with self.cv:
            self.admissions.append(slot)
        try:
            self.write(line)
        except EngineDied:
            with self.cv:
                self.admissions.remove(slot)
            raise

    def route(self, line: str) -> None:
        """The pump's routing, in the order the engine wrote: a slot line goes to its owner's queue once the
        owner's `BACC` was seen (so a stale line from before the admission is never taken for its own), else
        it is dropped and counted; the answer to a pipelined BGEN (BACC, or an ERR while admissions wait:
        the oldest one's) goes to that slot's queue; a PONG sets `pong`; every other line goes to the
        control queue."""
        if line.startswith("PONG "):
            word = line[5:].strip()
            if word.isdigit():
                self.pong = max(self.pong, int(word))
            return
        b = slot_of(line) if self.slots is not None else None
        if b is None:
            if not (self.slots is not None and self._answer(line)):
                self.lines.put(line)
            return
        with self.cv:
            if 0 <= b < self.slots.n and self.slots.owner[b] is not None and self.slots.open[b]:
                self.slots.q[b].put(line)
            else:
                self.slots.stale_frames += 1

    def _answer(self, line: str) -> bool:
        """An admission's answer: BACC <slot> opens the slot for its lines; ERR answers the oldest admission."""
        is_bacc, is_err = line.startswith("BACC "), line.startswith("ERR ")
        if not (is_bacc or is_err):
            return False
        with self.cv:
            if not self.admissions:
                return False  # an answer nobody waits for: a control command's (or a stray line)
            b = self.admissions.popleft()
            if is_bacc and line.split(" ")[1:2] != [str(b)]:
                self.slots.stale_frames += 1  # out of step with what was written: left to the control queue
                return False
            if self.slots.owner[b] is not None:
                self.slots.open[b] = is_bacc
                self.slots.q[b].put(line)
            return True

    def ended_now(self) -> None:
        """EOF: every queue of this process gets its end mark (None); waiters on cv are woken."""
        self.ended = True
        self.lines.put(None)
        with self.cv:
            if self.slots is not None:
                for q in self.slots.q:
                    q.put(None)
            self.cv.notify_all()


def start_pump(proc: EngineProcess, on_line=None) -> None:
    proc.pump = threading.Thread(target=_pump, args=(proc, on_line), daemon=True, name=f"engine-pump-{proc.gen}")
    proc.pump.start()


def _pump(proc: EngineProcess, on_line) -> None:
    out = proc.out
    last = None
    try:
        while True:
            raw = out.readline(MAX_LINE_BYTES)
            if not raw:
                break
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            proc.heard = time.monotonic()
            if on_line is not None:
                on_line(line)
            if line.startswith(FATAL_PREFIXES):
                proc.note = f"the engine reported a fatal error: {line[:300]}"
                proc.ended = True
                with contextlib.suppress(OSError):
                    proc.popen.terminate()
                break
            last = line
            proc.route(line)
    except (OSError, ValueError):
        pass
    if last is not None and last.startswith("ERR "):
        proc.last_err = last[4:]
    proc.ended_now()  # only this process's queues: a successor has its own


# ---------------------------------------------------------------------------------------------- silence
class Allowance:
    """How long the engine may stay silent now (PROTOCOL / UPSTREAM 4.3 steps 3-4)."""

    def __init__(self, silence_s: float, n_prompt: int, stall_s: float, pid: int):
        self.silence_s = silence_s
        self.allow_s = silence_s + min(n_prompt, PROMPT_ALLOWANCE_CAP) / PROMPT_TOK_PER_S_FLOOR
        self.last = time.monotonic()
        self.chunk_from = 0
        self.stall_s = stall_s
        self.pid = pid
        self.base = None   # (time, cpu_s, io_bytes) taken soon after the last line

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

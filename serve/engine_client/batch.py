"""The one request path of StrataEngine: requests in decode slots, scheduled by the engine (UPSTREAM 4.4).

Role: run requests on one engine started with `--batch N` (N = the server's `--parallel`, 1 included). The engine owns the schedule (one step = the
decoding slots' tokens, then prompt chunks shortest remaining first; docs/PROTOCOL.md "Slot steps"); a
request thread here only claims a free slot, submits `BGEN` and reads its own slot queue, which the process's
pump fills (serve/engine_client/protocol.py). It knows nothing of HTTP or text, and nothing of StrataEngine's
privates: it uses `engine.current()`, `alive()`, `starting`, `gone()`, `info`, `ctl`, `slot_cv`.

Locks: `engine.slot_cv` guards every process's slot table (`SlotTable`: owners, held streams, queues' routing)
and `waiting` (requests waiting for a free slot, served short first: `STRATA_ADMIT_SHORT_FIRST`, a long prompt
that waited `STRATA_ADMIT_MAX_WAIT_S` counts as short). `engine.ctl` guards the control lines: writing a `BGEN`
(and noting it as waiting for its answer) or a whole control command. Admissions are pipelined: the answer,
`BACC` or `ERR`, comes on the request's own slot queue (the pump attributes it; docs/PROTOCOL.md). Every
wait has a limit, and each also ends when its process ends: the process's heartbeat
(serve/engine_client/liveness.py) ends a frozen engine within STRATA_ENGINE_STALL_S of its last line, whether
requests wait for a slot, for an admission's BACC or for their next token.

Rules it keeps (each has a test in tests/serve/test_batch*.py):
- Ownership: a request is bound to the process it was admitted on, reads only that process's queues and never
  writes to a later one (EngineDied instead). A request still waiting for a slot was sent nowhere: when its
  process ends it keeps its place and goes to the replacement once that is up (`STRATA_REQUEUE_WAIT_S`), or
  gets EngineDied when the engine was closed on purpose or none came. Slot lines for a slot nobody owns, or that come before its
  owner's BACC, are dropped and counted.
- A waiter re-reads its turn and its process's end under slot_cv right before waiting (no lost notification);
  a waiter that leaves notifies the others.
- A request that leaves early sends `BSTOP` and reads its slot to `BDONE` (keeping the figures) for up to
  `LEAVE_WAIT_S`; past that the slot stays quarantined (claimed) until its BDONE, on a thread of its own.
  The wait for the admission's answer (`ACCEPT_TIMEOUT_S`) and the quarantine (`QUARANTINE_S`) count from the last line the
  engine wrote; when they run out the engine is ended: a slot whose lines may still come is never reused.
- Accounting: one request = one BGEN = one BDONE with its figures; figures the engine never reported stay
  None, never 0.

Public surface: `BatchPath(engine)`, `.generate(ids, max_new, keys, cancelled, result)`, `.slot_view()`,
`.stats()`; `conversation_slots(engine)`, `eos_ids(info)`.
"""
from __future__ import annotations

import itertools
import os
import queue
import threading
import time

from serve.engine_client.protocol import (
    HEARTBEAT_S, POLL_S, SLOTS_MAX, Allowance, EngineBadLine, EngineDied, EngineNonFinite, EngineRefused,
    EngineSilent, parse_bdone, parse_progress, parse_token)
from serve.engine_client.slot_table import pick_slot

SLOT_WAIT_STEP_S = 1.0        # each wait for a free slot; cancel and the process's end are checked this often
ADMIT_LONG_TOKENS = 1024      # a prompt longer than this is "long" for admission order
ADMIT_MAX_WAIT_S = 30.0       # a long prompt that waited this long counts as short
ACCEPT_TIMEOUT_S = 300.0      # BGEN's answer: engine silence allowed before it is ended (BACC is immediate)
QUARANTINE_S = 600.0          # a BSTOPped slot's BDONE: engine silence allowed before it is ended
LEAVE_WAIT_S = 2.0            # a request that leaves waits this long for its BDONE (its figures) itself
CONTROL_WAIT_S = 300.0        # the control lines are held for one short exchange; waiting longer = stuck
REQUEUE_WAIT_S = 60.0         # a waiter whose engine died waits this long for the replacement (the supervisor's
                              # restart: its backoff, then the model's load) before it gets EngineDied
_SEQ = itertools.count(1)


def _env_float(name, default):
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def eos_ids(info) -> set[int]:
    raw = str(info.get("eos", ""))
    return {int(x) for x in raw.split(",") if x.strip().lstrip("-").isdigit()}


def conversation_slots(engine) -> int:
    """Decode slots of this engine, known before READY (from its `--batch`/`--slots` flag), else 0."""
    n = engine.info.get("batch_slots") if engine.info else None
    if isinstance(n, int):
        return n
    args = list(getattr(engine, "args", []))
    for i, a in enumerate(args[:-1]):
        if a in ("--batch", "--slots") and args[i + 1].isdigit():
            return max(0, min(SLOTS_MAX, int(args[i + 1])))
    return 0


class _Waiter:
    __slots__ = ("plen", "arrival", "seq")

    def __init__(self, plen, arrival):
        self.plen, self.arrival, self.seq = plen, arrival, next(_SEQ)


class _SlotRequest:
    """One request's state; only its own thread touches it (the slot claim goes through slot_cv)."""

    def __init__(self, ids, max_new, keys, cancelled, embed=False, on_wait=None, closing=None):
        self.ids = list(ids)
        self.embed = embed        # BEMB: an embedding (no tokens; BVEC before BDONE)
        self.max_new = int(max_new)
        self.keys = (" " + keys.strip()) if keys and keys.strip() else ""
        self.cancelled = cancelled or (lambda: False)
        self.on_wait = on_wait or (lambda: None)   # before each wait with nothing to read (stream_pacing)
        self.arrival = time.monotonic()
        self.proc = None          # the process it was admitted on
        self.slot = None          # the slot it claims
        self.sent = False         # BGEN written: its answer will come (BACC or ERR)
        self.accepted = False     # BACC seen: lines for its slot will come until BDONE
        self.stopped = False      # BSTOP sent
        self.closing = closing or (lambda: False)  # True: BCLOSE (the grammar's shortest completion, then BDONE)
        self.close_sent = False   # BCLOSE written
        self.stop_at = 0.0        # when
        self.out: list[int] = []
        self.figures: dict = {}   # the caller's result: progress, then BDONE's figures

    def cancel(self) -> bool:
        return bool(self.cancelled())


class BatchPath:
    """Slot claims, the BGEN exchange and the slot reads for one StrataEngine (survives restarts)."""

    def __init__(self, engine):
        self.engine = engine
        self.cv = engine.slot_cv                 # slot_cv (see the module docstring)
        self.waiting: dict[int, _Waiter] = {}    # requests waiting for a free slot
        self.short_first = os.environ.get("STRATA_ADMIT_SHORT_FIRST", "1") != "0"
        self.max_wait_s = _env_float("STRATA_ADMIT_MAX_WAIT_S", ADMIT_MAX_WAIT_S)
        self.requeue_wait_s = _env_float("STRATA_REQUEUE_WAIT_S", REQUEUE_WAIT_S)
        self.quarantines = 0
        self.requeued = 0                        # waiters carried over to a replacement process

    # ------------------------------------------------------------------ views
    def slot_view(self) -> list[dict]:
        proc = self.engine.current()
        slots = proc.slots if proc is not None else None
        if slots is None:
            return []
        now = time.monotonic()
        out = []
        with self.cv:
            for b in range(slots.n):
                live = slots.live[b]
                if slots.owner[b] is None or live is None:
                    out.append({"slot": b, "state": "idle", "held_tokens": len(slots.held[b])})
                    continue
                el, gen = now - live["t0"], live["generated"]
                out.append({"slot": b, "state": live["state"], "prompt_tokens": live["prompt_tokens"],
                            "generated": gen, "elapsed_s": round(el, 3),
                            "tok_s": round(gen / el, 2) if el > 0 and gen else None})
        return out

    def stats(self) -> dict:
        proc = self.engine.current()
        slots = proc.slots if proc is not None else None
        with self.cv:
            return {"slots": slots.n if slots else 0, "busy": slots.busy() if slots else 0,
                    "waiting": len(self.waiting), "stale_frames": slots.stale_frames if slots else 0,
                    "quarantines": self.quarantines, "requeued": self.requeued}

    # ------------------------------------------------------------------ one request
    def generate(self, ids, max_new, keys="", cancelled=None, result=None, embed=False, on_wait=None, closing=None):
        """Yields token ids, and None as heartbeats; `result` gets the request's figures at the end (an
        embedding's vector as `result["embedding"]`). `on_wait()` runs on this thread right before each wait
        for a slot or a line (serve/http/pacing.py)."""
        result = {} if result is None else result
        req = _SlotRequest(ids, max_new, keys, cancelled, embed, on_wait, closing)
        req.figures = result  # filled as the lines come: progress, then BDONE's figures
        try:
            if not (yield from self._claim(req)):
                return
            self._submit(req)
            yield from self._read(req)
        finally:
            try:
                self._leave(req)
            finally:
                if req.cancel() and result.get("finish") not in ("stop", "length"):
                    result["finish"] = "cancel"
                result.setdefault("finish", "cancel" if req.cancel() else "stop")

    def _short(self, w: _Waiter, now: float) -> bool:
        return not self.short_first or w.plen <= ADMIT_LONG_TOKENS or now - w.arrival >= self.max_wait_s

    def _first_waiter(self) -> _Waiter | None:
        """The waiter whose turn it is (caller holds cv): short ones first, then arrival order."""
        now = time.monotonic()
        return min(self.waiting.values(), key=lambda w: (0 if self._short(w, now) else 1, w.arrival, w.seq),
                   default=None)

    def _claim(self, req: _SlotRequest):
        """Bind the request to the current process and claim a free slot in admission order. True when
        claimed, False when the caller left first. A process that ends while the request waits (nothing was
        sent) hands the waiter, in its place in the order, to the replacement process (`_replacement`)."""
        proc = self.engine.current()
        if proc is None or proc.ended:
            raise EngineDied("the engine is unavailable; this request was not sent")
        if proc.slots is None:
            raise EngineDied("the engine has no decode slots (it must run with --batch N); this request was not sent")
        req.proc, slots = proc, proc.slots
        im_start = self.engine.info.get("im_start")
        me = _Waiter(len(req.ids), req.arrival)
        beat = time.monotonic()
        with self.cv:
            self.waiting[me.seq] = me
        try:
            while True:
                if req.cancel():
                    return False
                req.on_wait()  # outside the lock: what the caller holds goes out before a wait may come
                with self.cv:
                    # read under the lock, right before waiting: the pump marks the end and notifies under
                    # this lock, and a free slot is announced the same way, so neither is slept through
                    gone = proc.ended
                    b = pick_slot(slots, req.ids, im_start) if self._first_waiter() is me and not gone else None
                    if b is not None:
                        self._take_slot(req, slots, b)
                        return True
                    if not gone:
                        self.cv.wait(SLOT_WAIT_STEP_S)
                if gone:
                    proc = yield from self._replacement(req, proc)
                    if proc is None:
                        return False
                    req.proc, slots = proc, proc.slots
                    continue
                if time.monotonic() - beat >= HEARTBEAT_S:
                    beat = time.monotonic()
                    yield None
        finally:
            with self.cv:
                if self.waiting.pop(me.seq, None) is not None:
                    self.cv.notify_all()  # a waiter that leaves (or claimed) lets the next one go

    def _replacement(self, req: _SlotRequest, dead):
        """The process that replaces `dead` (ended while `req` waited for a slot, before anything was sent), once
        it is up; None when the caller left meanwhile. EngineDied when the engine was closed on purpose (shutdown,
        unload, switch) or no replacement came within `requeue_wait_s`. Heartbeats go on meanwhile."""
        why = self.engine.gone(dead)  # outside the lock: the text may read the log
        end = beat = time.monotonic()
        end += self.requeue_wait_s
        while True:
            if req.cancel():
                return None
            nxt = self.engine.current()
            if nxt is not None and nxt is not dead and not nxt.ended and nxt.slots is not None:
                with self.cv:
                    self.requeued += 1
                return nxt
            if getattr(self.engine, "closed", False) or time.monotonic() >= end:
                raise EngineDied(why)
            req.on_wait()
            with self.cv:  # a start notifies slot_cv once its process is current
                nxt = self.engine.current()
                if nxt is None or nxt is dead or nxt.ended:
                    self.cv.wait(min(SLOT_WAIT_STEP_S, max(0.0, end - time.monotonic())))
            if time.monotonic() - beat >= HEARTBEAT_S:
                beat = time.monotonic()
                yield None

    def _take_slot(self, req, slots, b) -> None:
        """Caller holds cv."""
        slots.owner[b], slots.open[b], req.slot = req, False, b
        while not slots.q[b].empty():
            slots.q[b].get_nowait()
        slots.live[b] = {"state": "reading", "prompt_tokens": len(req.ids), "generated": 0,
                         "t0": time.monotonic()}

    def _submit(self, req: _SlotRequest) -> None:
        """The control-line exchange: write the BGEN (its answer, BACC or ERR, comes on the slot's own queue:
        admissions are pipelined, so a request never waits for another's answer)."""
        proc, e = req.proc, self.engine
        end = time.monotonic() + CONTROL_WAIT_S
        while not e.ctl.acquire(timeout=POLL_S):  # its holder is bounded too; a frozen engine ends meanwhile
            if proc.ended:
                raise EngineDied(e.gone(proc))
            if time.monotonic() > end:
                raise EngineDied("the engine's control lines stayed busy; this request was not sent")
        try:
            if proc.ended or proc is not e.current():
                raise EngineDied(e.gone(proc))  # never sent to a later process
            ids = ','.join(map(str, req.ids))
            proc.admit(req.slot, f"BEMB {req.slot} {ids}" if req.embed else
                       f"BGEN {req.slot} {req.max_new}{req.keys} {ids}")
            req.sent = True
        finally:
            e.ctl.release()

    def _accepted(self, req: _SlotRequest, q) -> None:
        """Wait for the admission's answer on the slot queue: BACC, or ERR (refused: EngineRefused)."""
        while True:
            try:
                line = q.get(timeout=POLL_S)
            except queue.Empty:
                if time.monotonic() - req.proc.heard > ACCEPT_TIMEOUT_S:
                    req.proc.kill("the engine did not answer an admission; it was ended")
                    raise EngineSilent("the engine did not answer an admission; it was ended") from None
                continue
            if line is None:
                raise EngineDied(self.engine.gone(req.proc))
            if line.startswith("ERR "):
                req.sent = False
                raise EngineRefused(line[4:])
            if line.startswith("BACC "):
                req.accepted = True
                parts = line.split()
                if len(parts) > 2 and parts[2].isdigit():  # the prefix the slot kept: prompt_progress's `cache`
                    req.figures["reused"] = int(parts[2])
                return

    def _read(self, req: _SlotRequest):
        """The slot's own lines to BDONE. A cancelled request sends BSTOP and reads on (nothing shown)."""
        q, e = req.proc.slots.q[req.slot], self.engine
        self._accepted(req, q)
        clock = Allowance(e.silence_s, len(req.ids), e.stall_s, req.proc.popen.pid)
        beat = time.monotonic()
        while True:
            if req.cancel() and not req.stopped:
                self._stop(req)
            elif not (req.close_sent or req.stopped) and req.closing():
                req.close_sent = True
                req.proc.write(f"BCLOSE {req.slot}")
            if q.empty():
                req.on_wait()
            try:
                line = q.get(timeout=POLL_S)
            except queue.Empty:
                self._check_silence(req, clock)
                if time.monotonic() - beat >= HEARTBEAT_S:
                    beat = time.monotonic()
                    yield None
                continue
            if line is None:
                raise EngineDied(e.gone(req.proc))
            now = time.monotonic()
            clock.heard(now)
            word, _, rest = line.partition(" ")
            rest = rest.partition(" ")[2]
            try:
                if word == "BT":
                    clock.token(now)
                    if self._token(req, parse_token(rest, req.proc.n_vocab, line)):
                        yield req.out[-1]
                elif word == "BPP":
                    self._progress(req, rest, line, clock, now)
                    beat = now
                    yield None
                elif word == "BVEC":
                    req.figures["embedding"] = rest
                elif word == "BDONE":
                    self._done(req, parse_bdone(line))
                    return
            except EngineBadLine as err:
                req.proc.kill(str(err))  # out of step: the process goes, the next request gets a new one
                raise

    def _token(self, req, tid) -> bool:
        """Record a token; whether it is shown (a cancelled request's tokens are not)."""
        req.out.append(tid)
        with self.cv:
            live = req.proc.slots.live[req.slot]
            if live is not None:
                live.update(state="decoding", generated=live["generated"] + 1)
        return not req.stopped and not req.cancel()

    def _progress(self, req, rest, line, clock, now) -> None:
        reached, total, rate = parse_progress(rest.split(), line)
        clock.chunk(now, reached, rate)
        self.engine.progress = (reached, total)
        if rate > 0:
            self.engine.prefill_tok_s = rate
        req.figures["prompt_reached"] = reached

    def _check_silence(self, req, clock) -> None:
        if req.stopped:
            quiet = time.monotonic() - max(req.proc.heard, req.stop_at)
            if quiet <= QUARANTINE_S:
                return
            why = f"slot {req.slot} never finished after BSTOP (engine silent {quiet:.0f} s); the engine was ended"
        else:
            why = clock.expired(time.monotonic())
            if not why:
                return
        req.proc.kill(why)
        raise EngineSilent(why)

    def _stop(self, req) -> None:
        req.stopped, req.stop_at = True, time.monotonic()
        try:
            req.proc.write(f"BSTOP {req.slot}")
        except EngineDied:
            pass

    def _done(self, req, figures: dict) -> None:
        """BDONE: the request's figures, and the slot is free again holding what its session holds."""
        req.figures.update(figures)
        req.sent = req.accepted = False
        finish = figures.get("finish")
        self._free(req, [] if finish == "nonfinite" else _held(req, figures))
        if finish == "nonfinite":
            raise EngineNonFinite("the engine produced non-finite logits")

    def _free(self, req, held) -> None:
        slots = req.proc.slots
        with self.cv:
            slots.owner[req.slot], slots.open[req.slot] = None, False
            slots.live[req.slot] = None
            slots.used[req.slot] = time.monotonic()
            if held is not None:
                slots.held[req.slot] = held
            self.cv.notify_all()
        req.slot = None

    # ------------------------------------------------------------------ leaving
    def _leave(self, req: _SlotRequest) -> None:
        """After the request ends (normally, cancelled, closed early, or on an error)."""
        if req.slot is None:
            return
        if not req.sent or req.proc.ended:
            self._free(req, None if not req.sent else [])  # never sent: the slot's session is unchanged
            return
        if not req.stopped:
            self._stop(req)  # acts on a read, a decode, or an admission not answered yet
        end = time.monotonic() + LEAVE_WAIT_S
        q = req.proc.slots.q[req.slot]
        while time.monotonic() < end:  # most often the BDONE comes within a step: the figures are kept
            try:
                line = q.get(timeout=min(POLL_S, max(0.01, end - time.monotonic())))
            except queue.Empty:
                continue
            held = self._stopped_line(req, line)
            if held is not _GO_ON:
                self._free(req, held)
                return
        with self.cv:
            self.quarantines += 1
            req.proc.slots.owner[req.slot] = "quarantine"  # stays claimed until its BDONE
        threading.Thread(target=self._quarantine, args=(req,), daemon=True,
                         name=f"slot-{req.slot}-quarantine").start()

    def _quarantine(self, req: _SlotRequest) -> None:
        """Wait for a BSTOPped slot's BDONE; past QUARANTINE_S of engine silence, end the engine."""
        q, held = req.proc.slots.q[req.slot], []
        try:
            while True:
                try:
                    line = q.get(timeout=POLL_S)
                except queue.Empty:
                    if time.monotonic() - max(req.stop_at, req.proc.heard) > QUARANTINE_S:
                        req.proc.kill(f"slot {req.slot} never finished after BSTOP; the engine was ended")
                        held = []
                        return
                    continue
                held = self._stopped_line(req, line)
                if held is not _GO_ON:
                    return
        finally:
            self._free(req, held)

    def _stopped_line(self, req: _SlotRequest, line):
        """One line of a stopped request's slot: _GO_ON, or what the slot then holds (None: unchanged, the
        admission was refused; []: unknown, the process ended or broke the protocol)."""
        try:
            if line is None:
                return []
            if line.startswith("BT "):
                req.out.append(parse_token(line.split(" ", 2)[2], req.proc.n_vocab, line))
            elif line.startswith("ERR "):
                return None
            elif line.startswith("BDONE "):
                figures = parse_bdone(line)
                req.figures.update(figures)
                return [] if figures.get("finish") == "nonfinite" else _held(req, figures)
        except EngineBadLine as err:
            req.proc.kill(str(err))
            return []
        return _GO_ON


_GO_ON = object()  # _stopped_line: the slot's request has not ended yet


def _held(req: _SlotRequest, figures: dict) -> list[int]:
    """What the slot's session holds after BDONE: what was read, plus every generated token but the last."""
    if figures.get("reused") is not None and figures.get("prompt_read") is not None:
        n = figures["reused"] + figures["prompt_read"] + max(0, (figures.get("generated") or 0) - 1)
    else:
        n = len(req.ids) + max(0, len(req.out) - 1)
    return (req.ids + req.out)[:n]

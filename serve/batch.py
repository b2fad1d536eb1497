"""The batch path of StrataEngine: decode slots, the control lines, admission order (UPSTREAM 4.4).

Role: run many requests on one engine started with `--batch N`. One prompt read (a solo `GEN` or a `BGEN`
admission) at a time holds `engine.ctl`, "the control lines"; every other request decodes in its own slot,
reading only its slot queue, which the pump fills from `BT <slot>` / `BDONE <slot>` lines. Short prompts go
first; a long read gives way (`BYIELD`) to a much shorter waiter; a solo request is promoted into a slot when
another request arrives, and a slot left alone goes solo again. It knows nothing of HTTP or text.

Rules it keeps (each has a test in tests/serve/test_batch*.py):
- Ownership: a request is bound to the engine process it was first sent on (`_Proc`), reads only that
  process's queues and never writes to a later one (EngineDied instead). The pump drops BT/BDONE lines for a
  slot nobody claims (`stale_frames`).
- `_take_control` re-reads its turn under `slot_cv`'s lock right before waiting (no lost notification); a
  waiter that leaves notifies the others.
- A request that leaves early is drained: STOP (solo or admission) to DONE/BADM while it still holds ctl; a
  decoding slot is BSTOPped and quarantined until its BDONE. These limits (`DRAIN_TIMEOUT_S`, `QUARANTINE_S`)
  count from the last line the engine wrote, and when they run out the engine is ended: a slot whose lines may
  still come is never given to another request.
- Accounting: `prefill_leg_stats` joins the legs of one prompt read (a read that yielded and resumed),
  `request_stats` the segments of a request; figures the engine never reported stay None, never 0.

Public surface: `BatchPath(engine)` (made by StrataEngine when INFO says batch_slots > 0), `.attach(proc,
info)`, `.route(proc, line)` and `.proc_ended(proc)` (pump hooks), `.generate(ids, max_new, keys, cancelled,
result)`, `.slot_view()`, `.stats()`; `pick_slot(slots, prompt, im_start)`, `conversation_slots(engine)`,
`prefill_leg_stats(legs)`, `request_stats(segments)`. Tunables: env `STRATA_ADMIT_SHORT_FIRST` (default 1),
`STRATA_ADMIT_MAX_WAIT_S`, `STRATA_PARALLEL_SOLO` (0 = never solo again).
"""
from __future__ import annotations

import itertools
import os
import queue
import threading
import time

from serve.engine import (EngineDied, EngineNonFinite, EngineRefused, EngineSilent, HEARTBEAT_S, POLL_S,
                          _Allowance, parse_done)
from serve.slot_table import _Slots, pick_slot  # noqa: F401  (pick_slot is part of this module's surface)

SLOTS_MAX = 8                 # the engine's limit (PROTOCOL.md: --batch 1..8)
WAIT_STEP_S = 0.5             # each wait for ctl / on slot_cv; cancel and death are checked this often
SLOT_WAIT_STEP_S = 1.0        # each wait for a free slot
YIELDS_MAX = 2                # a read gives way at most this often (then it finishes, whoever waits)
SOLO_AGAIN_MAX = 2            # a request returns from a slot to solo decoding at most this often
SOLO_AGAIN_MIN_LEFT = 32      # ... and only with at least this many tokens still allowed
ADMIT_LONG_TOKENS = 1024      # a prompt longer than this is "long" for admission order
ADMIT_MAX_WAIT_S = 30.0       # a long prompt that waited this long counts as short
DRAIN_TIMEOUT_S = 300.0       # STOP/BYIELD drain: engine silence allowed before it is ended
QUARANTINE_S = 600.0          # a BSTOPped slot's BDONE: engine silence allowed before it is ended
_SEQ = itertools.count(1)


def _env_float(name, default):
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def _eos_ids(info) -> set[int]:
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


# ---------------------------------------------------------------------------------------------- accounting
_SUMMED = ("prompt_ms", "decode_ms", "generated", "prompt_read", "drafts_acc", "drafts_off", "hits",
           "lookups", "ram_blobs", "file_blobs", "file_mb", "offloaded")


def _sum(values):
    known = [v for v in values if v is not None]
    return sum(known) if known else None  # never reported anywhere stays unknown


def prefill_leg_stats(legs: list[dict]) -> dict:
    """One prompt read made of legs (each a DONE dict; all but the last gave way). The boundary `reused` is
    the first leg's (later legs reuse what earlier legs read, which is no cache reuse); times and tokens are
    summed once each; `finish`, `prompt` and the first token's count come from the last leg."""
    if not legs:
        return {}
    out = {k: v for k, v in legs[-1].items() if k not in _SUMMED}
    for k in ("prompt_ms", "prompt_read", "drafts_acc", "drafts_off", "hits", "lookups"):
        out[k] = _sum(leg.get(k) for leg in legs)
    out["reused"] = legs[0].get("reused")
    out["chunk"] = legs[0].get("chunk", out.get("chunk"))
    out["generated"] = legs[-1].get("generated")
    out["decode_ms"] = legs[-1].get("decode_ms")
    out["legs"] = len(legs)
    return out


def request_stats(segments: list[dict]) -> dict:
    """A request's figures over its segments (solo, admission + slot, promoted, solo again): the first
    segment's `reused`/`prompt_read`/`chunk`/`prompt`, summed times and counts, the last `finish`."""
    if not segments:
        return {}
    first, last = segments[0], segments[-1]
    out = {k: v for k, v in last.items() if k not in _SUMMED}
    for k in _SUMMED:
        out[k] = _sum(s.get(k) for s in segments)
    for k in ("reused", "prompt_read", "chunk", "prompt", "legs"):
        if k in first:
            out[k] = first[k]
    out["segments"] = len(segments)
    return out


class _Waiter:
    __slots__ = ("plen", "arrival", "seq", "after_epoch")

    def __init__(self, plen, arrival, after_epoch):
        self.plen, self.arrival, self.seq, self.after_epoch = plen, arrival, next(_SEQ), after_epoch


class _Request:
    """One request's control state; only its own thread touches it (slot claims go through cv)."""

    def __init__(self, ids, max_new, keys, cancelled):
        self.ids = list(ids)
        self.left = int(max_new)
        self.keys = (" " + keys.strip()) if keys and keys.strip() else ""
        self.out: list[int] = []
        self.cancelled = cancelled or (lambda: False)
        self.arrival = time.monotonic()
        self.proc = None          # the process it was admitted on
        self.slot = None          # the slot it claims (reserved, reading or decoding)
        self.phase = None         # None | "solo" | "admit" | "decode": what a leaving request must drain
        self.has_ctl = False
        self.reads: list[dict] = []      # legs of the prompt read in progress
        self.segments: list[dict] = []
        self.yields = 0
        self.solo_again = 0
        self.first = 0            # index in out of the current slot's first token

    def cancel(self) -> bool:
        return bool(self.cancelled())


class BatchPath:
    """Slot bookkeeping and the batch algorithm for one StrataEngine (shared objects survive restarts)."""

    def __init__(self, engine):
        self.engine = engine
        self.cv = threading.Condition()  # slot_cv: guards waiting, admitting, ctl_epoch and every _Slots
        self.waiting: dict[int, _Waiter] = {}   # requests waiting for ctl
        self.admitting = 0                      # requests that gave ctl back to wait for a free slot
        self.ctl_epoch = 0                      # +1 each time ctl is taken
        self.short_first = os.environ.get("STRATA_ADMIT_SHORT_FIRST", "1") != "0"
        self.max_wait_s = _env_float("STRATA_ADMIT_MAX_WAIT_S", ADMIT_MAX_WAIT_S)
        self.solo_again_on = os.environ.get("STRATA_PARALLEL_SOLO", "1") != "0"
        self.quarantines = 0

    # ------------------------------------------------------------------ pump hooks (pump threads)
    def attach(self, proc, info: dict) -> None:
        n = max(0, min(SLOTS_MAX, int(info.get("batch_slots") or 0)))
        proc.slots = _Slots(n, int(info.get("batch_groups") or 1))
        with self.cv:
            self.cv.notify_all()

    def route(self, proc, line: str) -> bool:
        """True when the line was a slot line (queued for its claimant, or dropped)."""
        slots = getattr(proc, "slots", None)
        if slots is None:
            return False
        slots.heard = time.monotonic()
        if not line.startswith(("BT ", "BDONE ")):
            return False
        try:
            b = int(line.split(" ", 2)[1])
        except (IndexError, ValueError):
            return False
        with self.cv:
            if 0 <= b < slots.n and slots.owner[b] is not None:
                slots.q[b].put(line)
            else:
                slots.stale_frames += 1
        return True

    def proc_ended(self, proc) -> None:
        slots = getattr(proc, "slots", None)
        if slots is not None:
            for q in slots.q:
                q.put(None)
        with self.cv:
            self.cv.notify_all()

    # ------------------------------------------------------------------ views
    def slot_view(self) -> list[dict]:
        slots = getattr(self.engine._cur, "slots", None)
        if slots is None:
            return []
        now = time.monotonic()
        with self.cv:
            out = []
            for b in range(slots.n):
                live = slots.live[b]
                if slots.owner[b] is None or live is None:
                    out.append({"slot": b, "state": "idle", "held_tokens": len(slots.held[b])})
                    continue
                el = now - live["t0"]
                gen = live["generated"]
                out.append({"slot": b, "state": live["state"], "prompt_tokens": live["prompt_tokens"],
                            "generated": gen, "elapsed_s": round(el, 3),
                            "tok_s": round(gen / el, 2) if el > 0 and gen else None})
            return out

    def stats(self) -> dict:
        slots = getattr(self.engine._cur, "slots", None)
        with self.cv:
            return {"slots": slots.n if slots else 0, "busy": slots.busy() if slots else 0,
                    "waiting": len(self.waiting), "admitting": self.admitting,
                    "stale_frames": slots.stale_frames if slots else 0, "quarantines": self.quarantines}

    # ------------------------------------------------------------------ the control lines
    def _short(self, w: _Waiter, now: float) -> bool:
        return (not self.short_first or w.plen <= ADMIT_LONG_TOKENS or now - w.arrival >= self.max_wait_s)

    def _turn(self, me: _Waiter) -> bool:
        """Whether `me` may take ctl now (caller holds cv)."""
        if len(self.waiting) <= 1:
            return True
        # a request that gave way (after_epoch) waits until someone else took ctl, unless only deferred
        # requests are left
        now = time.monotonic()
        ready = [w for w in self.waiting.values() if w.after_epoch is None or self.ctl_epoch > w.after_epoch]
        pool = ready or list(self.waiting.values())  # only deferred ones left: they go in order
        if me not in pool:
            return False
        return min(pool, key=lambda w: (0 if self._short(w, now) else 1, w.arrival, w.seq)) is me

    def _take_control(self, req: _Request, plen: int, after_epoch=None):
        """Wait for ctl in admission order; True when held, False when the caller was cancelled."""
        e = self.engine
        me = _Waiter(plen, req.arrival, after_epoch)
        with self.cv:
            self.waiting[me.seq] = me
            self.cv.notify_all()   # a running read may want to give way
        beat = time.monotonic()
        try:
            while True:
                if req.cancel():
                    return False
                with self.cv:
                    if not e.alive() and not e.starting:
                        raise EngineDied("the engine stopped while this request waited; it was not sent")
                    # both re-read under the lock, right before waiting (an end between a look outside and
                    # the wait would be slept through for WAIT_STEP_S)
                    gone = req.proc is not None and req.proc.ended
                    turn = self._turn(me)
                    if not turn and not gone:
                        self.cv.wait(WAIT_STEP_S)
                if gone:
                    raise EngineDied(self._gone(req))  # outside the lock: the text may read the engine's log
                if turn and e.ctl.acquire(timeout=WAIT_STEP_S):
                    if not e.alive():
                        e.ctl.release()
                        time.sleep(min(WAIT_STEP_S, 0.05))
                        continue
                    with self.cv:
                        mine = self._turn(me)  # a shorter one may have come while we sat in acquire
                        if mine:
                            self.ctl_epoch += 1
                            del self.waiting[me.seq]
                            self.cv.notify_all()
                    if not mine:
                        e.ctl.release()
                        with self.cv:
                            self.cv.notify_all()
                        continue
                    req.has_ctl = True
                    return True
                if time.monotonic() - beat >= HEARTBEAT_S:
                    beat = time.monotonic()
                    yield None
        finally:
            with self.cv:
                if self.waiting.pop(me.seq, None) is not None:
                    self.cv.notify_all()  # a waiter that leaves lets the next one go

    def _release_ctl(self, req: _Request) -> None:
        if req.has_ctl:
            req.has_ctl = False
            self.engine.ctl.release()
            with self.cv:
                self.cv.notify_all()

    def _shorter_waiter(self, remaining: int) -> bool:
        if not self.short_first:
            return False  # strict arrival order: giving way would not let anyone ahead
        with self.cv:
            return any(w.plen * 2 <= remaining for w in self.waiting.values())

    def _gone(self, req) -> str:
        return ("the engine stopped while this request ran (it restarts for the next one)"
                if req.proc is not self.engine._cur else self.engine.death_note())

    def _bind(self, req: _Request):
        cur = self.engine._cur
        if req.proc is None:
            if cur is None or cur.ended or getattr(cur, "slots", None) is None:
                raise EngineDied("the engine is unavailable; this request was not sent")
            req.proc = cur
        elif req.proc is not cur or req.proc.ended:
            raise EngineDied(self._gone(req))  # never sent to a later process
        return req.proc.slots

    def _send(self, req: _Request, line: str) -> None:
        if req.proc.ended:
            raise EngineDied(self._gone(req))
        self.engine._write(req.proc, line)

    def _free(self, slots: _Slots, b: int, held=None) -> None:
        with self.cv:
            slots.owner[b] = None
            slots.live[b] = None
            slots.used[b] = time.monotonic()
            if held is not None:
                slots.held[b] = held
            self.cv.notify_all()

    # ------------------------------------------------------------------ one request
    def generate(self, ids, max_new, keys="", cancelled=None, result=None):
        """Yields token ids, and None as heartbeats; `result` gets `request_stats` figures at the end."""
        result = {} if result is None else result
        req = _Request(ids, max_new, keys, cancelled)
        try:
            yield from self._run(req)
        finally:
            try:
                self._leave(req)
            finally:
                result.update(request_stats(req.segments) or {})
                if req.cancel() and result.get("finish") not in ("stop", "length"):
                    result["finish"] = "cancel"
                result.setdefault("finish", "cancel" if req.cancel() else "stop")

    def _run(self, req: _Request):
        P, after = list(req.ids), None
        eos = _eos_ids(self.engine.info)
        while True:
            if not (yield from self._take_control(req, len(P), after)):
                return
            slots, after = self._bind(req), None
            with self.cv:
                alone = slots.busy() == 0 and not self.waiting and req.slot is None
            if alone and req.left > 1:
                how = yield from self._solo_leg(req, slots, P, eos)
                if how == "done":
                    return
                P = req.ids + req.out
                if how == "yielded":
                    after = self._give_way(req)
                    continue
            if req.slot is None and not (yield from self._find_slot(req, slots, P)):
                return
            how = yield from self._admit(req, slots, P)
            if how == "yielded":
                after = self._give_way(req)
                continue
            self._release_ctl(req)
            if how == "done":
                return
            how = yield from self._decode(req, slots, P, eos)
            if how != "solo":
                return
            req.solo_again += 1
            P = req.ids + req.out

    def _give_way(self, req) -> int:
        req.yields += 1
        with self.cv:
            epoch = self.ctl_epoch
        self._release_ctl(req)
        return epoch

    def _lines(self, req, clock):
        """Control lines of the request's process: a line, or "" after POLL_S of quiet; raises on EOF and on
        silence past the allowance (the engine is then ended)."""
        try:
            line = req.proc.lines.get(timeout=POLL_S)
        except queue.Empty:
            why = clock.expired(time.monotonic())
            if why:
                req.phase = None
                self.engine._kill(req.proc, why)
                raise EngineSilent(why) from None
            return ""
        if line is None:
            req.phase = None
            raise EngineDied(self._gone(req))
        clock.heard(time.monotonic())
        return line

    def _read_leg(self, req, slots, P, b_yield, end_word):
        """Read one GEN/BGEN leg on the control lines to DONE (solo) or BADM (admission). Yields tokens;
        sends STOP (promotion, solo only) or BYIELD under the give-way rules. Returns (done, yielded_k, cont)."""
        e = self.engine
        clock = _Allowance(e.silence_s, len(P), e.stall_s, req.proc.popen.pid)
        done, yielded, cont, stopped = None, None, None, False
        reached, n_out0, beat = 0, len(req.out), time.monotonic()
        solo = end_word == "DONE"
        while True:
            line = self._lines(req, clock)
            kind, _, rest = line.partition(" ")
            if kind == "T":
                clock.token(time.monotonic())
                req.out.append(int(rest))
                req.left -= 1
                if not req.cancel():
                    yield req.out[-1]
            elif kind == "PP":
                w = rest.split()
                reached = int(w[0])
                rate = float(w[3]) if len(w) > 3 else 0.0
                clock.chunk(time.monotonic(), reached, rate)
                e.progress = (reached, int(w[1]))
                if rate > 0:
                    e.prefill_tok_s = rate
                yield None
            elif kind == "RESUME":
                reached = int(rest.split()[0])
                clock.chunk(time.monotonic(), reached, 0.0)
            elif kind == "YIELDED":
                w = rest.split()
                if b_yield is not None and int(w[0]) == b_yield:
                    yielded = int(w[1])
            elif kind == "DONE":
                done = parse_done(line)
                if solo:
                    break
            elif kind == "BADM":
                w = rest.split()
                if b_yield is not None and int(w[0]) == b_yield:
                    cont = w[1] == "1"
                    break
            elif kind == "ERR":
                req.phase = None  # refused: no DONE follows, nothing to drain
                raise EngineRefused(rest)
            elif not line:
                if req.cancel():
                    return None, None, None  # the caller's finally drains
                if time.monotonic() - beat >= HEARTBEAT_S:
                    beat = time.monotonic()
                    yield None
            if stopped or not self.waiting:
                continue
            if len(req.out) == n_out0 and req.yields < YIELDS_MAX and self._shorter_waiter(len(P) - reached):
                if solo and b_yield is None:
                    with self.cv:
                        b_yield = pick_slot(slots, P, e.info.get("im_start"))
                        if b_yield is not None:
                            slots.owner[b_yield] = req
                            req.slot = b_yield
                if b_yield is not None:
                    self._send(req, f"BYIELD {b_yield}")
                    stopped = True
            if solo and not stopped:
                self._send(req, "STOP")  # someone waits: this request goes on in a slot (promotion)
                stopped = True
        return done, yielded, cont

    def _solo_leg(self, req, slots, P, eos):
        req.phase = "solo"
        self._send(req, f"GEN {req.left}{req.keys} {','.join(map(str, P))}")
        done, yielded, _ = yield from self._read_leg(req, slots, P, None, "DONE")
        if done is None:
            return "done"
        req.phase = None
        req.reads.append(done)
        if done.get("finish") == "nonfinite":
            raise EngineNonFinite("the engine produced non-finite logits")
        if req.slot is not None and yielded is not None:
            with self.cv:
                slots.held[req.slot] = list(P[:yielded])
            return "yielded"
        if req.slot is not None:
            self._free(slots, req.slot)  # the reservation was not used
            req.slot = None
        self._end_read(req)
        if (req.cancel() or req.left <= 0 or done.get("finish") in ("stop", "length")
                or (req.out and req.out[-1] in eos)):
            return "done"
        return "promote"

    def _end_read(self, req, extra=None) -> None:
        seg = prefill_leg_stats(req.reads)
        if extra:
            seg.update(extra)
        req.segments.append(seg)
        req.reads = []

    def _find_slot(self, req, slots, P):
        """Claim a free slot; without one, give ctl back (a yielded read needs it), wait, take ctl again."""
        im = self.engine.info.get("im_start")
        with self.cv:
            b = pick_slot(slots, P, im)
            if b is not None:
                slots.owner[b], req.slot = req, b
                return True
            self.admitting += 1
        self._release_ctl(req)
        beat = time.monotonic()
        try:
            while b is None:
                if req.cancel():
                    return False
                with self.cv:
                    # read under the lock, right before waiting: the pump sets `ended` and then notifies
                    # under this lock (proc_ended), so an end that comes meanwhile is never slept through
                    gone = req.proc.ended
                    if not gone:
                        b = pick_slot(slots, P, im)
                        if b is not None:
                            slots.owner[b], req.slot = req, b
                        else:
                            self.cv.wait(SLOT_WAIT_STEP_S)
                if gone:  # the slots it waits for belong to a process that is gone: never a later one
                    raise EngineDied(self._gone(req))
                if time.monotonic() - beat >= HEARTBEAT_S:
                    beat = time.monotonic()
                    yield None
        finally:
            with self.cv:
                self.admitting -= 1
        if not (yield from self._take_control(req, len(P))):
            return False
        self._bind(req)
        return True

    def _admit(self, req, slots, P):
        b = req.slot
        with self.cv:
            while not slots.q[b].empty():
                slots.q[b].get_nowait()
            slots.held[b] = []
            slots.live[b] = {"state": "reading", "prompt_tokens": len(P), "generated": 0,
                             "t0": time.monotonic()}
        req.phase = "admit"
        self._send(req, f"BGEN {b} {req.left}{req.keys} {','.join(map(str, P))}")
        done, yielded, cont = yield from self._read_leg(req, slots, P, b, "BADM")
        if cont is None and done is None:
            return "done"  # cancelled mid-read: the finally drains
        req.phase = None
        if done is not None:
            req.reads.append(done)
        if cont:
            req.phase = "decode"
            req.first = len(req.out) - 1
            with self.cv:
                slots.live[b].update(state="decoding", generated=1)
            return "decode"
        if done is not None and done.get("finish") == "nonfinite":
            self._free(slots, b, [])
            req.slot = None
            raise EngineNonFinite("the engine produced non-finite logits")
        if yielded is not None and not req.cancel():
            with self.cv:
                slots.held[b] = list(P[:yielded])
            return "yielded"
        self._end_read(req)
        self._free(slots, b, list(P))
        req.slot = None
        return "done"

    def _may_go_solo(self, req, slots) -> bool:
        if (not self.solo_again_on or req.solo_again >= SOLO_AGAIN_MAX or req.left < SOLO_AGAIN_MIN_LEFT
                or not self.engine.info.get("slot_cache")):
            return False
        with self.cv:
            return slots.busy() == 1 and not self.waiting and self.admitting == 0

    def _decode(self, req, slots, P, eos):
        b, q = req.slot, slots.q[req.slot]
        stopped = solo = False
        beat = time.monotonic()
        since = time.monotonic()
        while True:
            try:
                line = q.get(timeout=POLL_S)
            except queue.Empty:
                if req.cancel() and not stopped:
                    self._send(req, f"BSTOP {b}")
                    stopped, since = True, time.monotonic()
                quiet = time.monotonic() - max(slots.heard, since)
                limit = QUARANTINE_S if stopped else self.engine.silence_s
                if limit > 0 and quiet > limit:
                    req.phase = None
                    why = f"slot {b} never finished (engine silent {quiet:.0f} s); the engine was ended"
                    self.engine._kill(req.proc, why)
                    raise EngineSilent(why)
                if time.monotonic() - beat >= HEARTBEAT_S:
                    beat = time.monotonic()
                    yield None
                continue
            if line is None:
                req.phase = None
                raise EngineDied(self._gone(req))
            w = line.split()
            if w[0] == "BT":
                req.out.append(int(w[2]))
                req.left -= 1
                with self.cv:
                    if slots.live[b] is not None:
                        slots.live[b]["generated"] += 1
                if stopped and not solo:
                    continue  # cancelled: drained, not shown
                if req.cancel():
                    self._send(req, f"BSTOP {b}")
                    stopped, since = True, time.monotonic()
                    continue
                yield req.out[-1]
                if not stopped and self._may_go_solo(req, slots):
                    self._send(req, f"BSTOP {b}")
                    stopped = solo = True
                    since = time.monotonic()
                continue
            if w[0] != "BDONE":
                continue
            req.phase = None
            finish = w[3] if len(w) > 3 else "stop"
            ms = float(w[4]) if len(w) > 4 else None
            self._end_read(req, {"generated": int(w[2]), "decode_ms": ms, "finish": finish,
                                 "slot_ms": _sum([(req.reads[-1] if req.reads else {}).get("prompt_ms"), ms])})
            if finish == "nonfinite":
                self._free(slots, b, [])
                req.slot = None
                raise EngineNonFinite("the engine produced non-finite logits")
            self._free(slots, b, list(P) + req.out[req.first:-1])
            req.slot = None
            if (solo and finish == "cancel" and req.left > 0 and not req.cancel()
                    and not (req.out and req.out[-1] in eos)):
                return "solo"
            return "done"

    # ------------------------------------------------------------------ leaving
    def _leave(self, req: _Request) -> None:
        """After the request ends (normally, cancelled, closed early, or on an error)."""
        proc = req.proc
        try:
            if proc is not None and not proc.ended and req.phase in ("solo", "admit"):
                self._drain_control(req)
            if proc is not None and not proc.ended and req.phase == "decode" and req.slot is not None:
                b = req.slot
                try:
                    self.engine._write(proc, f"BSTOP {b}")
                except EngineDied:
                    pass
                else:
                    with self.cv:
                        self.quarantines += 1
                        proc.slots.owner[b] = "quarantine"  # stays claimed until its BDONE
                    req.slot = None
                    threading.Thread(target=self._quarantine, args=(proc, b, req.ids + req.out),
                                     daemon=True, name=f"slot-{b}-quarantine").start()
        finally:
            if req.slot is not None and proc is not None:
                self._free(proc.slots, req.slot, [])
                req.slot = None
            self._release_ctl(req)

    def _drain_control(self, req: _Request) -> None:
        """STOP the running solo leg or admission and read to its DONE (solo) or BADM (admission), while ctl
        is still held. The limit counts from the last line the engine wrote; past it the engine is ended."""
        proc, slots = req.proc, req.proc.slots
        want = "DONE" if req.phase == "solo" else "BADM"
        try:
            self.engine._write(proc, "STOP")
        except EngineDied:
            return
        start = time.monotonic()
        while True:
            try:
                line = proc.lines.get(timeout=POLL_S)
            except queue.Empty:
                if time.monotonic() - max(start, slots.heard) > DRAIN_TIMEOUT_S:
                    self.engine._kill(proc, "the engine did not answer STOP; it was ended")
                    req.phase = None
                    return
                continue
            if line is None or line.startswith("ERR"):
                req.phase = None
                return
            if line.startswith("T "):
                req.out.append(int(line.split()[1]))
            if line.startswith("DONE"):
                try:
                    req.reads.append(parse_done(line))
                except EngineDied:
                    pass
            if line.startswith(want):
                w = line.split()
                req.phase = "decode" if want == "BADM" and len(w) > 2 and w[2] == "1" else None
                if req.phase == "decode":
                    req.first = len(req.out) - 1
                if req.reads:
                    self._end_read(req, {"finish": "cancel"})
                return

    def _quarantine(self, proc, b: int, stream: list[int]) -> None:
        """Wait for a BSTOPped slot's BDONE; past QUARANTINE_S of engine silence, end the engine."""
        slots = proc.slots
        start = time.monotonic()
        held = None
        try:
            while True:
                try:
                    line = slots.q[b].get(timeout=POLL_S)
                except queue.Empty:
                    if time.monotonic() - max(start, slots.heard) > QUARANTINE_S:
                        self.engine._kill(proc, f"slot {b} never finished after BSTOP; the engine was ended")
                        return
                    continue
                if line is None:
                    return
                w = line.split()
                if w[0] == "BT":
                    stream.append(int(w[2]))
                elif w[0] == "BDONE":
                    held = [] if (len(w) > 3 and w[3] == "nonfinite") else stream[:-1]
                    return
        finally:
            self._free(slots, b, held if held is not None else [])

"""Generation guards: the stop strings and the loop guard of one reply, token by token.

Role: `StopMatcher` finds the client's stop strings in the decoded text, holding back text that may still
become one until it is decided; `LoopGuard` ends a reply that repeats one token `REPEAT_STOP_TOKENS` times in
a row or falls into a short cycle of tokens (`loop_need(period)` positions in a row equal to the one a
period earlier). Neither has Service state: the run loop (serve/generation/service.py) feeds them.

Public surface: `StopMatcher(stops)`, `LoopGuard(limit)`, `loop_need(period)`, `REPEAT_STOP_TOKENS`,
`LOOP_PERIOD_MAX`, `LOOP_SPAN_TOKENS`, `LOOP_REPEATS_MIN`.
"""
from __future__ import annotations

from collections import deque

REPEAT_STOP_TOKENS = 256   # the same token this many times in a row is a loop: end the reply as `length`
LOOP_PERIOD_MAX = 256      # a cycle of up to this many tokens repeating exactly ... (measured: SmolLM2 fell
                           # into a 27-token cycle and ran 2,809 tokens under a 16-token limit)
LOOP_SPAN_TOKENS = 128     # ... over the last max(this, (1 + LOOP_REPEATS_MIN) x the cycle) tokens also
LOOP_REPEATS_MIN = 2       # ends the reply as `length`: a short cycle over 128 tokens (small models fall into
                           # 5-10 token cycles), a long one seen three times in a row (a text may quote a
                           # paragraph twice; a third copy in a row is a loop)


class StopMatcher:
    """Stop strings over content text: emits what can no longer start a stop string, holds the rest."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.buf = ""
        self.hit: str | None = None

    def feed(self, text: str) -> str:
        if not self.stops:
            return text
        self.buf += text
        first = None
        for s in self.stops:
            i = self.buf.find(s)
            if i >= 0 and (first is None or i < first[0]):
                first = (i, s)
        if first is not None:
            out, self.hit, self.buf = self.buf[:first[0]], first[1], ""
            return out
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.buf)), hold, -1):
                if self.buf.endswith(s[:n]):
                    hold = n
                    break
        out = self.buf[:len(self.buf) - hold]
        self.buf = self.buf[len(self.buf) - hold:]
        return out

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out


def loop_need(period: int) -> int:
    """How many positions in a row must equal the one `period` earlier before a cycle is called a loop."""
    return max(LOOP_SPAN_TOKENS - period, LOOP_REPEATS_MIN * period)


class LoopGuard:
    """The repeat guard over a reply's shown tokens, across its passes: `limit` equal ids in a row (0 = off),
    or a cycle of 2..LOOP_PERIOD_MAX ids repeated (`loop_need`), ends the reply as `length`.

    For each period p the guard needs the number of newest positions in a row whose id equals the id p
    earlier. Only the periods at which this token's id occurred in the window (`seen`: its positions) extend
    their run; every other period's run is broken by this token. So a period keeps (`at[p]`, `run[p]`): the
    last position its run was extended at and the run's length; a run whose `at` is not the previous
    position was broken meanwhile. A token costs one step per earlier occurrence of its id in the window
    (a few), not one per period (256, ~15 us of interpreter time a streamed token)."""

    def __init__(self, limit: int):
        self.limit, self.last, self.run_len = limit, None, 0
        self.n = 0                                       # positions seen
        self.seen: dict[int, deque] = {}                 # id -> its positions within the window, oldest first
        self.at = [-2] * (LOOP_PERIOD_MAX + 1)           # period -> last position its run was extended at
        self.run = [0] * (LOOP_PERIOD_MAX + 1)           # period -> that run's length
        self.need = [loop_need(p) for p in range(LOOP_PERIOD_MAX + 1)]

    def looping(self, tid: int) -> bool:
        self.run_len = self.run_len + 1 if tid == self.last else 1
        self.last = tid
        if not self.limit:
            return False
        if self.run_len >= self.limit:
            return True
        t = self.n
        self.n = t + 1
        where = self.seen.get(tid)
        if where is None:
            where = self.seen[tid] = deque()
        while where and t - where[0] > LOOP_PERIOD_MAX:
            where.popleft()
        at, run, need = self.at, self.run, self.need
        found = False
        for s in where:
            p = t - s
            if p < 2:
                continue  # period 1 is the run-length guard's
            run[p] = run[p] + 1 if at[p] == t - 1 else 1
            at[p] = t
            found = found or run[p] >= need[p]
        where.append(t)
        if len(self.seen) > 4 * LOOP_PERIOD_MAX:  # ids not seen within the window hold no positions
            self.seen = {k: v for k, v in self.seen.items() if v and t - v[-1] <= LOOP_PERIOD_MAX}
        return found

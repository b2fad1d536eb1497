"""Live request figures: what is running now, latency histograms, estimated decode calls, rejections.

Role: the figures Prometheus and the Monitor need that a finished request's record cannot give: how many
requests run at this moment (whatever the number of decode slots), vLLM's latency histograms, each token's
share of an engine decode step, and the requests refused before they ran (400 context overflow, 401, 413,
503 ...). `Service.run` feeds it (`begin` → `token` per token → `end`); the HTTP boundary feeds `reject`.
It knows nothing of HTTP, pipes or text.

Inter-token latency is taken per burst: tokens that reach the server together (the engine writes a slot's
tokens a stream interval at a time, serve/http/pacing.py) were still made one step apart, so a burst of k
tokens whose last came Δ after the token before the burst counts k latencies of Δ/k (the sum is exact, and the
buckets show the decode pace, not the write pace). Tokens less than BURST_GAP_S apart are one burst.

Decode calls are estimated on the server's side (the engine reports no step count): a token produced while k
requests were decoding counts 1/k of a step, so a step of k busy slots adds one decode and k busy slots, and
`busy_slots_per_decode` = tokens / decodes, as llama.cpp's `n_busy_slots_per_decode` means it.

Public surface: `LiveFigures` (`.begin(t0) -> Tracker`, `.reject(...)`, `.snapshot()`), `Histogram`,
`TTFT_BOUNDS_S`, `ITL_BOUNDS_S`, `E2E_BOUNDS_S` (vLLM's bucket bounds, vllm/v1/metrics), `BURST_GAP_S`.
"""
from __future__ import annotations

import bisect
import threading
import time
from collections import deque

# vLLM's bucket upper bounds in seconds (vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds,
# vllm:e2e_request_latency_seconds), so dashboards built for vLLM read Strata's histograms unchanged
TTFT_BOUNDS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BOUNDS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
E2E_BOUNDS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                480.0, 960.0, 1920.0, 7680.0)
REJECTED_KEEP = 100   # refused requests kept for the Monitor's table (the newest; older ones only count)
BURST_GAP_S = 0.001   # tokens closer than this reached the server in one engine write (one burst)


class Histogram:
    """Cumulative-on-read histogram: per-bucket counts (the last bucket is +Inf), sum and count. Not locked:
    its owner (LiveFigures) holds its lock around every call."""

    def __init__(self, bounds):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.sum += value * times
        self.count += times

    def cumulative(self) -> list[tuple[float, int]]:
        """[(upper bound, observations <= it)], +Inf last."""
        out, running = [], 0
        for bound, n in zip(list(self.bounds) + [float("inf")], self.counts):
            running += n
            out.append((bound, running))
        return out

    def copy(self) -> "Histogram":
        h = Histogram(self.bounds)
        h.counts, h.sum, h.count = list(self.counts), self.sum, self.count
        return h


class Tracker:
    """One running request's hooks (used by its own thread only)."""

    def __init__(self, owner: "LiveFigures", t0: float):
        self.owner, self.t0 = owner, t0
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.burst_from = 0.0     # the time of the token before the current burst ...
        self.burst_n = 0          # ... and the burst's tokens so far (observed when it is over)
        self.ended = False

    def token(self, now: float | None = None) -> None:
        self.owner._token(self, time.monotonic() if now is None else now)

    def end(self, record: dict, now: float | None = None) -> None:
        if not self.ended:
            self.ended = True
            self.owner._end(self, record, time.monotonic() if now is None else now)


class LiveFigures:
    def __init__(self):
        self._lock = threading.Lock()  # guards every field below
        self.running = 0          # requests past admission to the Service (their turn held) and not ended
        self.decoding = 0         # of those, the ones that have produced a token
        self.tokens = 0           # tokens produced (every request, every pass)
        self.decodes = 0.0        # estimated engine decode steps (see the module docstring)
        self.finished: dict[str, int] = {}   # finish reason -> requests
        self.ttft = Histogram(TTFT_BOUNDS_S)
        self.itl = Histogram(ITL_BOUNDS_S)
        self.e2e = Histogram(E2E_BOUNDS_S)
        self.rejected: deque = deque(maxlen=REJECTED_KEEP)
        self.rejected_total = 0
        self.n_tokens_max = 0     # the longest request seen: prompt + generated tokens (llama.cpp n_tokens_max)

    def begin(self, t0: float) -> Tracker:
        """A request starts running; `t0` is its arrival (time.monotonic()), so TTFT includes its wait."""
        with self._lock:
            self.running += 1
        return Tracker(self, t0)

    def _token(self, tr: Tracker, now: float) -> None:
        with self._lock:
            if tr.first_at is None:
                tr.first_at = now
                self.decoding += 1
                self.ttft.observe(max(0.0, now - tr.t0))
            elif now - tr.last_at < BURST_GAP_S and tr.burst_n:
                tr.burst_n += 1
            else:
                self._burst_over(tr)
                tr.burst_from, tr.burst_n = tr.last_at, 1
            tr.last_at = now
            self.tokens += 1
            self.decodes += 1.0 / max(1, self.decoding)

    def _burst_over(self, tr: Tracker) -> None:
        """Caller holds the lock: the burst's k tokens count k latencies of (its last token's time - the time of
        the token before it) / k."""
        if tr.burst_n:
            self.itl.observe(max(0.0, tr.last_at - tr.burst_from) / tr.burst_n, tr.burst_n)
            tr.burst_n = 0

    def _end(self, tr: Tracker, record: dict, now: float) -> None:
        finish = str(record.get("finish") or "error")
        with self._lock:
            self._burst_over(tr)
            self.running -= 1
            if tr.first_at is not None:
                self.decoding -= 1
            self.e2e.observe(max(0.0, now - tr.t0))
            self.finished[finish] = self.finished.get(finish, 0) + 1
            n = int(record.get("prompt_tokens") or 0) + int(record.get("output_tokens") or 0)
            self.n_tokens_max = max(self.n_tokens_max, n)

    def reject(self, method: str, path: str, status: int, message: str, api: str = "") -> None:
        """A request refused before it ran (its record joins the Monitor's table as `finish: rejected`)."""
        with self._lock:
            self.rejected_total += 1
            self.rejected.append({"time": time.time(), "finish": "rejected", "status": int(status),
                                  "method": method, "path": path, "api": api, "error": str(message)[:300]})

    def snapshot(self) -> dict:
        with self._lock:
            return {"running": self.running, "decoding": self.decoding, "tokens": self.tokens,
                    "decodes": self.decodes, "finished": dict(self.finished), "ttft": self.ttft.copy(),
                    "itl": self.itl.copy(), "e2e": self.e2e.copy(), "rejected": list(self.rejected),
                    "rejected_total": self.rejected_total, "n_tokens_max": self.n_tokens_max}

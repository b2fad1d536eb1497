"""The lifecycle's clock side: idle unload (each model after its own idle time) and the resource lease (while
leased, requests are refused with 503 or wait, and every loaded model without running requests is unloaded; the
models a lease unloaded are loaded again when it ends).

Role: `Leases`, a mixin of serve/lifecycle/models.py's `Lifecycle`: it reads and writes the Lifecycle's state
under its `_cv` (`_leases`, `_lease_unloaded`, `_loaded`, `_busy`, `_pending`) and unloads through its
`_take_load` / `_switch`. The idle thread looks at most `IDLE_TICK_MAX_S` apart.

Public surface (on a Lifecycle): `start_idle_thread()`, `tick()`, `lease(seconds, reason)`, `renew(id,
seconds)`, `end_lease(id)`, `leases_view()`.
"""
from __future__ import annotations

import secrets
import threading
import time

from serve.lifecycle.entries import LifecycleError, ModelEntry

IDLE_TICK_MAX_S = 30.0     # the idle thread looks at most this far apart (and at least every second)
LEASE_MAX_S = 7 * 24 * 3600  # a lease is at most a week; renew it for longer
KEEP_ALIVE_NOW_S = 1e-3    # keep_alive 0 while a request runs: unloaded at the idle thread's next look after it


class Leases:
    """Idle unload and leases: the half of `Lifecycle` that runs on the clock."""

    def start_idle_thread(self) -> None:
        threading.Thread(target=self._idle_loop, daemon=True, name="lifecycle-idle").start()

    def _idle_s(self, entry: ModelEntry) -> float:
        """The idle time after which `entry` is unloaded (0 = never): a client's keep_alive (Ollama's: < 0
        never, 0 at once), else the model's own idle_unload_s, else the server's."""
        keep = entry.info.get("keep_alive_s")
        if keep is not None:
            return 0.0 if keep < 0 else max(keep, KEEP_ALIVE_NOW_S)
        own = entry.info.get("idle_unload_s")
        return float(own) if own is not None else self.idle_unload_s

    def _tick_s(self) -> float:
        times = [t for t in (self._idle_s(e) for e in self.entries) if t]
        if self._leases or not times:
            return 1.0
        return max(1.0, min(IDLE_TICK_MAX_S, min(times) / 4))

    def _idle_loop(self) -> None:
        while not self._stop.wait(self._tick_s()):
            self.tick()

    def tick(self) -> str | None:
        """One look: unload the idle models (each after its own idle time) or, while leased, every loaded
        model without running requests; end expired leases -> what it did (for tests)."""
        with self._cv:
            ended = self._expire_leases()
            now = self.clock()
            gone = [] if self._busy or self._pending is not None else [
                e for e in self._loaded if not e.in_flight and (
                    self._leases or (self._idle_s(e) and now - e.last_used >= self._idle_s(e)))]
            if gone:
                self._take_load(gone)
                if self._leases:   # reloaded when the lease ends, least recently used first
                    self._lease_unloaded = sorted(self._lease_unloaded + gone, key=lambda e: e.last_used)
        if ended:
            self._reload_after_lease()
        if not gone:
            return "lease ended" if ended else None
        self._switch(gone, None)
        return "unloaded (leased)" if self._leases else "unloaded (idle)"

    def _expire_leases(self) -> bool:
        now = self.clock()
        gone = [k for k, v in self._leases.items() if v["until_m"] <= now]
        for k in gone:
            del self._leases[k]
        if gone:
            self._cv.notify_all()
        return bool(gone)

    def _refuse_if_leased(self, deadline: float | None = None) -> None:
        """(under _cv) 503 with the lease's reason and end time while a lease holds the memory; with
        `lease_wait` a request waits for the lease's end until `deadline` first."""
        self._expire_leases()
        while self._leases and self.lease_wait and deadline is not None and self.clock() < deadline:
            self._cv.wait(min(1.0, max(0.0, deadline - self.clock())))
            self._expire_leases()
        if self._leases:
            last = max(self._leases.values(), key=lambda v: v["until"])
            raise LifecycleError(503, "unavailable_error", f"Strata's memory is leased ({last['reason']}) until "
                                 f"{time.strftime('%H:%M:%S', time.localtime(last['until']))}; try again then",
                                 code="leased")

    @staticmethod
    def _seconds(value) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= LEASE_MAX_S:
            raise LifecycleError(400, "invalid_request_error", f"seconds: a number of seconds, 1..{LEASE_MAX_S}",
                                 param="seconds")
        return float(value)

    def lease(self, seconds, reason) -> dict:
        """Grant a lease: requests are refused (503) until it ends; the loaded model is unloaded as soon as
        its running requests have finished (now when none run)."""
        seconds = self._seconds(seconds)
        if not isinstance(reason, str) or not reason.strip() or len(reason) > 200:
            raise LifecycleError(400, "invalid_request_error", "reason: a short text (1..200 characters)",
                                 param="reason")
        lease_id = "lease_" + secrets.token_hex(8)
        with self._cv:
            self._leases[lease_id] = {"reason": reason.strip(), "until": self.wall() + seconds,
                                      "until_m": self.clock() + seconds}
        self.tick()
        return {"id": lease_id, **self._lease_view(lease_id)}

    def renew(self, lease_id, seconds) -> dict:
        seconds = self._seconds(seconds)
        with self._cv:
            self._expire_leases()
            if lease_id not in self._leases:
                raise LifecycleError(404, "not_found_error", f"no lease {lease_id!r} (ended or never granted)",
                                     param="id")
            self._leases[lease_id].update(until=self.wall() + seconds, until_m=self.clock() + seconds)
        return {"id": lease_id, **self._lease_view(lease_id)}

    def end_lease(self, lease_id) -> dict:
        with self._cv:
            found = self._leases.pop(lease_id, None)
            self._cv.notify_all()
        if found is None:
            raise LifecycleError(404, "not_found_error", f"no lease {lease_id!r}", param="id")
        self._reload_after_lease()
        return {"id": lease_id, "status": "released"}

    def _reload_after_lease(self) -> None:
        """Strata reloads when the lease ends (unless it loads lazily): the models the lease unloaded, the
        most recently used last (so it is the one kept if they no longer fit together), else the default."""
        with self._cv:
            if self._leases or self._loaded or self.lazy_load:
                return
            names, self._lease_unloaded = [e.name for e in self._lease_unloaded] or [None], []
        threading.Thread(target=lambda: [self._quiet(self.load, n) for n in names], daemon=True,
                         name="lease-reload").start()

    @staticmethod
    def _quiet(fn, *args):
        try:
            fn(*args)
        except Exception:   # the next request loads it and reports what went wrong
            pass

    def _lease_view(self, lease_id) -> dict:
        with self._cv:
            v = self._leases.get(lease_id)
            return {} if v is None else {"reason": v["reason"], "until": round(v["until"], 3),
                                         "seconds_left": round(max(0.0, v["until_m"] - self.clock()), 3),
                                         "loaded": bool(self._loaded)}

    def leases_view(self) -> dict:
        with self._cv:
            self._expire_leases()
            ids = list(self._leases)
        return {"leases": [{"id": i, **self._lease_view(i)} for i in ids]}

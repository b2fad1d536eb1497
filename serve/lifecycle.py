"""The models a server can serve and the engine of each: lazy load, idle unload, load/unload, switching by the
request's `model`, and the resource lease.

Role: own one `Service` per model (built on first use by the factory bootstrap gives; its engine started and
closed here) and decide which engine runs. One model is loaded at a time: a request for another model waits
until the running requests of the loaded one have finished (requests that arrive for it meanwhile wait too, so
the switch cannot starve), then the loaded engine is closed and the wanted one started. A request is served
only by the Service of the model it named, so it can never get another model's answer. It knows no HTTP: the
server maps `LifecycleError.status` onto its error answers.

Locking: `_cv` (a Condition) guards `_current`, `_busy` (a load or unload in progress), `_pending`, every
entry's `in_flight`/`last_used` and `_leases`; engine starts and closes run outside it, with `_busy` set.
Every wait has a limit (`SWITCH_WAIT_S`).

Public surface: `Lifecycle(entries, default, lazy_load, idle_unload_s)`, `ModelEntry(name, make, aliases,
info)`, `enter(model) -> Ticket` / `Ticket.release()`, `view_service()`, `load(model)`, `unload(model=None)`,
`models_view()`, `health()`, `lease(seconds, reason)`, `renew(id, seconds)`, `end_lease(id)`, `leases_view()`,
`boot()`, `start_idle_thread()`, `start_engine()` / `stop_engine()` / `kill_engine()` / `close()` (the server's
life cycle calls, as a Service has them), `LifecycleError`, `loaded_line(svc)`. With `lease_wait`, requests wait out a lease instead of a 503.
"""
from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field

from serve import telemetry

SWITCH_WAIT_S = 600.0      # a request waits at most this long for the model it named (running replies end)
IDLE_TICK_MAX_S = 30.0     # the idle thread looks at most this far apart (and at least every second)
LEASE_MAX_S = 7 * 24 * 3600  # a lease is at most a week; renew it for longer
MIB = 1 << 20


class LifecycleError(Exception):
    """A request the lifecycle refuses: `status` 404 unknown model, 409 busy, 503 leased or timed out."""

    def __init__(self, status: int, err_type: str, message: str, param: str | None = None, code=None):
        super().__init__(message)
        self.status, self.err_type, self.message, self.param, self.code = status, err_type, message, param, code


@dataclass
class ModelEntry:
    name: str
    make: object                        # () -> Service (engine not started); called once, on first use
    aliases: list = field(default_factory=list)
    info: dict = field(default_factory=dict)   # what /v1/models shows before it is built: n_ctx, architecture
    svc: object = None
    in_flight: int = 0                  # requests holding a Ticket (guarded by Lifecycle._cv)
    last_used: float = 0.0

    def service(self):
        if self.svc is None:
            self.svc = self.make()
        return self.svc


@dataclass
class Ticket:
    entry: ModelEntry
    owner: "Lifecycle"
    released: bool = False

    @property
    def service(self):
        return self.entry.svc

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.owner._leave(self.entry)


def loaded_line(svc) -> str:
    """The console line for a loaded model: model, architecture, context, threads, lanes, kernels, RAM."""
    info = svc.engine.info
    _, engines = telemetry.process_rss()
    ram = f"{engines // MIB} MiB" if engines else "?"
    return (f"strata: loaded {svc.model_name} ({info.get('arch') or svc.arch or '?'}): context "
            f"{svc.engine.max_context or svc.engine.known_ctx}, threads {info.get('threads', '?')}, lanes "
            f"{max(1, int(info.get('batch_slots') or 0))}, kernels {info.get('kernels', '?')}, kv "
            f"{info.get('kv', '?')}, weights {info.get('weights_mib', '?')} MiB, engine RAM {ram}")


class Lifecycle:
    def __init__(self, entries: list, default: str | None = None, lazy_load: bool = False,
                 idle_unload_s: float = 0.0, on_loaded=None, clock=time.monotonic, wall=time.time,
                 lease_wait: bool = False):
        self.entries = list(entries)
        self._names = {n: e for e in self.entries for n in (e.name, *e.aliases)}
        self.default = self._names[default] if default else self.entries[0]
        self.lazy_load = lazy_load
        self.lease_wait = lease_wait    # while leased, requests wait for the lease's end (else 503 at once)
        self.idle_unload_s = float(idle_unload_s or 0)
        self.on_loaded = on_loaded      # called with the Service after each load (the console line)
        self.clock, self.wall = clock, wall
        self._cv = threading.Condition()
        self._current: ModelEntry | None = None
        self._busy = False              # a load or unload is running (outside the lock)
        self._boot_pending = not lazy_load   # the start's load has not ended yet (/health: loading)
        self._pending = None            # (entry, arrival number) of the first request waiting for a switch
        self._seq = 0                   # arrival numbers of enter()
        self._leases: dict = {}         # id -> {"reason", "until" (wall clock), "until_m" (monotonic)}
        self._stop = threading.Event()
        self.loads = 0                  # figures for tests and /v1/status
        self.unloads = 0

    # ---------------------------------------------------------------- names
    def resolve(self, name: str | None) -> ModelEntry:
        if not name:
            with self._cv:
                return self._current or self.default
        entry = self._names.get(name)
        if entry is None:
            known = ", ".join(n for e in self.entries for n in (e.name, *e.aliases))
            raise LifecycleError(404, "not_found_error", f"model {name!r} is not one this server has; known: "
                                 f"{known}", param="model", code="model_not_found")
        return entry

    def view_service(self):
        """The Service the views (status, metrics, tokenize, ...) read: the loaded model's, else the default's."""
        with self._cv:
            entry = self._current or self.default
        return entry.service()

    # ---------------------------------------------------------------- requests
    def enter(self, name: str | None) -> Ticket:
        """Wait until the model `name` (None: the loaded one, else the default) is loaded and count this
        request on it; the caller must `release()` the ticket when its reply has ended.

        Order: a request for the loaded model is admitted unless a request for another model has been waiting
        since before it came (`_pending`, by arrival number); the request that switches is admitted as the
        switch ends, so every switch serves at least the request that caused it."""
        # one model: a request naming any model runs on it, as llama-server with one model answers clients
        # that send "gpt-3.5-turbo" and the like; /v1/load, /v1/unload and /config keep the strict names
        entry = self.entries[0] if len(self.entries) == 1 else self.resolve(name)
        deadline = self.clock() + SWITCH_WAIT_S
        with self._cv:
            self._seq += 1
            seq = self._seq
            try:
                while True:
                    self._refuse_if_leased(deadline)
                    cur = self._current
                    if cur is entry and not self._busy and (self._pending is None or seq < self._pending[1]):
                        return self._admit(entry)
                    if not self._busy and (cur is None or (cur is not entry and cur.in_flight == 0)):
                        self._busy = True
                        break
                    if cur is not entry and self._pending is None:
                        self._pending = (entry, seq)   # later requests for the loaded model wait behind this
                    left = deadline - self.clock()
                    if left <= 0:
                        raise LifecycleError(503, "unavailable_error", f"model {entry.name!r} did not become "
                                             f"free within {SWITCH_WAIT_S:.0f} s; try again")
                    self._cv.wait(min(left, 1.0))
            finally:
                if self._pending is not None and self._pending[1] == seq and not self._busy:
                    self._pending = None   # gave up (lease, timeout): let the others on
                    self._cv.notify_all()
        return self._switch(cur, entry, admit=True)

    def _admit(self, entry: ModelEntry) -> Ticket:
        """(under _cv) count one request on the loaded `entry`."""
        entry.in_flight += 1
        entry.last_used = self.clock()
        return Ticket(entry, self)

    def _leave(self, entry: ModelEntry) -> None:
        with self._cv:
            entry.in_flight -= 1
            entry.last_used = self.clock()
            self._cv.notify_all()

    def _switch(self, old: ModelEntry | None, new: ModelEntry | None, admit: bool = False):
        """Close `old`'s engine and start `new`'s; `_busy` is set by the caller and cleared here. With `admit`
        the caller's request is counted on `new` as the switch ends -> its Ticket."""
        loaded, ticket = None, None
        try:
            if old is not None and old.svc is not None:
                _close_engine(old.svc)
                self.unloads += 1
            with self._cv:
                self._current = None
            if new is not None:
                svc = new.service()
                if not svc.engine.alive():
                    svc.start_engine()   # ServiceError when it cannot load; a supervisor heals it after
                    self.loads += 1
                new.last_used = self.clock()   # idle time counts from the load
                loaded = svc
        finally:
            with self._cv:
                self._current = new if loaded is not None else None
                self._busy = False
                if self._pending is not None and self._pending[0] is new:
                    self._pending = None
                if admit and loaded is not None:
                    ticket = self._admit(new)
                self._cv.notify_all()
        if loaded is not None and self.on_loaded is not None:
            self.on_loaded(loaded)
        return ticket

    # ---------------------------------------------------------------- load / unload
    def _take_busy(self, refuse_running: bool):
        """Wait out another load/unload, then hold `_busy` -> the loaded entry. 409 while requests run."""
        deadline = self.clock() + SWITCH_WAIT_S
        with self._cv:
            while self._busy:
                if self.clock() >= deadline:
                    raise LifecycleError(503, "unavailable_error", "a model is still loading; try again")
                self._cv.wait(1.0)
            cur = self._current
            if refuse_running and cur is not None and cur.in_flight:
                raise LifecycleError(409, "model_busy", f"model {cur.name!r} is serving {cur.in_flight} "
                                     f"request(s); try again when they have finished", code="model_busy")
            self._busy = True
            return cur

    def load(self, name: str | None = None) -> dict:
        entry = self.resolve(name) if name else self.default
        with self._cv:
            self._refuse_if_leased()
        cur = self._take_busy(refuse_running=True)
        if cur is entry and entry.svc is not None and entry.svc.engine.alive():
            with self._cv:
                self._busy = False
                self._cv.notify_all()
        else:
            self._switch(cur, entry)
        return {"model": entry.name, "status": "loaded"}

    def unload(self, name: str | None = None, refuse_running: bool = True) -> dict:
        """Close the loaded engine (`name`, when given, must be the loaded one); 409 while requests run."""
        entry = self.resolve(name) if name else None
        cur = self._take_busy(refuse_running)
        if cur is None or (entry is not None and cur is not entry):
            with self._cv:
                self._busy = False
                self._cv.notify_all()
            return {"model": (entry or self.default).name, "status": "unloaded", "was_loaded": False}
        self._switch(cur, None)
        return {"model": cur.name, "status": "unloaded", "was_loaded": True}

    def boot(self) -> None:
        """At start: load the default model unless `lazy_load` (then the first request loads it)."""
        try:
            if not self.lazy_load:
                self.load()
        finally:
            with self._cv:
                self._boot_pending = False

    # the server's life cycle calls (serve/server.py run_server), as a Service has them
    def start_engine(self) -> None:
        """At start: the idle/lease thread, then `boot()` (ServiceError when the model cannot be loaded)."""
        self.start_idle_thread()
        self.boot()

    def stop_engine(self) -> None:
        """At shutdown: every model's engine closed."""
        for e in self.entries:
            if e.svc is not None:
                _close_engine(e.svc)

    def kill_engine(self) -> None:
        """A second Ctrl+C: kill the loaded engine without waiting."""
        with self._cv:
            cur = self._current
        if cur is not None and cur.svc is not None:
            cur.svc.kill_engine()

    # ---------------------------------------------------------------- idle unload and leases
    def start_idle_thread(self) -> None:
        threading.Thread(target=self._idle_loop, daemon=True, name="lifecycle-idle").start()

    def _tick_s(self) -> float:
        if self._leases or not self.idle_unload_s:
            return 1.0
        return max(1.0, min(IDLE_TICK_MAX_S, self.idle_unload_s / 4))

    def _idle_loop(self) -> None:
        while not self._stop.wait(self._tick_s()):
            self.tick()

    def tick(self) -> str | None:
        """One look: unload an idle or leased model, end expired leases -> what it did (for tests)."""
        with self._cv:
            ended = self._expire_leases()
            cur = self._current
            idle = cur is not None and self.idle_unload_s and self.clock() - cur.last_used >= self.idle_unload_s
            act = cur is not None and not self._busy and not cur.in_flight and (self._leases or idle)
            if act:
                self._busy = True
        if ended:
            self._reload_after_lease()
        if not act:
            return "lease ended" if ended else None
        self._switch(cur, None)
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
        """Strata reloads when the lease ends (unless it loads lazily)."""
        with self._cv:
            if self._leases or self._current is not None or self.lazy_load:
                return
        threading.Thread(target=lambda: self._quiet(self.load), daemon=True, name="lease-reload").start()

    @staticmethod
    def _quiet(fn):
        try:
            fn()
        except Exception:   # the next request loads it and reports what went wrong
            pass

    def _lease_view(self, lease_id) -> dict:
        with self._cv:
            v = self._leases.get(lease_id)
            return {} if v is None else {"reason": v["reason"], "until": round(v["until"], 3),
                                         "seconds_left": round(max(0.0, v["until_m"] - self.clock()), 3),
                                         "loaded": self._current is not None}

    def leases_view(self) -> dict:
        with self._cv:
            self._expire_leases()
            ids = list(self._leases)
        return {"leases": [{"id": i, **self._lease_view(i)} for i in ids]}

    # ---------------------------------------------------------------- views
    def models_view(self) -> list[tuple[ModelEntry, bool]]:
        with self._cv:
            cur = self._current
        return [(e, e is cur and e.svc is not None and e.svc.engine.alive()) for e in self.entries]

    def loaded(self) -> bool:
        with self._cv:
            return self._current is not None or self._busy

    def switching(self) -> bool:
        """A load or unload is running, or the start's load has not begun yet (no model answers meanwhile)."""
        with self._cv:
            return self._busy or self._boot_pending

    def close(self) -> None:
        self._stop.set()
        for e in self.entries:
            if e.svc is not None:
                e.svc.close()



def _close_engine(svc) -> None:
    """Unload: the engine ends (closed on purpose: its supervisor leaves it alone until the next start)."""
    try:
        svc.engine.close()
    except Exception as e:   # EngineStuck: as the HTTP layer sees it (ServiceUnavailable)
        raise svc.service_error(e) from None

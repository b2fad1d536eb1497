"""The models a server can serve and the engine of each: lazy load, idle unload, load/unload, switching by the
request's `model`, several models loaded within a count and RAM budget, and the resource lease.

Role: own one `Service` per model (built on first use by the factory bootstrap gives; its engine started and
closed here) and decide which engines run. By default one model is loaded at a time (`max_loaded` 1); with
`max_loaded` N and/or `ram_budget_bytes` several stay loaded, each with its own Service and engine, and a load
that would pass either limit unloads the least recently used ones first (idle ones before busy ones). A model
chosen for unloading is *draining*: its running requests finish, requests that arrive for it meanwhile wait
(so the switch cannot starve), then its engine is closed and the wanted one started. A request is served only
by the Service of the model it named, so it can never get another model's answer. A model whose own need
(weights + KV + overhead, the launch plan's arithmetic) is over the RAM budget is refused with the numbers. It
knows no HTTP: the server maps `LifecycleError.status` onto its error answers.

Locking: `_cv` (a Condition) guards `_loaded`, `_busy` (a load or unload in progress), `_pending`, every
entry's `in_flight`/`last_used`/`draining` and `_leases`; engine starts and closes run outside it, with `_busy`
set (one load/unload at a time; requests for other loaded models run on meanwhile). Every wait has a limit
(`SWITCH_WAIT_S`).

Public surface: `Lifecycle(entries, default, lazy_load, idle_unload_s, max_loaded, ram_budget_bytes)`,
`ModelEntry(name, make, aliases, info)`, `enter(model) -> Ticket` / `Ticket.release()`, `view_service()`,
`load(model)`, `unload(model=None)` (None: every loaded model), `models_view()`, `loaded_entries()`,
`health()`, `lease(seconds, reason)`, `renew(id, seconds)`, `end_lease(id)`, `leases_view()`, `boot()`,
`start_idle_thread()`, `start_engine()` / `stop_engine()` / `kill_engine()` / `close()` (the server's life
cycle calls, as a Service has them), `LifecycleError`, `loaded_line(svc)`. With `lease_wait`, requests wait out
a lease instead of a 503.
"""
from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field

from serve.ops import telemetry

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
    info: dict = field(default_factory=dict)   # what /v1/models shows before it is built: n_ctx, architecture;
    #                                            ram_bytes (the plan's need), idle_unload_s (its own), config_path
    svc: object = None
    in_flight: int = 0                  # requests holding a Ticket (guarded by Lifecycle._cv)
    last_used: float = 0.0              # (guarded by Lifecycle._cv)
    draining: bool = False              # chosen to be unloaded: admits no request (guarded by Lifecycle._cv)
    _build: threading.Lock = field(default_factory=threading.Lock)   # guards the one call of `make`

    def service(self):
        with self._build:
            if self.svc is None:
                self.svc = self.make()
            return self.svc

    @property
    def ram_bytes(self) -> int:
        """What its engine needs loaded: the launch plan's weights + KV + overhead (0 = not known)."""
        memory = getattr(self.svc, "plan_memory", None) if self.svc is not None else None
        return int((memory or {}).get("total") or self.info.get("ram_bytes") or 0)


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
                 lease_wait: bool = False, max_loaded: int = 1, ram_budget_bytes: int | None = None):
        self.entries = list(entries)
        self._names = {n: e for e in self.entries for n in (e.name, *e.aliases)}
        self.default = self._names[default] if default else self.entries[0]
        self.lazy_load = lazy_load
        self.lease_wait = lease_wait    # while leased, requests wait for the lease's end (else 503 at once)
        self.idle_unload_s = float(idle_unload_s or 0)   # a model's own info["idle_unload_s"] wins over it
        self.max_loaded = max(1, int(max_loaded))          # models loaded at once
        self.ram_budget_bytes = ram_budget_bytes           # their plans' RAM at most this (None: no RAM limit)
        self.on_loaded = on_loaded      # called with the Service after each load (the console line)
        self.clock, self.wall = clock, wall
        self._cv = threading.Condition()
        self._loaded: list[ModelEntry] = []   # engines started (and not being closed), in load order
        self._busy = False              # a load or unload is running (outside the lock)
        self._boot_pending = not lazy_load   # the start's load has not ended yet (/health: loading)
        self._pending = None            # (entry, arrival number, victims) of the load that drains others
        self._seq = 0                   # arrival numbers of enter()
        self._leases: dict = {}         # id -> {"reason", "until" (wall clock), "until_m" (monotonic)}
        self._lease_unloaded: list = []  # the models a lease unloaded, to load again when it ends
        self._stop = threading.Event()
        self.loads = 0                  # figures for tests and /v1/status
        self.unloads = 0

    # ---------------------------------------------------------------- names
    def resolve(self, name: str | None, any_name_on_one: bool = False) -> ModelEntry:
        """The entry `name` names (an alias, NAME:latest); no name: the implicit one. `any_name_on_one`: with one
        model any name is it, as llama-server answers clients that send "gpt-3.5-turbo" (requests; /v1/load,
        /v1/unload, /config and Ollama's /api/show keep the strict names)."""
        if any_name_on_one and len(self.entries) == 1:
            return self.entries[0]
        if not name:
            with self._cv:
                return self._implicit()
        entry = self._names.get(name)
        if entry is None and name.endswith(":latest"):   # Ollama's clients name a model NAME:latest
            entry = self._names.get(name[:-len(":latest")])
        if entry is None:
            raise LifecycleError(404, "not_found_error", f"model {name!r} is not one this server has; known: "
                                 f"{self.known_names()}", param="model", code="model_not_found")
        return entry

    def known_names(self) -> str:
        return ", ".join(n for e in self.entries for n in (e.name, *e.aliases))

    def _implicit(self) -> ModelEntry:
        """(under _cv) The model of a request that names none: the default when it is loaded, else the most
        recently used loaded one, else the default."""
        if self.default in self._loaded or not self._loaded:
            return self.default
        return max(self._loaded, key=lambda e: e.last_used)

    def view_service(self):
        """The Service the views (status, metrics, ...) read: the loaded model's, else the default's."""
        with self._cv:
            entry = self._implicit()
        return entry.service()

    def is_loaded(self, entry: ModelEntry) -> bool:
        with self._cv:
            return entry in self._loaded

    def loaded_entries(self) -> list[ModelEntry]:
        with self._cv:
            return list(self._loaded)

    # ---------------------------------------------------------------- requests
    def enter(self, name: str | None) -> Ticket:
        """Wait until the model `name` (None: see `_implicit`) is loaded and count this request on it; the
        caller must `release()` the ticket when its reply has ended.

        Order: a request for a loaded model is admitted unless that model is draining (chosen to make room for
        another); a request for an unloaded one picks what to unload (`_room`) and loads as soon as those have
        no running requests; it is admitted as its load ends, so every load serves the request that caused
        it. One such load is pending at a time; later ones wait behind it.
        One model: a request naming any model runs on it, as llama-server with one model answers clients that
        send "gpt-3.5-turbo" and the like; /v1/load, /v1/unload and /config keep the strict names."""
        entry = self.resolve(name, any_name_on_one=True)
        deadline = self.clock() + SWITCH_WAIT_S
        with self._cv:
            self._seq += 1
            seq = self._seq
            try:
                while True:
                    self._refuse_if_leased(deadline)
                    if entry in self._loaded and not entry.draining:
                        return self._admit(entry)
                    mine = self._pending is not None and self._pending[1] == seq
                    if not self._busy and entry not in self._loaded and (self._pending is None or mine):
                        # the models drained for this load stay the ones unloaded (none is picked anew)
                        victims = [v for v in self._pending[2] if v in self._loaded] if mine else self._room(entry)
                        if all(v.in_flight == 0 for v in victims):
                            self._take_load(victims)
                            break
                        if not mine:   # drain them: their running requests finish, new ones wait
                            self._pending = (entry, seq, victims)
                            for v in victims:
                                v.draining = True
                    left = deadline - self.clock()
                    if left <= 0:
                        raise LifecycleError(503, "unavailable_error", f"model {entry.name!r} did not become "
                                             f"free within {SWITCH_WAIT_S:.0f} s; try again")
                    self._cv.wait(min(left, 1.0))
            finally:
                if self._pending is not None and self._pending[1] == seq:
                    self._pending = None   # loading now, or gave up (lease, timeout): let the others on
                    self._undrain()
                    self._cv.notify_all()
        return self._switch(victims, entry, admit=True)

    def _room(self, entry: ModelEntry) -> list[ModelEntry]:
        """(under _cv) The loaded models to unload so that `entry` fits: least recently used first, idle ones
        before busy ones, until the count and the RAM budget hold. 503 with the numbers when `entry` alone is
        over the RAM budget."""
        budget, need = self.ram_budget_bytes, entry.ram_bytes
        if budget is not None and need > budget:
            raise LifecycleError(503, "unavailable_error", f"model {entry.name!r} needs {need // MIB} MiB (weights "
                                 f"+ KV + overhead, its launch plan) but the models' RAM budget is {budget // MIB} "
                                 f"MiB (--models-ram-budget); it cannot be loaded", param="model",
                                 code="over_ram_budget")
        order = sorted(self._loaded, key=lambda e: (e.in_flight > 0, e.last_used))
        victims, kept = [], list(self._loaded)
        while kept and (len(kept) + 1 > self.max_loaded or
                        (budget is not None and sum(e.ram_bytes for e in kept) + need > budget)):
            victims.append(order.pop(0))
            kept.remove(victims[-1])
        return victims

    def _undrain(self) -> None:
        """(under _cv) No load waits any more: every loaded model admits requests again."""
        for e in self._loaded:
            e.draining = False

    def _take_load(self, victims: list) -> None:
        """(under _cv) Hold `_busy` for a load: the victims leave `_loaded` now (no request is admitted on
        them again) and are closed by `_switch`."""
        self._busy = True
        for v in victims:
            self._loaded.remove(v)
            v.draining = False

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

    def _switch(self, victims: list, new: ModelEntry | None, admit: bool = False):
        """Close the victims' engines and start `new`'s; `_busy` is held by the caller (`_take_load` took the
        victims out of `_loaded`) and cleared here. With `admit` the caller's request is counted on `new` as
        the switch ends -> its Ticket."""
        loaded, ticket = None, None
        try:
            for old in victims:
                if old.svc is not None:
                    _close_engine(old.svc)
                    self.unloads += 1
            if new is not None:
                svc = new.service()
                if not svc.engine.alive():
                    svc.start_engine()   # ServiceError when it cannot load; a supervisor heals it after
                    self.loads += 1
                loaded = svc
        finally:
            with self._cv:
                if loaded is not None and new not in self._loaded:
                    new.last_used = self.clock()   # idle time counts from the load
                    self._loaded.append(new)
                self._busy = False
                if admit and loaded is not None:
                    ticket = self._admit(new)
                self._cv.notify_all()
        if loaded is not None and self.on_loaded is not None:
            self.on_loaded(loaded)
        return ticket

    # ---------------------------------------------------------------- load / unload
    def _take_busy(self, pick, refuse_running: bool) -> list:
        """Wait out another load/unload, then hold `_busy` with the models `pick()` (under _cv) names taken
        out of `_loaded` -> them. 409 (nothing taken) when one of them runs requests and `refuse_running`."""
        deadline = self.clock() + SWITCH_WAIT_S
        with self._cv:
            while self._busy or self._pending is not None:
                if self.clock() >= deadline:
                    raise LifecycleError(503, "unavailable_error", "a model is still loading; try again")
                self._cv.wait(1.0)
            victims = pick()
            busy = [v for v in victims if v.in_flight]
            if refuse_running and busy:
                raise LifecycleError(409, "model_busy", f"model {busy[0].name!r} is serving {busy[0].in_flight} "
                                     f"request(s); try again when they have finished", code="model_busy")
            self._take_load(victims)
            return victims

    def load(self, name: str | None = None) -> dict:
        """Load `name` (None: the default), unloading what `_room` picks; 409 while those run requests."""
        entry = self.resolve(name) if name else self.default
        with self._cv:
            self._refuse_if_leased()
            self._room(entry)   # over the RAM budget: refused before anything is unloaded
        with self._cv:
            if entry in self._loaded and entry.svc is not None and entry.svc.engine.alive():
                return {"model": entry.name, "status": "loaded"}
        victims = self._take_busy(lambda: [] if entry in self._loaded else self._room(entry), True)
        self._switch(victims, entry)
        return {"model": entry.name, "status": "loaded"}

    def unload(self, name: str | None = None, refuse_running: bool = True) -> dict:
        """Close a loaded model's engine (None: every loaded model's); 409 while it runs requests."""
        entry = self.resolve(name) if name else None
        victims = self._take_busy(lambda: [e for e in self._loaded if entry in (None, e)], refuse_running)
        self._switch(victims, None)
        names = [v.name for v in victims]
        return {"model": (entry.name if entry else (names[0] if len(names) == 1 else self.default.name)),
                "status": "unloaded", "was_loaded": bool(victims),
                **({"models": names} if entry is None and len(names) > 1 else {})}

    def boot(self) -> None:
        """At start: load the default model unless `lazy_load` (then the first request loads it)."""
        try:
            if not self.lazy_load:
                self.load()
        finally:
            with self._cv:
                self._boot_pending = False

    # the server's life cycle calls (serve/http/run.py run_server), as a Service has them
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
        """A second Ctrl+C: kill the loaded engines without waiting."""
        for e in self.loaded_entries():
            if e.svc is not None:
                e.svc.kill_engine()

    # ---------------------------------------------------------------- idle unload and leases
    def start_idle_thread(self) -> None:
        threading.Thread(target=self._idle_loop, daemon=True, name="lifecycle-idle").start()

    def _idle_s(self, entry: ModelEntry) -> float:
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

    # ---------------------------------------------------------------- views
    def models_view(self) -> list[tuple[ModelEntry, bool]]:
        with self._cv:
            loaded = list(self._loaded)
        return [(e, e in loaded and e.svc is not None and e.svc.engine.alive()) for e in self.entries]

    def loaded(self) -> bool:
        with self._cv:
            return bool(self._loaded) or self._busy

    def switching(self) -> bool:
        """No model answers: a load or unload runs with none loaded, or the start's load has not ended."""
        with self._cv:
            return (self._busy and not self._loaded) or self._boot_pending

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

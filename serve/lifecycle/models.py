"""Which model's engine runs: `Lifecycle` (lazy load, switching by the request's `model`, several models loaded
within a count and RAM budget, load/unload), with idle unload and leases from serve/lifecycle/leases.py.

Role and locking: serve/lifecycle/__init__.py (the package's contract).

Public surface: `Lifecycle`, `SWITCH_WAIT_S`.
"""
from __future__ import annotations

import os
import threading
import time

from serve.lifecycle.entries import MIB, LifecycleError, ModelEntry, Ticket, close_engine
from serve.lifecycle.leases import KEEP_ALIVE_NOW_S, Leases

SWITCH_WAIT_S = 600.0      # a request waits at most this long for the model it named (running replies end)


class Lifecycle(Leases):
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
        self.entry_factory = None       # (name, gguf path) -> ModelEntry for a created model's own file
        #                                 (bootstrap sets it); None: a create needs an existing model's file
        self.created = None             # Ollama's created models (serve/lifecycle/created.py), when kept
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

    # ---------------------------------------------------------------- models made at run time (Ollama's create)
    def add_entry(self, entry: ModelEntry) -> None:
        """A model the server did not start with (a created model's own GGUF): served like the others."""
        with self._cv:
            taken = [n for n in (entry.name, *entry.aliases) if n in self._names]
            if taken:
                raise LifecycleError(409, "conflict_error", f"model name {taken[0]!r} is taken", param="model")
            self.entries = self.entries + [entry]
            self._names = {**self._names, **{n: entry for n in (entry.name, *entry.aliases)}}

    def add_name(self, name: str, entry: ModelEntry) -> None:
        """`name` is one more alias of `entry` (a created model that runs on it)."""
        with self._cv:
            if self._names.get(name, entry) is not entry:
                raise LifecycleError(409, "conflict_error", f"model name {name!r} is taken", param="model")
            if name != entry.name and name not in entry.aliases:
                entry.aliases = entry.aliases + [name]
            self._names = {**self._names, name: entry}

    def remove_name(self, name: str) -> None:
        """Forget the name `name`; an entry added at run time that has no name left is unloaded and removed
        (409 while it serves requests). A model the server started with keeps its own name."""
        with self._cv:
            entry = self._names.get(name)
            if entry is None or (name == entry.name and not entry.info.get("added")):
                return
            last = bool(entry.info.get("added")) and all(n == name for n, e in self._names.items() if e is entry)
        if last:
            victims = self._take_busy(lambda: [e for e in self._loaded if e is entry], True)
            self._switch(victims, None)
        with self._cv:
            entry.aliases = [a for a in entry.aliases if a != name]
            if name == entry.name and entry.aliases:   # an added model goes on under its next name
                entry.name, entry.aliases = entry.aliases[0], entry.aliases[1:]
            self._names = {k: v for k, v in self._names.items() if k != name}
            if last:
                self.entries = [e for e in self.entries if e is not entry]

    def entry_for_path(self, path: str) -> ModelEntry | None:
        """The model served from the GGUF file `path` (same file after links), if any."""
        real = os.path.realpath(path)
        with self._cv:
            return next((e for e in self.entries if e.info.get("path") and
                         os.path.realpath(e.info["path"]) == real), None)

    def has_name(self, name: str) -> bool:
        """`name` (or NAME:latest) names a model or alias exactly (no "any name on one model" rule)."""
        with self._cv:
            return name in self._names or name.endswith(":latest") and name[:-len(":latest")] in self._names

    def keep_alive(self, entry: ModelEntry, seconds: float | None, unload_now: bool = False) -> None:
        """Ollama's keep_alive for `entry`: None = the server's own idle rule; < 0 = stay loaded; 0 = unloaded
        as soon as it runs no request (`unload_now`: now, when it runs none); else after `seconds` idle."""
        with self._cv:
            if seconds is None:
                entry.info.pop("keep_alive_s", None)
                return
            entry.info["keep_alive_s"] = float(seconds)
            now = unload_now and seconds == 0 and entry in self._loaded and not entry.in_flight
        if now:
            try:
                self.unload(entry.name)
            except LifecycleError:
                pass   # a request came meanwhile: the idle rule unloads it after that request

    def expires_at(self, entry: ModelEntry) -> float | None:
        """(wall clock) When the idle rule will unload `entry` if no request comes; None = never."""
        with self._cv:
            idle = self._idle_s(entry)
            if not idle:
                return None
            left = idle if entry.in_flight else max(0.0, idle - (self.clock() - entry.last_used))
            return self.wall() + left

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
            unload = entry.info.get("keep_alive_s") == 0 and not entry.in_flight
        if unload:   # Ollama's keep_alive 0: unloaded once its last request ended, not at the next idle look
            timer = threading.Timer(KEEP_ALIVE_NOW_S * 10, self.tick)
            timer.daemon = True   # a shutdown does not wait for it
            timer.start()

    def _switch(self, victims: list, new: ModelEntry | None, admit: bool = False):
        """Close the victims' engines and start `new`'s; `_busy` is held by the caller (`_take_load` took the
        victims out of `_loaded`) and cleared here. With `admit` the caller's request is counted on `new` as
        the switch ends -> its Ticket."""
        loaded, ticket = None, None
        try:
            for old in victims:
                if old.svc is not None:
                    close_engine(old.svc)
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
                close_engine(e.svc)

    def kill_engine(self) -> None:
        """A second Ctrl+C: kill the loaded engines without waiting."""
        for e in self.loaded_entries():
            if e.svc is not None:
                e.svc.kill_engine()

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

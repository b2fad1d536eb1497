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
a lease instead of a 503. Models made at run time (Ollama's create): `add_entry(entry)`, `add_name(name,
entry)`, `remove_name(name)`, `has_name(name)`, `entry_for_path(path)`, `entry_factory`, `created` (created.py's `ModelStore`);
Ollama's `keep_alive(entry, seconds)` and `expires_at(entry)`.

Modules: models.py (`Lifecycle`: names, requests, load/unload, views), leases.py (idle unload and leases, a
mixin of Lifecycle), entries.py (`ModelEntry`, `Ticket`, `LifecycleError`, `loaded_line`), created.py
(`ModelStore`: Ollama's created models and blobs, kept in a private folder).
"""
from serve.lifecycle.entries import LifecycleError, ModelEntry, Ticket, loaded_line
from serve.lifecycle.models import SWITCH_WAIT_S, Lifecycle

__all__ = ["Lifecycle", "LifecycleError", "ModelEntry", "Ticket", "loaded_line", "SWITCH_WAIT_S"]

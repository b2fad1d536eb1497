"""HTTP views over `serve/lifecycle.Lifecycle`: load/unload, every model's status, /health before a model is
loaded, the resource lease, and GET/POST /config (a model's run config, editable keys only).

Role: turn bodies into Lifecycle calls and Lifecycle answers into JSON; `serve/http/server.py` routes here
(its table, serve/http/routes.py, names these views) and turns `LifecycleError` into its error answers. Every
route takes `(lifecycle, body, ctx)`. `health`, `models` and `ollama_tags` answer for a Lifecycle routes the
server already has for a single Service (`None` from one means "answer as the Service does").

Public surface: the views `leases`, `lease`, `lease_release`, `load`, `unload`, `config_get`, `config_post`,
`health`, `models`, `ollama_tags`; `LIVE_KEYS`, `by_model(lc, method, body, ctx)`.
"""
from __future__ import annotations

import os

from strata_control.runconfig_file import ConfigError
from serve.core.events import BadRequest
from serve.api import ollama
from serve.lifecycle import LifecycleError
from serve.api.openai import model_entries, model_in
from serve.api.replies import JsonReply
from serve.generation.guards import REPEAT_STOP_TOKENS

def _model_field(body) -> str | None:
    name = body.get("model")
    if name is not None and not isinstance(name, str):
        raise BadRequest("model: a string", param="model")
    return name or None


def by_model(lc, method, body, ctx):
    """A by-model request (serve/http/routes.py `BY_MODEL_ROUTES`) -> the Service of the model it names (404 listing the known ones for an
    unknown name; None: the loaded or default one); `ctx` says whether that model is loaded, and its query
    loses `model` (the Service answers for itself, whichever name or alias picked it)."""
    name = ctx.query.get("model") if method in ("GET", "HEAD") else _model_field(body)
    if name is None and ctx.path == "/api/show" and isinstance(body.get("name"), str):
        name = body["name"]   # Ollama's older field
    entry = lc.resolve(name or None, any_name_on_one=ctx.path != "/api/show")
    if ctx.path == "/api/show":   # the name (an alias, NAME:latest) is resolved: the Service shows itself
        ctx.created = lc.created.settings(name) if lc.created is not None else None
        body["model"] = entry.name
    ctx.model_unloaded = not lc.is_loaded(entry)
    ctx.query = {k: v for k, v in ctx.query.items() if k != "model"}
    return entry.service()


def health(lc, body, ctx):
    """503 while a model loads or unloads; 200 with `loaded: false` while none is loaded (lazy load, idle
    unload, unload, lease); else None (the loaded Service answers: 503 while its engine is down)."""
    if lc.switching():
        return JsonReply(503, {"status": "loading", "loaded": False, "model": lc.default.name, "service": "strata",
                               "error": {"code": 503, "type": "unavailable_error", "message": "Loading model"}})
    if lc.loaded():
        return None
    out = {"status": "ok", "loaded": False, "model": lc.default.name, "service": "strata"}
    leases = lc.leases_view()["leases"]
    if leases:
        out["leased"] = leases
    return JsonReply(200, out)


def models(lc, body, ctx):
    data = []
    for entry, loaded in lc.models_view():
        svc = entry.svc
        n_ctx = (svc.engine.max_context or svc.engine.known_ctx) if svc is not None else entry.info.get("n_ctx", 0)
        data += model_entries(entry.name, entry.aliases, loaded, n_ctx, svc.started if svc is not None else 0,
                              **{k: v for k, v in entry.info.items() if k not in ("n_ctx", "config_path")})
    return JsonReply(200, {"object": "list", "data": data})


def model_get(lc, body, ctx):
    """GET /v1/models/{id} over every model the Lifecycle knows (loaded or not)."""
    return model_in(models(lc, body, ctx), ctx)


def ollama_tags(lc, body, ctx):
    """Ollama's /api/tags: every model (its Service is built once and kept, engine not started), by name and
    aliases, as `NAME:latest`."""
    return JsonReply(200, {"models": [ollama.tag_entry(entry.service(), n) for entry in lc.entries
                                      for n in (entry.name, *entry.aliases)]})


def load(lc, body, ctx):
    return JsonReply(200, lc.load(_model_field(body)))


def unload(lc, body, ctx):
    return JsonReply(200, lc.unload(_model_field(body)))


def lease(lc, body, ctx):
    """{seconds, reason} grants a lease; {id, seconds} renews one."""
    if "id" in body:
        return JsonReply(200, lc.renew(body.get("id"), body.get("seconds")))
    return JsonReply(200, lc.lease(body.get("seconds"), body.get("reason")))


def lease_release(lc, body, ctx):
    return JsonReply(200, lc.end_lease(body.get("id")))


def leases(lc, body, ctx):
    return JsonReply(200, lc.leases_view())


def _config_entry(lc, name):
    entry = lc.resolve(name)
    path = entry.info.get("config_path")
    if not path:
        raise LifecycleError(404, "not_found_error", f"model {entry.name!r} has no run config file to edit; "
                             "start with --config FILE", param="model")
    return entry, path


def config_get(lc, body, ctx):
    from strata_control import runconfig
    entry, path = _config_entry(lc, ctx.query.get("model"))
    cfg = runconfig.read_config(path) if os.path.exists(path) else {}
    return JsonReply(200, {"model": entry.name, "path": path, "editable": list(runconfig.EDITABLE),
                           "config": {k: v for k, v in cfg.items() if k in runconfig.EDITABLE}})


# Editable keys a running server takes at once (each request reads them from the model's Service config, the
# idle thread reads idle_unload_s each look); the others are read when the server starts (the model's Service
# is built once and kept, so a later load of the same model does not read its file again).
LIVE_KEYS = frozenset({"idle_unload_s", "sampling", "reasoning_effort", "reasoning_budget_tokens",
                       "anthropic_thinking", "fit_max_tokens", "repeat_stop_tokens"})


def _apply_live(entry, changes: dict, new: dict) -> dict:
    """Apply the LIVE_KEYS of `changes` (a removed key: back to what the server started with for
    idle_unload_s, unset otherwise) -> {key: "now" | "next_start"} for every changed key."""
    applies = {}
    for key in changes:
        if key not in LIVE_KEYS:
            applies[key] = "next_start"
            continue
        value = new.get(key)
        if key == "idle_unload_s":
            entry.info["idle_unload_s"] = value
        elif entry.svc is not None:
            if value is None:
                entry.svc.config.pop(key, None)
            else:
                entry.svc.config[key] = value
            if key == "repeat_stop_tokens":
                entry.svc.repeat_stop = int(entry.svc.config.get(key, REPEAT_STOP_TOKENS))
        applies[key] = "now"
    return applies


def config_post(lc, body, ctx):
    """{"model"?, "changes": {key: value | null}}: every change checked first; the old file is kept as
    `.bak`; LIVE_KEYS apply at once, the rest at the next start (`applies` says which, per key)."""
    from strata_control import runconfig
    entry, path = _config_entry(lc, _model_field(body))
    try:
        current = runconfig.read_config(path) if os.path.exists(path) else {}
        new = runconfig.edit(current, body.get("changes"))
    except ConfigError as e:
        raise BadRequest(str(e), param="changes") from None
    runconfig.save_edit(path, new)
    return JsonReply(200, {"model": entry.name, "path": path, "saved": True, "backup": path + ".bak",
                           "config": {k: v for k, v in new.items() if k in runconfig.EDITABLE},
                           "applies": _apply_live(entry, body["changes"], new)})

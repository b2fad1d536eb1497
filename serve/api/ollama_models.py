"""Ollama's model management on local files: create, blobs, copy, delete, ps and keep_alive.

Role: the Lifecycle's Ollama routes (each takes `(lifecycle, body, ctx)`; serve/http/routes.py lists them in
`LIFECYCLE_ONLY`, so a bare Service answers 404) over serve/lifecycle/created.py's `ModelStore`. Errors are
Ollama's `{"error": "..."}` (serve/api/ollama.py `error_body`).

Routes:
- POST `/api/create` `{model, from | files | modelfile, parameters, system, messages, license, stream}`: `from`
  an existing model (its settings are the start), a blob (`sha256:...`) or, for a trusted client (it gave the
  API key, or a keyless server on loopback), an absolute GGUF path on this machine; `files` `{name: digest}`
  one uploaded GGUF blob; `modelfile` Ollama's Modelfile text (FROM / PARAMETER / SYSTEM / MESSAGE / LICENSE;
  strata_control/modelfile.py). Refused by name (400): `quantize`, `adapters`, `template` / TEMPLATE, ADAPTER,
  `path` (a Modelfile on the server). Answers NDJSON status lines ending `{"status": "success"}` (`stream`
  default true), or that one object.
- HEAD / GET `/api/blobs/sha256:<hex>`: 200 when kept, else 404; POST: the body (the file, streamed to disk) is
  kept when its sha256 is the one its path names (201), else 400.
- POST `/api/copy` `{source, destination}`; DELETE `/api/delete` `{model}` (only created models: a model the
  server was started with is its file's, 400 saying so).
- GET `/api/ps`: every loaded model with `expires_at` (when its idle rule unloads it; far ahead when never).
- `keep_alive` on `/api/chat`, `/api/generate`, `/api/embed`: a duration or seconds; 0 = unload now (an empty
  prompt or message list with it only unloads, `done_reason: "unload"`), negative = stay loaded, else the idle
  limit (serve/lifecycle/models.py `keep_alive`). Without it the server's own idle rule holds.

Public surface: `create`, `blob_head`, `blob_post`, `copy`, `delete`, `ps`, `keep_alive`, `NAME_MAX_CHARS`.
"""
from __future__ import annotations

import json
import os
import re
import time
from datetime import datetime, timezone

from serve.api import ollama
from serve.api.replies import JsonReply, StreamReply
from serve.core.events import BadRequest
from serve.lifecycle import LifecycleError
from serve.lifecycle.created import StoreError, check_digest, is_gguf
from strata_control import modelfile

NAME_MAX_CHARS = 120   # Ollama's own names (namespace/model:tag) stay well under this
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*(:[A-Za-z0-9._-]+)?\Z")
_REFUSED = {"quantize": "quantize: this server does not quantize models; create from a GGUF already quantized",
            "adapters": "adapters: LoRA adapters are not supported by this server",
            "template": "template: a model keeps the chat template of its GGUF here (the server renders it)",
            "path": "path: send the Modelfile's text as `modelfile`; the server reads no Modelfile from its disk"}
FAR_AHEAD = "2318-01-01T00:00:00Z"   # Ollama's clients read a time this far ahead as "stays loaded"


def _store(lc):
    if lc.created is None:
        raise BadRequest("this server keeps no created models (start it with a model store)", status=501)
    return lc.created


def _name(value, field: str) -> str:
    if not isinstance(value, str) or not value or len(value) > NAME_MAX_CHARS or not _NAME.match(value):
        raise BadRequest(f"{field}: a model name (letters, digits, '.', '_', '-', '/', an optional :tag), "
                         f"not {str(value)[:80]!r}", param=field)
    return value[:-len(":latest")] if value.endswith(":latest") else value


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def _source(lc, store, settings: dict, ctx) -> dict:
    """Where a created model runs: {"path": a GGUF} or {"base": a model's name}, and the settings it starts
    from (a created base's own)."""
    src = settings.get("from")
    if not isinstance(src, str) or not src:
        raise BadRequest("from: the model, blob (sha256:...) or GGUF file it is made from", param="from")
    if src.startswith(("sha256:", "sha256-", "@sha256:")):
        digest = src.lstrip("@").replace("sha256-", "sha256:", 1)
        if not store.has_blob(digest):
            raise BadRequest(f"blob {digest} is not here; upload it first (POST /api/blobs/{digest})", status=404)
        return {"path": store.blob_path(digest)}
    if src.startswith(("/", "~")):
        if not ctx.trusted:
            raise BadRequest("from: a file path is for a trusted client (the API key, or a keyless server on "
                             "this machine); upload the file as a blob instead", param="from", status=403)
        path = os.path.abspath(os.path.expanduser(src))
        if not os.path.isfile(path) or not is_gguf(path):
            raise BadRequest(f"from: {path} is not a GGUF file on this machine", param="from")
        return {"path": path}
    base_name = src[:-len(":latest")] if src.endswith(":latest") else src
    base = store.get(base_name)
    if base is not None:   # a created model: its source and settings are the new one's start
        return {k: base[k] for k in ("path", "base") if base.get(k)} | {"inherit": base}
    try:
        entry = lc.resolve(base_name)
    except LifecycleError:
        raise BadRequest(f"from: model {src!r} not found; known: {lc.known_names()}", param="from",
                         status=404) from None
    return {"base": entry.name}


def _settings(body: dict) -> dict:
    """The body (and its Modelfile) -> settings; 400 naming what is refused or malformed."""
    for key, why in _REFUSED.items():
        if body.get(key):
            raise BadRequest(why, param=key)
    try:
        out = modelfile.parse(body["modelfile"]) if body.get("modelfile") else \
            {"from": None, "parameters": {}, "system": None, "messages": [], "license": None}
        files = body.get("files")
        if files:
            if not isinstance(files, dict) or len(files) != 1:
                raise modelfile.ModelfileError("files: one {name: digest} entry, the GGUF (no adapters, no "
                                               "split files)")
            out["from"] = next(iter(files.values()))
        if body.get("from"):
            out["from"] = body["from"]
        out["parameters"] = {**out["parameters"], **modelfile.check_parameters(body.get("parameters"))}
        if body.get("messages") is not None:
            out["messages"] = modelfile.check_messages(body["messages"])
        for key in ("system", "license"):
            value = body.get(key)
            if value is not None:
                if isinstance(value, list) and key == "license":
                    value = "\n".join(map(str, value))
                if not isinstance(value, str):
                    raise modelfile.ModelfileError(f"{key}: a string")
                out[key] = value
    except modelfile.ModelfileError as e:
        raise BadRequest(str(e), param="modelfile") from None
    return out


def create(lc, body, ctx):
    store = _store(lc)
    name = _name(body.get("model") or body.get("name"), "model")
    settings = _settings(body)
    src = _source(lc, store, settings, ctx)
    base = src.pop("inherit", None) or {}
    had = {k for k in ("system", "license") if body.get(k) is not None or
           (body.get("modelfile") and settings.get(k) is not None)}
    record = {"name": name, **src, "from": settings["from"],
              "parameters": {**(base.get("parameters") or {}), **settings["parameters"]},
              "system": settings["system"] if "system" in had else base.get("system"),
              "messages": settings["messages"] or base.get("messages") or [],
              "license": settings["license"] if "license" in had else base.get("license"),
              "modified_at": time.time()}
    if lc.has_name(name) and store.get(name) is None:
        raise BadRequest(f"model: {name!r} is a model this server was started with; pick another name",
                         param="model", status=409)
    try:
        store.put(record)
    except StoreError as e:
        raise BadRequest(e.message, status=e.status) from None
    steps = [{"status": "using existing layer"}, {"status": "writing manifest"}, {"status": "success"}]
    if body.get("stream", True) is False:
        return JsonReply(200, steps[-1])
    return StreamReply((json.dumps(s) + "\n" for s in steps), content_type=ollama.NDJSON)


def blob_head(lc, body, ctx):
    digest = ctx.path.rsplit("/", 1)[-1]
    try:
        check_digest(digest)
    except StoreError as e:
        raise BadRequest(e.message) from None
    return JsonReply(200 if _store(lc).has_blob(digest) else 404, {})


def blob_post(lc, body, ctx):
    digest = ctx.path.rsplit("/", 1)[-1]
    try:
        _store(lc).write_blob(digest, ctx.read_body_into)
    except StoreError as e:
        raise BadRequest(e.message, status=e.status) from None
    return JsonReply(201, {})


def copy(lc, body, ctx):
    _store(lc)   # 501 without a model store
    source = _name(body.get("source"), "source")
    destination = _name(body.get("destination"), "destination")
    return create(lc, {"model": destination, "from": source, "stream": False}, ctx) if source != destination \
        else JsonReply(200, {})


def delete(lc, body, ctx):
    store = _store(lc)
    name = _name(body.get("model") or body.get("name"), "model")
    if store.get(name) is None:
        if lc.has_name(name):
            raise BadRequest(f"model {name!r} is served from its file (--model, a models folder or a run "
                             "config); only models made with /api/create can be deleted", param="model")
        return JsonReply(404, {"error": f"model '{name}' not found"})
    try:
        store.drop(name)
    except StoreError as e:
        raise BadRequest(e.message, status=e.status) from None
    return JsonReply(200, {})


def ps(lc, body, ctx):
    models = []
    for entry in lc.loaded_entries():
        svc = entry.svc
        if svc is None or not svc.engine.alive():
            continue
        row = ollama.tag_entry(svc, entry.name)
        until = lc.expires_at(entry)
        row.update(expires_at=_iso(until) if until is not None else FAR_AHEAD, size_vram=0,
                   context_length=svc.engine.max_context or svc.engine.known_ctx)
        models.append(row)
    return JsonReply(200, {"models": models})


def keep_alive(lc, body, ctx):
    """Before an Ollama model route: apply `keep_alive` to the model the body names; an unload-only request
    (keep_alive 0 and nothing to answer) is answered here without loading anything. None: go on."""
    seconds = ollama.keep_alive_seconds(body.get("keep_alive"))
    name = body.get("model") if isinstance(body.get("model"), str) else None
    entry = lc.resolve(name, any_name_on_one=True)
    empty = not body.get("messages") if ctx.path == "/api/chat" else \
        not body.get("input") if ctx.path == "/api/embed" else not body.get("prompt")
    if seconds == 0 and empty:
        lc.keep_alive(entry, 0, unload_now=True)
        piece = {"message": {"role": "assistant", "content": ""}} if ctx.path == "/api/chat" else {"response": ""}
        return JsonReply(200, {"model": name or entry.name, "created_at": _iso(time.time()), **piece,
                               "done": True, "done_reason": "unload"})
    lc.keep_alive(entry, seconds)
    return None

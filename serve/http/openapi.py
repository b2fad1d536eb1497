"""GET /openapi.json: an OpenAPI 3.1 document of every route this server answers, built from its route tables.

Role: walk serve/http/routes.py's tables (GET, POST, DELETE, the prefix routes) and describe each operation:
its request body (serve/api/schemas.py `BODIES`, keyed by the handler, so an alias path gets the same one),
its 200 answer (a fixed shape where `ANSWERS` has one, SSE or NDJSON where the handler streams, text for
the Prometheus views, any JSON otherwise) and its errors in the dialect the path answers in
(`routes.error_dialect`). Nothing is written by hand per path: a route added to a table is in the document,
and a POST handler without a body schema is a test failure (tests/serve/http/test_openapi.py), not a silent
gap. The web app's pages and /static/ are not API and are left out. Knows no engine.

Public surface: `document(routes)`, `ERROR_STATUSES`, `OPENAPI_VERSION`.
"""
from __future__ import annotations

from serve.api import anthropic, llama_routes, ollama, schemas
from serve.http import stream_sessions, views

OPENAPI_VERSION = "3.1.0"
# every status a route may answer besides 200 (docs/API.md "Errors"): input, key, own page, path, method,
# slow body, a busy slot, size, content type, busy, a bug, a feature that is off, the engine broke the protocol
# or is down, a full disk
ERROR_STATUSES = ("400", "401", "403", "404", "405", "408", "409", "413", "415", "429", "500", "501", "502", "503",
                  "507")
TEXT_VIEWS = {"/metrics": "text/plain", "/metrics/prometheus": "text/plain"}
# one server-sent event (OpenAPI 3.2's reading of a text/event-stream schema): its data is one JSON text or [DONE]
SSE_EVENT = {"type": "object", "properties": {"event": {"type": "string"}, "data": {"type": "string"},
                                              "id": {"type": "string"}}}
# path parameters of the prefix routes: (method, prefix) -> the parameter's name
PREFIX_PARAMS = {"/v1/responses/": "response_id", "/v1/models/": "model", "/slots/": "id_slot",
                 "/api/blobs/": "digest"}


# bodies of the handlers that live in the HTTP shell itself (serve/api/schemas.py cannot import them)
SHELL_BODIES = {views.settings_post: schemas.SETTINGS, views.cors_proxy: schemas.OBJ,
                stream_sessions.lookup: schemas.obj(conversation_ids={"type": "array", "items": schemas.STR})}
QUERY_PARAMS = {"/slots/": [{"name": "action", "in": "query", "required": True,
                             "schema": {"enum": ["save", "restore", "erase"]}}]}


def _dialect_key(module) -> str:
    return {anthropic: "anthropic", ollama: "ollama", llama_routes: "llama"}.get(module, "openai")


def _answers(routes, path: str, handler, method: str) -> dict:
    error = schemas.ERROR_BODIES[_dialect_key(routes.error_dialect(path))]
    ok_json = schemas.ANSWERS.get(handler, {})
    content = {"application/json": {"schema": ok_json}}
    if path in TEXT_VIEWS:
        content = {TEXT_VIEWS[path]: {"schema": {"type": "string"}}, **content}
    if handler in schemas.STREAMS:
        content["text/event-stream"] = {"schema": SSE_EVENT}
    if handler in schemas.NDJSON_STREAMS:
        content["application/x-ndjson"] = {"schema": {"type": "string"}}
    out = {"200": {"description": "the answer", "content": content}}
    for status in ERROR_STATUSES:
        out[status] = {"description": "an error in this route's dialect",
                       "content": {"application/json": {"schema": error}}}
    return out


def _operation(routes, path: str, method: str, handler) -> dict:
    doc = (handler.__doc__ or "").strip().split("\n")[0] if callable(handler) else ""
    op = {"operationId": f"{method.lower()}{path.replace('/', '_').replace('-', '_').replace('.', '_')}",
          "summary": doc or f"{method} {path}", "responses": _answers(routes, path, handler, method)}
    if handler in schemas.RAW_BODIES and method == "POST":
        op["requestBody"] = {"required": True, "content": {"application/octet-stream": {
            "schema": {"type": "string", "format": "binary"}}}}
    elif method in ("POST", "DELETE"):
        body = schemas.BODIES.get(handler) or SHELL_BODIES.get(handler)
        if body is not None:
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


def document(routes) -> dict:
    """The OpenAPI 3.1 document of `routes` (the module serve/http/routes.py)."""
    paths: dict[str, dict] = {}
    for method, table in (("get", routes.GET_ROUTES), ("post", routes.POST_ROUTES),
                          ("delete", routes.DELETE_ROUTES)):
        for path, handler in sorted(table.items()):
            paths.setdefault(path, {})[method] = _operation(routes, path, method.upper(), handler)
    for (method, prefix), handler in sorted(routes.PREFIX_ROUTES.items()):
        name = PREFIX_PARAMS[prefix]
        path = f"{prefix}{{{name}}}"
        op = _operation(routes, path, method, handler)
        op["parameters"] = [{"name": name, "in": "path", "required": True,
                             "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]+$"}}, *QUERY_PARAMS.get(prefix, [])]
        paths.setdefault(path, {})[method.lower()] = op
    return {"openapi": OPENAPI_VERSION,
            "info": {"title": "Strata", "version": "1",
                     "description": "A local LLM server: the OpenAI, Anthropic, Ollama and llama.cpp APIs over "
                                    "one engine. Generated from the server's route tables."},
            "paths": paths}

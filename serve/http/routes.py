"""The route table: every path the server answers, in one place.

Role: which handler answers a method and a path, which paths are public (no key), which are the web app's
pages, which dialect shapes a path's error body, which routes only a browser on this server's own page may
call, and how a route meets a `Lifecycle` (a model route picks its model by the body's `model`; a by-model
route reads a model's tokenizer without loading it; a lifecycle route exists only with a Lifecycle; an
override answers for a Lifecycle instead of the loaded Service). serve/http/server.py reads these tables and
nothing else decides a route. Adding an endpoint: one line in `GET_ROUTES` or `POST_ROUTES` (plus
`MODEL_ROUTES` / `BY_MODEL_ROUTES` when a model's body picks the model, `ERROR_DIALECTS` when its errors are
not OpenAI's).

Public surface: `GET_ROUTES`, `POST_ROUTES`, `DELETE_ROUTES`, `PREFIX_ROUTES`, `PAGES`, `PUBLIC_PATHS`,
`ERROR_DIALECTS`, `error_dialect(path)`, `OWN_PAGE_ROUTES`, `LIFECYCLE_ONLY`, `OVERRIDES`, `PREFIX_OVERRIDES`,
`POST_OVERRIDES`, `MODEL_ROUTES`, `BY_MODEL_ROUTES`, `LEASE_PREFIX`, `DELETE_JSON`, `UPLOAD_PREFIX`.
"""
from __future__ import annotations

import sys

from serve.api import (anthropic, embeddings, lifecycle_routes as lc, llama_routes, ollama, ollama_models as om,
                       openai, responses, slot_routes)
from serve.api.replies import JsonReply
from serve.http import openapi, stream_sessions, views
from serve.ops import llama_views, metrics_views

PAGES = {"/": "index.html", "/chat": "index.html", "/monitor": "monitor.html", "/about": "about.html"}
PUBLIC_PATHS = ("/health", "/api/health")

GET_ROUTES = {
    "/health": views.health, "/api/health": views.health, "/v1/health": views.health,
    "/v1/models": openai.models, "/models": openai.models,
    "/v1/status": views.status, "/status": lambda s, b, c: JsonReply(200, s.status_view()),
    "/metrics": views.metrics, "/metrics/prometheus": views.prometheus_text, "/settings": views.settings_get,
    "/props": llama_routes.props, "/slots": lambda s, b, c: JsonReply(200, llama_views.slots(s)),
    "/about.json": lambda s, b, c: JsonReply(200, metrics_views.about_view(   # the About page's facts
        s, metrics_views.routes_view(GET_ROUTES, POST_ROUTES, PAGES))),
    "/api/version": ollama.version, "/api/tags": ollama.tags, "/api/ps": ollama.ps,
    "/cors-proxy": views.cors_proxy,
    "/openapi.json": lambda s, b, c: JsonReply(200, openapi.document(sys.modules[__name__])),  # from these tables
    "/v1/stream": stream_sessions.get_stream,
    "/v1/lease": lc.leases, "/config": lc.config_get,          # only with a Lifecycle (else 404)
}
POST_ROUTES = {
    "/v1/chat/completions": openai.chat_completions, "/chat/completions": openai.chat_completions,
    "/v1/completions": openai.completions, "/settings": views.settings_post,
    "/v1/responses": responses.responses, "/responses": responses.responses,
    "/api/chat": ollama.chat, "/api/generate": ollama.generate, "/api/show": ollama.show,
    "/api/pull": ollama.no_hub, "/api/push": ollama.no_hub, "/api/create": om.create, "/api/copy": om.copy,
    "/completion": llama_routes.completion, "/completions": llama_routes.completion,
    "/infill": llama_routes.infill, "/apply-template": llama_routes.apply_template,
    "/v1/chat/completions/input_tokens": llama_routes.input_tokens,
    "/chat/completions/input_tokens": llama_routes.input_tokens,
    "/v1/responses/input_tokens": responses.input_tokens, "/responses/input_tokens": responses.input_tokens,
    "/tokenize": llama_routes.tokenize, "/detokenize": llama_routes.detokenize,
    "/v1/embeddings": embeddings.openai_embeddings, "/embedding": embeddings.llama_embedding,
    "/embeddings": embeddings.llama_embedding, "/api/embed": embeddings.ollama_embed,
    "/api/embeddings": embeddings.ollama_embeddings,
    "/cors-proxy": views.cors_proxy,
    "/v1/streams/lookup": stream_sessions.lookup,
    "/v1/load": lc.load, "/v1/unload": lc.unload, "/v1/lease": lc.lease,   # only with a Lifecycle (else 404)
    "/v1/lease/release": lc.lease_release, "/config": lc.config_post,
    "/v1/messages": anthropic.messages, "/v1/messages/count_tokens": anthropic.count_tokens,
}
DELETE_ROUTES = {"/api/delete": om.delete, "/v1/stream": stream_sessions.delete_stream}
DELETE_JSON = frozenset({"/api/delete"})   # DELETE routes whose body is JSON (Ollama's {"model"})
UPLOAD_PREFIX = "/api/blobs/"              # POST bodies that are files, streamed to the route (not JSON)
PREFIX_ROUTES = {**{(m, "/v1/responses/"): responses.get_response for m in ("GET", "POST", "DELETE")},  # stored ones
                 ("GET", "/v1/models/"): openai.model_get,
                 ("POST", "/slots/"): slot_routes.slot_action,   # llama-server's saved slots: ?action=save|...
                 ("GET", UPLOAD_PREFIX): om.blob_head, ("POST", UPLOAD_PREFIX): om.blob_post}   # HEAD is a GET

# Error bodies in the dialect of the path (the rest: OpenAI's, or Anthropic's under /v1/messages)
ERROR_DIALECTS = (("/api/", ollama), ("/completion", llama_routes), ("/infill", llama_routes),
                  ("/apply-template", llama_routes), ("/tokenize", llama_routes), ("/detokenize", llama_routes),
                  ("/embedding", llama_routes), ("/slots/", llama_routes))


def error_dialect(path: str):
    """The translator module whose error shape answers a failure on `path`."""
    for prefix, dialect in ERROR_DIALECTS:
        if path.startswith(prefix):
            return dialect
    return anthropic if path.startswith("/v1/messages") else openai


# Routes that change the server for every client: JSON only, and from this server's own page (or a client
# that sends no Origin, such as curl), whatever the API key
OWN_PAGE_ROUTES = {"/settings", "/config"}

# ---------------------------------------------------------------- routes and the Lifecycle
# load/unload, lease, /config: they take the Lifecycle itself (a bare Service answers 404)
LIFECYCLE_ONLY = frozenset({lc.leases, lc.config_get, lc.load, lc.unload, lc.lease, lc.lease_release,
                            lc.config_post, om.create, om.copy, om.delete, om.blob_head, om.blob_post})
# routes a Lifecycle answers itself (a None from one: answer as the loaded Service does)
OVERRIDES = {"/health": lc.health, "/api/health": lc.health, "/v1/health": lc.health, "/v1/models": lc.models,
             "/models": lc.models, "/api/tags": lc.ollama_tags, "/api/ps": om.ps}
# POST routes a Lifecycle looks at first (a reply: answered; None: the route runs): Ollama's keep_alive
POST_OVERRIDES = {"/api/chat": om.keep_alive, "/api/generate": om.keep_alive, "/api/embed": om.keep_alive}
PREFIX_OVERRIDES = {"/v1/models/": lc.model_get}  # the same for paths under a prefix
# POST routes that run a model: the request's `model` picks it (loaded on demand), counted while it runs
MODEL_ROUTES = frozenset({"/v1/chat/completions", "/chat/completions", "/v1/completions", "/v1/messages",
                          "/v1/responses", "/responses", "/api/chat", "/api/generate", "/completion",
                          "/completions", "/infill",
                          "/v1/embeddings", "/embedding", "/embeddings", "/api/embed", "/api/embeddings"})
LEASE_PREFIX = "/v1/lease"
# Routes that read a model's tokenizer, template or settings: the body's (POST) or query's (GET) `model` picks
# it; they never load an engine (the model's Service is built once and kept: its tokenizer read from the GGUF)
BY_MODEL_ROUTES = frozenset({"/tokenize", "/detokenize", "/v1/messages/count_tokens", "/props", "/apply-template",
                             "/v1/chat/completions/input_tokens", "/chat/completions/input_tokens",
                             "/v1/responses/input_tokens", "/responses/input_tokens", "/api/show"})

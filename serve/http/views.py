"""The plain views: the server's own answers that belong to no dialect.

Role: health (503 with the reason until the engine is READY), status (a trusted client also gets the engine's
death note and log path), the activity counts, /metrics (Prometheus text, or JSON for the Monitor), the
shared Chat settings (read, and written beside the run config), and the refused CORS proxy. Every view takes
`(service, body, ctx)` and returns a reply; serve/http/routes.py maps paths to them.

Public surface: `health`, `status`, `activity(svc)`, `metrics`, `prometheus_text`, `settings_get`,
`settings_post`, `cors_proxy`, `DIALECTS` (the chat/completion paths /v1/status lists).
"""
from __future__ import annotations

import sys
import time

from serve.api.replies import JsonReply
from serve.core.errors import public_text
from serve.core.events import BadRequest
from serve.http.guard import HttpError
from serve.ops import llama_views, metrics_views, prometheus, telemetry
from strata_control.files import StorageFull
from strata_control.runconfig_file import save_shared_settings

# The paths of the dialects that answer chat and completion requests (listed by /v1/status)
DIALECTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/api/chat", "/api/generate", "/completion",
            "/infill", "/v1/messages")


# ---------------------------------------------------------------- plain views
def health(svc, body, ctx):
    status, out = svc.health()
    if status != 200:
        return JsonReply(503, {**out, "error": {"code": 503, "type": "unavailable_error",
                                                "message": "Loading model" if out["status"] == "loading"
                                                else public_text(svc.death_note())}})
    return JsonReply(200, out)


def status(svc, body, ctx):
    """The service's state; a trusted client (serve/http/access.py `trusted`) also gets the engine's whole death note
    (its log's last lines, paths) and the engine log's path."""
    e = svc.engine
    detail = {"engine_note": None if e.alive() else svc.death_note(),
              "engine_log": e.log_path} if ctx.trusted else {}
    return JsonReply(200, {**detail, "service": "strata", "model": svc.model_name, "loaded": e.alive(),
                           "engine": e.info.get("engine"), "started": svc.started,
                           "uptime_s": round(time.time() - svc.started, 1),
                           "context": {"max_positions": e.max_context or e.known_ctx,
                                       "native": e.info.get("n_ctx_train")},
                           "concurrency": {"serving": llama_views.total_slots(e), "requested": svc.config.get("parallel", 1)},
                           "dialects": list(DIALECTS),
                           "activity": activity(svc),
                           "live": svc.status_view(), "last_timings": svc.last_timings,
                           "machine": telemetry.machine()})


def activity(svc) -> dict:
    """Requests served, running (in_flight: being answered or waiting), and how many of those wait."""
    live = metrics_views.live_counts(svc)
    return {"requests": svc.totals["requests"], "in_flight": live["running"], "waiting": live["deferred"],
            "slots_busy": live["slots_busy"], "slots_total": live["slots_total"]}


def metrics(svc, body, ctx):
    """Prometheus text as llama-server answers GET /metrics (llama.cpp's names, then vLLM's and strata:), with
    its Process-Start-Time-Unix header; JSON for the Monitor when asked: ?format=json, or an Accept naming
    application/json and no text form"""
    accept = (ctx.headers.get("Accept") or "").lower()
    start = {"Process-Start-Time-Unix": str(int(svc.started))}
    if ctx.query.get("format") == "json" or (
            "application/json" in accept and "text/plain" not in accept and "openmetrics" not in accept):
        return JsonReply(200, metrics_views.metrics_json(svc, all_requests=ctx.query.get("requests") == "all"),
                         start)
    counts = ctx.http_counts() if ctx.http_counts else None   # the HTTP server's connections (strata:http_*)
    return (prometheus.CONTENT_TYPE, prometheus.render_all(svc, counts), start)


def prometheus_text(svc, body, ctx):
    """Prometheus text with llama.cpp's names"""
    return (prometheus.CONTENT_TYPE, prometheus.render(svc))


def settings_get(svc, body, ctx):
    return JsonReply(200, svc.settings_view())


def settings_post(svc, body, ctx):
    """POST /settings {"defaults": {...} | null}: the shared Chat settings every request gets for the fields
    it omits (checked whole: a 400 names the field). Saved beside the run config when there is one."""
    if "defaults" not in body:
        raise BadRequest('send {"defaults": {...}} (or {"defaults": null} to clear them)', param="defaults")
    before = svc.settings_view()["defaults"]
    view = svc.set_settings(body["defaults"])
    path = getattr(svc, "settings_path", None)
    if path:
        try:
            save_shared_settings(path, view["defaults"])
        except StorageFull:   # a 507: the server keeps what the file keeps, so a restart changes nothing
            svc.set_settings(before)
            raise
        except OSError as e:
            print(f"strata: shared settings not saved to {path}: {e}", file=sys.stderr)
    return JsonReply(200, view)


def cors_proxy(svc, body, ctx):
    """llama-server's web-UI proxy (off there unless --ui-mcp-proxy): never here, it would let any client make
    the server fetch any URL (SSRF); answered as llama-server answers it when off"""
    raise HttpError(403, "feature_disabled", "this feature is disabled: Strata has no CORS proxy")

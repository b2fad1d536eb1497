"""The HTTP server: a threaded standard-library server, its routes, security checks and life cycle.

Role: accept connections (one thread each, at most `max_connections`; read deadlines, bodies and the raw
socket rules are `serve/http/guard.py`'s), check Host / API key / Origin (`serve/http/access.py`), route to the
API translators (`serve/api/openai.py`, `serve/api/anthropic.py`) and to the plain views (health, models, status,
metrics, tokenize, web app), write JSON answers and SSE streams (a burst of frames a write, at most one every
`--stream-interval-ms`: `serve/http/pacing.py`), and turn exceptions into error answers at this one
boundary. It knows nothing of pipes: `Service` and `StrataEngine` own those.

Life cycle (`run_server(opts)`): bind (the port is known before the model loads; `--port 0` picks a free
one), serve, start the engine in the background (`/health` is 503 until READY), print
`strata: listening on http://HOST:PORT` once `/health` answers 200. A model that cannot be loaded ends the
server: one line `strata: the engine did not start: ...`, exit 1. After that an engine that dies is restarted
by the Service's supervisor (`/health` returns to 200 by itself). SIGTERM/SIGINT: stop accepting, end the
running streams with a final event, QUIT the engine (then terminate, kill), exit 0; a second Ctrl+C kills
the engine and exits at once. `--parent-pid PID`: the same shutdown when that process is gone.

Public surface: `run_server(opts)`, `StrataHTTPServer`, `make_server(service, opts)`, `Options`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import http.client
import hmac
import io
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from serve.api import openai as openai_api
from serve.http import access, guard as http_guard, stream_sessions
from serve.api import embeddings, lifecycle_routes, llama_routes, ollama, responses
from serve.ops import llama_views, metrics_views, prometheus, telemetry
from serve.core.errors import ServiceError, public_text
from strata_control.runconfig_file import save_shared_settings
from serve.core.events import BadRequest
from serve.http.guard import HttpError
from serve.lifecycle import Lifecycle, LifecycleError
from serve.api.replies import JsonReply, RequestContext, StreamReply
from serve.http.pacing import StreamPacer

try:
    from serve.api import anthropic as anthropic_api
except ImportError:
    anthropic_api = None

HTTP_BACKLOG = 256              # listen queue (env STRATA_HTTP_BACKLOG)
SHUTDOWN_STREAMS_S = 10.0       # running streams get this long to send their final event
CANCEL_CHECK_S = 0.05           # the socket is probed for a hang-up at most this often
PARENT_POLL_S = 1.0             # --parent-pid is checked this often
STATIC_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "static")
STATIC_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}
PAGES = {"/": "index.html", "/chat": "index.html", "/monitor": "monitor.html", "/about": "about.html"}
PUBLIC_PATHS = ("/health", "/api/health")


@dataclass
class Options:
    host: str = "127.0.0.1"
    port: int = 8080
    api_keys: list = field(default_factory=list)
    cors_origins: list = field(default_factory=list)
    allowed_hosts: list = field(default_factory=list)
    parent_pid: int | None = None
    quiet: bool = False
    stream_interval_ms: float | None = None   # None: $STRATA_STREAM_INTERVAL_MS or the default (http_guard)


class StrataHTTPServer(http_guard.GuardedServer, ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # server_close() must not join handler threads: shutdown() bounds its own waits
    allow_reuse_address = True
    request_queue_size = int(http_guard.env_float("STRATA_HTTP_BACKLOG", HTTP_BACKLOG))

    def __init__(self, addr, service, opts: Options):
        self.service = service
        self.opts = opts
        self.streams = 0                     # streams being written (guarded by streams_lock)
        self.streams_lock = threading.Lock()
        self.stopping = threading.Event()
        self.stream_sessions = stream_sessions.SessionStore()   # X-Conversation-Id replies (its own lock)
        limits = http_guard.Limits.from_env()  # timeouts, body limit, connection cap (serve/http/guard.py)
        if opts.stream_interval_ms is not None:
            limits = dataclasses.replace(limits,
                                         stream_interval_s=http_guard.stream_interval_s(opts.stream_interval_ms))
        self.guard_init(limits)
        super().__init__(addr, Handler)


def make_server(service, opts: Options) -> StrataHTTPServer:
    return StrataHTTPServer((opts.host, opts.port), service, opts)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server_version = "strata"
    # TCP_NODELAY: a stream is one small write a token; with Nagle on, a write waits for the previous one's ACK,
    # which a remote client may delay (delayed ACK, up to ~40 ms), and tokens would arrive in bursts
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):  # one line per request, on our own (non-blocking) stderr
        if not self.server.opts.quiet:
            sys.stderr.write(f"strata: {self.address_string()} {fmt % args}\n")

    # ---------------------------------------------------------------- the connection (serve/http/guard.py)
    def setup(self):
        super().setup()
        self.rfile.close()  # replaced by a reader with a deadline per phase (idle, headers, body)
        self._reader = http_guard.DeadlineReader(self.connection, self.server.limits)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self):
        try:
            super().handle_one_request()
        except http_guard.ReadDeadline as e:  # idle: nothing was asked, so nothing is answered
            self.close_connection = True
            if e.phase != "idle":
                self.send_error(408, e.message)

    def parse_request(self):
        line = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        if len(line.split()) == 2:  # HTTP/0.9 ("GET /path"): no headers follow, and its answer has no status
            self.requestline, self.command, self.request_version = line, None, "HTTP/1.0"
            self.send_error(505, "HTTP/0.9 requests are not served; send HTTP/1.0 or HTTP/1.1")
            return False
        if not super().parse_request():
            return False
        self._reader.start_body()
        return True

    def send_error(self, code, message=None, explain=None):
        """http.server's own refusals (bad request line 400, 414, 431, 501, 505) and 408, as OpenAI JSON
        with a status line (an HTTP/0.9-looking request line would get neither)."""
        self.close_connection = True
        if self.request_version in ("HTTP/0.9", ""):
            self.request_version = "HTTP/1.0"
        text = message or HTTPStatus(code).phrase
        if explain and explain not in text:
            text += f" ({explain})"
        data = json.dumps(http_guard.error_json(code, text)).encode()
        with contextlib.suppress(OSError):
            self.send_response(code)  # the standard reason phrase; the detail is in the body
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

    # ---------------------------------------------------------------- plumbing
    def _api(self, path):
        for prefix, dialect in ERROR_DIALECTS:
            if path.startswith(prefix):
                return dialect
        return anthropic_api if path.startswith("/v1/messages") and anthropic_api is not None else openai_api

    def _send(self, status, body, content_type="application/json", headers=None):
        data = body if isinstance(body, bytes) else (
            body.encode() if isinstance(body, str) else json.dumps(body, ensure_ascii=False).encode())
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        for k, v in {**self._cors_headers(), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            with contextlib.suppress(OSError):  # the client left before its answer: nothing to tell it
                self.wfile.write(data)

    def _error(self, path, status, err_type, message, param=None, code=None, extra=None):
        api = self._api(path)
        if path.startswith("/v1/messages") and anthropic_api is None:
            body = {"type": "error", "error": {"type": err_type, "message": message}}
        else:
            body = api.error_body(status, err_type, message, param, code)
        if extra and api in (openai_api, llama_routes) and isinstance(body.get("error"), dict):
            body["error"].update(extra)  # llama-server's error figures; Anthropic's fixed shape keeps its own
        metrics_views.note_rejected(self.server.service, getattr(self, "command", None), path, status, message)
        self._send(status, body)

    def _cancelled(self):
        """True when the client hung up (a readable socket with nothing to read) or we are stopping."""
        if self.server.stopping.is_set():
            return True
        session = getattr(self, "_session", None)
        if session is not None:   # a resumable reply outlives its client: only a stop ends it
            return session.cancelled()
        pacer = getattr(self, "_pacer", None)
        if pacer is not None and pacer.gone:   # a held burst's write failed
            return True
        now = time.monotonic()
        if now - getattr(self, "_probe_at", 0.0) < CANCEL_CHECK_S:
            return getattr(self, "_gone", False)
        self._probe_at = now
        self._gone = getattr(self, "_gone", False) or http_guard.peer_gone(self.connection)
        return self._gone

    def _on_wait(self):
        """The engine client is about to wait (on this thread): a stream's held frames go out (StreamPacer)."""
        pacer = getattr(self, "_pacer", None)
        if pacer is not None:
            pacer.on_wait()

    def _json_body(self):
        raw = http_guard.read_body(self.rfile, self.headers, self._reader, self.server.limits.max_body_bytes)
        return http_guard.parse_json(raw)

    # ---------------------------------------------------------------- security (serve/http/access.py)
    def _check_access(self, method, path):
        """Host, key and Origin; True when the request gave a valid API key."""
        opts = self.server.opts
        access.check_host(self.headers, opts.host, opts.allowed_hosts, bool(opts.api_keys))
        if path in PUBLIC_PATHS or path in PAGES or path.startswith("/static/"):
            return False
        lease = path.startswith(lifecycle_routes.LEASE_PREFIX) and isinstance(self.server.service, Lifecycle)
        if lease and self._lease_token_ok():   # the resource lease: the user-only token file's token
            key_checked = False
        elif lease and not opts.api_keys:
            raise HttpError(401, "authentication_error", "a lease needs the API key or the token from the "
                            "server's lease token file (strata ps --json shows where it is)")
        else:
            key_checked = access.check_key(self.headers, opts.api_keys)
        access.check_origin(self.headers, method, opts.cors_origins, bool(opts.api_keys))
        return key_checked

    def _lease_token_ok(self) -> bool:
        token = getattr(self.server.service, "lease_token", None)
        auth = self.headers.get("Authorization") or ""
        got = auth[7:].strip() if auth.lower().startswith("bearer ") else (self.headers.get("X-Api-Key") or "")
        return bool(token) and hmac.compare_digest(got.encode("utf-8", "surrogateescape"), token.encode("utf-8"))

    def _check_own_page(self):
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise HttpError(415, "invalid_request_error", "send this request as Content-Type: application/json")
        origin = self.headers.get("Origin")
        if origin and urlsplit(origin).netloc != (self.headers.get("Host") or "") and \
                origin not in self.server.opts.cors_origins:
            raise HttpError(403, "forbidden", f"only this server's own page may change its settings, not {origin!r}")

    def _cors_headers(self, preflight=False):
        """CORS headers on every API route (serve/http/access.py), none on the pages (same origin)."""
        if not (hasattr(self, "headers") and self.headers):
            return {}
        path = urlsplit(self.path).path
        if path in PAGES or path.startswith("/static/"):
            return {}
        return access.cors_headers(self.headers, self.server.opts.cors_origins, preflight)

    # ---------------------------------------------------------------- dispatch
    def do_OPTIONS(self):
        self.send_response(200)  # llama-server's preflight answer; no key asked (browsers send none)
        for k, v in self._cors_headers(preflight=True).items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        try:
            self._dispatch("GET")
        finally:
            self._leave_model()

    def do_POST(self):
        try:
            self._dispatch("POST")
        finally:
            self._leave_model()

    def _leave_model(self):
        """The reply has ended: the model it ran on may be unloaded or switched now (serve/lifecycle.py)."""
        ticket, self._ticket = getattr(self, "_ticket", None), None
        if ticket is not None:
            ticket.release()

    def _route(self, route, path, method, body, ctx, svc):
        """With a Lifecycle: its own routes get it; a model route runs on the model its body names (loaded on
        demand, counted until the reply ends); a tokenizer/template route reads the named model's Service without
        loading it; every other route reads the loaded (or default) model's Service."""
        if not isinstance(svc, Lifecycle):
            if route in LIFECYCLE_ONLY:
                raise HttpError(404, "not_found_error", f"{path}: this server has no model lifecycle")
            return route(svc, body, ctx)
        if route in LIFECYCLE_ONLY:
            return route(svc, body, ctx)
        override = lifecycle_routes.OVERRIDES.get(path)
        reply = override(svc, body, ctx) if override is not None and method in ("GET", "HEAD") else None
        if reply is not None:
            return reply
        if method == "POST" and path in lifecycle_routes.MODEL_ROUTES:
            self._ticket = svc.enter(body.get("model") if isinstance(body.get("model"), str) else None)
            reply = route(self._ticket.service, body, ctx)
            # the model is free once the engine's work is done, before the client has the last bytes (so a
            # client's next call, an unload say, never finds its own finished request still running)
            if isinstance(reply, StreamReply):
                reply.before_last = self._leave_model
            else:
                self._leave_model()
            return reply
        if path in lifecycle_routes.BY_MODEL_ROUTES:   # the named model's tokenizer/template; no engine load
            return route(lifecycle_routes.by_model(svc, method, body, ctx), body, ctx)
        return route(svc.view_service(), body, ctx)

    def do_DELETE(self):
        try:
            self._dispatch("DELETE")
        finally:
            self._leave_model()

    def _dispatch(self, method):
        self._session = None   # this request's resumable stream session, if it opens one
        parts = urlsplit(self.path)
        path = parts.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        svc = self.server.service
        try:
            key_checked = self._check_access(method, path)
            routes = GET_ROUTES if method in ("GET", "HEAD") else DELETE_ROUTES if method == "DELETE" else POST_ROUTES
            route = routes.get(path) or next((r for (m, prefix), r in PREFIX_ROUTES.items()
                                              if m == method and path.startswith(prefix)), None)
            if route is None:
                if method == "GET" and (path in PAGES or path.startswith("/static/")):
                    return self._static(path)
                if path.startswith("/v1/messages") and anthropic_api is None and method == "POST":
                    raise HttpError(404, "not_found_error", "the Anthropic API is not available in this build")
                raise HttpError(404, "not_found_error", f"not found: {method} {path}")
            if method == "POST":
                access.check_browser_json(self.headers)
            if method == "POST" and path in OWN_PAGE_ROUTES:
                self._check_own_page()
            body = self._json_body() if method == "POST" else {}
            if method == "DELETE":
                http_guard.read_body(self.rfile, self.headers, self._reader,  # read, so the answer is not
                                     self.server.limits.max_body_bytes)    # cut off by a reset
            ctx = RequestContext(cancelled=self._cancelled, on_wait=self._on_wait,
                                 shutting_down=self.server.stopping.is_set,
                                 headers=self.headers, path=path, query=query, trusted=access.trusted(
                                     self.server.opts.api_keys, key_checked, self.client_address[0]),
                                 sessions=self.server.stream_sessions)
            conv_id = stream_sessions.conversation_id(self.headers) if method == "POST" else None
            reply = self._route(route, path, method, body, ctx, svc)
            if conv_id and isinstance(reply, StreamReply) and reply.content_type.startswith("text/event-stream"):
                self._session = self.server.stream_sessions.open(conv_id)
        except (HttpError, LifecycleError) as e:
            return self._error(path, e.status, e.err_type, e.message, e.param, e.code)
        except BadRequest as e:
            return self._error(path, e.status, "invalid_request_error", e.message, e.param, e.code, e.extra)
        except ServiceError as e:  # the Service turned every engine failure into one (503 / 502)
            return self._error(path, e.status, e.err_type, public_text(e.message))
        except ValueError as e:  # an engine ERR, or a value the translator refused
            return self._error(path, 400, "invalid_request_error", public_text(str(e)))
        except RecursionError:  # a body nested deeper than a walk over it can go
            return self._error(path, 400, "invalid_request_error", "the request is nested too deeply")
        except (TypeError, KeyError, AttributeError) as e:
            traceback.print_exc()
            return self._error(path, 400, "invalid_request_error", f"the request is malformed ({e})")
        except Exception as e:  # the one place an unexpected failure becomes a 500 (its detail: the log)
            traceback.print_exc()
            return self._error(path, 500, "server_error", f"internal error ({type(e).__name__}); see the "
                               "server log")
        if isinstance(reply, StreamReply):
            return self._stream(reply)
        if isinstance(reply, JsonReply):
            return self._send(reply.status, reply.body, headers=reply.headers)
        content_type, text, *headers = reply   # (content type, text[, headers])
        self._send(200, text, content_type, headers[0] if headers else None)

    def _static(self, path):
        name = PAGES.get(path) or path[len("/static/"):]
        if "/" in name or "\\" in name or name.startswith("."):
            raise HttpError(404, "not_found_error", "not found")
        full = os.path.join(STATIC_DIR, name)
        ext = os.path.splitext(name)[1]
        if ext not in STATIC_TYPES or not os.path.isfile(full):
            raise HttpError(404, "not_found_error", "not found")
        with open(full, "rb") as f:
            self._send(200, f.read(), STATIC_TYPES[ext], {"Cache-Control": "no-cache"})

    def _stream(self, reply: StreamReply):
        srv = self.server
        with srv.streams_lock:
            srv.streams += 1
        frames = reply.frames
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Cache-Control", "no-cache")
            self.send_header("X-Accel-Buffering", "no")
            self.send_header("Connection", "close")
            for k, v in self._cors_headers().items():
                self.send_header(k, v)
            self.end_headers()
            # a moderate send buffer, so a client that stops reading blocks the write within a few hundred
            # tokens and the write timeout (sendall's total limit) ends the stream and the engine request
            http_guard.limit_send_buffer(self.connection, srv.limits)
            timeout = srv.limits.write_s
            self.connection.settimeout(timeout if timeout > 0 else None)
            session = getattr(self, "_session", None)
            if session is not None:   # written frame by frame (the session keeps each): released before the last
                return self._tee(_release_before_last(frames, reply.before_last) if reply.before_last else frames,
                                 session)
            # frames are held and written a burst at a time: at the engine client's next wait (ctx.on_wait)
            self._pacer = pacer = StreamPacer(self.wfile.write, srv.limits.stream_interval_s)
            for frame in frames:
                pacer.hold(frame if isinstance(frame, bytes) else frame.encode("utf-8"))
                if pacer.gone:
                    break
            pacer.finish(reply.before_last)
        except (OSError, ValueError):  # the client hung up or stopped reading past the limit
            self._gone = True
        finally:
            self._pacer = None
            frames.close()  # stops the engine (STOP + drain) if the stream did not finish
            with srv.streams_lock:
                srv.streams -= 1

    def _tee(self, frames, session):
        """A resumable reply (serve/http/stream_sessions.py): every frame into its session, and to the client while
        it listens; the reply runs to its end after a hang-up unless stopped (ctx.cancelled: _cancelled)."""
        try:
            for frame in frames:
                data = frame.encode("utf-8")
                session.append(data)
                if not getattr(self, "_gone", False):
                    try:
                        self.wfile.write(data)
                    except (OSError, ValueError):
                        self._gone = True
        finally:
            session.finish()


def _release_before_last(frames, release):
    """`frames`, with `release()` called once the last frame is known (before it is written)."""
    try:
        prev = next(frames, None)
        while prev is not None:
            nxt = next(frames, None)
            if nxt is None:
                release()
            yield prev
            prev = nxt
    finally:
        frames.close()


# ---------------------------------------------------------------- plain views
def _health(svc, body, ctx):
    status, out = svc.health()
    if status != 200:
        return JsonReply(503, {**out, "error": {"code": 503, "type": "unavailable_error",
                                                "message": "Loading model" if out["status"] == "loading"
                                                else public_text(svc.death_note())}})
    return JsonReply(200, out)


def _status(svc, body, ctx):
    """The service's state; a trusted client (access.trusted) also gets the engine's whole death note
    (its log's last lines, paths) and the engine log's path."""
    e = svc.engine
    detail = {"engine_note": None if e.alive() else svc.death_note(),
              "engine_log": getattr(e, "log_path", None)} if ctx.trusted else {}
    return JsonReply(200, {**detail, "service": "strata", "model": svc.model_name, "loaded": e.alive(),
                           "engine": e.info.get("engine"), "started": svc.started,
                           "uptime_s": round(time.time() - svc.started, 1),
                           "context": {"max_positions": e.max_context or e.known_ctx,
                                       "native": e.info.get("n_ctx_train")},
                           "concurrency": {"serving": llama_views.total_slots(e), "requested": svc.config.get("parallel", 1)},
                           "dialects": ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/api/chat",
                                        "/api/generate", "/completion", "/infill"] +
                           (["/v1/messages"] if anthropic_api is not None else []),
                           "activity": _activity(svc),
                           "live": svc.status_view(), "last_timings": svc.last_timings,
                           "machine": telemetry.machine()})


def _activity(svc) -> dict:
    """Requests served, running (in_flight: being answered or waiting), and how many of those wait."""
    live = metrics_views.live_counts(svc)
    return {"requests": svc.totals["requests"], "in_flight": live["running"], "waiting": live["deferred"],
            "slots_busy": live["slots_busy"], "slots_total": live["slots_total"]}


def _metrics(svc, body, ctx):
    """Prometheus text as llama-server answers GET /metrics (llama.cpp's names, then vLLM's and strata:), with
    its Process-Start-Time-Unix header; JSON for the Monitor when asked: ?format=json, or an Accept naming
    application/json and no text form"""
    accept = (ctx.headers.get("Accept") or "").lower()
    start = {"Process-Start-Time-Unix": str(int(svc.started))}
    if ctx.query.get("format") == "json" or (
            "application/json" in accept and "text/plain" not in accept and "openmetrics" not in accept):
        return JsonReply(200, metrics_views.metrics_json(svc, all_requests=ctx.query.get("requests") == "all"),
                         start)
    return (prometheus.CONTENT_TYPE, prometheus.render_all(svc), start)


def _prometheus(svc, body, ctx):
    """Prometheus text with llama.cpp's names"""
    return (prometheus.CONTENT_TYPE, prometheus.render(svc))


def _settings_get(svc, body, ctx):
    return JsonReply(200, svc.settings_view())


def _settings_post(svc, body, ctx):
    """POST /settings {"defaults": {...} | null}: the shared Chat settings every request gets for the fields
    it omits (checked whole: a 400 names the field). Saved beside the run config when there is one."""
    if "defaults" not in body:
        raise BadRequest('send {"defaults": {...}} (or {"defaults": null} to clear them)', param="defaults")
    view = svc.set_settings(body["defaults"])
    path = getattr(svc, "settings_path", None)
    if path:
        try:
            save_shared_settings(path, view["defaults"])
        except OSError as e:
            print(f"strata: shared settings not saved to {path}: {e}", file=sys.stderr)
    return JsonReply(200, view)


def _cors_proxy(svc, body, ctx):
    """llama-server's web-UI proxy (off there unless --ui-mcp-proxy): never here, it would let any client make
    the server fetch any URL (SSRF); answered as llama-server answers it when off"""
    raise HttpError(403, "feature_disabled", "this feature is disabled: Strata has no CORS proxy")


def _anthropic(name):
    def route(svc, body, ctx):
        return getattr(anthropic_api, name)(svc, body, ctx)
    return route


GET_ROUTES = {"/health": _health, "/api/health": _health, "/v1/health": _health,
              "/v1/models": openai_api.models, "/models": openai_api.models,
              "/v1/status": _status, "/status": lambda s, b, c: JsonReply(200, s.status_view()),
              "/metrics": _metrics, "/metrics/prometheus": _prometheus, "/settings": _settings_get,
              "/props": llama_routes.props, "/slots": lambda s, b, c: JsonReply(200, llama_views.slots(s))}
GET_ROUTES["/about.json"] = lambda s, b, c: JsonReply(200, metrics_views.about_view(  # the About page's facts
    s, metrics_views.routes_view(GET_ROUTES, POST_ROUTES, PAGES)))
POST_ROUTES = {"/v1/chat/completions": openai_api.chat_completions, "/chat/completions": openai_api.chat_completions,
               "/v1/completions": openai_api.completions, "/settings": _settings_post}
GET_ROUTES.update({"/api/version": ollama.version, "/api/tags": ollama.tags, "/api/ps": ollama.ps})
POST_ROUTES.update({"/v1/responses": responses.responses, "/responses": responses.responses,
                    "/api/chat": ollama.chat, "/api/generate": ollama.generate, "/api/show": ollama.show,
                    "/api/pull": ollama.no_hub, "/api/push": ollama.no_hub, "/api/create": ollama.no_hub,
                    "/api/copy": ollama.no_hub,
                    "/completion": llama_routes.completion, "/completions": llama_routes.completion,
                    "/infill": llama_routes.infill, "/apply-template": llama_routes.apply_template,
                    "/v1/chat/completions/input_tokens": llama_routes.input_tokens,
                    "/chat/completions/input_tokens": llama_routes.input_tokens,
                    "/v1/responses/input_tokens": responses.input_tokens,
                    "/responses/input_tokens": responses.input_tokens,
                    "/tokenize": llama_routes.tokenize, "/detokenize": llama_routes.detokenize})
POST_ROUTES.update({"/v1/embeddings": embeddings.openai_embeddings, "/embedding": embeddings.llama_embedding,
                    "/embeddings": embeddings.llama_embedding, "/api/embed": embeddings.ollama_embed,
                    "/api/embeddings": embeddings.ollama_embeddings})
DELETE_ROUTES = {"/api/delete": ollama.no_hub}
GET_ROUTES["/cors-proxy"] = POST_ROUTES["/cors-proxy"] = _cors_proxy
GET_ROUTES["/v1/stream"], DELETE_ROUTES["/v1/stream"] = stream_sessions.get_stream, stream_sessions.delete_stream
POST_ROUTES["/v1/streams/lookup"] = stream_sessions.lookup
PREFIX_ROUTES = {(m, "/v1/responses/"): responses.get_response for m in ("GET", "POST", "DELETE")}  # nothing stored
# Error bodies in the dialect of the path (the rest: OpenAI's, or Anthropic's under /v1/messages)
ERROR_DIALECTS = (("/api/", ollama), ("/completion", llama_routes), ("/infill", llama_routes),
                  ("/apply-template", llama_routes), ("/tokenize", llama_routes), ("/detokenize", llama_routes),
                  ("/embedding", llama_routes))
# Routes that change the server for every client: JSON only, and from this server's own page (or a client
# that sends no Origin, such as curl), whatever the API key
OWN_PAGE_ROUTES = {"/settings", "/config"}
GET_ROUTES.update(lifecycle_routes.GET)    # load/unload, lease, /config: only with a Lifecycle (else 404)
POST_ROUTES.update(lifecycle_routes.POST)
LIFECYCLE_ONLY = frozenset([*lifecycle_routes.GET.values(), *lifecycle_routes.POST.values()])
if anthropic_api is not None:
    POST_ROUTES["/v1/messages"] = _anthropic("messages")
    POST_ROUTES["/v1/messages/count_tokens"] = _anthropic("count_tokens")


# ---------------------------------------------------------------- life cycle
def _health_ok(host, port, timeout_s=2.0) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1" if host in ("0.0.0.0", "") else host, port,
                                          timeout=timeout_s)
        conn.request("GET", "/health")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def run_server(svc, opts: Options, start_engine=True, httpd=None) -> int:
    """Serve until a signal or the parent's exit; returns the exit code. `svc`: a Service, or a Lifecycle
    (serve/lifecycle.py: it loads the default model unless lazy, and unloads idle ones). `httpd`: a server
    bound already (bootstrap.bind: the port is taken before anything loads)."""
    httpd = httpd or make_server(svc, opts)
    httpd.service = svc
    host, port = httpd.server_address[:2]
    stop = threading.Event()
    server_thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                     daemon=True, name="http-accept")
    server_thread.start()
    shown = f"[{host}]" if ":" in host else host

    failed = []

    def boot():
        # the Monitor's charts have a history from the start (a Lifecycle's views read its loaded model's Service)
        metrics_views.ensure_sampler(svc.view_service() if hasattr(svc, "view_service") else svc)
        if start_engine:
            try:
                svc.start_engine()  # then its supervisor restarts an engine that dies while idle
            except ServiceError as e:  # the model cannot be loaded: one clear line, exit 1, no server left
                print(f"strata: the engine did not start: {e}", file=sys.stderr, flush=True)
                failed.append(e)
                stop.set()
                return
        for _ in range(50):
            if stop.is_set() or _health_ok(host, port):
                break
            time.sleep(0.1)
        if not stop.is_set():
            print(f"strata: listening on http://{shown}:{port}", flush=True)

    threading.Thread(target=boot, daemon=True, name="engine-boot").start()
    presses = []

    def on_signal(signum, frame):
        presses.append(signum)
        if len(presses) > 1 and signum == signal.SIGINT:
            svc.kill_engine()  # a second Ctrl+C forces it
            os._exit(130)
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    if opts.parent_pid:
        threading.Thread(target=_watch_parent, args=(opts.parent_pid, stop), daemon=True,
                         name="parent-watch").start()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        shutdown(httpd, svc)
        for s, h in old.items():
            signal.signal(s, h)
    return 1 if failed else 0


def _watch_parent(pid, stop):
    import psutil
    while not stop.wait(PARENT_POLL_S):
        if not psutil.pid_exists(pid):
            print(f"strata: parent process {pid} is gone; shutting down", file=sys.stderr, flush=True)
            stop.set()
            return


def shutdown(httpd, svc):
    """Stop accepting, end the streams with a final event, QUIT the engine (terminate, kill)."""
    print("strata: shutting down", file=sys.stderr, flush=True)
    httpd.stopping.set()
    svc.close()
    t = threading.Thread(target=httpd.shutdown, daemon=True)
    t.start()
    t.join(5.0)
    end = time.monotonic() + SHUTDOWN_STREAMS_S
    while time.monotonic() < end:
        with httpd.streams_lock:
            if httpd.streams == 0:
                break
        time.sleep(0.05)
    with contextlib.suppress(Exception):
        httpd.server_close()
    try:
        svc.stop_engine()
    except ServiceError as e:
        print(f"strata: {e}", file=sys.stderr, flush=True)

"""The HTTP server: a threaded standard-library server, its routes, security checks and life cycle.

Role: accept connections (one thread each, at most `max_connections`; read deadlines, bodies and the raw
socket rules are `serve/http/guard.py`'s), check Host / API key / Origin (`serve/http/access.py`), route to the
API translators (`serve/api/openai.py`, `serve/api/anthropic.py`) and to the plain views (health, models, status,
metrics, tokenize, web app), write JSON answers and SSE streams (serve/http/stream_writer.py: a burst of frames a write, at most one every
`--stream-interval-ms`: `serve/http/pacing.py`), and turn exceptions into error answers at this one
boundary. It knows nothing of pipes: `Service` and `StrataEngine` own those.

Connections are HTTP/1.1 and persistent (`serve/http/keepalive.py` has the rules): an answer has a
Content-Length, a stream is chunked and ends with the empty last chunk only when it finished cleanly (a
`CutFrame` — an error event, a dying engine, a shutdown — ends it without one and closes the connection);
`Connection: close`, HTTP/1.0, a body left unread, the request limit and shutdown close it. `server.counts`
holds the connections and requests seen.

Life cycle (`run_server`, serve/http/run.py): bind (the port is known before the model loads; `--port 0` picks a free
one), serve, start the engine in the background (`/health` is 503 until READY), print
`strata: listening on http://HOST:PORT` once `/health` answers 200. A model that cannot be loaded ends the
server: one line `strata: the engine did not start: ...`, exit 1. After that an engine that dies is restarted
by the Service's supervisor (`/health` returns to 200 by itself). SIGTERM/SIGINT: stop accepting, end the
running streams with a final event, QUIT the engine (then terminate, kill), exit 0; a second Ctrl+C kills
the engine and exits at once. `--parent-pid PID`: the same shutdown when that process is gone.

Public surface: `StrataHTTPServer`, `Handler`, `make_server(service, opts)`, `Options`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hmac
import io
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from serve.api import lifecycle_routes, llama_routes, openai as openai_api, response_store
from serve.http import access, guard as http_guard, keepalive, stream_sessions
from serve.http.routes import (
    BY_MODEL_ROUTES, DELETE_JSON, DELETE_ROUTES, GET_ROUTES, LEASE_PREFIX, LIFECYCLE_ONLY,
    MODEL_ROUTES, OVERRIDES, OWN_PAGE_ROUTES, PAGES, POST_OVERRIDES, POST_ROUTES, PREFIX_OVERRIDES, PREFIX_ROUTES,
    PUBLIC_PATHS, UPLOAD_PREFIX, error_dialect)
from serve.ops import metrics_views
from serve.core.errors import bug_text, client_error, log_bug
from serve.http.guard import HttpError
from serve.lifecycle import Lifecycle
from serve.api.replies import JsonReply, RequestContext, StreamReply
from serve.http.stream_writer import StreamWriter

HTTP_BACKLOG = 256              # listen queue (env STRATA_HTTP_BACKLOG)
CANCEL_CHECK_S = 0.05           # the socket is probed for a hang-up at most this often
STATIC_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "static")
STATIC_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}


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
    host_name: str | None = None   # sent as X-Strata-Host on every answer (which host of a cluster answered)
    slot_save_path: str | None = None         # --slot-save-path (a 0700 folder), None: saved slots are off
    responses_dir: str | None = None          # --responses-dir: stored Responses kept there too (0700), else memory
    responses_max: int = response_store.MAX_COUNT           # --responses-max: stored responses at most
    responses_max_mib: float = response_store.MAX_MIB       # --responses-max-mib: their JSON together at most
    responses_max_age_s: float = response_store.MAX_AGE_S   # --responses-max-age: seconds one is kept at most


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
        self.responses = response_store.ResponseStore(    # stored Responses, bounded (its own lock)
            opts.responses_dir, opts.responses_max, int(opts.responses_max_mib * (1 << 20)), opts.responses_max_age_s)
        self.counts = keepalive.Counts()     # connections and requests, for reuse figures (its own lock)
        self.idle_handlers = set()           # handlers waiting for a connection's next request (idle_lock)
        self.idle_lock = threading.Lock()
        limits = http_guard.Limits.from_env()  # timeouts, body limit, connection cap (serve/http/guard.py)
        if opts.stream_interval_ms is not None:
            limits = dataclasses.replace(limits,
                                         stream_interval_s=http_guard.stream_interval_s(opts.stream_interval_ms))
        self.guard_init(limits)
        super().__init__(addr, Handler)

    def begin_stop(self) -> None:
        """Shutdown's first step: no answer keeps its connection open, and the connections waiting for a next
        request are ended now (their read side is shut: the wait returns at once) instead of at their idle
        timeout."""
        self.stopping.set()
        with self.idle_lock:
            idle = list(self.idle_handlers)
        for handler in idle:
            handler.end_idle_wait()


def make_server(service, opts: Options) -> StrataHTTPServer:
    return StrataHTTPServer((opts.host, opts.port), service, opts)


class Handler(StreamWriter, BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"   # persistent connections, chunked streams: serve/http/keepalive.py
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
        self._n_requests = 0   # requests read on this connection
        self.server.counts.connection()

    def finish(self):
        try:
            super().finish()
        finally:
            self.server.counts.closed()

    def handle_one_request(self):
        """One request of the connection (the next one waits in the idle phase again: serve/http/keepalive.py)."""
        self._gone, self._probe_at, self._body_read, self._status = False, 0.0, False, 0
        self.headers = None
        if self._n_requests:
            self._reader.next_request()
        self._set_idle(True)
        try:
            if self.server.stopping.is_set():   # begin_stop ran before this wait was registered
                self.close_connection = True
                return
            super().handle_one_request()
        except http_guard.ReadDeadline as e:  # idle: nothing was asked, so nothing is answered
            self.close_connection = True
            if e.phase != "idle":
                self.send_error(408, e.message)
        except ConnectionError:   # the client reset a kept connection (a health checker's close): nothing to log
            self.close_connection = True
        finally:
            self._set_idle(False)

    def _set_idle(self, idle: bool) -> None:
        with self.server.idle_lock:
            (self.server.idle_handlers.add if idle else self.server.idle_handlers.discard)(self)

    def end_idle_wait(self) -> None:
        """(begin_stop) The wait for a next request returns now, as if the client had closed."""
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RD)

    def send_response_only(self, code, message=None):
        self._status = code
        super().send_response_only(code, message)

    def end_headers(self):
        """Every final answer says `Connection: close` when the connection ends after it."""
        if self._status >= 200:
            if self.server.opts.host_name:
                self.send_header("X-Strata-Host", self.server.opts.host_name)
            if not self.close_connection and (self.server.stopping.is_set() or self._body_unread()):
                self.close_connection = True
            if self.close_connection:
                self.send_header("Connection", "close")
        super().end_headers()

    def _body_unread(self) -> bool:
        return not self._body_read and keepalive.body_pending(getattr(self, "headers", None))

    def parse_request(self):
        line = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        if len(line.split()) == 2:  # HTTP/0.9 ("GET /path"): no headers follow, and its answer has no status
            self.requestline, self.command, self.request_version = line, None, "HTTP/1.0"
            self.send_error(505, "HTTP/0.9 requests are not served; send HTTP/1.0 or HTTP/1.1")
            return False
        if not super().parse_request():
            return False
        self._set_idle(False)
        self._n_requests += 1
        self.server.counts.request(reused=self._n_requests > 1)
        if not keepalive.speaks_http11(self.request_version) or \
                self._n_requests >= keepalive.MAX_REQUESTS_PER_CONNECTION:
            self.close_connection = True   # HTTP/1.0 (even with Connection: keep-alive), or the connection's last
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
            self.end_headers()   # with Connection: close
            if self.command != "HEAD":
                self.wfile.write(data)

    # ---------------------------------------------------------------- plumbing
    def _api(self, path):
        return error_dialect(path)

    def _send(self, status, body, content_type="application/json", headers=None):
        data = body if isinstance(body, bytes) else (
            body.encode() if isinstance(body, str) else json.dumps(body, ensure_ascii=False).encode())
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for k, v in {**self._cors_headers(), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            with contextlib.suppress(OSError):  # the client left before its answer: nothing to tell it
                self.wfile.write(data)

    def _error(self, path, status, err_type, message, param=None, code=None, extra=None):
        api = self._api(path)
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

    def _read_body(self) -> bytes:
        """The whole body; only once it is read may the connection carry a next request."""
        raw = http_guard.read_body(self.rfile, self.headers, self._reader, self.server.limits.max_body_bytes)
        self._body_read = True
        return raw

    def _read_body_into(self, sink) -> int:
        """An upload's body streamed to `sink` (serve/api/ollama_models.py's blobs)."""
        n = http_guard.read_body_into(self.rfile, self.headers, http_guard.MAX_UPLOAD_GIB << 30, sink)
        self._body_read = True
        return n

    def _json_body(self):
        return http_guard.parse_json(self._read_body())

    # ---------------------------------------------------------------- security (serve/http/access.py)
    def _check_access(self, method, path):
        """Host, key and Origin; True when the request gave a valid API key."""
        opts = self.server.opts
        access.check_host(self.headers, opts.host, opts.allowed_hosts, bool(opts.api_keys))
        if path in PUBLIC_PATHS or path in PAGES or path.startswith("/static/"):
            return False
        lease = path.startswith(LEASE_PREFIX) and isinstance(self.server.service, Lifecycle)
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
        """The reply has ended: the model it ran on may be unloaded or switched now (serve/lifecycle/)."""
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
        override = OVERRIDES.get(path) or next((o for p, o in PREFIX_OVERRIDES.items() if path.startswith(p)), None)
        reply = override(svc, body, ctx) if override is not None and method in ("GET", "HEAD") else None
        if method == "POST" and path in POST_OVERRIDES:
            reply = POST_OVERRIDES[path](svc, body, ctx)
        if reply is not None:
            return reply
        if method == "POST" and path in MODEL_ROUTES:
            name = body.get("model") if isinstance(body.get("model"), str) else None
            ctx.created = svc.created.settings(name) if svc.created is not None else None
            self._ticket = svc.enter(name)
            reply = route(self._ticket.service, body, ctx)
            # the model is free once the engine's work is done, before the client has the last bytes (so a
            # client's next call, an unload say, never finds its own finished request still running)
            if isinstance(reply, StreamReply):
                reply.before_last = self._leave_model
            else:
                self._leave_model()
            return reply
        if path in BY_MODEL_ROUTES:   # the named model's tokenizer/template; no engine load
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
                raise HttpError(404, "not_found_error", f"not found: {method} {path}")
            if method == "POST":
                access.check_browser_json(self.headers)
            if method == "POST" and path in OWN_PAGE_ROUTES:
                self._check_own_page()
            upload = method == "POST" and path.startswith(UPLOAD_PREFIX)   # the body is a file, not JSON
            body = self._json_body() if method == "POST" and not upload else {}
            if method == "DELETE":   # read, so the answer is not cut off by a reset; JSON where one is sent
                raw = self._read_body()
                body = http_guard.parse_json(raw) if path in DELETE_JSON and raw.strip() else {}
            ctx = RequestContext(cancelled=self._cancelled, on_wait=self._on_wait,
                                 shutting_down=self.server.stopping.is_set,
                                 headers=self.headers, path=path, query=query, trusted=access.trusted(
                                     self.server.opts.api_keys, key_checked, self.client_address[0]),
                                 sessions=self.server.stream_sessions, http_counts=self.server.counts.snapshot,
                                 slot_save_path=self.server.opts.slot_save_path,
                                 read_body_into=self._read_body_into if upload else None,
                                 method=method, responses=self.server.responses)
            conv_id = stream_sessions.conversation_id(self.headers) if method == "POST" else None
            reply = self._route(route, path, method, body, ctx, svc)
            if conv_id and isinstance(reply, StreamReply) and reply.content_type.startswith("text/event-stream"):
                self._session = self.server.stream_sessions.open(conv_id)
        except Exception as e:  # the one boundary: serve/core/errors.py
            return self._refuse(path, method, e)
        if isinstance(reply, StreamReply):
            return self._stream(reply)
        if isinstance(reply, JsonReply):
            return self._send(reply.status, reply.body, headers=reply.headers)
        content_type, text, *headers = reply   # (content type, text[, headers])
        self._send(200, text, content_type, headers[0] if headers else None)

    def _refuse(self, path, method, e: Exception):
        """An exception before the answer began, in the caller's dialect: a StrataError (bad input, a refusal,
        the Service unable to answer now: the Service turned every engine failure into one) with its status
        and message; anything else is a bug, a 500 with a short reason and its traceback in the server log."""
        err = client_error(e)
        if err is None:
            log_bug(e, f"{method} {path}")
            return self._error(path, 500, "server_error", bug_text(e))
        return self._error(path, err.status, err.err_type, err.client_text(), err.param, err.code, err.extra)

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

"""The HTTP server: a threaded standard-library server, its routes, security checks and life cycle.

Role: accept connections (one thread each), check Host / API key / Origin, read and parse bodies, route to
the API translators (`serve/openai.py`, `serve/anthropic.py`) and to the plain views (health, models,
status, metrics, tokenize, web app), write JSON answers and SSE streams, and turn exceptions into error
answers at this one boundary. It knows nothing of pipes: `Service` and `StrataEngine` own those.

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
import hmac
import http.client
import ipaddress
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from serve import openai as openai_api
from serve import llama_views, prometheus, telemetry
from serve.errors import ServiceError
from serve.config import save_shared_settings
from serve.events import BadRequest
from serve.replies import JsonReply, RequestContext, StreamReply

try:
    from serve import anthropic as anthropic_api
except ImportError:
    anthropic_api = None

STREAM_WRITE_TIMEOUT_S = 60.0   # a client that reads nothing for this long is gone (env, 0 = off)
MAX_BODY_MIB = 256              # bodies over this are 413 (env STRATA_MAX_BODY_MIB)
HTTP_BACKLOG = 256              # listen queue (env STRATA_HTTP_BACKLOG)
DRAIN_BODY_S = 5.0              # an unread body is drained this long after an early answer
SHUTDOWN_STREAMS_S = 10.0       # running streams get this long to send their final event
CANCEL_CHECK_S = 0.05           # the socket is probed for a hang-up at most this often
PARENT_POLL_S = 1.0             # --parent-pid is checked this often
STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
STATIC_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}
PAGES = {"/": "index.html", "/chat": "index.html", "/monitor": "monitor.html", "/about": "about.html"}
PUBLIC_PATHS = ("/health", "/api/health")


def _env_float(name, default):
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass
class Options:
    host: str = "127.0.0.1"
    port: int = 8080
    api_keys: list = field(default_factory=list)
    cors_origins: list = field(default_factory=list)
    allowed_hosts: list = field(default_factory=list)
    parent_pid: int | None = None
    quiet: bool = False


class StrataHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = int(_env_float("STRATA_HTTP_BACKLOG", HTTP_BACKLOG))

    def __init__(self, addr, service, opts: Options):
        self.service = service
        self.opts = opts
        self.streams = 0                     # streams being written (guarded by streams_lock)
        self.streams_lock = threading.Lock()
        self.stopping = threading.Event()
        self.write_timeout_s = _env_float("STRATA_STREAM_WRITE_TIMEOUT_S", STREAM_WRITE_TIMEOUT_S)
        self.max_body = int(_env_float("STRATA_MAX_BODY_MIB", MAX_BODY_MIB) * (1 << 20))
        super().__init__(addr, Handler)


def make_server(service, opts: Options) -> StrataHTTPServer:
    return StrataHTTPServer((opts.host, opts.port), service, opts)


class HttpError(Exception):
    def __init__(self, status, err_type, message, param=None, code=None):
        super().__init__(message)
        self.status, self.err_type, self.message, self.param, self.code = status, err_type, message, param, code


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server_version = "strata"

    def log_message(self, fmt, *args):  # one line per request, on our own (non-blocking) stderr
        if not self.server.opts.quiet:
            sys.stderr.write(f"strata: {self.address_string()} {fmt % args}\n")

    # ---------------------------------------------------------------- plumbing
    def _api(self, path):
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

    def _error(self, path, status, err_type, message, param=None, code=None):
        api = self._api(path)
        if path.startswith("/v1/messages") and anthropic_api is None:
            body = {"type": "error", "error": {"type": err_type, "message": message}}
        else:
            body = api.error_body(status, err_type, message, param, code)
        self._send(status, body)

    def _cancelled(self):
        """True when the client hung up (a readable socket with nothing to read) or we are stopping."""
        if self.server.stopping.is_set():
            return True
        now = time.monotonic()
        if now - getattr(self, "_probe_at", 0.0) < CANCEL_CHECK_S:
            return getattr(self, "_gone", False)
        self._probe_at = now
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if readable:
                self._gone = self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            self._gone = True
        return getattr(self, "_gone", False)

    def _read_body(self) -> bytes:
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        limit = self.server.max_body
        if "chunked" in te:
            parts, total = [], 0
            while True:
                line = self.rfile.readline(65537)
                try:
                    size = int(line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise HttpError(400, "invalid_request_error", "malformed chunked body") from None
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                total += size
                if total > limit:
                    raise HttpError(413, "invalid_request_error", f"the body is over {limit >> 20} MiB")
                parts.append(self.rfile.read(size))
                self.rfile.readline(3)
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise HttpError(400, "invalid_request_error", "malformed Content-Length") from None
        if n > limit:
            self._drain_unread(n)
            raise HttpError(413, "invalid_request_error",
                            f"the body ({n} bytes) is over the limit of {limit >> 20} MiB")
        return self.rfile.read(n) if n > 0 else b""

    def _drain_unread(self, n):
        end = time.monotonic() + DRAIN_BODY_S
        self.connection.settimeout(DRAIN_BODY_S)
        with contextlib.suppress(OSError):
            while n > 0 and time.monotonic() < end:
                got = self.rfile.read(min(n, 1 << 20))
                if not got:
                    break
                n -= len(got)

    def _json_body(self):
        raw = self._read_body()
        if not raw.strip():
            raise HttpError(400, "invalid_request_error", "the request body is empty; send a JSON object")
        try:
            body = json.loads(raw.decode("utf-8-sig"))
        except (UnicodeDecodeError, ValueError) as e:
            raise HttpError(400, "invalid_request_error", f"the body is not valid JSON ({e})") from None
        if not isinstance(body, dict):
            raise HttpError(400, "invalid_request_error", "the body must be a JSON object")
        return body

    # ---------------------------------------------------------------- security
    def _check_host(self):
        if self.server.opts.api_keys:
            return
        host = self.headers.get("Host")
        if not host:
            return
        name = host.rsplit(":", 1)[0] if not host.startswith("[") else host[1:host.find("]")]
        name = name.lower().rstrip(".")
        allowed = list(self.server.opts.allowed_hosts) + [
            h.strip() for h in os.environ.get("STRATA_ALLOWED_HOSTS", "").split(",") if h.strip()]
        if "*" in allowed or name in ("localhost", self.server.opts.host.lower()) or name.endswith(".localhost"):
            return
        with contextlib.suppress(ValueError):
            ipaddress.ip_address(name)
            return
        for a in allowed:
            a = a.lower()
            if name == a or (a.startswith(".") and (name.endswith(a) or name == a[1:])):
                return
        raise HttpError(403, "forbidden", f"the Host {host!r} is not one this server answers to "
                        "(DNS-rebinding protection); add it to allowed_hosts or STRATA_ALLOWED_HOSTS")

    def _check_key(self, path):
        keys = self.server.opts.api_keys
        if not keys or path in PUBLIC_PATHS or path in PAGES or path.startswith("/static/"):
            return
        got = self.headers.get("X-Api-Key") or ""
        auth = self.headers.get("Authorization") or ""
        if auth.lower().startswith("bearer "):
            got = auth[7:].strip()
        ok = False
        for k in keys:  # constant-time compare against every key
            ok |= hmac.compare_digest(got.encode("utf-8", "surrogateescape"), k.encode("utf-8"))
        if not ok:
            raise HttpError(401, "authentication_error", "missing or wrong API key")

    def _check_origin(self):
        origin = self.headers.get("Origin")
        if not origin or self.command != "POST" or self.server.opts.api_keys:
            return
        cors = self.server.opts.cors_origins
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or "*" in cors or origin in cors:
            return
        if parts.netloc == (self.headers.get("Host") or ""):
            return
        raise HttpError(403, "forbidden", f"requests from the page {origin!r} are not allowed; add it to "
                        "cors_origins")

    def _check_own_page(self):
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise HttpError(415, "invalid_request_error", "send this request as Content-Type: application/json")
        origin = self.headers.get("Origin")
        if origin and urlsplit(origin).netloc != (self.headers.get("Host") or "") and \
                origin not in self.server.opts.cors_origins:
            raise HttpError(403, "forbidden", f"only this server's own page may change its settings, not {origin!r}")

    def _cors_headers(self):
        origin = self.headers.get("Origin") if hasattr(self, "headers") and self.headers else None
        cors = self.server.opts.cors_origins
        if not origin or not (origin in cors or "*" in cors) or not urlsplit(self.path).path.startswith("/v1/"):
            return {}
        return {"Access-Control-Allow-Origin": "*" if "*" in cors else origin, "Vary": "Origin",
                "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                "Access-Control-Allow-Headers": self.headers.get("Access-Control-Request-Headers") or
                "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta",
                "Access-Control-Max-Age": "600"}

    # ---------------------------------------------------------------- dispatch
    def do_OPTIONS(self):
        self.send_response(204)
        for k, v in self._cors_headers().items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def _dispatch(self, method):
        parts = urlsplit(self.path)
        path = parts.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        svc = self.server.service
        try:
            self._check_host()
            self._check_key(path)
            self._check_origin()
            route = (GET_ROUTES if method in ("GET", "HEAD") else POST_ROUTES).get(path)
            if route is None:
                if method == "GET" and (path in PAGES or path.startswith("/static/")):
                    return self._static(path)
                if path.startswith("/v1/messages") and anthropic_api is None and method == "POST":
                    raise HttpError(404, "not_found_error", "the Anthropic API is not available in this build")
                raise HttpError(404, "not_found_error", f"not found: {method} {path}")
            if method == "POST" and path in OWN_PAGE_ROUTES:
                self._check_own_page()
            body = self._json_body() if method == "POST" else {}
            ctx = RequestContext(cancelled=self._cancelled, shutting_down=self.server.stopping.is_set,
                                 headers=self.headers, path=path, query=query)
            reply = route(svc, body, ctx)
        except HttpError as e:
            return self._error(path, e.status, e.err_type, e.message, e.param, e.code)
        except BadRequest as e:
            return self._error(path, e.status, "invalid_request_error", e.message, e.param, e.code)
        except ServiceError as e:  # the Service turned every engine failure into one (503 / 502)
            return self._error(path, e.status, e.err_type, e.message)
        except ValueError as e:  # an engine ERR, or a value the translator refused
            return self._error(path, 400, "invalid_request_error", str(e))
        except (TypeError, KeyError, AttributeError) as e:
            traceback.print_exc()
            return self._error(path, 400, "invalid_request_error", f"the request is malformed ({e})")
        except Exception as e:  # the one place an unexpected failure becomes a 500
            traceback.print_exc()
            return self._error(path, 500, "server_error", f"internal error: {type(e).__name__}: {e}")
        if isinstance(reply, StreamReply):
            return self._stream(reply)
        if isinstance(reply, JsonReply):
            return self._send(reply.status, reply.body, headers=reply.headers)
        content_type, text = reply
        self._send(200, text, content_type)

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
            timeout = srv.write_timeout_s
            self.connection.settimeout(timeout if timeout > 0 else None)  # sendall's total limit
            for frame in frames:
                self.wfile.write(frame.encode("utf-8"))
        except (OSError, ValueError):  # the client hung up or stopped reading past the limit
            self._gone = True
        finally:
            frames.close()  # stops the engine (STOP + drain) if the stream did not finish
            with srv.streams_lock:
                srv.streams -= 1


# ---------------------------------------------------------------- plain views
def _health(svc, body, ctx):
    status, out = svc.health()
    if status != 200:
        return JsonReply(503, {**out, "error": {"code": 503, "type": "unavailable_error",
                                                "message": "Loading model" if out["status"] == "loading"
                                                else svc.death_note()}})
    return JsonReply(200, out)


def _props(svc, body, ctx):
    status, out = llama_views.props(svc, ctx.query)
    return JsonReply(status, out)


def _status(svc, body, ctx):
    e = svc.engine
    return JsonReply(200, {"service": "strata", "model": svc.model_name, "loaded": e.alive(),
                           "engine": e.info.get("engine"), "started": svc.started,
                           "uptime_s": round(time.time() - svc.started, 1),
                           "context": {"max_positions": e.max_context or e.known_ctx,
                                       "native": e.info.get("n_ctx_train")},
                           "concurrency": {"serving": llama_views.total_slots(e), "requested": svc.config.get("parallel", 1)},
                           "dialects": ["/v1/chat/completions", "/v1/completions"] +
                           (["/v1/messages"] if anthropic_api is not None else []),
                           "activity": {"requests": svc.totals["requests"], "in_flight": int(
                               bool(svc.status.get("busy"))) + svc.queued},
                           "live": svc.status_view(), "last_timings": svc.last_timings,
                           "machine": telemetry.machine()})


def _metrics(svc, body, ctx):
    accept = ctx.headers.get("Accept") or ""
    if ctx.query.get("format") == "prometheus" or "text/plain" in accept or "openmetrics" in accept:
        return _prometheus(svc, body, ctx)
    out = svc.metrics_view(all_requests=ctx.query.get("requests") == "all")
    out["hardware"] = telemetry.machine()
    return JsonReply(200, out)


def _prometheus(svc, body, ctx):
    return (prometheus.CONTENT_TYPE, prometheus.render(svc))


def _tokenize(svc, body, ctx):
    content = body.get("content")
    if not isinstance(content, str):
        raise BadRequest("content: a string", param="content")
    parse_special = body.get("parse_special", False)
    if not isinstance(parse_special, bool):
        raise BadRequest("parse_special: true or false", param="parse_special")
    ids = svc.tok.encode(content, parse_special=parse_special)
    if body.get("with_pieces"):
        return JsonReply(200, {"tokens": [{"id": i, "piece": svc.tok.token_bytes(i).decode("utf-8", "replace")}
                                          for i in ids]})
    return JsonReply(200, {"tokens": ids})


def _detokenize(svc, body, ctx):
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise BadRequest("tokens: a list of token ids", param="tokens")
    if any(not 0 <= i < svc.tok.n_vocab for i in ids):
        raise BadRequest(f"tokens: ids are 0..{svc.tok.n_vocab - 1}", param="tokens")
    return JsonReply(200, {"content": svc.tok.decode(ids)})


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


def _anthropic(name):
    def route(svc, body, ctx):
        return getattr(anthropic_api, name)(svc, body, ctx)
    return route


GET_ROUTES = {"/health": _health, "/api/health": _health, "/v1/health": _health,
              "/v1/models": openai_api.models, "/models": openai_api.models,
              "/v1/status": _status, "/status": lambda s, b, c: JsonReply(200, s.status_view()),
              "/metrics": _metrics, "/metrics/prometheus": _prometheus, "/settings": _settings_get,
              "/props": _props, "/slots": lambda s, b, c: JsonReply(200, llama_views.slots(s))}
POST_ROUTES = {"/v1/chat/completions": openai_api.chat_completions, "/chat/completions": openai_api.chat_completions,
               "/v1/completions": openai_api.completions, "/tokenize": _tokenize, "/detokenize": _detokenize,
               "/settings": _settings_post}
# Routes that change the server for every client: JSON only, and from this server's own page (or a client
# that sends no Origin, such as curl), whatever the API key
OWN_PAGE_ROUTES = {"/settings"}
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


def run_server(svc, opts: Options, start_engine=True) -> int:
    """Serve until a signal or the parent's exit; returns the exit code."""
    httpd = make_server(svc, opts)
    host, port = httpd.server_address[:2]
    stop = threading.Event()
    server_thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                     daemon=True, name="http-accept")
    server_thread.start()
    shown = f"[{host}]" if ":" in host else host

    failed = []

    def boot():
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

"""The socket side of the HTTP server: read deadlines per phase, a connection cap, bounded bodies, raw errors.

Role: everything about one TCP connection that is not routing, so `serve/http/server.py` only routes.
- `DeadlineReader`: the connection's read side. A connection passes three read phases, each with a deadline
  (a socket timeout alone limits one recv, so a client sending a byte every few seconds would never trip it):
  idle (connected, nothing sent yet), headers (from the request line's first byte to the blank line), body
  (from the end of the headers, pushed back by every byte that arrives at `BODY_MIN_BYTES_S`). A passed
  deadline raises `ReadDeadline`, a 408 `HttpError` (an idle connection is closed without an answer). A kept
  connection (serve/http/keepalive.py) returns to the idle phase before each next request (`next_request`).
- `GuardedServer`: a mixin for the ThreadingHTTPServer. At most `max_connections` connections have a
  handler thread; past that a connection gets a 503 from one refuser thread and no thread of its own. An
  accept that fails for lack of file descriptors closes a spare descriptor to accept and refuse the waiting
  connection, then backs off, so the accept loop never spins on a readable listening socket.
- `read_body`: a Content-Length or chunked body within the size limit (strict sizes: a negative, non-hex or
  over-long chunk size is a 400); `parse_json`: any JSON failure, 100,000 levels of nesting included, a 400.
- `error_json` / `raw_error`: the OpenAI error shape for answers the routes never see.
- `limit_send_buffer`: the moderate send buffer of an SSE socket, so the stream write timeout measures the
  client and not the kernel's buffering; `peer_gone`: whether the client hung up; `stream_interval_s`: the
  stream interval (`Limits.stream_interval_s`, serve/http/pacing.py) within its bounds.
It knows nothing of routes, keys or the engine.

Public surface: `Limits.from_env()`, `HttpError`, `ReadDeadline`, `DeadlineReader` (`.next_request()`), `GuardedServer`,
`read_body`, `read_body_into` (an upload streamed to disk), `parse_json`, `error_json`, `raw_error`, `limit_send_buffer`, `peer_gone`, `stream_interval_s`.
"""
from __future__ import annotations

import contextlib
import errno
import io
import json
import math
import os
import re
import select
import socket
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus

from serve.core.errors import StrataError
from serve.http.pacing import INTERVAL_MS as STREAM_INTERVAL_MS, MAX_INTERVAL_MS

# Each limit: default, why that number, and the environment variable that overrides it (0 = off where said).
IDLE_TIMEOUT_S = 30.0         # a connection that sends nothing this long is closed (STRATA_IDLE_TIMEOUT_S): a
                              # client connects when it has a request; idle sockets must not hold threads
HEADER_TIMEOUT_S = 30.0       # request line + headers within this of their first byte (STRATA_HEADER_TIMEOUT_S):
                              # they are a few KB; nginx allows 60 s, Apache 20-40 s; a slow-loris is out here
BODY_TIMEOUT_S = 60.0         # the body's first bytes within this (STRATA_BODY_TIMEOUT_S) ...
BODY_MIN_BYTES_S = 64 << 10   # ... and each byte buys 1/64 KiB s more: a LAN client sends MB/s, a stalled
                              # or trickling one runs out; a 256 MiB body may take at most about 70 min
STREAM_WRITE_TIMEOUT_S = 60.0  # a client that reads nothing for this long is gone (env, 0 = off)
STREAM_SNDBUF_BYTES = 64 << 10  # an SSE socket's send buffer (STRATA_STREAM_SNDBUF_KIB): the kernel's own
                              # autotuning grows it to 4 MB, thousands of tokens a never-reading client would
                              # "take" before STREAM_WRITE_TIMEOUT_S could fire; 64 KiB is still seconds of tokens
MAX_BODY_MIB = 256            # bodies over this are 413 (STRATA_MAX_BODY_MIB)
MAX_UPLOAD_GIB = 256          # an upload streamed to disk (a GGUF blob) is at most this (the largest GGUFs)
BODY_PIECE_BYTES = 1 << 20    # an upload is read and written a MiB at a time
MAX_CONNECTIONS = 256         # connections with a handler thread (STRATA_MAX_CONNECTIONS): far above the 8
                              # lanes' worth of streams plus polling pages, and it bounds the threads' memory
DRAIN_BODY_S = 5.0            # an unread body is drained this long after an early answer (so the client reads it)
REFUSE_LINGER_S = 2.0         # a refused connection is kept this long for its request to drain (then closed)
MAX_REFUSING = 64             # refused connections lingering at once; past this the oldest is closed at once
ACCEPT_BACKOFF_S = 0.1        # out of file descriptors: accept again after this (they free as connections end)
MAX_CHUNK_LINE = 4096         # a chunk-size line (size + extensions) longer than this is a 400
MAX_TRAILERS = 64             # trailer lines after the last chunk, at most
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_HEX_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")   # 16 hex digits = 64 bits; a longer size is not a size
_DECIMAL = re.compile(r"[0-9]{1,19}")
ERROR_TYPES = {400: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error",
               414: "invalid_request_error", 415: "invalid_request_error", 431: "invalid_request_error",
               501: "not_implemented_error", 503: "unavailable_error", 505: "invalid_request_error"}


def stream_interval_s(ms: float) -> float:
    """The least time between two writes of a stream (serve/http/pacing.py), in seconds: `ms` within
    0 .. MAX_INTERVAL_MS (not a number: the default)."""
    ms = float(ms)
    return min(max(ms, 0.0), MAX_INTERVAL_MS) / 1e3 if math.isfinite(ms) else STREAM_INTERVAL_MS / 1e3


def env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass(frozen=True)
class Limits:
    idle_s: float = IDLE_TIMEOUT_S
    header_s: float = HEADER_TIMEOUT_S
    body_s: float = BODY_TIMEOUT_S
    body_min_bytes_s: float = BODY_MIN_BYTES_S
    write_s: float = STREAM_WRITE_TIMEOUT_S
    stream_interval_s: float = STREAM_INTERVAL_MS / 1e3
    stream_sndbuf_bytes: int = STREAM_SNDBUF_BYTES
    max_body_bytes: int = MAX_BODY_MIB << 20
    max_connections: int = MAX_CONNECTIONS

    @classmethod
    def from_env(cls) -> "Limits":
        return cls(idle_s=env_float("STRATA_IDLE_TIMEOUT_S", IDLE_TIMEOUT_S),
                   header_s=env_float("STRATA_HEADER_TIMEOUT_S", HEADER_TIMEOUT_S),
                   body_s=env_float("STRATA_BODY_TIMEOUT_S", BODY_TIMEOUT_S),
                   write_s=env_float("STRATA_STREAM_WRITE_TIMEOUT_S", STREAM_WRITE_TIMEOUT_S),
                   stream_interval_s=stream_interval_s(env_float("STRATA_STREAM_INTERVAL_MS", STREAM_INTERVAL_MS)),
                   stream_sndbuf_bytes=int(env_float("STRATA_STREAM_SNDBUF_KIB", STREAM_SNDBUF_BYTES >> 10)) << 10,
                   max_body_bytes=int(env_float("STRATA_MAX_BODY_MIB", MAX_BODY_MIB) * (1 << 20)),
                   max_connections=max(1, int(env_float("STRATA_MAX_CONNECTIONS", MAX_CONNECTIONS))))


class HttpError(StrataError):
    """A refusal of the HTTP shell (a socket rule, access, routing), with its status and error type."""

    def __init__(self, status, err_type, message, param=None, code=None):
        super().__init__(message, param=param, code=code, status=status, err_type=err_type)


class ReadDeadline(HttpError):
    """A read phase ran past its deadline; `phase` is "idle", "headers" or "body"."""

    def __init__(self, phase: str, limit_s: float):
        env = {"idle": "STRATA_IDLE_TIMEOUT_S", "headers": "STRATA_HEADER_TIMEOUT_S"}.get(phase,
                                                                                          "STRATA_BODY_TIMEOUT_S")
        super().__init__(408, "timeout_error", f"the request's {phase} did not arrive in time "
                         f"({limit_s:g} s; {env})")
        self.phase = phase


def error_json(status: int, message: str, err_type: str | None = None) -> dict:
    """The OpenAI error shape (with llama.cpp's numeric `code`) for answers outside the routes."""
    return {"error": {"message": message, "type": err_type or ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": None, "code": status}}


def raw_error(status: int, message: str) -> bytes:
    """A whole HTTP/1.0 error answer, written where no handler runs (a refused connection)."""
    body = json.dumps(error_json(status, message)).encode()
    head = (f"HTTP/1.0 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\nRetry-After: 1\r\n\r\n")
    return head.encode() + body


# ---------------------------------------------------------------- reading
class DeadlineReader(io.RawIOBase):
    """The read side of one connection; each recv waits at most until the current phase's deadline."""

    def __init__(self, sock: socket.socket, limits: Limits):
        self._sock, self._limits = sock, limits
        self.phase, self._limit_s, self._per_byte_s = "idle", limits.idle_s, 0.0
        self._deadline = _deadline(limits.idle_s)
        self._after = limits.write_s if limits.write_s > 0 else None  # the timeout between reads (writes)

    def readable(self) -> bool:
        return True

    def start_body(self) -> None:
        self.phase, self._limit_s = "body", self._limits.body_s
        self._deadline = _deadline(self._limits.body_s)
        rate = self._limits.body_min_bytes_s
        self._per_byte_s = 1.0 / rate if rate > 0 else 0.0

    def next_request(self) -> None:
        """A kept connection waits for its next request: the idle phase (and its deadline) again."""
        self.phase, self._limit_s, self._per_byte_s = "idle", self._limits.idle_s, 0.0
        self._deadline = _deadline(self._limits.idle_s)

    def limit(self, seconds: float) -> None:
        """From now on read at most `seconds` more (the drain after an early answer)."""
        self._deadline, self._per_byte_s = min(self._deadline, time.monotonic() + seconds), 0.0

    def readinto(self, buf) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise ReadDeadline(self.phase, self._limit_s)
        self._sock.settimeout(None if math.isinf(left) else left)
        try:
            n = self._sock.recv_into(buf)
        except TimeoutError:
            raise ReadDeadline(self.phase, self._limit_s) from None
        finally:
            with contextlib.suppress(OSError):
                self._sock.settimeout(self._after)
        if n and self.phase == "idle":
            self.phase, self._limit_s = "headers", self._limits.header_s
            self._deadline = _deadline(self._limits.header_s)
        self._deadline += n * self._per_byte_s
        return n


def _deadline(seconds: float) -> float:
    return time.monotonic() + seconds if seconds > 0 else math.inf


def read_body(rfile, headers, reader: DeadlineReader, limit: int) -> bytes:
    """The request body (Content-Length or chunked) within `limit` bytes; HttpError 400/408/413/501."""
    te = headers.get("Transfer-Encoding")
    if te is not None:
        if [c.strip().lower() for c in te.split(",") if c.strip()] != ["chunked"]:
            raise HttpError(501, "not_implemented_error", f"Transfer-Encoding {te!r}: only chunked is supported")
        return _read_chunked(rfile, limit)
    lengths = {v.strip() for v in headers.get_all("Content-Length") or []}
    if not lengths:
        return b""
    if len(lengths) > 1 or not _DECIMAL.fullmatch(next(iter(lengths))):
        raise HttpError(400, "invalid_request_error", "malformed Content-Length: one decimal number")
    n = int(next(iter(lengths)))
    if n > limit:
        drain(rfile, reader, n)
        raise HttpError(413, "invalid_request_error", f"the body ({n} bytes) is over the limit of {limit >> 20} MiB")
    data = rfile.read(n) if n else b""
    if len(data) < n:
        raise HttpError(400, "invalid_request_error", f"the body ended after {len(data)} of its {n} bytes")
    return data


def read_body_into(rfile, headers, limit: int, sink) -> int:
    """The request body streamed to `sink(bytes)` a piece (at most BODY_PIECE_BYTES) at a time, within
    `limit` bytes (for uploads larger than a JSON body may be) -> its size; HttpError as `read_body`."""
    if headers.get("Transfer-Encoding") is not None:
        if [c.strip().lower() for c in headers["Transfer-Encoding"].split(",") if c.strip()] != ["chunked"]:
            raise HttpError(501, "not_implemented_error", "Transfer-Encoding: only chunked is supported")
        return _read_chunked(rfile, limit, sink)
    lengths = {v.strip() for v in headers.get_all("Content-Length") or []}
    if len(lengths) != 1 or not _DECIMAL.fullmatch(next(iter(lengths))):
        raise HttpError(411 if not lengths else 400, "invalid_request_error",
                        "an upload needs one decimal Content-Length (or chunked Transfer-Encoding)")
    n = int(next(iter(lengths)))
    if n > limit:
        raise HttpError(413, "invalid_request_error", f"the body ({n} bytes) is over the limit of {limit >> 20} MiB")
    left = n
    while left:
        piece = rfile.read(min(left, BODY_PIECE_BYTES))
        if not piece:
            raise HttpError(400, "invalid_request_error", f"the body ended after {n - left} of its {n} bytes")
        sink(piece)
        left -= len(piece)
    return n


def _read_chunked(rfile, limit: int, sink=None):
    """A chunked body: its bytes, or with `sink` each chunk given to it and the total size returned."""
    parts, total = [], 0
    while True:
        line = rfile.readline(MAX_CHUNK_LINE + 1)
        if len(line) > MAX_CHUNK_LINE or not line.endswith(b"\n"):
            raise HttpError(400, "invalid_request_error", "malformed chunked body: a chunk-size line is too "
                            "long or the body ended early")
        field = line.split(b";", 1)[0].strip()
        if not _HEX_SIZE.fullmatch(field):
            raise HttpError(400, "invalid_request_error", f"malformed chunked body: chunk size {field[:24]!r} "
                            "is not 1-16 hexadecimal digits")
        size = int(field, 16)
        if size == 0:
            for _ in range(MAX_TRAILERS):
                if rfile.readline(MAX_CHUNK_LINE + 1) in (b"\r\n", b"\n", b""):
                    return total if sink is not None else b"".join(parts)
            raise HttpError(400, "invalid_request_error", f"malformed chunked body: over {MAX_TRAILERS} trailers")
        total += size
        if total > limit:
            raise HttpError(413, "invalid_request_error", f"the body is over the limit of {limit >> 20} MiB")
        data = rfile.read(size)
        if len(data) < size:
            raise HttpError(400, "invalid_request_error", "malformed chunked body: it ended inside a chunk")
        if rfile.readline(3) not in (b"\r\n", b"\n"):
            raise HttpError(400, "invalid_request_error", "malformed chunked body: a chunk is longer than its size")
        if sink is not None:
            sink(data)
        else:
            parts.append(data)


def drain(rfile, reader: DeadlineReader, n: int) -> None:
    """Read and drop up to `n` body bytes for at most DRAIN_BODY_S, so the client gets to read our answer."""
    reader.limit(DRAIN_BODY_S)
    with contextlib.suppress(OSError, HttpError):
        while n > 0:
            got = rfile.read(min(n, 1 << 20))
            if not got:
                break
            n -= len(got)


def parse_json(raw: bytes) -> dict:
    if not raw.strip():
        raise HttpError(400, "invalid_request_error", "the request body is empty; send a JSON object")
    try:
        body = json.loads(raw.decode("utf-8-sig"))
    except RecursionError:
        raise HttpError(400, "invalid_request_error", "the body's JSON is nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise HttpError(400, "invalid_request_error", f"the body is not valid JSON ({e})") from None
    if not isinstance(body, dict):
        raise HttpError(400, "invalid_request_error", "the body must be a JSON object")
    return body


# ---------------------------------------------------------------- sockets
def limit_send_buffer(sock: socket.socket, limits: Limits) -> None:
    if limits.stream_sndbuf_bytes > 0:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, limits.stream_sndbuf_bytes)


def peer_gone(sock: socket.socket) -> bool:
    """True when the client hung up (readable with nothing to read) or the socket is unusable. poll, not
    select: descriptors past 1024 are fine."""
    try:
        p = select.poll()
        p.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)
        if not p.poll(0):
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except (OSError, ValueError):
        return True


def _drain_nowait(sock: socket.socket, max_bytes: int = 1 << 20) -> bool:
    """Read what has arrived without waiting; False when the peer closed or the socket failed."""
    try:
        while max_bytes > 0:
            got = sock.recv(65536, socket.MSG_DONTWAIT)
            if not got:
                return False
            max_bytes -= len(got)
        return True
    except BlockingIOError:
        return True
    except OSError:
        return False


class _Refuser:
    """Answers connections past the cap with a 503 at once (a fresh socket's send buffer is empty, so the send
    never waits), then keeps each up to REFUSE_LINGER_S reading its request, so the close is a FIN after the
    answer and not a reset that can discard it. One thread, started when needed, ending when idle."""

    def __init__(self, response: bytes):
        self._response = response
        self._cv = threading.Condition()   # guards _pending (socket -> close-by time) and _running
        self._pending: dict[socket.socket, float] = {}
        self._running = False

    def refuse(self, sock: socket.socket) -> None:
        try:
            sock.setblocking(False)
            _drain_nowait(sock)
            sock.send(self._response)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            _close(sock)
            return
        with self._cv:
            if len(self._pending) >= MAX_REFUSING:
                oldest = next(iter(self._pending))
                del self._pending[oldest]
                _close(oldest)
            self._pending[sock] = time.monotonic() + REFUSE_LINGER_S
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, daemon=True, name="http-refuser").start()

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._pending:
                    self._running = False
                    return
                socks = {s.fileno(): s for s in self._pending}
            poller = select.poll()
            for fd in socks:
                poller.register(fd, select.POLLIN)
            done = {socks[fd] for fd, _ in poller.poll(100) if not _drain_nowait(socks[fd])}
            now = time.monotonic()
            with self._cv:
                for s in [s for s, end in self._pending.items() if s in done or end <= now]:
                    del self._pending[s]
                    _close(s)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


class GuardedServer:
    """Mixin before ThreadingHTTPServer: the connection cap and the accept loop's descriptor shortage."""
    limits: Limits

    def guard_init(self, limits: Limits) -> None:
        self.limits = limits
        self._slots = threading.BoundedSemaphore(limits.max_connections)  # one per handler thread
        busy = raw_error(503, f"the server is at its limit of {limits.max_connections} connections "
                         "(STRATA_MAX_CONNECTIONS); retry shortly")
        self._refuser = _Refuser(busy)
        self._no_fds = raw_error(503, "the server is out of file descriptors (ulimit -n); retry shortly")
        self._spare = _open_spare()

    def get_request(self):
        try:
            return self.socket.accept()
        except OSError as e:
            if e.errno in _OUT_OF_FDS:
                self._shed_one()
                time.sleep(ACCEPT_BACKOFF_S)  # the listening socket stays readable: without a pause, a spin
            raise

    def _shed_one(self) -> None:
        """Out of descriptors: free the spare, accept the waiting connection, answer 503, take the spare back."""
        if self._spare is None:
            return
        os.close(self._spare)
        self._spare = None
        try:
            sock, _ = self.socket.accept()
            with contextlib.suppress(OSError):
                sock.setblocking(False)
                sock.send(self._no_fds)
            _close(sock)
        except OSError:
            pass
        finally:
            self._spare = _open_spare()

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            self._refuser.refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def server_close(self):
        super().server_close()
        if self._spare is not None:
            with contextlib.suppress(OSError):
                os.close(self._spare)
            self._spare = None


def _open_spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return None

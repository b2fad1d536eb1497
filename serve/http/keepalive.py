"""HTTP/1.1 persistent connections: when a connection stays open, the chunked framing of a stream, the counts.

Role: the rules `serve/http/server.py` applies after each answer, so it only routes.
- A connection stays open after an answer unless: the client asked `Connection: close` or spoke HTTP/1.0; the
  request's body was left unread (an early error, a 413, a malformed body: the next request would be parsed
  from the middle of it); a stream was cut short (an error event, a dying engine: it ends without its last
  chunk); the server is stopping; or the connection has served `MAX_REQUESTS_PER_CONNECTION` requests.
  Between two requests the idle timeout (STRATA_IDLE_TIMEOUT_S, serve/http/guard.py) applies again; the header
  and body deadlines and the connection cap hold per connection as before.
- Pipelined requests (sent before the previous answer) are read and answered strictly in order: the handler
  reads one request, answers it, then reads the next from the same buffered reader.
- A non-streamed answer carries Content-Length; a stream to an HTTP/1.1 client is `Transfer-Encoding:
  chunked` (`chunk(data)` per write), and only a clean end writes `LAST_CHUNK`; to an HTTP/1.0 client it is
  ended by closing the connection, as before.
- `Counts`: connections accepted and open, requests read and those on a reused connection, so a test (or an
  operator, /metrics) sees reuse.
It knows nothing of routes, keys or the engine.

Public surface: `MAX_REQUESTS_PER_CONNECTION`, `LAST_CHUNK`, `chunk(data)`, `body_pending(headers)`,
`speaks_http11(version)`, `Counts`.
"""
from __future__ import annotations

import threading

MAX_REQUESTS_PER_CONNECTION = 1000  # then the answer says Connection: close: a client's connection is
                                    # renewed now and then (nginx's keepalive_requests default), so no thread
                                    # is held by one client forever, and a leak per connection stays bounded
LAST_CHUNK = b"0\r\n\r\n"          # a chunked body's end: written only after a clean finish


def chunk(data: bytes) -> bytes:
    """`data` as one chunk of a chunked body; empty data is no chunk (an empty chunk would end the body)."""
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""


def body_pending(headers) -> bool:
    """The request announced a body (chunked, or a Content-Length other than 0)."""
    if headers is None:
        return False
    if headers.get("Transfer-Encoding") is not None:
        return True
    return any(v.strip() not in ("", "0") for v in headers.get_all("Content-Length") or [])


def speaks_http11(version: str) -> bool:
    """An `HTTP/1.x` version of 1.1 or later (persistent by default, understands chunked answers)."""
    try:
        major, minor = version.split("/", 1)[1].split(".", 1)
        return (int(major), int(minor)) >= (1, 1)
    except (IndexError, ValueError):
        return False


class Counts:
    """Connections accepted and open, requests read, and those read on a reused connection (not its first),
    since the server started: /metrics shows them (strata:http_*), so an operator sees keep-alive work."""

    def __init__(self):
        self._lock = threading.Lock()   # guards connections, open, requests, reused
        self.connections = 0
        self.open = 0
        self.requests = 0
        self.reused = 0

    def connection(self) -> None:
        with self._lock:
            self.connections += 1
            self.open += 1

    def closed(self) -> None:
        with self._lock:
            self.open -= 1

    def request(self, reused: bool = False) -> None:
        with self._lock:
            self.requests += 1
            self.reused += int(reused)

    def snapshot(self) -> dict:
        with self._lock:
            return {"connections": self.connections, "open": self.open, "requests": self.requests,
                    "reused": self.reused}

"""Resumable streams: llama-server's conversation stream sessions (its server-stream.cpp), bounded.

Role: keep the bytes of a streamed reply whose request carried `X-Conversation-Id: ID`, so that a client that
lost its connection (a reloaded page, a sleeping laptop) can read the reply again and follow it to its end.
- The reply runs on when its client hangs up: the HTTP layer (serve/http/server.py) writes each frame into the
  session as well as to the socket, and only a stop (below), the server's shutdown or the reply's own end ends
  it. One session per ID: a new request with the same ID replaces the old session and stops its reply.
- `GET /v1/stream?conv_id=ID&from=N`: the session's SSE bytes from byte N (default 0), then the live ones
  until the reply ends (`text/event-stream`). 400 without conv_id or with a bad `from`, or when `from` is
  before the bytes still kept; 404 when there is no such session (never made, stopped or expired). A reply
  that was cut short (an error event, a stop), or a follower that stops early, ends incomplete as the
  original did: without the chunked stream's last chunk (a `cut` frame, serve/api/replies.py).
- `DELETE /v1/stream?conv_id=ID`: the user's stop: the reply's engine request is cancelled and the session
  forgotten; 204 whether or not it existed.
- `POST /v1/streams/lookup {"conversation_ids": [...]}`: `[{conversation_id, is_done, total_bytes,
  started_at, completed_at}]` for the sessions of the IDs named (an ID matches itself and `ID::<model>`);
  sessions are never listed to a caller that does not name them.
- The ID travels in the query string, not the path: it may hold a model name with slashes.
Bounds (llama-server keeps any number of sessions; Strata caps them): `MAX_SESSION_BYTES` per session (the
oldest bytes are dropped first), a finished session expires `SESSION_TTL_S` after its end, and at most
`MAX_SESSIONS` are kept: a new one drops the oldest finished one, and when every kept session is still
running the new reply is served without a session (not resumable; the server log says so).
It knows nothing of sockets or engines: the HTTP layer tees frames in and reads them out.

Public surface: `SessionStore` (`open`, `get`, `stop`, `discard`, `lookup`), `Session` (`append`, `finish(cut)`,
`cancelled`, `was_cut`, `read`), `conversation_id(headers)`, the routes `get_stream`, `delete_stream`, `lookup`.
"""
from __future__ import annotations

import sys
import threading
import time

from serve.core.events import BadRequest
from serve.http.guard import HttpError
from serve.api.replies import JsonReply, StreamReply, cut

SESSION_TTL_S = 300.0                 # a finished session is kept this long after its end (llama-server's 300 s)
MAX_SESSION_BYTES = 4 * 1024 * 1024   # SSE bytes kept per session: llama-server's cap; older bytes are dropped
MAX_SESSIONS = 64                     # sessions kept at once (RAM at most 64 x 4 MiB); llama-server has no cap
READ_WAKE_S = 0.2                     # a follower re-checks its client and the server this often
MAX_ID_CHARS = 512                    # a longer X-Conversation-Id is refused (a key, not a payload)
HEADER = "X-Conversation-Id"


class OffsetLost(Exception):
    """The bytes asked for were dropped (the session holds only its last MAX_SESSION_BYTES)."""


class Session:
    """One reply's SSE bytes: appended by its producer (the request's handler thread), read by any number of
    followers from any kept offset."""

    def __init__(self, conv_id: str, max_bytes: int, clock=time.time):
        self.conv_id = conv_id
        self.started_at = int(clock())
        self._clock = clock
        self._max_bytes = max_bytes
        self._cond = threading.Condition()  # guards _buf, _dropped, _done, _completed_at; notified on each change
        self._buf = bytearray()
        self._dropped = 0                   # bytes cut from the front (total bytes = _dropped + len(_buf))
        self._done = False
        self._cut = False                   # the reply ended short (an error event, a stop): followers' streams too
        self._completed_at = 0.0            # clock() at finish (0 while running)
        self._cancelled = threading.Event()  # a stop or a replacement: the producer ends its reply

    def append(self, data: bytes) -> None:
        with self._cond:
            if self._done:
                return
            self._buf += data
            over = len(self._buf) - self._max_bytes
            if over > 0:
                del self._buf[:over]
                self._dropped += over
            self._cond.notify_all()

    def finish(self, cut: bool = False) -> None:
        """The reply has ended; `cut`: short of its end (serve/api/replies.py `cut`)."""
        with self._cond:
            if not self._done:
                self._done, self._cut, self._completed_at = True, cut, self._clock()
                self._cond.notify_all()

    def cancel(self) -> None:
        self._cancelled.set()
        self.finish(cut=True)

    def was_cut(self) -> bool:
        with self._cond:
            return self._cut

    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def read(self, offset: int, wait_s: float) -> tuple[bytes, bool]:
        """(bytes from `offset` on, whether the reply has ended), waiting up to `wait_s` for new bytes when
        there are none yet; raises OffsetLost when `offset` was dropped."""
        with self._cond:
            if not self._done and offset >= self._dropped + len(self._buf):
                self._cond.wait(wait_s)
            if offset < self._dropped:
                raise OffsetLost(offset)
            chunk = bytes(self._buf[offset - self._dropped:])
            return chunk, self._done and not chunk

    def view(self) -> dict:
        with self._cond:
            return {"conversation_id": self.conv_id, "is_done": self._done,
                    "total_bytes": self._dropped + len(self._buf), "started_at": self.started_at,
                    "completed_at": int(self._completed_at)}

    def expired(self, now: float, ttl_s: float) -> bool:
        with self._cond:
            return self._done and now - self._completed_at >= ttl_s

    def done(self) -> bool:
        with self._cond:
            return self._done


class SessionStore:
    """The server's sessions by conversation ID (one each), expired lazily on every call: no thread."""

    def __init__(self, max_sessions: int = MAX_SESSIONS, ttl_s: float = SESSION_TTL_S,
                 max_bytes: int = MAX_SESSION_BYTES, clock=time.time):
        self.max_sessions, self.ttl_s, self.max_bytes, self._clock = max_sessions, ttl_s, max_bytes, clock
        self._lock = threading.Lock()        # guards _sessions
        self._sessions: dict[str, Session] = {}   # insertion order = age

    def _prune(self) -> None:
        now = self._clock()
        for key in [k for k, s in self._sessions.items() if s.expired(now, self.ttl_s)]:
            del self._sessions[key]

    def open(self, conv_id: str) -> Session | None:
        """A new session for `conv_id` (the old one is stopped), or None when every kept session runs."""
        fresh = Session(conv_id, self.max_bytes, self._clock)
        with self._lock:
            self._prune()
            old = self._sessions.pop(conv_id, None)
            if len(self._sessions) >= self.max_sessions:
                oldest_done = next((k for k, s in self._sessions.items() if s.done()), None)
                if oldest_done is None:
                    fresh = None
                else:
                    del self._sessions[oldest_done]
            if fresh is not None:
                self._sessions[conv_id] = fresh
        if old is not None:
            old.cancel()
        if fresh is None:
            print(f"strata: {MAX_SESSIONS} stream sessions are running; this reply is not resumable",
                  file=sys.stderr, flush=True)
        return fresh

    def get(self, conv_id: str) -> Session | None:
        with self._lock:
            self._prune()
            return self._sessions.get(conv_id)

    def stop(self, conv_id: str) -> None:
        with self._lock:
            session = self._sessions.pop(conv_id, None)
        if session is not None:
            session.cancel()

    def discard(self, session: Session) -> None:
        """Forget `session` (its request failed or was not a stream) unless a newer one took its ID."""
        with self._lock:
            if self._sessions.get(session.conv_id) is session:
                del self._sessions[session.conv_id]
        session.finish()

    def lookup(self, ids: list[str]) -> list[dict]:
        with self._lock:
            self._prune()
            found = [s for want in ids for key, s in self._sessions.items()
                     if key == want or key.startswith(want + "::")]
        return [s.view() for s in found]


def conversation_id(headers) -> str | None:
    """The request's X-Conversation-Id (None when absent or empty); 400 when it is too long."""
    value = (headers.get(HEADER) or "").strip()
    if len(value) > MAX_ID_CHARS:
        raise BadRequest(f"{HEADER}: at most {MAX_ID_CHARS} characters", param=HEADER)
    return value or None


def _conv_id(ctx) -> str:
    conv_id = ctx.query.get("conv_id") or ""
    if not conv_id:
        raise BadRequest("conv_id: the conversation id is required (?conv_id=...)", param="conv_id")
    return conv_id


def get_stream(svc, body, ctx):
    """GET /v1/stream?conv_id=ID&from=N: a session's bytes from N on, then live to its end"""
    conv_id = _conv_id(ctx)
    session = ctx.sessions.get(conv_id) if ctx.sessions is not None else None
    if session is None:
        raise HttpError(404, "not_found_error", "stream not found or expired")
    raw = ctx.query.get("from") or "0"
    if not raw.isdigit():
        raise BadRequest(f"from: a byte offset (a whole number >= 0), not {raw!r}", param="from")
    try:
        first, done = session.read(int(raw), 0.0)   # checks the offset before the 200
    except OffsetLost:
        raise BadRequest("from: the stream's bytes before this offset were dropped; restart", param="from")
    return StreamReply(_follow(session, int(raw) + len(first), first, done, ctx))


def _follow(session: Session, offset: int, first: bytes, done: bool, ctx):
    if first:
        yield first
    while not done and not ctx.cancelled():
        try:
            chunk, done = session.read(offset, READ_WAKE_S)
        except OffsetLost:   # the follower fell more than MAX_SESSION_BYTES behind: it ends here, incomplete
            break
        if chunk:
            offset += len(chunk)
            yield chunk
    if not done or session.was_cut():   # the follower stopped early, or the reply itself was cut short:
        yield cut(b"")                  # its stream ends visibly incomplete too


def delete_stream(svc, body, ctx):
    """DELETE /v1/stream?conv_id=ID: stop the reply and forget its session (204 either way)"""
    conv_id = _conv_id(ctx)
    if ctx.sessions is not None:
        ctx.sessions.stop(conv_id)
    return JsonReply(204, b"")


def lookup(svc, body, ctx):
    """POST /v1/streams/lookup {"conversation_ids": [...]}: the named conversations' sessions"""
    ids = body.get("conversation_ids", [])
    if not isinstance(ids, list):
        raise BadRequest("conversation_ids: a list of conversation ids", param="conversation_ids")
    ids = [i for i in ids if isinstance(i, str) and i]
    return JsonReply(200, ctx.sessions.lookup(ids) if ctx.sessions is not None and ids else [])

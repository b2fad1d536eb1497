"""What an API handler gets from the HTTP layer and what it gives back (see serve/api/openai.py's docstring).

`RequestContext`: `cancelled()` (the client closed its connection, or the server is shutting down),
`on_wait()` (hand it to `service.run` / `run_choices`: the engine client calls it on this thread right before
it waits for the engine, and a stream's held frames go out then: serve/http/pacing.py), `shutting_down()`,
`headers` (the request's headers, case-insensitive), `path`, `query` (dict of str), `trusted` (may see local
detail such as engine log lines: serve/http/access.py), `sessions` (the server's `stream_sessions.SessionStore`),
`slot_save_path` (--slot-save-path, or None), `method`, `responses` (the stored Responses), `created` (an Ollama-created model's settings: its parameters,
system and messages; serve/lifecycle/created.py), `read_body_into(sink)` (an upload route's body, streamed).
`JsonReply(status, body, headers)`: one JSON answer. `StreamReply(frames, content_type)`: `frames` is an
iterator of already-framed text (SSE events, keep-alive comments; bytes are written as they are); the server
writes them a burst at a time (at each `on_wait()`, and at the end), with the stream write timeout, and closes
the iterator when the client is gone (which stops the engine). `before_last` (set by the server) runs once the
frames are over, before the last of them are written. `cut(frame)`: a `CutFrame`, the frame that reports a
stream was cut short (an error after the headers, a shutdown, a dying engine); the server writes it (and any
frame after it) and then ends the stream without its end marker (an HTTP/1.1 stream's last, empty chunk), so a
client sees the reply as incomplete, and closes the connection.
`EventRun(service, prep, ctx)`: a run's events to iterate, then its `done`; `collect(...)`: (events, Done).
No HTTP or socket code lives here, so handlers can be tested without a server.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from serve.core.events import Done


@dataclass
class RequestContext:
    cancelled: Callable[[], bool] = lambda: False
    on_wait: Callable[[], None] = lambda: None
    shutting_down: Callable[[], bool] = lambda: False
    headers: Any = field(default_factory=dict)
    path: str = ""
    query: dict = field(default_factory=dict)
    trusted: bool = False   # may see local detail: gave the API key, or keyless server and a loopback client
    model_unloaded: bool = False   # (a Lifecycle) the model a view reads has no engine now: views say so
    sessions: Any = None           # the server's resumable stream sessions (serve/http/stream_sessions.py)
    http_counts: Callable[[], dict] | None = None   # the server's connection counts (serve/http/keepalive.py)
    slot_save_path: str | None = None   # --slot-save-path: the saved slots' folder (serve/api/slot_routes.py)
    method: str = ""               # the request's method (GET, POST, DELETE; HEAD reads as GET)
    responses: Any = None          # the server's stored Responses (serve/api/response_store.py)
    created: dict | None = None    # (a Lifecycle) the settings of the Ollama-created model the request names
    read_body_into: Callable[[Callable[[bytes], None]], int] | None = None   # an upload route's body -> a sink


@dataclass
class JsonReply:
    status: int
    body: Any
    headers: dict = field(default_factory=dict)


class CutFrame(str):
    """A stream's frame that says the reply was cut short: the stream ends visibly incomplete after it."""


def cut(frame) -> CutFrame:
    """`frame` (text, or bytes as UTF-8) marked as the report of a cut-short reply."""
    return CutFrame(frame.decode("utf-8") if isinstance(frame, bytes) else frame)


@dataclass
class StreamReply:
    frames: Iterator[str]
    content_type: str = "text/event-stream"
    status: int = 200
    before_last: Callable[[], object] | None = None


class EventRun:
    """A prepared request's run as a translator reads it: iterating yields its events (a stream closed
    early stops the engine), and `done` is its `Done` once they are over (None if the run failed)."""

    def __init__(self, service, prep, ctx):
        self.service, self.prep, self.ctx = service, prep, ctx
        self.done: Done | None = None

    def __iter__(self):
        with contextlib.closing(self.service.run(self.prep, self.ctx.cancelled, self.ctx.on_wait)) as events:
            for ev in events:
                if isinstance(ev, Done):
                    self.done = ev
                else:
                    yield ev


def collect(service, prep, ctx) -> tuple[list, Any]:
    """Runs a prepared request to its end for a non-streamed answer: (its events, its `Done`)."""
    run = EventRun(service, prep, ctx)
    events = list(run)
    return events, run.done

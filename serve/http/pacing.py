"""Paced writes of a streamed reply: the frames a burst of tokens makes leave in one socket write.

Role: a streamed reply is one small frame a token. Written one at a time, each token costs the server a wake of
the request's thread and a socket write (and the client a wake), on cores the engine's threads fill: ~300 µs
of CPU a token, 6-9 % of one stream's decode speed (tools/bench_server_overhead.py). Here the writer holds its
frames, and the engine client calls `on_wait()` on the request's thread right before it waits for the engine
(serve/engine_client/batch.py, serve/engine_client/engine.py, serve/generation/choices.py): the held frames then go out in one write, but at most one
write every `interval_s`. When the last write is more recent, the thread first rests for the remainder while
the engine goes on, and the tokens of that time gather in the slot's queue, to be read, framed and written
together next. So a token is at most about `interval_s` late; a token that comes `interval_s` or more after
the last write (any of a slow engine's) is not late at all, nor are the first two writes (the reply's opening
frames, then its first token); and 0 gives every burst its own write at once (`--stream-interval-ms`). A frame
is never held past the next wait. The engine holds a slot's token lines for the same interval (serve.bootstrap
passes it as `--token-flush-ms`; docs/PROTOCOL.md "Token flush"), so a burst also reaches the server in one
read and one wake of its pump.

Thread rule: only the thread that made the pacer (the request's own, the one writing its socket) sends;
`on_wait()` from any other thread (a choice's thread in an n > 1 merge) does nothing. A failed write marks the
pacer `gone` (the handler's hang-up probe reads it) instead of raising into the engine client.

Public surface: `StreamPacer(send, interval_s)`, `.hold(data)`, `.on_wait()`, `.finish(before_last=None)`,
`.gone`, `.writes`; `INTERVAL_MS` (the default), `MAX_INTERVAL_MS`, `HOLD_MAX_BYTES`, `OPENING_WRITES`.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

INTERVAL_MS = 20.0          # the default: at most 50 writes a second a stream (measured: README "Streaming")
MAX_INTERVAL_MS = 1000.0    # --stream-interval-ms accepts 0 .. this
HOLD_MAX_BYTES = 1 << 16    # frames held beyond this go out at once (all but the newest, see `finish`)
OPENING_WRITES = 2          # never delayed: a reply's opening frames (a chat's role, Anthropic's message_start)
                            # and its first token's, so the interval never adds to the time to first token


class StreamPacer:
    """One streamed reply's writer. `send(bytes)` writes to the client (may raise OSError / ValueError)."""

    def __init__(self, send: Callable[[bytes], object], interval_s: float = INTERVAL_MS / 1e3):
        self._send = send
        self.interval_s = max(0.0, float(interval_s))
        self.owner = threading.get_ident()
        self.held: list[bytes] = []   # frames not written yet (only the owner's thread touches them)
        self.size = 0
        self.gone = False             # a write failed: the client hung up or stopped reading
        self.writes = 0               # socket writes made (frames go out several to a write)
        self.sent_at = 0.0            # when the last write was made (time.monotonic)

    def hold(self, data: bytes) -> None:
        """A frame for the client; it goes out at the next `on_wait()` or at `finish()`."""
        if self.gone:
            return
        self.held.append(data)
        self.size += len(data)
        if self.size > HOLD_MAX_BYTES and len(self.held) > 1:
            last = self.held.pop()
            self._write()
            self.held, self.size = [last], len(last)

    def on_wait(self) -> None:
        """The owner's thread is about to wait for the engine: what is held goes out, no sooner than
        `interval_s` after the last write."""
        if not self.held or threading.get_ident() != self.owner:
            return
        rest = self.sent_at + self.interval_s - time.monotonic()
        if rest > 0 and self.writes >= OPENING_WRITES and not self.gone:
            time.sleep(rest)
        self._write()

    def finish(self, before_last: Callable[[], object] | None = None) -> None:
        """The frames are over: `before_last()` (if given) runs before the last held frames are written, so
        whatever it releases is released before the client can see the reply's end."""
        if before_last is not None:
            before_last()
        if self.held:
            self._write()
        if self.gone:
            raise BrokenPipeError("the client is gone")

    def _write(self) -> None:
        data = b"".join(self.held)
        self.held, self.size = [], 0
        if self.gone:
            return
        try:
            self._send(data)
            self.writes += 1
            self.sent_at = time.monotonic()
        except (OSError, ValueError):
            self.gone = True

"""The stream writer: how a `StreamReply` goes out on the connection (a mixin of serve/http/server.py's Handler).

Role: write a stream's status and headers, then its frames. HTTP/1.1: chunked, the empty last chunk only when
the stream ended cleanly (a `CutFrame` - an error event, a dying engine, a shutdown - ends it without one and
closes the connection); HTTP/1.0: the stream ends when the connection closes (serve/http/keepalive.py). Frames
are held and written a burst at a time, at most one write every `--stream-interval-ms`
(serve/http/pacing.py `StreamPacer`); a resumable reply (X-Conversation-Id, serve/http/stream_sessions.py) is
written frame by frame into its session and to the client while it listens. A client that stops reading is
ended by the write timeout (a moderate send buffer: serve/http/guard.py). Closing the frames stops the engine's
request when the stream did not finish. Knows no pipes.

Public surface: `StreamWriter` (the Handler's `_stream(reply)`; it uses the Handler's `server`, `connection`,
`wfile`, `send_response`/`send_header`/`end_headers`, `_cors_headers()` and `_session`).
"""
from __future__ import annotations

from serve.api.replies import CutFrame, StreamReply
from serve.http import guard as http_guard, keepalive
from serve.http.pacing import StreamPacer


class StreamWriter:
    """The stream-writing half of serve/http/server.py's Handler."""

    def _stream(self, reply: StreamReply):
        srv = self.server
        with srv.streams_lock:
            srv.streams += 1
        frames = reply.frames
        # HTTP/1.1: chunked, so the end is explicit and the connection can carry the next request; HTTP/1.0:
        # the stream ends when the connection closes (serve/http/keepalive.py)
        self._chunked = keepalive.speaks_http11(self.request_version)
        self._end_body = False   # set once the stream is known to end cleanly: the last chunk joins the last write
        if not self._chunked:
            self.close_connection = True
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Cache-Control", "no-cache")
            self.send_header("X-Accel-Buffering", "no")
            if self._chunked:
                self.send_header("Transfer-Encoding", "chunked")
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
                cut = self._tee(_release_before_last(frames, reply.before_last) if reply.before_last else frames,
                                session)
            else:   # frames are held and written a burst at a time: at the engine client's next wait (ctx.on_wait)
                self._pacer = pacer = StreamPacer(self._write_body, srv.limits.stream_interval_s)
                cut = False
                for frame in frames:
                    cut = cut or isinstance(frame, CutFrame)
                    pacer.hold(frame if isinstance(frame, bytes) else frame.encode("utf-8"))
                    if pacer.gone:
                        break
                self._end_body = self._chunked and not cut and not pacer.gone
                pacer.finish(reply.before_last)
            if cut or getattr(self, "_gone", False):   # visibly incomplete: no last chunk, and the connection ends
                self.close_connection = True
            elif self._chunked and (self._end_body or session is not None):   # not written with the last frames
                self.wfile.write(keepalive.LAST_CHUNK)
        except (OSError, ValueError):  # the client hung up or stopped reading past the limit
            self._gone = self.close_connection = True
        finally:
            self._pacer = None
            frames.close()  # stops the engine (STOP + drain) if the stream did not finish
            with srv.streams_lock:
                srv.streams -= 1

    def _write_body(self, data: bytes) -> None:
        """A stream's bytes to the client: one chunk (HTTP/1.1) or as they are (HTTP/1.0)."""
        if data:
            last, self._end_body = (keepalive.LAST_CHUNK if self._end_body else b""), False
            self.wfile.write(keepalive.chunk(data) + last if self._chunked else data)

    def _tee(self, frames, session) -> bool:
        """A resumable reply (serve/http/stream_sessions.py): every frame into its session, and to the client while
        it listens; the reply runs to its end after a hang-up unless stopped (ctx.cancelled: _cancelled).
        True when the reply was cut short (a `CutFrame`)."""
        cut, ended = False, False
        try:
            for frame in frames:
                cut = cut or isinstance(frame, CutFrame)
                data = frame if isinstance(frame, bytes) else frame.encode("utf-8")
                session.append(data)
                if not getattr(self, "_gone", False):
                    try:
                        self._write_body(data)
                    except (OSError, ValueError):
                        self._gone = True
            ended = True
        finally:
            session.finish(cut=cut or not ended)
        return cut


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

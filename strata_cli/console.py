"""NonBlockingOut: the process's stdout/stderr as a queue and a writer thread, so printing never blocks.

Why: a server started by an app host (or `strata serve > pipe` with nobody reading) would freeze on its
next print once the pipe buffer is full, and a frozen print inside a request thread holds the turn. While
installed, `sys.stdout` and `sys.stderr` are replaced by writers that only append to a bounded queue; one
daemon thread writes the queue to the real streams. Past `MAX_QUEUED_BYTES` or `MAX_QUEUED_CHUNKS` the
oldest text is dropped (counted in `dropped_chunks`, not announced: announcing would add to the flood).
`uninstall(timeout_s)` drains what it can and restores the original streams. `STRATA_BLOCKING_CONSOLE=1`
turns it off (install does nothing).

Public surface: `NonBlockingOut.install()`, `.uninstall(timeout_s)`, `.dropped_chunks`, `MAX_QUEUED_*`.
"""
from __future__ import annotations

import collections
import os
import sys
import threading

MAX_QUEUED_BYTES = 1 << 20   # 1 MiB of console text waiting is far beyond what a person reads
MAX_QUEUED_CHUNKS = 4000     # and so many separate writes
DRAIN_AT_EXIT_S = 2.0


class _Writer:
    def __init__(self, owner, which, real):
        self._owner, self._which, self._real = owner, which, real
        self.encoding = getattr(real, "encoding", "utf-8")
        self.errors = "replace"

    def write(self, text):
        if text:
            self._owner._put(self._which, str(text))
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        return False

    def fileno(self):
        return self._real.fileno()

    @property
    def buffer(self):
        return self._real.buffer


class NonBlockingOut:
    def __init__(self):
        self._cv = threading.Condition()   # guards _queue, _bytes, dropped_chunks, _closing
        self._queue: collections.deque = collections.deque()
        self._bytes = 0
        self.dropped_chunks = 0
        self._closing = False
        self._thread = None
        self._orig = None

    def install(self) -> "NonBlockingOut":
        if os.environ.get("STRATA_BLOCKING_CONSOLE") == "1" or self._orig is not None:
            return self
        self._orig = (sys.stdout, sys.stderr)
        sys.stdout = _Writer(self, 0, self._orig[0])
        sys.stderr = _Writer(self, 1, self._orig[1])
        self._thread = threading.Thread(target=self._run, daemon=True, name="console-writer")
        self._thread.start()
        return self

    def _put(self, which, text):
        with self._cv:
            self._queue.append((which, text))
            self._bytes += len(text)
            while len(self._queue) > 1 and (self._bytes > MAX_QUEUED_BYTES or
                                            len(self._queue) > MAX_QUEUED_CHUNKS):
                _, old = self._queue.popleft()
                self._bytes -= len(old)
                self.dropped_chunks += 1
            self._cv.notify()

    def _run(self):
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait(1.0)
                if not self._queue and self._closing:
                    return
                which, text = self._queue.popleft()
                self._bytes -= len(text)
            stream = self._orig[which]
            try:
                stream.write(text)
                stream.flush()
            except (OSError, ValueError):
                pass  # a closed console: the text is lost, the server goes on

    def uninstall(self, timeout_s: float = DRAIN_AT_EXIT_S) -> None:
        if self._orig is None:
            return
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join(timeout_s)
        sys.stdout, sys.stderr = self._orig
        self._orig = None

"""NonBlockingOut: writes never block, the oldest text is dropped past the limits, drained at exit."""
import io
import os
import sys
import threading

from strata_cli import console as nonblocking_out
from strata_cli.console import NonBlockingOut


class Blocked(io.StringIO):
    """A console that blocks every write until released."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()

    def write(self, text):
        self.gate.wait(10)
        return super().write(text)


def test_writes_never_block_and_oldest_is_dropped(monkeypatch):
    monkeypatch.delenv("STRATA_BLOCKING_CONSOLE", raising=False)
    real_out, real_err = sys.stdout, sys.stderr
    fake = Blocked()
    monkeypatch.setattr(sys, "stdout", fake)
    monkeypatch.setattr(sys, "stderr", fake)
    out = NonBlockingOut().install()
    try:
        for i in range(nonblocking_out.MAX_QUEUED_CHUNKS + 500):
            print(f"line {i}")  # would block forever without the queue
        assert out.dropped_chunks >= 500
    finally:
        fake.gate.set()
        out.uninstall(timeout_s=5)
    assert sys.stdout is fake and sys.stderr is fake
    text = fake.getvalue()
    assert f"line {nonblocking_out.MAX_QUEUED_CHUNKS + 499}" in text and "line 0\n" not in text
    assert real_out is not None and real_err is not None


def test_blocking_console_env_turns_it_off(monkeypatch):
    monkeypatch.setenv("STRATA_BLOCKING_CONSOLE", "1")
    before = sys.stdout
    out = NonBlockingOut().install()
    assert sys.stdout is before
    out.uninstall()

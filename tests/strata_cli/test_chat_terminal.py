"""strata_cli/chat_terminal.py: turns, commands and streaming over a fake-engine server; the real `strata chat`
through a pseudo-terminal with the real model (it starts its own server): streaming, /system, /clear, /save,
Ctrl+C stopping a reply but not the program."""
import io
import json
import os
import pty
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from strata_cli import chat_terminal
from strata_cli.client import Server
from tests.conftest import ENGINE_EXE, ROOT, model_path
from tests.serve.conftest import server  # noqa: F401 (the fake-engine server fixture, shared from tests/serve)


def _lines(*items):
    it = iter(items)
    return lambda prompt: next(it, None)


def test_read_turn_joins_continued_lines_and_blocks():
    s = chat_terminal.ChatSession(Server(), out=io.StringIO())
    assert s.read_turn(_lines("one \\", "two\\", "three")) == "one \ntwo\nthree"
    assert s.read_turn(_lines('"""', "a", "", "b", '"""')) == "a\n\nb"
    assert s.read_turn(_lines()) is None


def test_commands_and_a_streamed_reply_over_a_server(server, tmp_path):
    run = server({"turns": [{"text": "Hi there."}]})
    out = io.StringIO()
    s = chat_terminal.ChatSession(Server("127.0.0.1", run.port), out=out)
    assert s.handle("/system Be brief.") and s.system == "Be brief."
    assert s.ask("hello") == "Hi there." and "Hi there.\n" in out.getvalue()
    assert s.messages() == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"},
                            {"role": "assistant", "content": "Hi there."}]
    assert s.handle(f"/save {tmp_path / 'c.json'}")
    assert json.loads((tmp_path / "c.json").read_text())["messages"] == s.messages()
    assert s.handle("/clear") and s.turns == [] and s.handle("/nope") and "unknown command" in out.getvalue()
    assert s.handle("/exit") is False


def test_save_on_a_full_disk_says_so_and_keeps_the_old_file(small_disk):
    out = io.StringIO()
    s = chat_terminal.ChatSession(Server(), out=out)
    s.system = "Be brief."
    path = f"{small_disk.path}/chat.json"
    assert s.handle(f"/save {path}") and "saved" in out.getvalue()
    before = open(path).read()
    small_disk.fill()
    s.system = "Be verbose."
    assert s.handle(f"/save {path}")
    assert "(not saved: cannot save " in out.getvalue() and "No space left" in out.getvalue()
    assert open(path).read() == before


def test_reasoning_is_dimmed_and_ctrl_c_keeps_what_came(monkeypatch):
    out = io.StringIO()
    s = chat_terminal.ChatSession(Server(), out=out, color=True)

    def stream(messages, model):
        yield "reasoning", "let me think"
        yield "content", "Paris"
        raise KeyboardInterrupt
    monkeypatch.setattr(s.server, "chat_stream", stream)
    assert s.ask("capital?") == "Paris"
    assert f"{chat_terminal.DIM}let me think{chat_terminal.RESET}\nParis\n(stopped)\n" == out.getvalue()
    assert s.turns[-1] == {"role": "assistant", "content": "Paris"}


class _Pty:
    def __init__(self, argv, env):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:   # the child: the chat, on the terminal
            os.chdir(ROOT)
            # Ctrl+C's SIGINT at its default, as a shell leaves it for a job in the foreground: a test run started
            # in the background of a script (`cmd &`, nohup) inherits SIGINT ignored, and Python then never turns
            # it into KeyboardInterrupt, so the Ctrl+C test below would wait out the whole reply
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execve(sys.executable, [sys.executable, *argv], env)
        self.seen = ""

    def read_until(self, text, timeout_s=300.0):
        end = time.monotonic() + timeout_s
        while text not in self.seen:
            left = end - time.monotonic()
            assert left > 0, f"no {text!r} in {self.seen[-800:]!r}"
            ready, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if ready:
                try:
                    self.seen += os.read(self.fd, 4096).decode("utf-8", "replace")
                except OSError:
                    raise AssertionError(f"the chat ended: {self.seen[-800:]!r}") from None
        at = self.seen.index(text) + len(text)
        before, self.seen = self.seen[:at], self.seen[at:]
        return before

    def send(self, text):
        os.write(self.fd, text.encode())


def _chat_in_pty(port, env):
    t = _Pty(["-m", "strata_cli", "chat", "--port", str(port)], env)
    t.read_until("/help for commands")
    t.read_until("> ")
    return t


def _end_pty(t):
    try:
        os.kill(t.pid, 9)
    except ProcessLookupError:
        pass
    os.close(t.fd)


def test_ctrl_c_in_a_pseudo_terminal_stops_the_reply_not_the_chat(server, tmp_path):
    # a reply that is still streaming when Ctrl+C comes, whatever a model would choose to say: the fake
    # engine sends 400 tokens 20 ms apart (8 s), so the stop is the only way the turn ends within the test
    run = server({"turns": [{"text": "1\n", "repeat": 400, "token_delay_s": 0.02}, {"text": "Ahoy."}]})
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path), "HOME": os.environ.get("HOME", str(tmp_path))}
    t = _chat_in_pty(run.port, env)
    try:
        t.send("Count from 1 to 300, one number per line, \\\nwith no other text.\n")
        t.read_until("with no other text.")   # the terminal's echo of the two lines
        t.read_until("1")                     # the reply is streaming
        started = time.monotonic()
        t.send("\x03")                        # Ctrl+C: the reply stops, the chat goes on
        t.read_until("(stopped)", timeout_s=30.0)  # the whole reply takes 8 s: past that, Ctrl+C was lost
        assert time.monotonic() - started < 5.0, "the reply ran on after Ctrl+C"
        t.read_until("> ")
        t.send("And now?\n")                  # the next turn is answered on the same chat
        assert "Ahoy." in t.read_until("\n> ")
        t.send(f"/save {tmp_path / 'chat.json'}\n")
        t.read_until("(saved 4 messages")
        saved = json.loads((tmp_path / "chat.json").read_text())["messages"]
        assert [m["role"] for m in saved] == ["user", "assistant", "user", "assistant"]
        assert saved[0]["content"] == "Count from 1 to 300, one number per line, \nwith no other text."
        kept = saved[1]["content"]             # what came before the stop, and no more
        assert set(kept.split()) == {"1"} and len(kept.split()) < 400
        t.send("/exit\n")
        _, status = os.waitpid(t.pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        _end_pty(t)


@pytest.mark.skipif(model_path() is None or not os.access(ENGINE_EXE, os.X_OK),
                    reason="needs the default model and the built engine")
def test_strata_chat_in_a_pseudo_terminal_with_the_real_model(tmp_path):
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path), "HOME": os.environ.get("HOME", str(tmp_path))}
    # a server of the test's own with greedy sampling (run config), so the replies are the model's top choices
    (tmp_path / "run.json").write_text(json.dumps({"sampling": {"temperature": 0}}))
    srv = subprocess.Popen([sys.executable, "-m", "strata_cli", "serve", "--port", "0", "--config",
                            str(tmp_path / "run.json")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in srv.stdout], daemon=True).start()
    port, end = None, time.monotonic() + 300
    while port is None and time.monotonic() < end:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", lines.get(timeout=max(0.1, end - time.monotonic())))
        port = m and m.group(1)
    t = _chat_in_pty(port, env)
    try:
        t.send("What is the capital of France?\n")
        reply = t.read_until("\n> ")
        assert "Paris" in reply
        # a question over two lines (a line ending in \ goes on); whatever the model says, the turn ends
        t.send("Name three colours, \\\nseparated by commas.\n")
        t.read_until("separated by commas.")  # the terminal's echo of the two lines
        t.read_until("\n> ")
        t.send("/system You are a pirate.\n")
        t.read_until("(system prompt set)")
        t.read_until("> ")
        t.send(f"/save {tmp_path / 'chat.json'}\n")
        t.read_until("(saved 5 messages")
        saved = json.loads((tmp_path / "chat.json").read_text())["messages"]
        assert [m["role"] for m in saved] == ["system", "user", "assistant", "user", "assistant"]
        assert saved[3]["content"] == "Name three colours, \nseparated by commas."
        t.send("/clear\n")
        t.read_until("(conversation cleared)")
        t.send("/exit\n")
        _, status = os.waitpid(t.pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        srv.terminate()
        srv.wait(timeout=30)
        deadline = time.monotonic() + 30   # the server ended: its activity record is removed
        while os.listdir(tmp_path / "strata") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [f for f in os.listdir(tmp_path / "strata") if f.endswith(".json")] == []
    finally:
        srv.kill()
        _end_pty(t)

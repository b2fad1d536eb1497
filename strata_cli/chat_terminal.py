"""`strata chat`: a terminal chat against a running Strata server, or one it starts for the chat.

Role: read the user's turns (multi-line: end a line with `\\` to go on, or wrap lines in `\"\"\"`), stream each
reply as it comes (reasoning dimmed), keep the conversation, and run the slash commands: `/system TEXT`,
`/clear`, `/save FILE`, `/help`, `/exit`. Ctrl+C while a reply streams stops that reply (the connection is
closed, so the server stops generating) and the chat goes on; Ctrl+C at the prompt clears the line; Ctrl+D
or `/exit` leaves. It talks to the server only through `strata_cli.client.Server`.

Public surface: `ChatSession(server, model, out, color)`, `ChatSession.read_turn(read_line)`,
`ChatSession.handle(text) -> bool`, `ChatSession.ask(text)`, `run(server, model, read_line, out,
initial_system)`. (A server for the chat: `strata_cli.client.start_server`.)
"""
from __future__ import annotations

import os
import sys

from strata_cli.client import ClientError, Server
from strata_control.files import write_private_json

DIM, RESET = "\x1b[2m", "\x1b[0m"
PROMPT, MORE = "> ", ". "
HELP = ("commands: /system TEXT (set the system prompt; empty clears it), /clear (forget the conversation), "
        "/save FILE (the conversation as JSON), /help, /exit. A line ending in \\ goes on on the next line; "
        "\"\"\" starts and ends a block of lines. Ctrl+C stops a reply; Ctrl+D leaves.")


class ChatSession:
    def __init__(self, server: Server, model: str | None = None, out=None, color: bool = True):
        self.server, self.model = server, model
        self.out = out or sys.stdout
        self.color = color
        self.system: str | None = None
        self.turns: list[dict] = []      # user and assistant messages, in order

    def messages(self) -> list[dict]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.turns

    def _say(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    # ---------------------------------------------------------------- input
    def read_turn(self, read_line) -> str | None:
        """One turn from `read_line(prompt)` (None at end of input): continued lines and \"\"\" blocks joined."""
        first = read_line(PROMPT)
        if first is None:
            return None
        if first.strip() == '"""':
            lines = []
            while True:
                line = read_line(MORE)
                if line is None or line.strip() == '"""':
                    return "\n".join(lines)
                lines.append(line)
        lines = [first]
        while lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1]
            line = read_line(MORE)
            if line is None:
                break
            lines.append(line)
        return "\n".join(lines)

    # ---------------------------------------------------------------- commands
    def handle(self, text: str) -> bool:
        """A slash command or a turn; False when the chat should end."""
        stripped = text.strip()
        if not stripped:
            return True
        if not stripped.startswith("/"):
            self.ask(text)
            return True
        name, _, arg = stripped.partition(" ")
        if name in ("/exit", "/quit", "/bye"):
            return False
        if name == "/system":
            self.system = arg.strip() or None
            self._say(f"(system prompt {'set' if self.system else 'cleared'})\n")
        elif name == "/clear":
            self.turns = []
            self._say("(conversation cleared)\n")
        elif name == "/save":
            self._save(arg.strip())
        elif name == "/help":
            self._say(HELP + "\n")
        else:
            self._say(f"(unknown command {name}; /help lists them)\n")
        return True

    def _save(self, path: str) -> None:
        if not path:
            self._say("(/save needs a file name)\n")
            return
        try:
            write_private_json(os.path.expanduser(path), {"model": self.model, "messages": self.messages()})
        except OSError as e:   # StorageFull among them: its text says which file and that the old one is kept
            self._say(f"(not saved: {e.strerror or e})\n")
            return
        self._say(f"(saved {len(self.messages())} messages to {path})\n")

    # ---------------------------------------------------------------- a reply
    def ask(self, text: str) -> str:
        """Stream the reply to `text`; Ctrl+C stops it (what came so far is kept in the conversation)."""
        self.turns.append({"role": "user", "content": text})
        reply, dim = [], False
        stream = self.server.chat_stream(self.messages(), self.model)
        try:
            for kind, piece in stream:
                if kind == "reasoning":
                    if self.color and not dim:
                        self._say(DIM)
                        dim = True
                    self._say(piece)
                    continue
                if dim:
                    self._say(RESET + "\n")
                    dim = False
                reply.append(piece)
                self._say(piece)
        except KeyboardInterrupt:
            self._say((RESET if dim else "") + "\n(stopped)")
            dim = False
        except ClientError as e:
            self._say(f"\n(error: {e})")
            self.turns.pop()
            return ""
        finally:
            stream.close()   # closes the connection: a stopped reply ends on the server too
            if dim:
                self._say(RESET)
        self._say("\n")
        answer = "".join(reply)
        self.turns.append({"role": "assistant", "content": answer})
        return answer


def _input_line(prompt: str) -> str | None:
    try:
        return input(prompt)
    except EOFError:
        return None


def run(server: Server, model: str | None = None, read_line=_input_line, out=None,
        initial_system: str | None = None) -> int:
    """The chat loop until /exit or end of input."""
    out = out or sys.stdout
    session = ChatSession(server, model, out, color=getattr(out, "isatty", lambda: False)())
    session.system = initial_system
    out.write(f"strata chat with {model or 'the loaded model'} on {server.host}:{server.port} (/help for "
              f"commands, Ctrl+D to leave)\n")
    while True:
        try:
            text = session.read_turn(read_line)
        except KeyboardInterrupt:   # at the prompt: forget the line, keep chatting
            out.write("\n")
            continue
        if text is None or not session.handle(text):
            out.write("\n")
            return 0

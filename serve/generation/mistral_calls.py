"""Mistral's tool-call syntax read as the `<tool_call>` form the output parser knows.

Role: Mistral-family models (their own chat template, serve/prompt/jinja_chat.py) write calls after the
`[TOOL_CALLS]` control token, in one of two forms:
- v3 (Mistral 7B v0.3, Nemo): `[TOOL_CALLS] [{"name": "f", "arguments": {...}}, {...}]`, a JSON array;
- v11 and later (Mistral Small 3.x, Ministral, Magistral): `[TOOL_CALLS]f[ARGS]{...}` per call, with an
  optional `[CALL_ID]id` between the name and `[ARGS]`.
`MistralCallText` rewrites that text, as it streams, into `<tool_call>{"name": "f", "arguments": {...}}</tool_call>`
per call (each object of a v3 array whole, its keys as the model wrote them), so that
serve/generation/output_parser.py reads, announces and streams the calls exactly as it does Hermes calls; every
other character passes through unchanged, and a `[TOOL_CALLS]` that does not open a call (a name longer than
NAME_MAX_CHARS, a line break in it) is passed through as written. `MistralOutputParser` is an OutputParser fed
through that rewrite (the same surface: feed, finish, in_reasoning, holding, holding_call, done, ...).

Public surface: `CALLS_OPEN`, `MistralCallText`, `MistralOutputParser`. Knows no HTTP, tokens or engine.
"""
from __future__ import annotations

import json

from serve.generation.output_parser import OutputParser
from serve.prompt.tool_text import CALL_CLOSE, CALL_OPEN

CALLS_OPEN = "[TOOL_CALLS]"
ARGS_OPEN = "[ARGS]"
CALL_ID_OPEN = "[CALL_ID]"
NAME_MAX_CHARS = 256   # a tool name longer than this is not a name: the text is content


def _held_prefix(text: str, tag: str) -> int:
    """Characters at the end of `text` that may start `tag` (kept until the next piece decides)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class MistralCallText:
    """Incremental rewrite (see the module docstring): `feed(text) -> str`, `finish() -> str`."""

    def __init__(self):
        self.state = "text"     # text | head | array | object | name | args
        self.buf = ""           # text not yet decided
        self.depth = 0          # JSON object nesting while copying one (object, args)
        self.in_string = False
        self.escaped = False
        self.name = ""

    def feed(self, text: str) -> str:
        self.buf += text
        out: list[str] = []
        while self.buf and self._step(out):
            pass
        return "".join(out)

    def finish(self) -> str:
        out = self.buf if self.state in ("text", "object", "args") else (
            CALLS_OPEN + self.name + self.buf if self.state == "name" else "")
        self.buf = ""
        return out

    def _step(self, out: list[str]) -> bool:
        return getattr(self, "_" + self.state)(out)

    def _text(self, out: list[str]) -> bool:
        at = self.buf.find(CALLS_OPEN)
        if at < 0:
            keep = _held_prefix(self.buf, CALLS_OPEN)
            out.append(self.buf[:len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep:]
            return False
        out.append(self.buf[:at])
        self.buf, self.state = self.buf[at + len(CALLS_OPEN):], "head"
        return True

    def _head(self, out: list[str]) -> bool:
        rest = self.buf.lstrip(" ")
        if not rest:
            self.buf = ""
            return False
        if rest[0] == "[":
            self.buf, self.state = rest[1:], "array"
        elif rest[0] == "{":
            self.buf, self.state = rest, "array"      # one object without its array
        else:
            self.buf, self.state, self.name = rest, "name", ""
        return True

    def _array(self, out: list[str]) -> bool:
        rest = self.buf.lstrip(" \n\t,")
        if not rest:
            self.buf = ""
            return False
        if rest[0] == "]":
            self.buf, self.state = rest[1:], "text"
            return True
        if rest[0] != "{":      # not a call array after all: the rest is text
            self.buf, self.state = rest, "text"
            return True
        out.append(CALL_OPEN)
        self.buf, self.state = rest, "object"
        self.depth, self.in_string, self.escaped = 0, False, False
        return True

    def _copy_json(self, out: list[str]) -> bool:
        """Copies one JSON object; True once it closed (the rest stays in buf)."""
        for i, c in enumerate(self.buf):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c == "{":
                self.depth += 1
            elif c == "}":
                self.depth -= 1
                if self.depth == 0:
                    out.append(self.buf[:i + 1])
                    self.buf = self.buf[i + 1:]
                    return True
        out.append(self.buf)
        self.buf = ""
        return False

    def _object(self, out: list[str]) -> bool:
        if not self._copy_json(out):
            return False
        out.append(CALL_CLOSE)
        self.state = "array"
        return True

    def _name(self, out: list[str]) -> bool:
        self.name += self.buf
        self.buf = ""
        at = self.name.find(ARGS_OPEN)
        name = self.name[:at] if at >= 0 else self.name
        head = name.split(CALL_ID_OPEN)[0]
        if len(head) > NAME_MAX_CHARS or "\n" in head:   # no call: what was read is text
            self.buf, self.state, self.name = CALLS_OPEN + self.name, "plain", ""
            return self._plain(out)
        if at < 0:
            return False
        out.append(CALL_OPEN + '{"name": ' + json.dumps(head.strip(), ensure_ascii=False) + ', "arguments": ')
        self.buf, self.state, self.name = self.name[at + len(ARGS_OPEN):].lstrip(" "), "args", ""
        self.depth, self.in_string, self.escaped = 0, False, False
        return True

    def _plain(self, out: list[str]) -> bool:
        out.append(self.buf)
        self.buf, self.state = "", "text"
        return False

    def _args(self, out: list[str]) -> bool:
        if not self._copy_json(out):
            return False
        out.append("}" + CALL_CLOSE)
        self.state = "text"
        return True


class MistralOutputParser:
    """An OutputParser (serve/generation/output_parser.py) over the rewrite of Mistral's call syntax."""

    def __init__(self, *args, **kwargs):
        self.inner = OutputParser(*args, **kwargs)
        self.rewrite = MistralCallText()

    def feed(self, text: str):
        return self.inner.feed(self.rewrite.feed(text))

    def finish(self):
        rest = self.rewrite.finish()
        return (self.inner.feed(rest) if rest else []) + self.inner.finish()

    @property
    def holding(self) -> bool:
        return bool(self.rewrite.buf) or self.rewrite.state != "text" or self.inner.holding

    def __getattr__(self, name):   # in_reasoning, holding_call, done, take_forced_opening, n_calls, ...
        return getattr(self.inner, name)

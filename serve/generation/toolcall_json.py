"""The JSON form of a tool call's body: `{"name": NAME, "arguments": {...}}` (Hermes / Qwen2.5 / SmolLM2),
read incrementally.

Role: `JsonCallBody` scans the body after `<tool_call>` character by character, announces the call once its
name is read, and re-writes the arguments in canonical form (json.dumps spacing) piece by piece, so the pieces
concatenate to exactly `arguments_text(call.arguments)`. It never raises on model text: a body that is not a
call is `failed`. The common state is serve/generation/call_body.py's `CallBody`; which form a body is:
serve/generation/toolcall_parsers.py `body_parser_for`.

Public surface: `JsonCallBody`.
"""
from __future__ import annotations

import json
import re

from serve.generation.call_body import NAME_MAX_CHARS, WS, CallBody, esc, json_value
from serve.prompt.tool_text import arguments_text

_SCALAR = re.compile(r"[-+0-9.eEa-zA-Z]+")
_STR_STOP = re.compile(r'["\\]')
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class JsonCallBody(CallBody):
    """`{"name": NAME, "arguments": {...}}` scanned incrementally; the arguments are re-written in
    canonical form (json.dumps spacing) piece by piece, strings character by character."""

    ARGS_KEYS = ("arguments", "parameters")

    def __init__(self, tools, index, call_id):
        super().__init__(tools, index, call_id)
        self.stack: list[list[str]] = []   # per open container: [kind "{" or "[", what comes next]
        self.top = "value"                 # the outer value: "value" -> "done"
        self.in_string = False
        self.string_is_key = False
        self.key = ""                      # the outer object's current key
        self._text: list[str] = []         # the string being read, when it is a key or the name
        self._in_args = False              # inside the value of "arguments"
        self._args_text: list[str] = []    # canonical text of the arguments (to parse at the end)
        self._args_kind = ""               # "{" when the arguments value is an object, '"' a string

    def _expect(self) -> str:
        return self.stack[-1][1] if self.stack else self.top

    def _set_expect(self, what: str) -> None:
        if self.stack:
            self.stack[-1][1] = what
        else:
            self.top = what

    def _value_done(self) -> None:
        if not self.stack:
            self.top = "done"
        else:
            self.stack[-1][1] = "comma_or_end"

    def _out(self, text: str) -> None:
        """Canonical text of something inside the arguments value."""
        self._args_text.append(text)
        if self._args_kind == "{":
            self._piece(text)

    def _step(self) -> None:
        raw = self.raw
        while self.status == "open" and self.pos < len(raw):
            if self.in_string:
                if not self._string_step():
                    return
                continue
            while self.pos < len(raw) and raw[self.pos] in WS:
                self.pos += 1
            if self.pos >= len(raw):
                return
            if not self._token_step(raw[self.pos]):
                return
            if self.top == "done":
                self._close_outer()
                return

    def _token_step(self, c: str) -> bool:
        expect = self._expect()
        depth = len(self.stack)
        if c in "{[" and expect in ("value", "value_or_end"):
            if depth == 0 and c != "{":
                self._fail()
                return False
            if depth == 1:
                self._in_args = self.key in self.ARGS_KEYS
                if self._in_args:
                    self._args_kind = c
            if self._in_args:
                self._out(c)
            self._set_expect("value")
            self.stack.append([c, "key_or_end" if c == "{" else "value_or_end"])
            self.pos += 1
            return True
        if c in "}]" and ((c == "}" and self.stack and self.stack[-1][0] == "{" and
                           expect in ("key_or_end", "comma_or_end")) or
                          (c == "]" and self.stack and self.stack[-1][0] == "[" and
                           expect in ("value_or_end", "comma_or_end"))):
            self.stack.pop()
            if self._in_args:
                self._out(c)
                if len(self.stack) == 1:
                    self._in_args = False
            self._value_done()
            self.pos += 1
            return True
        if c == "," and expect == "comma_or_end":
            if self._in_args:
                self._out(", ")
            self._set_expect("key" if self.stack[-1][0] == "{" else "value")
            self.pos += 1
            return True
        if c == ":" and expect == "colon":
            if self._in_args:
                self._out(": ")
            self._set_expect("value")
            self.pos += 1
            return True
        if c == '"' and expect in ("key", "key_or_end", "value", "value_or_end"):
            self.in_string, self.string_is_key = True, expect.startswith("key")
            if depth == 1 and not self.string_is_key:
                self._in_args = self.key in self.ARGS_KEYS
                if self._in_args:
                    self._args_kind = '"'
            self._text = []
            if self._in_args:
                self._out('"')
            self.pos += 1
            return True
        if expect in ("value", "value_or_end") and depth >= 1:
            return self._scalar_step()
        self._fail()
        return False

    def _scalar_step(self) -> bool:
        m = _SCALAR.match(self.raw, self.pos)
        if not m:
            self._fail()
            return False
        if m.end() >= len(self.raw):
            return False   # the token may go on
        value = json_value(m.group())
        if isinstance(value, str) and value == m.group():
            self._fail()
            return False
        if len(self.stack) == 1:
            if self.key in self.ARGS_KEYS:
                self._args_kind = "null" if value is None else "bad"
            elif self.key == "name":
                self._fail()   # a name that is not a string
                return False
        elif self._in_args:
            self._out(json.dumps(value, ensure_ascii=False))
        self.pos = m.end()
        self._value_done()
        return True

    def _string_step(self) -> bool:
        raw = self.raw
        m = _STR_STOP.search(raw, self.pos)
        end = m.start() if m else len(raw)
        if end > self.pos:
            self._string_piece(raw[self.pos:end])
            self.pos = end
        if m is None:
            return False
        if raw[end] == '"':
            self.pos = end + 1
            self._string_end()
            return True
        decoded, width = _escape_at(raw, end)
        if width == 0:
            return False    # the escape is still arriving
        if decoded is None:
            self._fail()
            return False
        self._string_piece(decoded)
        self.pos = end + width
        return True

    def _string_piece(self, text: str) -> None:
        depth = len(self.stack)
        if depth == 1 and (self.string_is_key or self.key == "name"):
            self._text.append(text)
        if self._in_args:
            self._out(esc(text))

    def _string_end(self) -> None:
        self.in_string = False
        depth = len(self.stack)
        if self._in_args:
            self._out('"')
        if self.string_is_key:
            if depth == 1:
                self.key = "".join(self._text)
            self._set_expect("colon")
            return
        if depth == 1:
            if self.key == "name" and self.name is None:
                name = "".join(self._text).strip()
                if not name or len(name) > NAME_MAX_CHARS or "\n" in name:
                    self._fail()
                    return
                self._announce(name)
            self._in_args = False
        self._value_done()

    def _close_outer(self) -> None:
        if self.name is None:
            self._fail()
            return
        text = "".join(self._args_text)
        if self._args_kind == "{":
            self.args = json.loads(text)
        elif self._args_kind == '"':
            inner = json.loads(text)
            parsed = json_value(inner)
            # arguments given as a string: the object it holds, else the text under "arguments", so the
            # arguments' text is always a JSON object for both APIs
            self.args = parsed if isinstance(parsed, dict) else {"arguments": inner}
            self._piece(arguments_text(self.args))
        elif self._args_kind in ("", "null"):
            self.args = {}
            self._piece("{}")
        else:
            self._fail()   # a list as arguments
            return
        self.status = "closed"


def _escape_at(raw: str, at: int) -> tuple[str | None, int]:
    """Decode the escape at raw[at] (a backslash) -> (text, width); width 0 = incomplete; text None = bad."""
    if at + 1 >= len(raw):
        return None, 0
    c = raw[at + 1]
    if c in _ESCAPES:
        return _ESCAPES[c], 2
    if c != "u":
        return None, 2
    hex4 = raw[at + 2:at + 6]
    if len(hex4) < 4:
        return None, 0 if all(h in "0123456789abcdefABCDEF" for h in hex4) else 2
    try:
        code = int(hex4, 16)
    except ValueError:
        return None, 6
    if 0xD800 <= code < 0xDC00:   # a high surrogate: its low half must follow as \\uXXXX
        low = raw[at + 6:at + 12]
        if len(low) < 6 and "\\u".startswith(low[:2]):
            return None, 0
        if low.startswith("\\u"):
            try:
                code2 = int(low[2:], 16)
            except ValueError:
                code2 = 0
            if 0xDC00 <= code2 < 0xE000:
                return chr(0x10000 + ((code - 0xD800) << 10) + (code2 - 0xDC00)), 12
        return "\ufffd", 6
    if 0xDC00 <= code < 0xE000:
        return "\ufffd", 6
    return chr(code), 6

"""Tool-call parsers: the incremental parsers of one call's body, in the two forms a model writes.

Role: read a tool call back out of model text. Two forms, both inside `<tool_call>...</tool_call>` (the tags
and the writing side: serve/prompt/tool_text.py):
- "xml" (Qwen3.5 / Qwen3-Coder): `<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>`;
  a `</parameter>` ends a value only when `<parameter=` or `</function>` follows; values are typed by the
  tool's JSON schema (a declared string stays a string, anything else is JSON-decoded when it parses);
- "json" (Hermes / Qwen2.5 / SmolLM2): `{"name": NAME, "arguments": {...}}`.
A body parser announces the call when its name is known, then yields argument pieces whose concatenation is
exactly `arguments_text(call.arguments)` (the JSON text the non-streamed answer carries), and finally the
call. It never raises on model text: a body that is not a call says so (`failed`) and the output parser
turns it back into content. Knows no HTTP; `serve/generation/output_parser.py` drives these parsers.

Public surface: `CallBody`, `XmlCallBody`, `JsonCallBody`, `body_parser_for(text)`, `value_is_text(kind)`,
`NAME_MAX_CHARS`.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

from serve.core.events import Event, KIND_TOOL_ARGS, KIND_TOOL_CALL, KIND_TOOL_START, ToolCall, ToolSpec
from serve.prompt.tool_text import (
    CALL_CLOSE, FUNCTION_CLOSE, FUNCTION_OPEN, PARAM_CLOSE, PARAM_OPEN, arguments_text)

NAME_MAX_CHARS = 256   # a tool name longer than this is not a name: the text is content
# A value ends at `</parameter>` followed by the next parameter or the function's end; a `</tool_call>` there
# (small models skip `</function>`) ends the function too: no value can be read another way.
_VALUE_END = re.compile(r"\n?</parameter>\s*(?=<parameter=|</function>|</tool_call>)")
_WS = " \t\r\n"


def _esc(text: str) -> str:
    """JSON string-body escape of a piece (escaping is per character, so pieces concatenate)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


class CallBody:
    """Common state of one call's body parser (the text after `<tool_call>`).

    status: "open" (more text needed), "closed" (the body ended; only `</tool_call>` may be missing),
    "complete" (`end` = offset in `raw` just past the call), "failed" (not a call, or a broken one).
    """

    def __init__(self, tools: dict[str, ToolSpec], index: int, call_id: str):
        self.tools = tools
        self.index = index
        self.call_id = call_id
        self.raw = ""
        self.pos = 0
        self.status = "open"
        self.end = 0
        self.name: str | None = None
        self.args: dict | str = {}
        self.events: list[Event] = []
        self._args_out: list[str] = []   # argument pieces written before the name was known

    @property
    def announced(self) -> bool:
        return self.name is not None

    def _announce(self, name: str) -> None:
        self.name = name
        self.events.append(Event(KIND_TOOL_START, index=self.index, call_id=self.call_id, name=name))
        if self._args_out:
            self.events.append(Event(KIND_TOOL_ARGS, text="".join(self._args_out), index=self.index))
            self._args_out = []

    def _piece(self, text: str) -> None:
        if not text:
            return
        if self.name is None:
            self._args_out.append(text)
        elif self.events and self.events[-1].kind == KIND_TOOL_ARGS:
            self.events[-1].text += text
        else:
            self.events.append(Event(KIND_TOOL_ARGS, text=text, index=self.index))

    def _fail(self) -> None:
        self.status = "failed"

    def _after_body(self) -> None:
        """Body closed: wait for `</tool_call>`; other text ends the call where the body ended."""
        rest = self.raw[self.pos:]
        stripped = rest.lstrip(_WS)
        if stripped.startswith(CALL_CLOSE):
            self.end = len(self.raw) - len(stripped) + len(CALL_CLOSE)
            self._complete()
        elif stripped and not CALL_CLOSE.startswith(stripped):
            self.end = self.pos
            self._complete()

    def _complete(self) -> None:
        self.status = "complete"
        call = ToolCall(id=self.call_id, name=self.name or "", arguments=self.args)
        self.events.append(Event(KIND_TOOL_CALL, index=self.index, call_id=self.call_id, name=call.name,
                                 call=call))

    def feed(self, text: str) -> None:
        self.raw += text
        if self.status == "open":
            self._step()
        if self.status == "closed":
            self._after_body()

    def finish(self) -> None:
        """End of output: a closed body is a call (only `</tool_call>` was missing); else it stays open."""
        if self.status == "closed":
            self.end = len(self.raw)
            self._complete()

    def take_events(self) -> list[Event]:
        out, self.events = self.events, []
        return out

    def _step(self) -> None:
        raise NotImplementedError


# ------------------------------------------------------------------------------------------ xml form

def _type_of(spec: ToolSpec | None, param: str) -> Any:
    if spec is None:
        return None
    props = (spec.parameters or {}).get("properties") or {}
    prop = props.get(param) if isinstance(props, dict) else None
    return prop.get("type") if isinstance(prop, dict) else None


def _is_string_type(kind: Any) -> bool:
    return kind == "string" or (isinstance(kind, list) and "string" in kind and
                                not ({"object", "array", "number", "integer", "boolean"} & set(kind)))


value_is_text = _is_string_type  # an XML value of this `type` is raw text (serve/generation/constrain.py's grammar agrees)


def _json_value(text: str) -> Any:
    """JSON-decoded value, or the text itself when it does not parse (NaN and infinities do not)."""
    def refuse(_: str):
        raise ValueError("not JSON")
    try:
        value = json.loads(text, parse_constant=refuse)
    except ValueError:
        return text
    if isinstance(value, float) and math.isinf(value):
        return text
    return value


def _could_end_value(tail: str) -> bool:
    """Whether `tail` (the value text from some point to the end) may still become a value's end."""
    if tail.startswith("\n"):
        tail = tail[1:]
    if PARAM_CLOSE.startswith(tail):
        return True
    if not tail.startswith(PARAM_CLOSE):
        return False
    rest = tail[len(PARAM_CLOSE):].lstrip(_WS)
    return PARAM_OPEN.startswith(rest) or FUNCTION_CLOSE.startswith(rest) or CALL_CLOSE.startswith(rest)


class XmlCallBody(CallBody):
    """`<function=NAME>` + `<parameter=P>VALUE</parameter>`... + `</function>`; string values stream."""

    def __init__(self, tools, index, call_id):
        super().__init__(tools, index, call_id)
        self.state = "function"   # function -> between -> (param -> value -> between)* -> closed
        self._param: str | None = None
        self._string = False      # the current value is a declared string: it streams
        self._skip = False        # the current parameter repeats an earlier one: parsed, not kept
        self._streamed = 0        # chars of the current value known not to start its end (string: written)
        self._started = False     # the value's first char (a newline to drop, or not) is decided
        self._n_params = 0

    def _step(self) -> None:
        while self.status == "open":
            if not getattr(self, "_step_" + self.state)():
                return

    def _read_tag_name(self, opener: str) -> str | None:
        """NAME of `<opener>NAME>` at pos; "" while incomplete; None when it cannot be a name."""
        text = self.raw[self.pos:]
        if not text.startswith(opener):
            return "" if opener.startswith(text) else None
        close = text.find(">", len(opener))
        name = text[len(opener):close if close >= 0 else len(text)]
        if "<" in name or "\n" in name or len(name) > NAME_MAX_CHARS:
            return None
        if close < 0:
            return ""
        self.pos += close + 1
        return name.strip() or None

    def _step_function(self) -> bool:
        while self.pos < len(self.raw) and self.raw[self.pos] in _WS:
            self.pos += 1
        name = self._read_tag_name(FUNCTION_OPEN)
        if name is None:
            self._fail()
        elif name:
            self._announce(name)
            self.state = "between"
            return True
        return False

    def _step_between(self) -> bool:
        rest = self.raw[self.pos:]
        stripped = rest.lstrip(_WS)
        skipped = len(rest) - len(stripped)
        if stripped.startswith(FUNCTION_CLOSE) or stripped.startswith(CALL_CLOSE):
            if stripped.startswith(FUNCTION_CLOSE):
                self.pos += skipped + len(FUNCTION_CLOSE)
            self._piece("}" if self._n_params else "{}")
            self.status = "closed"
            return False
        if stripped.startswith(PARAM_OPEN):
            self.pos += skipped
            self.state = "param"
            return True
        if not stripped or any(tag.startswith(stripped) for tag in (PARAM_OPEN, FUNCTION_CLOSE, CALL_CLOSE)):
            return False
        self._fail()
        return False

    def _step_param(self) -> bool:
        name = self._read_tag_name(PARAM_OPEN)
        if name is None:
            self._fail()
            return False
        if not name:
            return False
        self._param = name
        self._skip = isinstance(self.args, dict) and name in self.args
        self._string = _is_string_type(_type_of(self.tools.get(self.name or ""), name))
        if not self._skip:
            self._piece(("{" if not self._n_params else ", ") + json.dumps(name, ensure_ascii=False) + ": ")
            if self._string:
                self._piece('"')
            self._n_params += 1
        self._streamed, self._started = 0, False
        self.state = "value"
        return True

    def _step_value(self) -> bool:
        if not self._started:
            if self.pos >= len(self.raw):
                return False
            if self.raw[self.pos] == "\n":   # one leading newline of a value is not part of it
                self.pos += 1
            self._started = True
        text = self.raw[self.pos:]
        m = _VALUE_END.search(text, self._streamed)
        if m is None:   # no end yet: what cannot start one is safe (streamed when the value is a string)
            safe = len(text)
            for i in range(self._streamed, len(text)):
                if text[i] in "\n<" and _could_end_value(text[i:]):
                    safe = i
                    break
            if self._string and not self._skip:
                self._piece(_esc(text[self._streamed:safe]))
            self._streamed = safe
            return False
        value = text[:m.start()]
        if not self._skip:
            if self._string:
                self._piece(_esc(value[self._streamed:]) + '"')
                typed: Any = value
            else:
                typed = _json_value(value)
                self._piece(json.dumps(typed, ensure_ascii=False))
            self.args[self._param] = typed
        self.pos += m.end()
        self.state = "between"
        return True


# ------------------------------------------------------------------------------------------ json form

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
            while self.pos < len(raw) and raw[self.pos] in _WS:
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
        value = _json_value(m.group())
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
            self._out(_esc(text))

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
            parsed = _json_value(inner)
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


def body_parser_for(text: str):
    """Which body parser the text after `<tool_call>` calls for: a class, "" (undecided yet) or None."""
    stripped = text.lstrip(_WS)
    if not stripped:
        return ""
    if stripped.startswith(FUNCTION_OPEN):
        return XmlCallBody
    if stripped[0] == "{":
        return JsonCallBody
    if FUNCTION_OPEN.startswith(stripped):
        return ""
    return None



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
Here: the XML form and which form a body is; the common state is serve/generation/call_body.py's, the JSON form
serve/generation/toolcall_json.py's (both names are taken from here too).

Public surface: `CallBody`, `XmlCallBody`, `JsonCallBody`, `body_parser_for(text)`, `value_is_text(kind)`,
`NAME_MAX_CHARS`.
"""
from __future__ import annotations

import json
import re
from typing import Any

from serve.core.events import ToolSpec
from serve.generation.call_body import NAME_MAX_CHARS, WS, CallBody, esc, json_value
from serve.generation.toolcall_json import JsonCallBody
from serve.prompt.tool_text import CALL_CLOSE, FUNCTION_CLOSE, FUNCTION_OPEN, PARAM_CLOSE, PARAM_OPEN

__all__ = ["CallBody", "XmlCallBody", "JsonCallBody", "body_parser_for", "value_is_text", "NAME_MAX_CHARS"]

# A value ends at `</parameter>` followed by the next parameter or the function's end; a `</tool_call>` there
# (small models skip `</function>`) ends the function too: no value can be read another way.
_VALUE_END = re.compile(r"\n?</parameter>\s*(?=<parameter=|</function>|</tool_call>)")


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


def _could_end_value(tail: str) -> bool:
    """Whether `tail` (the value text from some point to the end) may still become a value's end."""
    if tail.startswith("\n"):
        tail = tail[1:]
    if PARAM_CLOSE.startswith(tail):
        return True
    if not tail.startswith(PARAM_CLOSE):
        return False
    rest = tail[len(PARAM_CLOSE):].lstrip(WS)
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
        while self.pos < len(self.raw) and self.raw[self.pos] in WS:
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
        stripped = rest.lstrip(WS)
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
                self._piece(esc(text[self._streamed:safe]))
            self._streamed = safe
            return False
        value = text[:m.start()]
        if not self._skip:
            if self._string:
                self._piece(esc(value[self._streamed:]) + '"')
                typed: Any = value
            else:
                typed = json_value(value)
                self._piece(json.dumps(typed, ensure_ascii=False))
            self.args[self._param] = typed
        self.pos += m.end()
        self.state = "between"
        return True


def body_parser_for(text: str):
    """Which body parser the text after `<tool_call>` calls for: a class, "" (undecided yet) or None."""
    stripped = text.lstrip(WS)
    if not stripped:
        return ""
    if stripped.startswith(FUNCTION_OPEN):
        return XmlCallBody
    if stripped[0] == "{":
        return JsonCallBody
    if FUNCTION_OPEN.startswith(stripped):
        return ""
    return None

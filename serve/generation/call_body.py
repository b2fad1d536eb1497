"""The common part of a tool call's body parser: the state one call's parse keeps, and the events it emits.

Role: `CallBody` holds one call's raw text, its status ("open", "closed", "complete", "failed"), its name and
arguments, and turns them into events (the call announced, argument pieces, the call); a form's parser
(serve/generation/toolcall_parsers.py `XmlCallBody`, serve/generation/toolcall_json.py `JsonCallBody`) supplies
`_step`, which reads `raw` from `pos`. It never raises on model text. Knows no HTTP.

Public surface: `CallBody`, `NAME_MAX_CHARS`, `WS` (the whitespace a body may hold between its parts),
`esc(text)` (JSON string-body escape of a piece), `json_value(text)` (JSON-decoded or the text itself).
"""
from __future__ import annotations

import json
import math
from typing import Any

from serve.core.events import Event, KIND_TOOL_ARGS, KIND_TOOL_CALL, KIND_TOOL_START, ToolCall, ToolSpec
from serve.prompt.tool_text import CALL_CLOSE

NAME_MAX_CHARS = 256   # a tool name longer than this is not a name: the text is content
WS = " \t\r\n"


def esc(text: str) -> str:
    """JSON string-body escape of a piece (escaping is per character, so pieces concatenate)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def json_value(text: str) -> Any:
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
        stripped = rest.lstrip(WS)
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

"""Reasoning control and the incremental output parser.

Role: turn the model's decoded text into the one event stream of `serve/events.py` (reasoning, content,
tool_start, tool_args, tool_call), and map every API's way of asking for more or less thinking onto one
effort level. It knows no HTTP, no pipes and no token ids: the service feeds it text, in pieces of any size.

Public surface:
- `OutputParser(tools, thinking, forced_opening=None)`: `feed(text) -> list[Event]`, `finish() -> list[Event]`.
  The same text gives the same events however it is split (never a partial tag, never a verdict taken
  before the text that decides it has arrived). `in_reasoning` tells the run loop where the model is.
- Effort: `normalize_effort(value, field)`, `effort_from_openai(body)`, `effort_from_anthropic(body, mode)`,
  `template_kwargs(effort)`.
- Budget: `thinking_budget(budget, max_new, answer_room)`, `WRAP_UP_TEXT`, `CLOSE_RETRY_TEXT`.
"""
from __future__ import annotations

from typing import Any

from serve.events import (BadRequest, Event, KIND_CONTENT, KIND_REASONING, ToolSpec)

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# The text a run appends when the thinking budget is spent: the model reads it as its own decision to answer.
WRAP_UP_TEXT = "\n\nI have thought about this long enough; time to give my answer.\n</think>\n\n"
# Opt-in `reasoning_close_retry`: appended once to a reply that stopped inside its thinking with no answer.
CLOSE_RETRY_TEXT = "\n</think>\n\n"

# A thinking budget never leaves the answer less than this many tokens (or a quarter of max_new, or half).
ANSWER_RESERVE_MIN = 512
# From this cap on, thinking without a budget is closed early enough to leave the answer its reserve: below
# it, the reserve would be most of the cap and a thinking model would hardly think at all.
ANSWER_ROOM_MIN_CAP = 2048

EFFORT_LEVELS = ("none", "low", "medium", "high")
_EFFORT_ALIASES = {
    "none": "none", "off": "none", "minimal": "none", "disabled": "none", "false": "none",
    "low": "low",
    "medium": "medium",
    "high": "high", "xhigh": "high", "max": "high", "maximum": "high",
}


# ------------------------------------------------------------------------------------------ effort levels

def normalize_effort(value: Any, field: str = "reasoning_effort") -> str | None:
    """One effort level ("none" | "low" | "medium" | "high") from any accepted spelling; None stays None.

    `False` means "none" (clients that send a boolean); anything unknown is a 400 naming the field.
    """
    if value is None:
        return None
    if value is False:
        return "none"
    if isinstance(value, str):
        level = _EFFORT_ALIASES.get(value.strip().lower())
        if level is not None:
            return level
    raise BadRequest(f"unknown reasoning effort {value!r} in `{field}`: use none, low, medium or high "
                     "(aliases: off, minimal, disabled, xhigh, max)", param=field)


def effort_from_openai(body: dict) -> str | None:
    """The effort an OpenAI-style body asks for, or None when it names none.

    Sources: `reasoning_effort`, `reasoning.effort`, `chat_template_kwargs.reasoning_effort` and
    `chat_template_kwargs.enable_thinking` (false wins over every other source).
    """
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise BadRequest("`chat_template_kwargs` must be an object", param="chat_template_kwargs")
    kwargs = kwargs or {}
    enable = kwargs.get("enable_thinking")
    if enable is not None and not isinstance(enable, bool):
        raise BadRequest("`chat_template_kwargs.enable_thinking` must be true or false",
                         param="chat_template_kwargs.enable_thinking")
    found = None
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise BadRequest("`reasoning` must be an object like {\"effort\": \"low\"}", param="reasoning")
    for field, value in (("reasoning_effort", body.get("reasoning_effort")),
                         ("reasoning.effort", (reasoning or {}).get("effort")),
                         ("chat_template_kwargs.reasoning_effort", kwargs.get("reasoning_effort"))):
        level = normalize_effort(value, field)
        if level is not None and found is None:
            found = level
    return "none" if enable is False else found


def effort_from_anthropic(body: dict, mode: str = "model") -> str | None:
    """The effort an Anthropic body asks for, or None (template default).

    `thinking.type: disabled` -> none; `output_config.effort`; else `thinking.budget_tokens` < 2048 low,
    < 8192 medium, else high. No `thinking` field: the template default, or "none" when the config's
    `anthropic_thinking` is "on_request".
    """
    thinking = body.get("thinking")
    if thinking is not None and not isinstance(thinking, dict):
        raise BadRequest("`thinking` must be an object like {\"type\": \"enabled\", \"budget_tokens\": 4096}",
                         param="thinking")
    output_config = body.get("output_config")
    if output_config is not None and not isinstance(output_config, dict):
        raise BadRequest("`output_config` must be an object", param="output_config")
    if thinking is not None:
        kind = thinking.get("type")
        if kind not in ("enabled", "disabled", "adaptive", None):
            raise BadRequest(f"`thinking.type` must be \"enabled\" or \"disabled\", not {kind!r}",
                             param="thinking.type")
        if kind == "disabled":
            return "none"
    level = normalize_effort((output_config or {}).get("effort"), "output_config.effort")
    if level is not None:
        return level
    if thinking is not None:
        budget = thinking.get("budget_tokens")
        if budget is None:
            return None
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
            raise BadRequest("`thinking.budget_tokens` must be an integer >= 0",
                             param="thinking.budget_tokens")
        return "low" if budget < 2048 else "medium" if budget < 8192 else "high"
    return "none" if mode == "on_request" else None


def template_kwargs(effort: str | None) -> dict:
    """Template variables for an effort level: `enable_thinking` and, when set, `reasoning_effort`."""
    if effort is None:
        return {"enable_thinking": True}
    if effort == "none":
        return {"enable_thinking": False}
    return {"enable_thinking": True, "reasoning_effort": effort}


# ------------------------------------------------------------------------------------------ budget

def answer_reserve(max_new: int) -> int:
    """Tokens kept for the answer out of `max_new`: min(max(512, max_new // 4), max_new // 2)."""
    return min(max(ANSWER_RESERVE_MIN, max_new // 4), max_new // 2)


def thinking_budget(budget: int | None, max_new: int, answer_room: bool = True) -> int | None:
    """The number of thinking tokens after which the run writes `WRAP_UP_TEXT`, or None (no limit).

    A request's budget (0 or None = none) is lowered so the answer keeps its reserve. Without a budget, a
    cap of at least `ANSWER_ROOM_MIN_CAP` still gets one (the answer's room), unless `answer_room` is off.
    """
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 0):
        raise BadRequest("`reasoning_budget_tokens` must be an integer >= 0", param="reasoning_budget_tokens")
    reserve = answer_reserve(max_new)
    if budget:
        return budget if budget <= max_new - reserve else max(1, max_new - reserve)
    if answer_room and max_new >= ANSWER_ROOM_MIN_CAP:
        return max_new - reserve
    return None


# ------------------------------------------------------------------------------------------ parser

def _held_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `tags` (0 if none)."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best


class OutputParser:
    """Incremental split of model output into reasoning, content and tool-call events.

    thinking: the generation prompt ended with `<think>\\n`, so the output starts in reasoning.
    forced_opening: text the run put at the end of the prompt (a forced tool-call opening, thinking off);
    it is parsed as if the model had written it.
    (This first version knows reasoning and content; tool calls are parsed by the full version.)
    """

    def __init__(self, tools: list[ToolSpec], thinking: bool, forced_opening: str | None = None):
        self.tools = list(tools)
        self.state = "reasoning" if thinking else "content"
        self._buf = ""          # text not yet turned into events (a possible tag start, held newlines)
        self._at_start = True   # nothing but whitespace seen in the current state
        self._pending = forced_opening or ""

    @property
    def in_reasoning(self) -> bool:
        return self.state == "reasoning"

    def feed(self, text: str) -> list[Event]:
        if self._pending:
            text, self._pending = self._pending + text, ""
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        out = self.feed("")
        out += self._drain(final=True)
        return out

    def _drain(self, final: bool) -> list[Event]:
        out: list[Event] = []
        while self._buf:
            if self.state == "reasoning":
                if not self._step_reasoning(out, final):
                    break
            elif not self._step_content(out, final):
                break
        return out

    def _emit(self, out: list[Event], kind: str, text: str) -> None:
        if not text:
            return
        if out and out[-1].kind == kind and kind in (KIND_CONTENT, KIND_REASONING):
            out[-1].text += text
        else:
            out.append(Event(kind, text=text))

    def _step_reasoning(self, out: list[Event], final: bool) -> bool:
        buf = self._buf
        if self._at_start:
            stripped = buf.lstrip("\n")
            if not stripped:
                self._buf = "" if final else buf
                return False
            buf = self._buf = stripped
            self._at_start = False
        at = buf.find(THINK_CLOSE)
        if at >= 0:
            self._emit(out, KIND_REASONING, buf[:at].rstrip("\n"))
            self._buf = buf[at + len(THINK_CLOSE):]
            self.state, self._at_start = "content", True
            return True
        if final:
            self._emit(out, KIND_REASONING, buf)
            self._buf = ""
            return False
        keep = _held_suffix(buf, (THINK_CLOSE,))
        body = buf[:len(buf) - keep]
        trail = len(body) - len(body.rstrip("\n"))   # newlines right before a `</think>` are dropped
        keep += trail
        self._emit(out, KIND_REASONING, buf[:len(buf) - keep])
        self._buf = buf[len(buf) - keep:]
        return False

    def _step_content(self, out: list[Event], final: bool) -> bool:
        buf = self._buf
        if self._at_start:
            stripped = buf.lstrip("\n")
            if not stripped:
                self._buf = "" if final else buf
                return False
            if stripped.startswith(THINK_OPEN):   # a model that opens its own thinking
                self._buf = stripped[len(THINK_OPEN):]
                self.state = "reasoning"
                return True
            if THINK_OPEN.startswith(stripped) and not final:
                return False
            buf = self._buf = stripped
            self._at_start = False
        self._emit(out, KIND_CONTENT, buf)
        self._buf = ""
        return False

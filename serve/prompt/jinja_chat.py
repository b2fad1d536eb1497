"""A chat rendered with the model's own Jinja template, behind the native renderers' interface.

Role: serve/prompt/chatml.py and serve/prompt/llama3_gemma.py render the native families; every other GGUF
template (Mistral, Phi-3, DeepSeek, Command-R, gpt-oss, ... or any family with `--chat-template jinja`) is
rendered here by serve/prompt/jinja_template.py, as its authors wrote it. This module turns Strata's
`Message`s and `ToolSpec`s into the dicts the templates read (the shape Hugging Face's `apply_chat_template`
and llama.cpp's server pass: `role`, `content`, `reasoning_content`, `tool_calls` with `function.arguments` an
object, `tool_call_id`, `name`; tools as `{"type": "function", "function": {...}}`), passes the flags
(`add_generation_prompt`, `enable_thinking`, `reasoning_effort`, `bos_token`, `eos_token`), puts the BOS text in
front when the GGUF asks for BOS and the template did not write it (llama.cpp adds it as a token), and keeps
client text plain (UPSTREAM §8.3) — see `_plain_spans`.

Plain text: a client string that holds a control token's text (`<|im_end|>` typed by a user) must be encoded
as text. Only then (it is rare) the chat is rendered a second time with that string replaced by a sentinel,
and the sentinel render is matched against the real one to find where the string landed (as written,
trimmed, or JSON-escaped); a template that transforms it past recognition gets a 400 naming the string's
place, never a prompt where a client wrote a control token.

Tool calls and reasoning: the template writes the tools and the history's calls in its own format; Strata reads a model's
calls back in the `<tool_call>` forms (serve/generation/toolcall_parsers.py), so `tool_format` is "xml" for a
template that writes `<function=`, "json" for one that writes `<tool_call>`, Mistral's `[TOOL_CALLS]` or Llama
3.1's bare JSON call (`call_syntax` "mistral" / "llama3_json": serve/generation/call_syntax.py rewrites the
model's calls into the JSON form; only `tool_choice` auto, since a forced call's opening is written in the
`<tool_call>` form), and None otherwise: a request with tools is then a 400 naming the family (the calls would
reach the client as text).

Public surface: `JinjaChat(text, family, bos_token, eos_token, add_bos, special_pattern)`, its `render(...)`
(the interface of `ChatTemplate.render`), `family`, `tool_format`, `call_syntax`, `default_system`, `message_dicts(messages)`,
`tool_dicts(tools)`. Knows no tokens (the caller passes the control tokens' pattern), no HTTP, no engine.
"""
from __future__ import annotations

import json
import re

from serve.core.events import BadRequest, Message, ToolSpec
from serve.prompt.jinja_template import JinjaTemplate, TemplateRenderError
from serve.prompt.tool_text import arguments_object
from serve.prompt.writer import Rendered

THINK_OPEN = "<think>"
MISTRAL_CALLS = "[TOOL_CALLS]"   # Mistral's call syntax (serve/generation/call_syntax.py reads it back)
EFFORTS = ("low", "medium", "high")       # the `reasoning_effort` values templates read (gpt-oss)
_SENTINEL = re.compile("\ue000(\\d+)\ue001")   # private-use marks: no template writes or trims them
_ASCII_SPACE = " \t\n\v\f\r"


def message_dicts(messages: list[Message]) -> list[dict]:
    """The messages as chat templates read them (Hugging Face's and llama.cpp's server's shape)."""
    out = []
    for m in messages:
        d: dict = {"role": m.role, "content": m.content or ""}
        if m.reasoning:
            d["reasoning_content"] = m.reasoning
        if m.tool_calls:
            d["tool_calls"] = [{"id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": arguments_object(c.arguments)}}
                               for c in m.tool_calls]
        if m.role == "tool":
            if m.tool_call_id:
                d["tool_call_id"] = m.tool_call_id
            if m.name:
                d["name"] = m.name
        out.append(d)
    return out


def tool_dicts(tools: list[ToolSpec]) -> list[dict]:
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.parameters or {"type": "object", "properties": {}}}}
            for t in tools]


def _tool_format(text: str) -> str | None:
    if "<function=" in text:
        return "xml"
    if "<tool_call>" in text or _call_syntax(text):
        return "json"
    return None


def _call_syntax(text: str) -> str | None:
    """How a template's model writes calls when not in `<tool_call>` tags (serve/generation/call_syntax.py)."""
    if "<tool_call>" in text:
        return None
    if MISTRAL_CALLS in text:
        return "mistral"
    if "<|channel|>" in text and "<|message|>" in text:
        return "harmony"       # gpt-oss: analysis / commentary / final channels
    if "<|start_header_id|>" in text and "tools" in text and ("<|python_tag|>" in text or '"parameters"' in text):
        return "llama3_json"   # Llama 3.1 / 3.2 / 3.3: a JSON object {"name": ..., "parameters": ...}
    return None


class JinjaChat:
    """One model's own template (see the module docstring); immutable, shared across request threads."""

    def __init__(self, text: str, family: str = "jinja", bos_token: str = "", eos_token: str = "",
                 add_bos: bool = False, special_pattern=None):
        self.template = JinjaTemplate(text, bos_token, eos_token)   # TemplateRenderError if it does not compile
        self.family = family
        self.renderer = "jinja"
        self.tool_format = _tool_format(text)
        # how the model writes calls: "mistral" ([TOOL_CALLS]) or "llama3_json" (a bare JSON object), read through
        # serve/generation/call_syntax.py, auto tool choice only; None: the <tool_call> forms
        self.call_syntax = _call_syntax(text)
        self.default_system: str | None = None      # --system-prompt: a system turn for chats without one
        self.bos = bos_token if add_bos else ""
        self.special = special_pattern               # the control tokens' texts (compiled), None = none
        self.knows_think = THINK_OPEN in text

    def render(self, messages: list[Message], tools: list[ToolSpec] | None = None, thinking: bool | None = None,
               add_generation_prompt: bool = True, effort: str | None = None) -> Rendered:
        if not messages:
            raise BadRequest("messages: at least one message is needed", param="messages")
        if tools and self.tool_format is None:
            raise BadRequest(f"tools: Strata does not read tool calls in the format of this model's {self.family} "
                             "chat template yet; send the request without tools", param="tools")
        msgs = message_dicts(messages)
        if self.default_system and msgs[0]["role"] != "system":
            msgs.insert(0, {"role": "system", "content": self.default_system})
        flags = {"add_generation_prompt": add_generation_prompt}
        if tools:
            flags["tools"] = tool_dicts(tools)
        if thinking is not None:
            flags["enable_thinking"] = thinking
        if effort in EFFORTS:
            flags["reasoning_effort"] = effort
        text = self._render(msgs, flags)
        plain = self._plain_spans(msgs, flags, text)
        if self.bos and not text.startswith(self.bos):
            text = self.bos + text
            plain = [(s + len(self.bos), e + len(self.bos)) for s, e in plain]
        opened = add_generation_prompt and text.rstrip("\n").endswith(THINK_OPEN)
        return Rendered(text, plain, opened)

    def _render(self, msgs: list[dict], flags: dict) -> str:
        try:
            return self.template.render(msgs, **flags)
        except TemplateRenderError as e:
            raise BadRequest(f"messages: {e}", param="messages") from None

    # ---------------------------------------------------------------------------------------- plain text

    def _plain_spans(self, msgs: list[dict], flags: dict, text: str) -> list[tuple[int, int]]:
        """Where the client strings that hold control-token text landed in `text` (see the module docstring)."""
        if self.special is None:
            return []
        marked: list[str] = []     # client strings replaced by sentinel i, in order

        def mark(value):
            if isinstance(value, str):
                if self.special.search(value) is None:
                    return value
                marked.append(value)
                return f"\ue000{len(marked) - 1}\ue001"
            if isinstance(value, dict):
                return {mark(k): mark(v) for k, v in value.items()}
            if isinstance(value, list):
                return [mark(v) for v in value]
            return value

        sentinel_msgs = [{k: (v if k == "role" else mark(v)) for k, v in m.items()} for m in msgs]
        sentinel_flags = {**flags, "tools": mark(flags["tools"])} if "tools" in flags else flags
        if not marked:
            return []
        spans = _match(self._render(sentinel_msgs, sentinel_flags), text, marked)
        if spans is None:
            raise BadRequest("messages: a message holds control-token text (such as "
                             f"{self.special.search(marked[0]).group()!r}) and this model's {self.family} chat "
                             "template changes that text too much for Strata to keep it plain text; remove it",
                             param="messages")
        return spans


def _candidates(value: str) -> list[str]:
    """The forms a template writes a string in: as is, trimmed (Jinja's trim / Python's strip), JSON-escaped."""
    forms = [value, value.strip(), value.strip(_ASCII_SPACE), value.lstrip(), value.rstrip(),
             json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]]
    seen: list[str] = []
    for f in forms:
        if f not in seen:
            seen.append(f)
    return sorted(seen, key=len, reverse=True)


def _match(sentinel_text: str, text: str, marked: list[str]) -> list[tuple[int, int]] | None:
    """Spans of `text` where the sentinels of `sentinel_text` stand, when the two agree everywhere else."""
    pieces = _SENTINEL.split(sentinel_text)   # literal, index, literal, index, ..., literal
    pos, spans = 0, []
    for k in range(0, len(pieces), 2):
        literal = pieces[k]
        if not text.startswith(literal, pos):
            return None
        pos += len(literal)
        if k + 1 == len(pieces):
            break
        following = pieces[k + 2]
        for form in _candidates(marked[int(pieces[k + 1])]):
            end = pos + len(form)
            if text.startswith(form, pos) and (text.startswith(following, end) if following else True):
                spans.append((pos, end))
                pos = end
                break
        else:
            return None
    return spans if pos == len(text) else None

"""Native chat-template rendering for the ChatML family (`<|im_start|>ROLE\\n...<|im_end|>\\n`).

Role: turn normalised `Message`s (and tools) into the prompt text the model was trained on, plus the
`plain` character spans that must be encoded as ordinary text (UPSTREAM §8.3: a user who types
`<|im_start|>` gets those characters, never the control token). No Jinja: the GGUF's template text is read
only to learn the family's facts: its default system prompt (SmolLM2 and Qwen2.5 add one when the chat has
no system message) and whether it knows `<think>`.

Public surface: `ChatTemplate.from_text(template_text)`, `ChatTemplate.render(messages, tools, thinking,
effort=)` -> `Rendered(text, plain, thinking)`. (Which family a template text is, and the list Strata
renders: strata_control/families.py.) It knows no tokens, no HTTP and no engine.
"""
from __future__ import annotations

import json
import re

from serve.core.events import BadRequest, Message, ToolSpec
from serve.prompt.writer import PromptWriter as _Writer
from serve.prompt.writer import Rendered
from serve.prompt.llama3_gemma import FamilyTemplate
from strata_control.families import detect_family
from serve.prompt.tool_text import arguments_object, tool_signature, tools_intro, tools_outro

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system(?:\n|\\n)(.*?)<\|im_end\|>", re.S)

# Reasoning effort on a template that knows <think> (thinking on): `medium` (and no effort) is the template's
# own prompt; `low` and `high` add one short system turn right before the generation prompt, so a change of
# effort keeps the cached history. `none` is the empty think block. The sentences follow the Qwen family's.
EFFORT_SENTENCES = {
    "low": "Reasoning effort is set to low. Keep your thinking brief and focused, moving directly to the "
           "conclusion without unnecessary elaboration.",
    "high": "Reasoning effort is set to high. Please think carefully through the task, validate key "
            "assumptions, consider plausible alternatives, and prioritize correctness, consistency, and "
            "clarity in the final answer.",
}

TOOLS_INTRO = ("# Tools\n\nYou have access to the following functions. To call one, answer with a call in "
               "exactly this format and nothing after it:\n\n<tool_call>\n<function=FUNCTION_NAME>\n"
               "<parameter=PARAMETER_NAME>\nVALUE\n</parameter>\n</function>\n</tool_call>\n\n"
               "Several calls are several such blocks. The functions:\n\n<tools>\n")


def _write_call(w: "_Writer", call, tool_format: str = "xml") -> None:
    """One tool call of the history in the template's form (XML or JSON); names and values are client text."""
    args = arguments_object(call.arguments)
    if tool_format == "json":
        w.raw("<tool_call>\n")
        w.user_text(json.dumps({"name": call.name, "arguments": args}, ensure_ascii=False))
        w.raw("\n</tool_call>")
        return
    w.raw("<tool_call>\n<function=")
    w.user_text(call.name)
    w.raw(">\n")
    for key, value in args.items():
        w.raw("<parameter=")
        w.user_text(str(key))
        w.raw(">\n")
        w.user_text(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
        w.raw("\n</parameter>\n")
    w.raw("</function>\n</tool_call>")


class ChatTemplate:
    """The ChatML family, with the facts read from one model's template text."""

    def __init__(self, default_system: str | None = None, knows_think: bool = False, tool_format: str = "xml"):
        self.default_system = default_system
        self.knows_think = knows_think
        self.tool_format = tool_format  # "xml" (<function=...>) or "json" (Hermes; templates without the XML form)

    @classmethod
    def from_text(cls, template: str | None) -> "ChatTemplate":
        if detect_family(template) in ("llama3", "gemma"):  # rendered there
            return FamilyTemplate(detect_family(template))
        if not template:
            return cls()
        default = None
        m = _DEFAULT_SYSTEM.search(template)
        # a default system prompt is a literal in the branch taken when messages[0] is not a system turn
        if m and "{{" not in m.group(1) and "{%" not in m.group(1) and "!= 'system'" in template.replace(
                '"', "'"):
            default = m.group(1).replace("\\n", "\n")
        return cls(default_system=default, knows_think=THINK_OPEN in template,
                   tool_format="xml" if "<function=" in template else "json")

    def render(self, messages: list[Message], tools: list[ToolSpec] | None = None,
               thinking: bool | None = None, add_generation_prompt: bool = True,
               effort: str | None = None) -> Rendered:
        if not messages:
            raise BadRequest("messages: at least one message is needed", param="messages")
        tools = tools or []
        w = _Writer()
        first_system = messages[0].role == "system"
        system_text = messages[0].content if first_system else self.default_system
        if system_text is not None or tools:
            w.raw(f"{IM_START}system\n")
            if first_system:
                w.user_text(system_text)
            elif system_text:
                w.raw(system_text)
            if tools:
                json_form = self.tool_format == "json"
                w.raw(("\n\n" if system_text else "") + (tools_intro("json") if json_form else TOOLS_INTRO))
                for t in tools:
                    w.user_text(tool_signature(t))
                    w.raw("\n")
                w.raw(tools_outro("json") if json_form else "</tools>")
            w.raw(f"{IM_END}\n")
        rest = messages[1:] if first_system else messages
        i = 0
        while i < len(rest):
            m = rest[i]
            if m.role == "tool":
                w.raw(f"{IM_START}user")
                while i < len(rest) and rest[i].role == "tool":
                    w.raw("\n<tool_response>\n")
                    w.user_text(rest[i].content)
                    w.raw("\n</tool_response>")
                    i += 1
                w.raw(f"{IM_END}\n")
                continue
            role = "user" if m.role == "system" else m.role  # a late system turn becomes a user turn in place
            w.raw(f"{IM_START}{role}\n")
            if role == "assistant":
                self._assistant(w, m)
            else:
                w.user_text(m.content)
            w.raw(f"{IM_END}\n")
            i += 1
        opened = False
        if add_generation_prompt:
            sentence = EFFORT_SENTENCES.get(effort) if self.knows_think and thinking else None
            if sentence:
                w.raw(f"{IM_START}system\n{sentence}{IM_END}\n")
            w.raw(f"{IM_START}assistant\n")
            if self.knows_think and thinking is not None:
                if thinking:
                    w.raw(f"{THINK_OPEN}\n")
                    opened = True
                else:
                    w.raw(f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n")
        return Rendered("".join(w.parts), w.plain, opened)

    def _assistant(self, w: _Writer, m: Message) -> None:
        content = m.content or ""
        if m.reasoning and self.knows_think:
            w.raw(f"{THINK_OPEN}\n")
            w.user_text(m.reasoning.strip("\n"))
            w.raw(f"\n{THINK_CLOSE}\n\n")
        elif content.startswith(THINK_OPEN) and THINK_CLOSE in content:
            # an assistant turn that itself opens with a whole think block keeps that block's markers
            end = content.index(THINK_CLOSE)
            w.raw(THINK_OPEN)
            w.user_text(content[len(THINK_OPEN):end])
            w.raw(THINK_CLOSE)
            content = content[end + len(THINK_CLOSE):]
        w.user_text(content)
        for k, call in enumerate(m.tool_calls):
            w.raw("\n" if (k or content) else "")
            _write_call(w, call, self.tool_format)

"""Chat-template families beyond ChatML: Llama 3 and Gemma, rendered natively, and "no template".

Role: serve/prompt/chatml.py renders ChatML; this module renders the other families Strata claims, with the
same interface (`render(messages, tools, thinking, add_generation_prompt) -> Rendered`, `default_system`,
`tool_format`) (strata_control/families.py says which family a GGUF's template text belongs to). The text rendered equals
llama.cpp's built-in rendering of the family (`llama_chat_apply_template` with "llama3" / "gemma"): each
message's content trimmed of ASCII whitespace; Llama 3 `<|start_header_id|>ROLE<|end_header_id|>\\n\\n
CONTENT<|eot_id|>`; Gemma `<start_of_turn>ROLE\\nCONTENT<end_of_turn>\\n` with "assistant" named "model"
and system text merged into the next user turn (Gemma has no system role). The model's BOS text is put in
front (`<|begin_of_text|>`, `<bos>`), as the model's own Jinja template does; llama.cpp adds it as a token.
Neither family has a tool or reasoning block here: tools are a 400 naming the family.

A model without any template (a base model such as Gemma 3 270M) gets `NoTemplate`: chat routes answer 400
saying to use /v1/completions or start with `--chat-template FAMILY`.

Public surface: FamilyTemplate(family), NoTemplate(). It knows no tokens, no HTTP and no engine.
"""
from __future__ import annotations

from serve.core.events import BadRequest, Message, ToolSpec
from serve.prompt.writer import PromptWriter, Rendered
from strata_control.families import FAMILIES

_ASCII_SPACE = " \t\n\v\f\r"  # llama.cpp trims with C isspace


class FamilyTemplate:
    """Llama 3 or Gemma rendering (see the module docstring)."""

    BOS = {"llama3": "<|begin_of_text|>", "gemma": "<bos>"}

    def __init__(self, family: str):
        if family not in ("llama3", "gemma"):
            raise ValueError(f"template family {family!r}: this class renders llama3 and gemma")
        self.family = family
        self.default_system: str | None = None
        self.tool_format = "json"
        self.bos = self.BOS[family]

    def render(self, messages: list[Message], tools: list[ToolSpec] | None = None, thinking: bool | None = None,
               add_generation_prompt: bool = True, bos: bool = True, effort: str | None = None):
        # `effort`: these families have no thinking block, so every reasoning effort renders the same prompt
        if not messages:
            raise BadRequest("messages: at least one message is needed", param="messages")
        if tools:
            raise BadRequest(f"tools: the model's {self.family} chat template has no tool format", param="tools")
        w = PromptWriter()
        if bos:
            w.raw(self.bos)
        msgs = list(messages)
        if self.default_system and msgs[0].role != "system":
            msgs.insert(0, Message(role="system", content=self.default_system))
        (self._llama3 if self.family == "llama3" else self._gemma)(w, msgs, add_generation_prompt)
        return Rendered("".join(w.parts), w.plain, False)

    @staticmethod
    def _content(m: Message) -> str:
        if m.role == "tool" or m.tool_calls:
            raise BadRequest("messages: tool turns need a template with a tool format", param="messages")
        return (m.content or "").strip(_ASCII_SPACE)

    def _llama3(self, w: PromptWriter, msgs: list[Message], add_generation_prompt: bool) -> None:
        for m in msgs:
            w.raw(f"<|start_header_id|>{m.role}<|end_header_id|>\n\n")
            w.user_text(self._content(m))
            w.raw("<|eot_id|>")
        if add_generation_prompt:
            w.raw("<|start_header_id|>assistant<|end_header_id|>\n\n")

    def _gemma(self, w: PromptWriter, msgs: list[Message], add_generation_prompt: bool) -> None:
        system = ""
        for m in msgs:
            if m.role == "system":
                system += self._content(m)
                continue
            role = "model" if m.role == "assistant" else m.role
            w.raw(f"<start_of_turn>{role}\n")
            if system and role != "model":
                w.user_text(system)
                w.raw("\n\n")
                system = ""
            w.user_text(self._content(m))
            w.raw("<end_of_turn>\n")
        if add_generation_prompt:
            w.raw("<start_of_turn>model\n")


class NoTemplate:
    """A model without a chat template: chat routes are a 400 that says what to do instead."""

    default_system: str | None = None
    tool_format = "json"

    def render(self, messages, tools=None, thinking=None, add_generation_prompt=True, effort=None):
        raise BadRequest("messages: this model has no chat template; use /v1/completions, or start the server "
                         f"with --chat-template FAMILY ({', '.join(FAMILIES)})", param="messages")

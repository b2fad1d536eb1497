"""Prefill: a chat whose final assistant message is continued, not answered by a new turn.

Role: Anthropic's documented prefill, Ollama's chat, and OpenAI's route as llama-server does it (vLLM's
`continue_final_message` / `add_generation_prompt: false`) send a last assistant message for the model to go
on writing. Every renderer (ChatML, Llama 3, Gemma, the Jinja one) renders it the same way, as llama-server
does: the chat before that message with its generation prompt, then the message's text, left open (no end of
turn). The reply holds only the new text. A model's own (Jinja) template is rendered whole, as history, and
cut after the message's text (Hugging Face's `continue_final_message`): such templates may write the last turn
unlike a new one (Mistral moves the system text into the last user turn).

Thinking: on a template that knows `<think>`, the message's `reasoning` (or a `<think>` its content opens) is
written inside an open think block. Reasoning without content leaves the block open, so the model goes on
thinking (`Rendered.thinking` is true and the output starts in reasoning); reasoning with content closes it
and the content follows; content alone follows an empty think block (thinking off), as Qwen3's own template
writes a last assistant turn. A template without `<think>` gets the content alone.

Refused (a 400 naming `messages`): a final message with tool calls (a call is finished, not continued) and a
chat of nothing but that message.

Public surface: `render_continued(template, messages, tools, effort)`, `split_thinking(message)`. Knows no
tokens, no HTTP and no engine.
"""
from __future__ import annotations

from serve.core.events import BadRequest, Message, ToolSpec
from serve.prompt.writer import Rendered

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def split_thinking(message: Message) -> tuple[str | None, str]:
    """(reasoning or None, content) of an assistant message: its `reasoning`, or a think block its content
    opens (closed or not)."""
    content = message.content or ""
    if message.reasoning:
        return message.reasoning, content
    if content.startswith(THINK_OPEN):
        inner = content[len(THINK_OPEN):]
        if THINK_CLOSE in inner:
            reasoning, rest = inner.split(THINK_CLOSE, 1)
            return reasoning, rest.lstrip("\n")
        return inner, ""
    return None, content


def render_continued(template, messages: list[Message], tools: list[ToolSpec] | None = None,
                     effort: str | None = None) -> Rendered:
    """The prompt that continues `messages[-1]` (an assistant message) with `template` (any renderer)."""
    *history, final = messages
    if final.role != "assistant":
        raise BadRequest("messages: the message to continue is the last one and an assistant's", param="messages")
    if final.tool_calls:
        raise BadRequest("messages: the final assistant message has tool calls; a call is not continued (send its "
                         "result as a tool message instead)", param="messages")
    if not any(m.role != "system" for m in history):
        raise BadRequest("messages: a final assistant message to continue needs a user turn before it",
                         param="messages")
    reasoning, content = split_thinking(final)
    knows_think = bool(getattr(template, "knows_think", False))
    if not knows_think:
        reasoning = None
    thinking = (reasoning is not None) if knows_think else None
    if content and getattr(template, "renderer", "") == "jinja":
        return _cut_whole(template, messages, tools, thinking, effort, content)
    base = template.render(history, tools, thinking=thinking, add_generation_prompt=True, effort=effort)
    parts, plain = [base.text], list(base.plain)
    n = len(base.text)

    def add(text: str, client: bool) -> None:
        nonlocal n
        if text:
            if client:
                plain.append((n, n + len(text)))
            parts.append(text)
            n += len(text)

    opened = False
    if reasoning is not None:
        if not base.thinking:  # a template whose generation prompt leaves `<think>` to the model
            add(THINK_OPEN + "\n", False)
        add(reasoning.strip("\n") if content else reasoning, True)
        opened = not content
        if content:
            add("\n" + THINK_CLOSE + "\n\n", False)
    add(content, True)
    return Rendered("".join(parts), plain, opened)


def _cut_whole(template, messages, tools, thinking, effort, content: str) -> Rendered:
    """A model's own (Jinja) template may write the last turn unlike a new one (Mistral puts the system text
    in the last user turn; others add a space): the whole chat is rendered as history and cut right after the
    final message's text, as Hugging Face's `continue_final_message` does."""
    whole = template.render(messages, tools, thinking=thinking, add_generation_prompt=False, effort=effort)
    text = content.strip()
    at = whole.text.rfind(text)
    if at < 0:
        raise BadRequest("messages: this model's chat template does not write the final assistant message as sent, "
                         "so it cannot be continued; send it as a new turn (continue_final_message: false)",
                         param="messages")
    end = at + len(text)
    plain = [(s, min(e, end)) for s, e in whole.plain if s < end]
    return Rendered(whole.text[:end], plain, False)

"""serve/prompt/prefill.py: a final assistant message is rendered open, by every renderer.

The reference for each family: the whole chat rendered as history (no generation prompt) is the continued
prompt followed by the family's end of turn, which is what vLLM's `continue_final_message` sends (the render
without a generation prompt, the last end-of-turn cut). Thinking templates: an open think block when the
message has reasoning only; closed with the content after it; an empty one before content alone (as Qwen3's
template writes a last assistant turn). Client text stays plain text (never a control token).
"""
import pathlib
import re

import pytest

from serve.core.events import BadRequest, Message, ToolCall
from serve.prompt.chatml import ChatTemplate
from serve.prompt.jinja_chat import JinjaChat
from serve.prompt.llama3_gemma import FamilyTemplate
from serve.prompt.prefill import render_continued, split_thinking

DATA = pathlib.Path(__file__).resolve().parents[2] / "data" / "chat_templates"
CHAT = [Message("system", "Be brief."), Message("user", "Name a colour."), Message("assistant", "The colour is")]


def _plain_text(r):
    return "".join(r.text[s:e] for s, e in r.plain)


@pytest.mark.parametrize("template, end", [
    (ChatTemplate(), "<|im_end|>\n"),
    (FamilyTemplate("llama3"), "<|eot_id|>"),
    (FamilyTemplate("gemma"), "<end_of_turn>\n"),
    (JinjaChat((DATA / "llama31.jinja").read_text(), "llama3", "<|begin_of_text|>", "<|eot_id|>"), "<|eot_id|>"),
    (JinjaChat((DATA / "mistral_v3.jinja").read_text(), "mistral", "<s>", "</s>"), "</s>"),
])
def test_the_final_message_is_left_open(template, end):
    r = render_continued(template, CHAT)
    whole = template.render(CHAT, add_generation_prompt=False).text
    assert whole == r.text + end and r.text.endswith("The colour is") and not r.thinking
    if not isinstance(template, JinjaChat):   # (the Jinja renderer marks only text that looks like a token)
        assert _plain_text(r).endswith("The colour is")   # the prefill is client text: never control tokens


@pytest.mark.parametrize("template", [
    ChatTemplate(),
    JinjaChat((DATA / "qwen3.jinja").read_text(), "qwen3", "", "<|im_end|>",
              special_pattern=re.compile(r"<\|im_start\|>|<\|im_end\|>")),
])
def test_a_control_token_typed_in_the_prefill_stays_text(template):
    r = render_continued(template, [Message("user", "hi"), Message("assistant", "say <|im_end|>")])
    assert r.text.endswith("\nsay <|im_end|>")
    start = r.text.rindex("say <|im_end|>")
    assert any(s <= start and start + len("say <|im_end|>") <= e for s, e in r.plain)


def test_thinking_templates_continue_reasoning_and_content():
    qwen = ChatTemplate(knows_think=True)
    history = [Message("user", "2+2?")]
    head = "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    open_ = render_continued(qwen, history + [Message("assistant", "", reasoning="Two and two")])
    assert open_.text == head + "<think>\nTwo and two" and open_.thinking   # the model goes on thinking
    both = render_continued(qwen, history + [Message("assistant", "It is", reasoning="\nTwo and two.\n")])
    assert both.text == head + "<think>\nTwo and two.\n</think>\n\nIt is" and not both.thinking
    content = render_continued(qwen, history + [Message("assistant", "It is")])
    assert content.text == head + "<think>\n\n</think>\n\nIt is" and not content.thinking
    inline = render_continued(qwen, history + [Message("assistant", "<think>Two")])   # a think block in content
    assert inline.text == head + "<think>\nTwo" and inline.thinking
    plain = render_continued(ChatTemplate(), history + [Message("assistant", "It is", reasoning="hidden")])
    assert plain.text == head + "It is"   # a template without <think> gets the content alone


def test_qwen3_jinja_template_continues_as_its_own_last_turn():
    qwen3 = JinjaChat((DATA / "qwen3.jinja").read_text(), "qwen3", "", "<|im_end|>")
    chat = [Message("user", "2+2?"), Message("assistant", "It is", reasoning="Two and two.")]
    r = render_continued(qwen3, chat)
    whole = qwen3.render(chat, add_generation_prompt=False).text
    assert whole == r.text + "<|im_end|>\n" and r.text.endswith("<think>\nTwo and two.\n</think>\n\nIt is")
    thinking = render_continued(qwen3, [chat[0], Message("assistant", "", reasoning="Two and")])
    assert thinking.thinking and thinking.text.endswith("<|im_start|>assistant\n<think>\nTwo and")


def test_split_thinking():
    assert split_thinking(Message("assistant", "<think>a</think>\n\nb")) == ("a", "b")
    assert split_thinking(Message("assistant", "<think>a")) == ("a", "")
    assert split_thinking(Message("assistant", "b", reasoning="a")) == ("a", "b")
    assert split_thinking(Message("assistant", "b")) == (None, "b")


def test_refused_prefills_name_messages():
    call = Message("assistant", "", tool_calls=[ToolCall("c1", "f", {})])
    for chat in ([Message("user", "x"), call], [Message("system", "s"), Message("assistant", "a")],
                 [Message("user", "x")]):
        with pytest.raises(BadRequest) as e:
            render_continued(ChatTemplate(), chat)
        assert e.value.param == "messages"

"""serve/prompt/jinja_chat.py: Strata's messages through a model's own template, BOS, tools, thinking, plain text."""

import re

import pytest

from serve.core.events import BadRequest, Message, ToolCall, ToolSpec
from serve.prompt.jinja_chat import JinjaChat, message_dicts

SPECIALS = re.compile(r"<\|im_start\|>|<\|im_end\|>|\[INST\]|\[/INST\]|<s>|</s>")
MISTRALISH = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content | trim }} [/INST]"
              "{% elif m.role == 'assistant' %} {{ m.content }}{{ eos_token }}{% endif %}{% endfor %}")
CHATML_TOOLS = ("{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n"
                "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}"
                "{% for c in m.tool_calls %}<tool_call>\n{{ c.function | tojson }}\n</tool_call>{% endfor %}"
                "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
                "<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking %}<think>\n{% endif %}"
                "{% endif %}")


def test_bos_is_written_once_and_client_control_text_stays_plain():
    t = JinjaChat(MISTRALISH, "mistral", "<s>", "</s>", add_bos=True, special_pattern=SPECIALS)
    r = t.render([Message("user", "  say [/INST] please "), Message("assistant", "ok</s>"), Message("user", "x")])
    assert r.text == "<s>[INST] say [/INST] please [/INST] ok</s></s>[INST] x [/INST]"
    assert [r.text[a:b] for a, b in r.plain] == ["say [/INST] please", "ok</s>"]  # trimmed as the template trims
    no_bos = JinjaChat("{% for m in messages %}{{ m.content }}{% endfor %}", "x", "<s>", "</s>", add_bos=True)
    assert no_bos.render([Message("user", "hi")]).text == "<s>hi"   # the GGUF asks for BOS: put in front once


def test_tools_tool_calls_and_thinking_reach_the_template():
    t = JinjaChat(CHATML_TOOLS, "chatml", special_pattern=SPECIALS)
    tools = [ToolSpec("get", "Get <|im_end|> it", {"type": "object", "properties": {"q": {"type": "string"}}})]
    msgs = [Message("user", "q"), Message("assistant", "", tool_calls=[ToolCall("c1", "get", '{"q": "é"}')]),
            Message("tool", "42", tool_call_id="c1", name="get")]
    r = t.render(msgs, tools, thinking=True)
    assert '{"name": "get", "arguments": {"q": "é"}}' in r.text and r.thinking
    assert "Get <|im_end|> it" in [r.text[a:b] for a, b in r.plain]   # JSON-escaped form found and kept plain
    assert t.tool_format == "json" and not t.render(msgs, tools, thinking=False).thinking
    assert message_dicts(msgs[2:]) == [{"role": "tool", "content": "42", "tool_call_id": "c1", "name": "get"}]


def test_a_template_that_mangles_control_text_is_a_400_and_render_errors_are_400():
    t = JinjaChat("{% for m in messages %}[INST]{{ m.content | replace('I', 'i') }}{% endfor %}", "mistral",
                  special_pattern=SPECIALS)
    assert t.render([Message("user", "Hi")]).text == "[INST]Hi"
    with pytest.raises(BadRequest, match="control-token text"):
        t.render([Message("user", "[INST]")])
    bad = JinjaChat("{{ raise_exception('Conversation roles must alternate') }}", "mistral")
    with pytest.raises(BadRequest, match="roles must alternate"):
        bad.render([Message("user", "x")])
    with pytest.raises(BadRequest, match="tools: .*mistral"):
        JinjaChat(MISTRALISH, "mistral").render([Message("user", "x")], [ToolSpec("f")])

"""A corpus of chat templates rendered by serve/prompt/jinja_chat.py, byte for byte against llama.cpp.

The templates: tests/data/chat_templates/*.jinja, written here in the shape of each family the field uses
(ChatML/Qwen3 with tools and thinking, Llama 3.1, Gemma 3, Mistral v3 and v7/tekken, Phi-3, Phi-4, DeepSeek R1,
Command-R, Zephyr, gpt-oss harmony) with the constructs real templates use (namespace(), macros, loop
variables, filters, raise_exception, tojson, strftime_now), plus the template inside the default model's GGUF,
read from the file at test time.

Two references, both through tests/llama_oracle.py (skipped with the reason when the peer is absent):
- llama-cpp-python's renderer of a template text (`Jinja2ChatFormatter`, what it renders a GGUF's own template
  with) on a conversation set with system prompts, tools, tool calls and results, reasoning, thinking flags,
  reasoning effort and typed control-token text: the conversation goes to it as the JSON a client sends
  (Hugging Face's message shape), and to Strata as its own `Message`s, so the adapter is under test too.
  A conversation the template refuses must be refused by both.
- llama.cpp's own C++ rendering of the family (`llama_chat_apply_template` by name) on plain chats, where the
  family's built-in form and the template agree by design: an independent implementation of the same text.
"""

import json
import pathlib
import re

import pytest

from serve.core.events import BadRequest, Message, ToolCall, ToolSpec
from serve.prompt.jinja_chat import JinjaChat, message_dicts, tool_dicts
from tests import oracle

DATA = pathlib.Path(__file__).resolve().parents[2] / "data" / "chat_templates"

# template file -> (bos text, eos text, llama.cpp built-in family or None, plain chats for it, add_ass)
TEMPLATES = {
    "qwen3": ("", "<|im_end|>", "chatml", "abc", True),
    "llama31": ("<|begin_of_text|>", "<|eot_id|>", None, "", True),
    "gemma3": ("<bos>", "<eos>", "gemma", "abc", True),
    "mistral_v3": ("<s>", "</s>", "mistral-v3", "ab", True),
    "mistral_v7_tekken": ("<s>", "</s>", "mistral-v7-tekken", "bd", True),
    "phi3": ("<s>", "<|endoftext|>", "phi3", "abcd", True),
    "phi4": ("<|endoftext|>", "<|im_end|>", "phi4", "abcd", True),
    "deepseek_r1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "deepseek3", "ac", False),
    "command_r": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", "command-r", "abcd", True),
    "zephyr": ("<s>", "<|endoftext|>", "zephyr", "abcd", True),
    "gpt_oss": ("<|startoftext|>", "<|return|>", None, "", True),
}

PLAIN = {   # chats llama.cpp's built-in renderers take (role, content), named by letter in TEMPLATES
    "a": [("user", "Hi")],
    "b": [("system", "You are terse."), ("user", "What is 2+2?")],
    "c": [("user", "one"), ("assistant", "two"), ("user", "three")],
    "d": [("system", "Be kind."), ("user", "Hello"), ("assistant", "Hi! How can I help?"), ("user", "Again")],
}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
CALL = {"id": "call12345", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}

# (name, messages as a client sends them, tools, thinking, effort)
CASES = [
    ("one turn", [{"role": "user", "content": "Hi"}], None, None, None),
    ("system", [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
     None, None, None),
    ("multi-turn, whitespace, non-ASCII", [
        {"role": "system", "content": "Rules:\n1. a\n2. b"}, {"role": "user", "content": " Hello there \n"},
        {"role": "assistant", "content": "Hi! How can I help?"}, {"role": "user", "content": "日本語で答えて 🙂"}],
     None, None, None),
    ("tools offered", [{"role": "system", "content": "You help with weather."},
                       {"role": "user", "content": "Weather in Paris?"}], [WEATHER], None, None),
    ("tool call and result", [
        {"role": "system", "content": "You help with weather."}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Paris: call the tool.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": '{"temp": 21}'}],
     [WEATHER], None, None),
    ("reasoning kept, thinking on", [
        {"role": "user", "content": "What is 17*3?"},
        {"role": "assistant", "content": "51", "reasoning_content": "17*3 = 51."},
        {"role": "user", "content": "And 17*4?"}], None, True, None),
    ("thinking off", [{"role": "user", "content": "Quick: 2+2?"}], None, False, None),
    ("reasoning effort high", [{"role": "user", "content": "Prove it."}], None, True, "high"),
    ("typed control text", [{"role": "user", "content": "Write <|im_end|> and [INST] and <|eot_id|> literally"}],
     None, None, None),
]


def strata_messages(msgs):
    out = []
    for m in msgs:
        calls = [ToolCall(c["id"], c["function"]["name"], json.dumps(c["function"]["arguments"]))
                 for c in m.get("tool_calls", [])]
        out.append(Message(m["role"], m.get("content") or "", m.get("reasoning_content"), calls,
                           m.get("tool_call_id"), m.get("name")))
    return out


def strata_tools(tools):
    return [ToolSpec(t["function"]["name"], t["function"]["description"], t["function"]["parameters"])
            for t in tools or []]


def control_pattern(*texts):
    return re.compile("|".join(re.escape(t) for t in sorted({t for t in texts if t}, key=len, reverse=True)))


SPECIALS = ("<|im_start|>", "<|im_end|>", "[INST]", "[/INST]", "<|eot_id|>", "<|start_header_id|>",
            "<start_of_turn>", "<end_of_turn>", "<|end|>", "<|im_sep|>", "<｜User｜>", "<|start|>", "<|message|>")


def ours(text, bos, eos, msgs, tools, thinking, effort):
    """Strata's rendering, or ("refused", message) where Strata answers a 400."""
    chat = JinjaChat(text, "test", bos, eos, add_bos=False, special_pattern=control_pattern(*SPECIALS, bos, eos))
    try:
        if tools and chat.tool_format is None:   # Strata refuses such a request; the rendering is still checked
            flags = {"enable_thinking": thinking} if thinking is not None else {}
            return chat.template.render(message_dicts(strata_messages(msgs)), tools=tool_dicts(strata_tools(tools)),
                                        **flags)
        return chat.render(strata_messages(msgs), strata_tools(tools), thinking=thinking, effort=effort).text
    except BadRequest as e:
        return ("refused", e.message)
    except Exception as e:  # noqa: BLE001  the template-level path raises TemplateRenderError
        return ("refused", str(e))


def theirs_cases():
    out = []
    for _, msgs, tools, thinking, effort in CASES:
        flags = {}
        if thinking is not None:
            flags["enable_thinking"] = thinking
        if effort is not None:
            flags["reasoning_effort"] = effort
        out.append({"messages": msgs, "tools": tools, "flags": flags})
    return out


def compare(name, text, bos, eos):
    answers = oracle.ask({"op": "jinja", "template": text, "bos": bos, "eos": eos, "cases": theirs_cases()})["texts"]
    rendered = 0
    for (case, msgs, tools, thinking, effort), want in zip(CASES, answers):
        got = ours(text, bos, eos, msgs, tools, thinking, effort)
        if isinstance(want, dict):   # the template refuses this conversation: so must Strata, with its reason
            assert isinstance(got, tuple), (name, case, got, want)
            continue
        assert got == want, (name, case, got, want)
        rendered += 1
    return rendered


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_template_renders_as_llama_cpp_python_renders_it(name):
    oracle.require_oracle()
    bos, eos = TEMPLATES[name][:2]
    assert compare(name, (DATA / f"{name}.jinja").read_text(encoding="utf-8"), bos, eos) >= 3


def test_the_default_models_own_template_renders_as_llama_cpp_python_renders_it():
    oracle.require_oracle()
    from tests.conftest import model_path
    from tokenizer.gguf_meta import read_metadata
    path = model_path()
    if path is None:
        pytest.skip("the default model file is not installed")
    text = read_metadata(path, ["tokenizer.chat_template"])["tokenizer.chat_template"]
    assert compare("smollm2", text, "", "<|im_end|>") >= 5


@pytest.mark.parametrize("name", sorted(n for n, t in TEMPLATES.items() if t[2]))
def test_plain_chats_render_as_llama_cpps_built_in_family(name):
    oracle.require_oracle()
    _, eos, family, letters, add_ass = TEMPLATES[name]
    text = (DATA / f"{name}.jinja").read_text(encoding="utf-8")
    chats = [[{"role": r, "content": c} for r, c in PLAIN[k]] for k in letters]
    want = oracle.ask({"op": "template", "name": family, "chats": chats, "add_ass": add_ass})["texts"]
    chat = JinjaChat(text, name, "", eos)
    for k, w in zip(letters, want):
        assert w is not None, f"llama.cpp does not know the family {family!r}"
        got = chat.render([Message(r, c) for r, c in PLAIN[k]], add_generation_prompt=add_ass).text
        assert got == w, (name, k, got, w)

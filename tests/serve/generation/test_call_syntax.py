"""Other families' tool calls (serve/generation/call_syntax.py): Mistral's both forms and Llama 3.1's JSON, split
anywhere, and through the server.

The rewrite is checked on every split of its input (one piece, two pieces at every offset, one character at a
time: the same events), on v3 arrays (several calls, extra keys, braces inside strings), v11 calls with and
without `[CALL_ID]`, text around calls, and text that only looks like a call. Then over the fake engine: a
model whose own template is Mistral-shaped (tests/data/chat_templates/mistral_v7_tekken.jinja) answers in
Mistral's syntax and the OpenAI route returns the calls, whole and streamed; a forced tool choice is a 400.
"""
import json
import pathlib

import pytest

from serve.core.events import ToolSpec
from serve.generation.call_syntax import CallSyntaxParser, MistralOutputParser
from serve.prompt.jinja_chat import JinjaChat
from tests.serve.conftest import chat

TEMPLATE = pathlib.Path(__file__).resolve().parents[2] / "data" / "chat_templates" / "mistral_v7_tekken.jinja"
TOOLS = [ToolSpec("get_weather", "weather", {"type": "object", "properties": {"city": {"type": "string"}}})]
V3 = ('Let me look. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Pa{r}is"}, "id": "a1b2c3d4e"}, '
      '{"name": "get_weather", "arguments": {"city": "Lyon \\"Part-Dieu\\""}}]')
V11 = '[TOOL_CALLS]get_weather[ARGS]{"city": "Nice"}[TOOL_CALLS]get_weather[CALL_ID]x9[ARGS]{"city": "Metz"}'
PLAIN = "no call here: [TOOL_CALL] or [TOOL_CALLS\n"


def parsed(parser, pieces):
    """(calls as (name, arguments), {event kind: its texts joined}) of `pieces` fed to `parser` one by one."""
    out = []
    for piece in pieces:
        out += parser.feed(piece)
    out += parser.finish()
    calls = [(e.call.name, e.call.arguments) for e in out if e.kind == "tool_call"]
    texts = {kind: "".join(e.text for e in out if e.kind == kind) for kind in ("content", "reasoning", "tool_args")}
    return calls, texts


def events(text, pieces):
    calls, texts = parsed(MistralOutputParser(TOOLS, False, new_id=lambda: "call_1"), pieces)
    return calls, texts["content"], texts["tool_args"]


def splits(text):
    yield [text]
    yield list(text)
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]


@pytest.mark.parametrize("text,calls,content", [
    (V3, [("get_weather", {"city": "Pa{r}is"}), ("get_weather", {"city": 'Lyon "Part-Dieu"'})], "Let me look. "),
    (V11, [("get_weather", {"city": "Nice"}), ("get_weather", {"city": "Metz"})], ""),
    (PLAIN, [], PLAIN),
])
def test_every_split_gives_the_same_calls(text, calls, content):
    want = events(text, [text])
    assert want[0] == calls and want[1] == content
    for pieces in splits(text):
        assert events(text, pieces) == want, pieces


def test_the_server_returns_mistral_calls_whole_and_streamed(server):
    answer = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
    run = server({"turns": [{"text": answer}]})
    run.svc.template = JinjaChat(TEMPLATE.read_text(encoding="utf-8"), "mistral", "<s>", "</s>")
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                                "parameters": {"type": "object", "properties": {
                                                    "city": {"type": "string"}}}}}]
    status, body, _ = run.post("/v1/chat/completions", chat("Weather in Paris?", tools=tools))
    assert status == 200, body
    msg = body["choices"][0]["message"]
    assert body["choices"][0]["finish_reason"] == "tool_calls" and not msg.get("content")
    call = msg["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    status, chunks, _ = run.stream(chat("Weather in Paris?", tools=tools))
    deltas = [tc for c in chunks for tc in (c["choices"][0]["delta"].get("tool_calls") or []) if c["choices"]]
    assert deltas[0]["function"]["name"] == "get_weather"
    assert json.loads("".join(d["function"].get("arguments") or "" for d in deltas)) == {"city": "Paris"}
    status, body, _ = run.post("/v1/chat/completions", chat("x", tools=tools, tool_choice="required"))
    assert status == 400 and "tool_choice" in json.dumps(body)


LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Pa{ris"}}'


def llama_events(pieces):
    calls, texts = parsed(CallSyntaxParser("llama3_json", TOOLS, False, new_id=lambda: "call_1"), pieces)
    return calls, texts["content"]


@pytest.mark.parametrize("text,calls,content", [
    (LLAMA_CALL, [("get_weather", {"city": "Pa{ris"})], ""),
    ("\n <|python_tag|>" + LLAMA_CALL, [("get_weather", {"city": "Pa{ris"})], ""),
    ('{"type": "function", "name": "get_weather", "parameters": {"city": "Nice"}}',
     [("get_weather", {"city": "Nice"})], ""),
    ('{"answer": 42}', [], '{"answer": 42}'),               # JSON that is no call stays content
    ("Sure: " + LLAMA_CALL, [], "Sure: " + LLAMA_CALL),    # a call only opens the reply
    ("{", [], "{"),
])
def test_llama3_json_calls_open_the_reply_whatever_the_split(text, calls, content):
    want = llama_events([text])
    assert want == (calls, content)
    for pieces in splits(text):
        assert llama_events(pieces) == want, pieces


def test_llama31_template_is_read_as_llama3_json():
    text = (pathlib.Path(__file__).resolve().parents[2] / "data" / "chat_templates" / "llama31.jinja").read_text()
    chat = JinjaChat(text, "llama3", "<|begin_of_text|>", "<|eot_id|>")
    assert (chat.call_syntax, chat.tool_format) == ("llama3_json", "json")
    assert JinjaChat(TEMPLATE.read_text(encoding="utf-8"), "mistral").call_syntax == "mistral"


HARMONY_CALL = ('<|channel|>analysis<|message|>They ask the weather: call it.<|end|><|start|>assistant<|channel|>'
                'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Pa<ris"}<|call|>')
HARMONY_ANSWER = ('<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>'
                  'Hello <b>there</b>!<|return|>')


def harmony_events(pieces):
    calls, texts = parsed(CallSyntaxParser("harmony", TOOLS, False, new_id=lambda: "call_1"), pieces)
    return calls, texts["reasoning"], texts["content"]


@pytest.mark.parametrize("text,want", [
    (HARMONY_CALL, ([("get_weather", {"city": "Pa<ris"})], "They ask the weather: call it.", "")),
    (HARMONY_ANSWER, ([], "Easy.", "Hello <b>there</b>!")),
    ("<|channel|>final<|message|>Just this.<|return|>", ([], "", "Just this.")),
])
def test_harmony_channels_whatever_the_split(text, want):
    assert harmony_events([text]) == want
    for pieces in splits(text):
        assert harmony_events(pieces) == want, pieces


def test_gpt_oss_template_is_read_as_harmony():
    text = (pathlib.Path(__file__).resolve().parents[2] / "data" / "chat_templates" / "gpt_oss.jinja").read_text()
    assert JinjaChat(text, "unknown").call_syntax == "harmony"

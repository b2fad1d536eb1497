"""Agents' APIs end to end on the real engine and the default model (skipped when either is absent):
a forced tool call parses on both APIs, streamed equals non-streamed, count_tokens equals the prompt.

Few, short requests (the engine on 2 shared cores writes a few tokens per second); greedy, so stream and
non-stream runs see the same tokens.
"""
import json
import os

import pytest

from tests.serve.conftest import real_server
from tests.serve.conftest import assemble, sse_events
from tests.serve.conftest import assemble_openai_stream
from tests.serve.scenarios.conftest import ENGINE, MODEL, WEATHER

pytestmark = pytest.mark.skipif(not (os.access(ENGINE, os.X_OK) and MODEL),
                                reason="needs build/strata-engine and the SmolLM2 model")
CTX = 1024
QUESTION = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    with real_server(ENGINE, MODEL, tmp_path_factory.mktemp("agents"), CTX) as running:
        yield running


def test_openai_required_tool_choice_returns_a_parsed_call(real):
    body = {"messages": [{"role": "user", "content": QUESTION}], "temperature": 0, "max_tokens": 64,
            "tools": [{"type": "function", "function": WEATHER}], "tool_choice": "required"}
    status, answer, _ = real.post("/v1/chat/completions", body, timeout=180)
    assert status == 200, answer
    choice = answer["choices"][0]
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
    arguments = json.loads(call["function"]["arguments"])
    assert isinstance(arguments, dict) and isinstance(arguments.get("city"), str)
    assert choice["finish_reason"] == "tool_calls"
    status, events, raw = real.stream(body)
    assert status == 200 and raw.endswith("data: [DONE]\n\n")
    deltas = [d for e in events if e["choices"] for d in e["choices"][0]["delta"].get("tool_calls", [])]
    streamed = assemble_openai_stream(deltas)
    streamed[0]["id"] = call["id"]
    assert streamed == [call]


def test_anthropic_any_tool_choice_stream_equals_message_and_count_tokens(real):
    body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "temperature": 0,
            "messages": [{"role": "user", "content": QUESTION}],
            "tools": [{"name": WEATHER["name"], "description": WEATHER["description"],
                       "input_schema": WEATHER["parameters"]}], "tool_choice": {"type": "any"}}
    status, counted, _ = real.post("/v1/messages/count_tokens", body, timeout=60)
    assert status == 200, counted
    status, message, _ = real.post("/v1/messages", body, timeout=180)
    assert status == 200, message
    assert message["type"] == "message" and message["stop_reason"] == "tool_use"
    uses = [b for b in message["content"] if b["type"] == "tool_use"]
    assert len(uses) == 1 and uses[0]["name"] == "get_weather" and isinstance(uses[0]["input"].get("city"), str)
    usage = message["usage"]
    assert counted["input_tokens"] == usage["input_tokens"] + usage["cache_read_input_tokens"]
    status, text, _ = real.post("/v1/messages", dict(body, stream=True), timeout=180)
    assert status == 200
    streamed = assemble(sse_events([text]))
    for m in (streamed, message):
        m.pop("id")
        for b in m["content"]:
            b.pop("id", None)
    streamed["usage"] = message["usage"] = None
    assert streamed == message
    # count_tokens stored no prompt: counting again gives the same, and a plain request counts fewer tokens
    assert real.post("/v1/messages/count_tokens", body)[1] == counted
    plain = dict(body, tool_choice={"type": "auto"})
    assert real.post("/v1/messages/count_tokens", plain)[1]["input_tokens"] < counted["input_tokens"]

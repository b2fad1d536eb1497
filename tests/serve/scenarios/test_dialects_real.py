"""The official clients, unchanged, against the real engine and the default model (skipped when either, or
the client package, is absent): openai's `client.responses.create` (stream and not, a function-call round
trip) and the `ollama` client (chat, stream, generate, tags, show, tools). Greedy and short: 2 shared cores."""
import json
import os

import pytest

from tests.serve.conftest import real_server
from tests.serve.scenarios.conftest import ENGINE, MODEL, WEATHER as CHAT_WEATHER

pytestmark = pytest.mark.skipif(not (os.access(ENGINE, os.X_OK) and MODEL),
                                reason="needs build/strata-engine and the SmolLM2 model")
CTX = 1024
WEATHER = {"type": "function", **CHAT_WEATHER}  # Responses' flat tool shape
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    with real_server(ENGINE, MODEL, tmp_path_factory.mktemp("dialects"), CTX) as running:
        running.svc.model_path = MODEL
        yield running


@pytest.fixture(scope="module")
def oai(real):
    openai = pytest.importorskip("openai", reason="the openai SDK is a test-only dependency (requirements-test.txt)")
    return openai.OpenAI(base_url=f"http://127.0.0.1:{real.port}/v1", api_key="unused", timeout=300)


@pytest.fixture(scope="module")
def olm(real):
    ollama = pytest.importorskip("ollama", reason="the ollama client is a test-only dependency (requirements-test.txt)")
    return ollama.Client(host=f"http://127.0.0.1:{real.port}", timeout=300)


def test_responses_create_stream_equals_non_stream(oai):
    r = oai.responses.create(model="smollm2", input=QUESTION, temperature=0, max_output_tokens=24)
    assert r.id.startswith("resp_") and r.status in ("completed", "incomplete") and "Paris" in r.output_text
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    with oai.responses.stream(model="smollm2", input=QUESTION, temperature=0, max_output_tokens=24) as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_response()
    assert final.output_text == r.output_text
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response." + (
        "completed" if r.status == "completed" else "incomplete")
    assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds


def test_responses_function_call_round_trip(oai, real):
    first = oai.responses.create(model="smollm2", input="What is the weather in Paris?", tools=[WEATHER],
                                 tool_choice="required", temperature=0, max_output_tokens=64)
    [call] = [it for it in first.output if it.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert isinstance(json.loads(call.arguments).get("city"), str)
    follow = [{"role": "user", "content": "What is the weather in Paris?"}, call.model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny", "c": 21}'}]
    second = oai.responses.create(model="smollm2", input=follow, tools=[WEATHER], temperature=0,
                                  max_output_tokens=48, tool_choice="none")
    assert second.status in ("completed", "incomplete") and second.output_text.strip()
    # the call and its result went back into the prompt as the template writes them
    from serve.api.responses import parse_responses
    text = real.svc.render_chat(parse_responses({"input": follow, "tools": [WEATHER]})).text
    assert "<tool_call>" in text and '<tool_response>\n{"sky": "sunny", "c": 21}\n</tool_response>' in text


def test_ollama_chat_stream_generate(olm):
    r = olm.chat(model="smollm2", messages=[{"role": "user", "content": QUESTION}],
                 options={"temperature": 0, "num_predict": 24})
    assert "Paris" in r.message.content and r.done and r.done_reason in ("stop", "length")
    assert r.eval_count > 0 and r.prompt_eval_count > 0 and r.eval_duration > 0 and r.total_duration >= r.eval_duration
    parts = list(olm.chat(model="smollm2", messages=[{"role": "user", "content": QUESTION}], stream=True,
                          options={"temperature": 0, "num_predict": 24}))
    assert "".join(p.message.content for p in parts) == r.message.content and parts[-1].done
    g = olm.generate(model="smollm2", prompt=QUESTION, options={"temperature": 0, "num_predict": 24})
    assert g.response == r.message.content  # the same chat prompt, greedy


def test_ollama_tags_show_and_tools(olm, real):
    names = [m.model for m in olm.list().models]
    assert names == ["smollm2:latest"]
    shown = olm.show("smollm2:latest")
    assert "tools" in shown.capabilities and shown.details.format == "gguf"
    # Ollama has no tool_choice and the 135M model does not call a tool unasked (a call's answer shape is
    # the golden test's); here the client's tools and a call's round trip go through the real prompt
    tool = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    history = [{"role": "user", "content": "What is the weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "content": "sunny, 21 C", "tool_name": "get_weather"}]
    r = olm.chat(model="smollm2", messages=history, tools=[tool], options={"temperature": 0, "num_predict": 32})
    assert r.message.content.strip() and r.done
    from serve.api.ollama import _messages
    from serve.api.wire import parse_tools
    from serve.core.events import ChatRequest
    text = real.svc.render_chat(ChatRequest(_messages(history), parse_tools([tool]))).text
    assert text.count("get_weather") >= 2 and '"city": "Paris"' in text  # the tool list, and the call (JSON form)
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text
    with pytest.raises(Exception) as err:
        olm.pull("llama3")
    assert "makes no downloads" in str(err.value)


def test_responses_previous_response_id_over_five_turns_reuses_the_cache(oai):
    """Stored responses (store defaults to true): each turn names only the previous response; the prompt the
    server renders starts with the one the engine read last turn, so the engine reuses it (cached tokens)."""
    openai = pytest.importorskip("openai")
    questions = ["My name is Ada. Say hello to me.", "What is my name?", "Name a color.", "Name a fruit.",
                 "What was my name again?"]
    prev, turns = None, []
    for q in questions:
        r = oai.responses.create(model="smollm2", input=q, previous_response_id=prev, temperature=0,
                                 max_output_tokens=16)
        assert r.previous_response_id == prev and r.store is True and r.output_text
        turns.append(r)
        prev = r.id
    for before, after in zip(turns, turns[1:]):
        assert after.usage.input_tokens > before.usage.input_tokens + before.usage.output_tokens - 2
        assert after.usage.input_tokens_details.cached_tokens >= before.usage.input_tokens, (before.usage,
                                                                                             after.usage)
    assert oai.responses.retrieve(turns[0].id).output_text == turns[0].output_text
    assert [it.content[0].text for it in oai.responses.input_items.list(turns[1].id).data] == [questions[1]]
    oai.responses.delete(turns[0].id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(turns[0].id)
    with pytest.raises(openai.BadRequestError):   # the chain lost its first link
        oai.responses.create(model="smollm2", input="Again?", previous_response_id=turns[-1].id)

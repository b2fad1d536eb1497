"""serve/api/anthropic.py: request parsing, the stream's event order, and stream == non-stream on the tool-call
corpus (streamed arguments on and off), checked the way the Anthropic SDK assembles a stream."""

import pytest

from serve.api import anthropic
from serve.api.anthropic import MessageBuilder, error_body, parse_messages, stream_error
from serve.core.events import BadRequest, Done, Event, KIND_CONTENT
from serve.generation.output_parser import OutputParser
from serve.api.replies import JsonReply, RequestContext, StreamReply

from tests.serve.conftest import SPECIMENS, TOOLS, StubService, counter_ids
from tests.serve.conftest import assemble, sse_events


def run_builder(text, pieces, spec, stream_args, finish="stop"):
    parser = OutputParser(TOOLS, spec["thinking"], parallel=spec["parallel"], new_id=counter_ids())
    builder = MessageBuilder("msg_1", "m", 10, stream_args=stream_args)
    frames = builder.start()
    for piece in pieces:
        for ev in parser.feed(piece):
            frames += builder.feed(ev)
    for ev in parser.finish():
        frames += builder.feed(ev)
    done = Done(finish, 10, 7, cached_tokens=4)
    frames += builder.finish(done)
    return frames, builder.message(done)


@pytest.mark.parametrize("spec", SPECIMENS, ids=[s["name"] for s in SPECIMENS])
def test_stream_assembles_to_the_message_on_every_specimen(spec):
    text = spec["text"]
    results = []
    for stream_args in (True, False):
        for pieces in ([text], list(text)):
            frames, message = run_builder(text, pieces, spec, stream_args)
            streamed = assemble(sse_events(frames))
            if spec["unfinished"] and stream_args:
                # the unfinished call's block was sent; the assembled message leaves it out
                unfinished = [b for b in streamed["content"] if b["type"] == "tool_use"
                              and b["name"] in spec["unfinished"] and b not in message["content"]]
                assert unfinished
                streamed["content"] = [b for b in streamed["content"] if b not in unfinished]
            streamed["usage"] = message["usage"]
            assert streamed == message
            results.append(message)
    assert all(r == results[0] for r in results), "the same message every way"
    message = results[0]
    calls = [{"name": b["name"], "arguments": b["input"]} for b in message["content"] if b["type"] == "tool_use"]
    assert calls == spec["calls"]
    assert "".join(b["text"] for b in message["content"] if b["type"] == "text") == spec["content"]
    assert "".join(b["thinking"] for b in message["content"] if b["type"] == "thinking") == spec["reasoning"]
    expected_reason = "tool_use" if spec["calls"] and not spec["unfinished"] else "end_turn"
    assert message["stop_reason"] == expected_reason


def test_stop_reasons_and_usage():
    b = MessageBuilder("msg_x", "m", 100)
    b.feed(Event(KIND_CONTENT, "hi"))
    assert b.message(Done("length", 100, 5))["stop_reason"] == "max_tokens"
    assert b.message(Done("cancel", 100, 5))["stop_reason"] == "end_turn"
    msg = b.message(Done("stop", 100, 5, cached_tokens=100, stop_sequence="END"))
    assert msg["stop_reason"] == "stop_sequence" and msg["stop_sequence"] == "END"
    # reused tokens are clamped to prompt - 1 (the last prompt token is always read)
    assert msg["usage"] == {"input_tokens": 1, "cache_read_input_tokens": 99, "cache_creation_input_tokens": 0,
                            "output_tokens": 5}
    assert b.message(Done("stop", 100, 5))["usage"]["cache_read_input_tokens"] == 0


def test_thinking_then_text_then_tool_blocks_in_order():
    spec = {"thinking": True, "parallel": True}
    frames, message = run_builder("", ['Plan.\n</think>\n\nCalling.\n<tool_call>\n{"name": "run", "arguments": '
                                       '{"x": 1}}\n</tool_call>'], spec, True)
    names = [n for n, _ in sse_events(frames)]
    assert names == ["message_start", "ping",
                     "content_block_start", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]
    assert [b["type"] for b in message["content"]] == ["thinking", "text", "tool_use"]
    assert message["content"][0] == {"type": "thinking", "thinking": "Plan.", "signature": ""}
    assert message["content"][2]["id"].startswith("call_") and message["content"][2]["input"] == {"x": 1}


def test_parse_messages():
    body = {"model": "m", "max_tokens": 100, "metadata": {"user_id": "u"},
            "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "need tool", "signature": "s"},
                                                  {"type": "text", "text": "Checking."},
                                                  {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                   "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                              "content": [{"type": "text", "text": "sunny"}]},
                                             {"type": "text", "text": "And tomorrow?"}]}],
            "tools": [{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}},
                      {"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "stop_sequences": ["END", ""], "temperature": 0.5, "top_k": 5,
            "thinking": {"type": "enabled", "budget_tokens": 4096}}
    req = parse_messages(body)
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool", "user"]
    assert req.messages[0].content == "Be brief.\n\nBe kind."
    assistant = req.messages[2]
    assert assistant.content == "Checking." and assistant.reasoning == "need tool"
    assert assistant.tool_calls[0].arguments == {"city": "Paris"} and assistant.tool_calls[0].id == "toolu_1"
    assert req.messages[3].content == "sunny" and req.messages[3].tool_call_id == "toolu_1"
    assert [t.name for t in req.tools] == ["get_weather"]
    assert req.tool_choice == "required" and req.parallel_tool_calls is False
    assert req.stop == ["END"] and req.max_new == 100 and req.api == "anthropic"
    assert req.sampling.temperature == 0.5 and req.sampling.top_k == 5
    assert req.reasoning_effort == "medium" and req.reasoning_budget_tokens == 4096
    assert parse_messages({"messages": [{"role": "user", "content": "x"}],
                           "tool_choice": {"type": "tool", "name": "f"}}).tool_choice == {"name": "f"}
    assert parse_messages({"messages": [{"role": "user", "content": "x"}],
                           "thinking": {"type": "disabled"}}).reasoning_effort == "none"
    assert parse_messages({"messages": [{"role": "user", "content": "x"}]}, "on_request").reasoning_effort == "none"
    # a tool_choice type naming nothing known acts as auto (said in the notes); not an object stays a 400
    req = parse_messages({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "maybe"}})
    assert req.tool_choice == "auto" and "acting as auto" in req.notes[0]


def test_billing_stamp_pinned():
    body = {"system": "x-anthropic-billing-header: cc_version=1.0; cch=3fa9c;\nYou are Claude Code.",
            "messages": [{"role": "user", "content": "hi"}]}
    assert parse_messages(body).messages[0].content == \
        "x-anthropic-billing-header: cc_version=1.0; cch=fffff;\nYou are Claude Code."


@pytest.mark.parametrize("body,words", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}]}, "system"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}]}]},
     "vision"),
    ({"messages": [{"role": "user", "content": 5}]}, "content"),
    ({"messages": [{"role": "user", "content": "x"}], "stop_sequences": "END"}, "stop_sequences"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "any"}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 5}, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "maybe"}}, "thinking"),
    ({"messages": [{"role": "user", "content": "x"}], "output_config": {"effort": "low"},
      "thinking": {"type": "enabled", "budget_tokens": "lots"}}, "thinking.budget_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]}, "input_schema"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "name": "f", "input": {}}]}]}, "user"),
])
def test_bad_requests_say_what_to_change(body, words):
    with pytest.raises(BadRequest) as e:
        parse_messages(body)
    assert words in e.value.message and e.value.status == 400


def test_tool_result_images_become_text():
    req = parse_messages({"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "is_error": True,
         "content": [{"type": "text", "text": "failed"}, {"type": "image", "source": {}}]}]}]})
    assert req.messages[0].role == "tool" and req.messages[0].content.startswith("Error: failed\n[image omitted")


def test_error_shapes():
    assert error_body(400, "invalid_request_error", "bad") == {
        "type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    assert error_body(503, "unavailable_error", "x")["error"]["type"] == "overloaded_error"
    assert error_body(413, "invalid_request_error", "x")["error"]["type"] == "request_too_large"
    assert error_body(500, "server_error", "x")["error"]["type"] == "api_error"
    assert error_body(401, "authentication_error", "x")["error"]["type"] == "authentication_error"
    [(name, data)] = sse_events([stream_error("boom")])
    assert name == "error" and data == {"type": "error", "error": {"type": "api_error", "message": "boom"}}


BODY = {"model": "claude-x", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "run", "input_schema": {"type": "object"}}]}
TEXT = 'Sure.\n<tool_call>\n{"name": "run", "arguments": {"cmd": "ls"}}\n</tool_call>'


def test_handler_stream_and_non_stream_agree():
    reply = anthropic.messages(StubService(TEXT), dict(BODY), RequestContext())
    assert isinstance(reply, JsonReply) and reply.status == 200
    message = reply.body
    assert message["model"] == "claude-x" and message["id"].startswith("msg_")
    assert [b["type"] for b in message["content"]] == ["text", "tool_use"]
    stream = anthropic.messages(StubService(TEXT), dict(BODY, stream=True), RequestContext())
    assert isinstance(stream, StreamReply)
    events = sse_events(list(stream.frames))
    assert [n for n, _ in events].count("ping") == 2
    streamed = assemble(events)
    for m in (streamed, message):
        for b in m["content"]:
            b.pop("id", None)
    streamed["id"] = message["id"]
    assert streamed == message and message["stop_reason"] == "tool_use"


def test_handler_error_after_start_is_an_error_event():
    stream = anthropic.messages(StubService(TEXT, pieces=list(TEXT), fail_after=3), dict(BODY, stream=True), RequestContext())
    events = sse_events(list(stream.frames))
    assert events[0][0] == "message_start" and events[-1][0] == "error"
    assert "engine died" in events[-1][1]["error"]["message"]


def test_count_tokens_handler():
    reply = anthropic.count_tokens(StubService(""), {"messages": [{"role": "user", "content": "x"}]},
                                   RequestContext())
    assert reply.body == {"input_tokens": 12}


def test_no_llama_timings_in_anthropic_answers(server):
    # Anthropic's shape stays exact: llama-server's own suite asserts `timings` is absent on /v1/messages
    s = server({"turns": [{"text": "ok"}]})
    status, msg, _ = s.post("/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and "timings" not in msg

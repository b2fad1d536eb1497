"""The output parser on the tool-call specimen corpus (tests/data/toolcall_specimens.json), whole, in
pieces and cut at every character; OpenAI delta grammar; rendering and forced openings.

The corpus holds well-formed calls in both forms, several calls, tags inside values, code fences,
outputs truncated at the end and near-misses that must stay content. Each specimen states the content,
reasoning, finished calls and unfinished (announced, never finished) calls a reader must get.
"""
import json
import random

import pytest
from hypothesis import given, settings, strategies as st


from serve.api import openai
from serve.core.events import Message, ToolCall
from serve.generation.output_parser import OutputParser
from serve.api.replies import RequestContext
from serve.prompt.chatml import ChatTemplate
from serve.prompt.tool_text import arguments_text, forced_opening, new_call_id
from tests.serve.conftest import SPECIMENS, StubService, TOOLS, assemble_openai_stream, counter_ids


def parse(pieces, thinking=False, parallel=True, tools=TOOLS, forced=None):
    parser = OutputParser(tools, thinking, forced, parallel=parallel, new_id=counter_ids())
    events = []
    for piece in pieces:
        events += parser.feed(piece)
    events += parser.finish()
    return events


def summary(events):
    """What a client ends up with, plus the grammar checks every event stream must pass."""
    out = {"content": "", "reasoning": "", "calls": [], "unfinished": []}
    started, args, finished = {}, {}, set()
    for e in events:
        if e.kind in ("content", "reasoning"):
            out[e.kind] += e.text
        elif e.kind == "tool_start":
            assert e.index not in started, "one tool_start per call"
            assert not finished or e.index > max(finished)
            started[e.index] = e.name
            args[e.index] = ""
        elif e.kind == "tool_args":
            assert e.index in started and e.index not in finished, "args only between start and call"
            args[e.index] += e.text
        elif e.kind == "tool_call":
            assert e.index in started and started[e.index] == e.call.name
            assert args[e.index] == arguments_text(e.call.arguments), "pieces concatenate to the arguments"
            json.loads(args[e.index])
            finished.add(e.index)
            out["calls"].append({"name": e.call.name, "arguments": e.call.arguments})
    assert sorted(started) == list(range(len(started))), "indexes count from 0"
    out["unfinished"] = [started[i] for i in sorted(started) if i not in finished]
    return out


def expected(spec):
    return {k: spec[k] for k in ("content", "reasoning", "calls", "unfinished")}


@pytest.mark.parametrize("spec", SPECIMENS, ids=[s["name"] for s in SPECIMENS])
def test_specimen_whole_pieces_and_every_cut(spec):
    text, kw = spec["text"], {"thinking": spec["thinking"], "parallel": spec["parallel"]}
    whole = summary(parse([text], **kw))
    assert whole == expected(spec)
    assert summary(parse(list(text), **kw)) == whole
    for cut in range(1, len(text)):
        assert summary(parse([text[:cut], text[cut:]], **kw)) == whole, cut
    rng = random.Random(spec["name"])
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 8))))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        assert summary(parse(pieces, **kw)) == whole, cuts


# Fragments that make outputs dense in tags, near-tags, JSON and code spans.
FRAGMENTS = ["<tool_call>", "</tool_call>", "<tool_", "</think>", "<think>", "</thi", "\n", "\n\n", " ", "`",
             "```", "hello", "<", ">", '{"name": "get_weather", "arguments": {', '"city": "Pa\\"ris"', "}", "}}",
             '{"name": "run"}', "<function=get_weather>", "<parameter=city>", "</parameter>", "</function>",
             "<parameter=days>\n4\n", "\\u00e9", '"', ":", ",", "é", "😀", "[1, 2]"]


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(st.sampled_from(FRAGMENTS), max_size=30), thinking=st.booleans(),
       parallel=st.booleans(), data=st.data())
def test_any_split_gives_the_same_events(parts, thinking, parallel, data):
    text = "".join(parts)
    whole = summary(parse([text], thinking=thinking, parallel=parallel))
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(text)), max_size=10))))
    pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    assert summary(parse(pieces, thinking=thinking, parallel=parallel)) == whole
    if not parallel:
        assert len(whole["calls"]) + len(whole["unfinished"]) <= max(1, len(whole["unfinished"]))


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=60), thinking=st.booleans())
def test_text_without_tags_is_kept(text, thinking):
    """Any text free of tags comes out whole (only the documented newlines are dropped)."""
    if any(t in text for t in ("<", "`")):
        return
    got = summary(parse([text], thinking=thinking))
    kind = "reasoning" if thinking else "content"
    assert got[kind] == text.lstrip("\n")
    assert got["calls"] == []


def test_events_are_incremental():
    """tool_start comes as soon as the name is known and string values stream before the call ends."""
    parser = OutputParser(TOOLS, False, new_id=counter_ids())
    first = parser.feed('<tool_call>\n<function=write_file>\n<parameter=content>\nline one\nline')
    assert [e.kind for e in first] == ["tool_start", "tool_args"]
    assert first[1].text == '{"content": "line one\\nline'
    more = parser.feed(' two\n</parameter>\n</function>\n</tool_call>')
    assert [e.kind for e in more] == ["tool_args", "tool_call"]
    assert more[0].text == ' two"}' and more[1].call.arguments == {"content": "line one\nline two"}
    parser = OutputParser(TOOLS, False, new_id=counter_ids())
    got = parser.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par')
    assert [e.kind for e in got] == ["tool_start", "tool_args"] and got[1].text == '{"city": "Par'


def test_close_tag_still_arriving_holds_the_verdict():
    parser = OutputParser(TOOLS, False, new_id=counter_ids())
    got = parser.feed('<tool_call>\n{"name": "run", "arguments": {}}\n</tool_')
    assert "tool_call" not in [e.kind for e in got]
    got = parser.feed("call>\nafter")
    assert [e.kind for e in got] == ["tool_call", "content"] and got[1].text == "after"


def test_forced_opening_is_parsed_as_output():
    for fmt, rest in (("json", 'get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
                      ("xml", "get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>")):
        opening = forced_opening("required", TOOLS, fmt)
        assert opening.startswith("<tool_call>\n")
        got = summary(parse([rest], forced=opening))
        assert got["calls"] == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    one = [TOOLS[0]]
    opening = forced_opening("required", one, "json")
    # a named tool with required parameters: the opening goes on to the first parameter
    assert opening == '<tool_call>\n{"name": "get_weather", "arguments": {"'
    assert summary(parse(['city": "Rome"}}'], tools=one, forced=opening))["calls"][0]["arguments"] == {
        "city": "Rome"}
    assert forced_opening("required", [TOOLS[2]], "json") == '<tool_call>\n{"name": "run", "arguments": '
    assert forced_opening("required", [TOOLS[2]], "xml") == "<tool_call>\n<function=run>\n"
    assert forced_opening({"type": "function", "function": {"name": "run"}}, TOOLS, "xml") == \
        "<tool_call>\n<function=run>\n"
    assert forced_opening({"type": "tool", "name": "list_files"}, TOOLS, "json").count("list_files") == 1
    assert forced_opening("any", one, "xml") == "<tool_call>\n<function=get_weather>\n<parameter="
    assert forced_opening({"name": "unknown"}, TOOLS) is None      # unknown acts as auto
    assert forced_opening("auto", TOOLS) is None and forced_opening("required", []) is None


def test_forced_opening_after_thinking():
    parser = OutputParser(TOOLS, True, forced_opening("required", TOOLS[:1], "json"), new_id=counter_ids())
    assert parser.take_forced_opening() is None
    events = parser.feed("Need to call.\n</think>\n")
    text = parser.take_forced_opening()
    assert text == '\n\n<tool_call>\n{"name": "get_weather", "arguments": {"'
    assert parser.take_forced_opening() is None
    events += parser.feed(text) + parser.feed('city": "Oslo"}}') + parser.finish()
    got = summary(events)
    assert got["reasoning"] == "Need to call." and got["calls"][0]["arguments"] == {"city": "Oslo"}


OPENAI_TOOLS = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                  "parameters": t.parameters}} for t in TOOLS]


@pytest.mark.parametrize("spec", SPECIMENS, ids=[s["name"] for s in SPECIMENS])
def test_openai_stream_assembles_to_the_message_on_every_specimen(spec):
    """serve/api/openai.py on the corpus: whole and character by character, streamed and not, the same answer."""
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": OPENAI_TOOLS,
            "parallel_tool_calls": spec["parallel"]}
    answers = []
    for pieces in ([spec["text"]], list(spec["text"])):
        svc = StubService(spec["text"], spec["thinking"], pieces)
        choice = openai.chat_completions(svc, dict(body), RequestContext()).body["choices"][0]
        message = choice["message"]
        stream = openai.chat_completions(StubService(spec["text"], spec["thinking"], pieces),
                                         dict(body, stream=True), RequestContext())
        chunks = [json.loads(f[6:]) for f in "".join(stream.frames).split("\n\n")
                  if f.startswith("data: {")]
        deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
        assert deltas[0] == {"role": "assistant", "content": None}
        streamed = assemble_openai_stream([tc for d in deltas for tc in d.get("tool_calls", [])])
        finished = message.get("tool_calls", [])
        assert [c for c in streamed if c["id"] in {f["id"] for f in finished}] == finished
        assert [c["function"]["name"] for c in streamed if c not in finished] == spec["unfinished"]
        assert "".join(d.get("content") or "" for d in deltas) == (message["content"] or "")
        assert "".join(d.get("reasoning_content") or "" for d in deltas) == message.get("reasoning_content", "")
        assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
        # the thinking also goes by the name vLLM/Ollama clients read
        assert message.get("reasoning") == message.get("reasoning_content")
        assert all(d.get("reasoning") == d.get("reasoning_content") for d in deltas)
        answers.append(choice)
    assert answers[0] == answers[1]
    message = answers[0]["message"]
    assert (message["content"] or "") == spec["content"] and message.get("reasoning_content", "") == spec["reasoning"]
    assert [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
            for c in message.get("tool_calls", [])] == spec["calls"]
    assert answers[0]["finish_reason"] == ("tool_calls" if spec["calls"] else "stop")


@pytest.mark.parametrize("fmt", ["json", "xml"])
def test_rendered_history_calls_parse_back(fmt):
    """The template's rendering of an assistant turn's calls is what the parser reads as those calls."""
    calls = [ToolCall("call_1", "get_weather", {"city": "Paris", "days": 2}),
             ToolCall("call_2", "write_file", {"path": "a", "content": "x\n</parameter> y"})]
    template = ChatTemplate(tool_format=fmt)
    text = template.render([Message("user", "go"), Message("assistant", "", tool_calls=calls)], TOOLS,
                           add_generation_prompt=False).text
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    got = summary(parse([turn]))
    assert got["calls"] == [{"name": c.name, "arguments": c.arguments} for c in calls]
    assert got["content"] == ""


def test_json_tool_section():
    text = ChatTemplate(tool_format="json").render([Message("user", "go")], TOOLS[:2]).text
    body = text[text.index("<tools>\n") + 8:text.index("</tools>")]
    assert [json.loads(line)["function"]["name"] for line in body.splitlines()] == ["get_weather", "write_file"]
    assert '{"name": "FUNCTION_NAME", "arguments":' in text and "<function=" not in text


def test_call_ids():
    assert new_call_id().startswith("call_") and len(new_call_id()) == 5 + 24
    assert new_call_id("anthropic").startswith("toolu_")
    assert new_call_id() != new_call_id()


def test_long_values_parse_in_linear_time():
    """An argument fed in 4-character pieces (as tokens come) costs about as much per byte at 64 KB as at
    8 KB, in every form: CPU time of the larger over the smaller stays near their size ratio (8), where a
    parser that rescans its buffer per piece grows with its square (64). CPU time, best of three: the
    machine's load does not move it."""
    import time

    def texts(n):
        body = json.dumps({"k": ["x\n<" * 20] * n})
        return ["<tool_call>\n<function=run>\n<parameter=data>\n" + body + "\n</parameter>\n</function>\n</tool_call>",
                "<tool_call>\n<function=write_file>\n<parameter=content>\n" + body + "\n</parameter>\n</function>\n"
                "</tool_call>",
                '<tool_call>\n{"name": "run", "arguments": {"data": ' + body + "}}\n</tool_call>"]

    def cost(text):
        best = float("inf")
        for _ in range(3):
            start = time.process_time()
            got = summary(parse([text[i:i + 4] for i in range(0, len(text), 4)]))
            best = min(best, time.process_time() - start)
            assert len(got["calls"]) == 1
        return best

    for small, large in zip(texts(90), texts(720)):
        assert cost(large) < 20 * max(cost(small), 1e-3), "parsing grows faster than the text"


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=6)), max_size=25),
       thinking=st.booleans(), data=st.data())
def test_any_text_never_raises_and_splits_agree(parts, thinking, data):
    """Model text is never an error: whatever it is, it parses, and every split agrees."""
    text = "".join(parts)
    whole = summary(parse([text], thinking=thinking))
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(text)), max_size=6))))
    pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    assert summary(parse(pieces, thinking=thinking)) == whole

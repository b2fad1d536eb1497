"""The output parser on the tool-call specimen corpus (tests/data/toolcall_specimens.json), whole, in
pieces and cut at every character; OpenAI delta grammar; rendering and forced openings.

The corpus holds well-formed calls in both forms, several calls, tags inside values, code fences,
outputs truncated at the end and near-misses that must stay content. Each specimen states the content,
reasoning, finished calls and unfinished (announced, never finished) calls a reader must get.
"""
import itertools
import json
import os
import random

import pytest
from hypothesis import given, settings, strategies as st

from serve.events import ToolCall, ToolSpec
from serve.reasoning import OutputParser
from serve.toolcalls import (arguments_text, forced_opening, new_call_id, openai_tool_call,
                             openai_tool_call_delta, render_tool_calls, tools_for_choice, tools_system_text)

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "toolcall_specimens.json")
with open(DATA, encoding="utf-8") as _f:
    SPECIMENS = json.load(_f)

TOOLS = [
    ToolSpec("get_weather", "Weather for a city", {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}),
    ToolSpec("write_file", "Write a file", {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"}}}),
    ToolSpec("run", "", {}),
    ToolSpec("list_files", "", {"type": "object", "properties": {}}),
]


def counter_ids():
    n = itertools.count()
    return lambda: f"call_{next(n):024x}"


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
    assert got[kind] == text.lstrip("\n") if thinking else got[kind] == text.lstrip("\n")
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
    assert tools_for_choice("none", TOOLS) == [] and tools_for_choice("auto", TOOLS) == TOOLS


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


def assemble_openai_stream(deltas):
    """How the OpenAI SDK's stream accumulator builds message.tool_calls: by index, id/type/name from the
    first delta that has them, argument strings concatenated."""
    calls = {}
    for d in deltas:
        slot = calls.setdefault(d["index"], {"id": None, "type": None, "function": {"name": None,
                                                                                  "arguments": ""}})
        if "id" in d:
            assert slot["id"] is None, "id only on the first delta of a call"
            slot["id"], slot["type"] = d["id"], d["type"]
            slot["function"]["name"] = d["function"]["name"]
        else:
            assert slot["id"] is not None, "the first delta of a call carries its id"
            assert set(d) == {"index", "function"} and set(d["function"]) == {"arguments"}
        slot["function"]["arguments"] += d["function"].get("arguments", "")
    return [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("spec", [s for s in SPECIMENS if s["calls"]], ids=lambda s: s["name"])
def test_openai_stream_assembles_to_the_non_streamed_calls(spec):
    kw = {"thinking": spec["thinking"], "parallel": spec["parallel"]}
    for pieces in ([spec["text"]], list(spec["text"])):
        events = parse(pieces, **kw)
        deltas = [d for d in map(openai_tool_call_delta, events) if d is not None]
        streamed = assemble_openai_stream(deltas)
        final = [openai_tool_call(e.call) for e in events if e.kind == "tool_call"]
        assert streamed == final
        assert all(json.loads(c["function"]["arguments"]) == c_spec["arguments"]
                   for c, c_spec in zip(final, spec["calls"]))


def test_rendered_history_calls_parse_back():
    calls = [ToolCall("call_1", "get_weather", {"city": "Paris", "days": 2}),
             ToolCall("call_2", "write_file", {"path": "a", "content": "x\n</parameter> y"})]
    for fmt in ("json", "xml"):
        text = render_tool_calls(calls, fmt)
        got = summary(parse([text]))
        assert got["calls"] == [{"name": c.name, "arguments": c.arguments} for c in calls], fmt
        assert got["content"] == ""


def test_tools_system_text():
    text = tools_system_text(TOOLS[:1], "json")
    body = text[text.index("<tools>\n") + 8:text.index("\n</tools>")]
    assert json.loads(body)["function"]["name"] == "get_weather"
    assert "<tool_call>" in text and '"arguments"' in text
    assert "<function=" in tools_system_text(TOOLS, "xml")
    assert len(tools_system_text(TOOLS, "xml").split("<tools>\n")[1].split("\n</tools>")[0].split("\n")) == 4


def test_call_ids():
    assert new_call_id().startswith("call_") and len(new_call_id()) == 5 + 24
    assert new_call_id("anthropic").startswith("toolu_")
    assert new_call_id() != new_call_id()


def test_long_values_parse_in_linear_time():
    """A 60 KB argument fed in 4-character pieces (as tokens come) takes well under a second in any form;
    a parser that rescans its buffer per piece takes seconds here."""
    import time
    body = json.dumps({"k": ["x\n<" * 20] * 700})
    texts = ["<tool_call>\n<function=run>\n<parameter=data>\n" + body + "\n</parameter>\n</function>\n</tool_call>",
             "<tool_call>\n<function=write_file>\n<parameter=content>\n" + body + "\n</parameter>\n</function>\n"
             "</tool_call>",
             '<tool_call>\n{"name": "run", "arguments": {"data": ' + body + "}}\n</tool_call>"]
    for text in texts:
        start = time.perf_counter()
        got = summary(parse([text[i:i + 4] for i in range(0, len(text), 4)]))
        assert time.perf_counter() - start < 2.0
        assert len(got["calls"]) == 1


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

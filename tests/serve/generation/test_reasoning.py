"""Reasoning, across the modules that hold it: effort levels (serve/core/effort.py) from every API's fields
(serve/api/wire.py, serve/api/anthropic.py), the thinking budget and answer room (serve/generation/passes.py),
and the output parser's reasoning rules (serve/generation/output_parser.py)."""
import pytest

from serve.core.events import BadRequest
from serve.generation.passes import ANSWER_RESERVE_MIN, ANSWER_ROOM_MIN_CAP, answer_reserve, thinking_budget
from serve.generation.output_parser import OutputParser
from serve.api.anthropic import effort_from_anthropic
from serve.api.wire import effort_from_openai
from serve.core.effort import normalize_effort, template_kwargs


@pytest.mark.parametrize("value,level", [
    ("none", "none"), ("off", "none"), ("minimal", "none"), ("disabled", "none"), ("false", "none"),
    (False, "none"), ("low", "low"), ("LOW ", "low"), ("medium", "medium"), ("high", "high"),
    ("xhigh", "high"), ("max", "high"), ("maximum", "high"), (None, None)])
def test_effort_aliases(value, level):
    assert normalize_effort(value) == level


@pytest.mark.parametrize("value", ["ultra", "", 3, True, ["low"]])
def test_unknown_effort_is_400(value):
    with pytest.raises(BadRequest) as e:
        normalize_effort(value, "reasoning.effort")
    assert e.value.status == 400 and e.value.param == "reasoning.effort" and "unknown reasoning effort" in str(e.value)


def test_openai_sources():
    assert effort_from_openai({}) is None
    assert effort_from_openai({"reasoning_effort": "low"}) == "low"
    assert effort_from_openai({"reasoning": {"effort": "high"}}) == "high"
    assert effort_from_openai({"chat_template_kwargs": {"reasoning_effort": "medium"}}) == "medium"
    # enable_thinking false wins over every other source
    assert effort_from_openai({"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False}}) == "none"
    assert effort_from_openai({"chat_template_kwargs": {"enable_thinking": True}}) is None
    assert effort_from_openai({"reasoning_effort": "low", "reasoning": {"effort": "high"}}) == "low"
    for bad in ({"reasoning": "low"}, {"chat_template_kwargs": {"enable_thinking": "no"}},
                {"chat_template_kwargs": []}, {"reasoning": {"effort": "huge"}}):
        with pytest.raises(BadRequest):
            effort_from_openai(bad)


def test_anthropic_sources():
    assert effort_from_anthropic({}) is None
    assert effort_from_anthropic({}, mode="on_request") == "none"
    assert effort_from_anthropic({"thinking": {"type": "disabled"}}) == "none"
    assert effort_from_anthropic({"thinking": {"type": "enabled", "budget_tokens": 1024}}) == "low"
    assert effort_from_anthropic({"thinking": {"type": "enabled", "budget_tokens": 4096}}) == "medium"
    assert effort_from_anthropic({"thinking": {"type": "enabled", "budget_tokens": 16000}}) == "high"
    assert effort_from_anthropic({"output_config": {"effort": "low"}, "thinking": {"type": "enabled",
                                                                                  "budget_tokens": 20000}}) == "low"
    for bad in ({"thinking": "on"}, {"thinking": {"type": "sometimes"}},
                {"thinking": {"type": "enabled", "budget_tokens": -1}}, {"output_config": {"effort": "x"}}):
        with pytest.raises(BadRequest):
            effort_from_anthropic(bad)


def test_template_kwargs():
    assert template_kwargs(None) == {"enable_thinking": True}
    assert template_kwargs("none") == {"enable_thinking": False}
    assert template_kwargs("low") == {"enable_thinking": True, "reasoning_effort": "low"}


def test_budget_lowered_to_leave_the_answer_its_reserve():
    assert answer_reserve(8192) == 2048 and answer_reserve(1000) == 500 and answer_reserve(1500) == ANSWER_RESERVE_MIN
    assert thinking_budget(1000, 8192) == 1000
    assert thinking_budget(8000, 8192) == 8192 - 2048
    assert thinking_budget(100, 150) == 75   # reserve = min(512, 150 // 2)
    assert thinking_budget(5, 1) == 1
    with pytest.raises(BadRequest):
        thinking_budget(-1, 100)
    with pytest.raises(BadRequest):
        thinking_budget("many", 100)


def test_answer_room():
    assert thinking_budget(None, ANSWER_ROOM_MIN_CAP - 1) is None
    assert thinking_budget(0, 8192) == 8192 - 2048
    assert thinking_budget(None, ANSWER_ROOM_MIN_CAP) == ANSWER_ROOM_MIN_CAP - answer_reserve(ANSWER_ROOM_MIN_CAP)
    assert thinking_budget(None, 8192, answer_room=False) is None


def run(pieces, thinking=True):
    parser = OutputParser([], thinking)
    events = []
    for p in pieces:
        events += parser.feed(p)
    events += parser.finish()
    got = {}
    for e in events:
        got[e.kind] = got.get(e.kind, "") + e.text
    return got


def test_reasoning_split_and_newlines():
    assert run(["\nStep one.\n\n</think>\n\nAnswer.\n"]) == {"reasoning": "Step one.", "content": "Answer.\n"}
    assert run(["Step", " one.\n", "\n</th", "ink>", "\n", "\nAnswer."]) == {"reasoning": "Step one.",
                                                                             "content": "Answer."}
    # a `</think>` that never completes is thinking text; an output that ends inside thinking has no answer
    assert run(["a </thin"]) == {"reasoning": "a </thin"}
    # `<think>` inside the thinking and after it is plain text
    assert run(["x <think> y</think>z <think>w"]) == {"reasoning": "x <think> y", "content": "z <think>w"}


def test_in_reasoning_and_holding():
    parser = OutputParser([], True)
    parser.feed("thinking </thi")
    assert parser.in_reasoning and parser.holding
    parser.feed("nk>")
    assert not parser.in_reasoning
    parser = OutputParser([], False)
    assert [e.text for e in parser.feed("<think>a</think>b")] == ["a", "b"]


def test_reasoning_fields():
    from serve.core.events import ChatRequest
    from serve.api.wire import reasoning_fields
    req = ChatRequest(messages=[])
    reasoning_fields({"reasoning_budget_tokens": 300, "answer_room": False, "reasoning_close_retry": True}, req)
    assert (req.reasoning_budget_tokens, req.answer_room, req.reasoning_close_retry) == (300, False, True)
    for bad in ({"reasoning_budget_tokens": "3"}, {"reasoning_budget_tokens": -1}, {"answer_room": 1},
                {"reasoning_close_retry": "yes"}):
        with pytest.raises(BadRequest):
            reasoning_fields(bad, ChatRequest(messages=[]))


def test_thinking_budget_breaks_once_at_a_clean_point():
    from serve.generation.passes import ThinkingBudget, WRAP_UP_TEXT
    parser = OutputParser([], True)
    budget = ThinkingBudget(3)
    verdicts = []
    for piece in ["a", " b", " </thi", "c", " d"]:   # the third token leaves a partial tag held
        parser.feed(piece)
        verdicts.append(budget.count(parser))
    assert verdicts == [False, False, False, True, False]
    events = parser.feed(WRAP_UP_TEXT) + parser.feed("Answer.") + parser.finish()
    kinds = {}
    for e in events:
        kinds[e.kind] = kinds.get(e.kind, "") + e.text
    assert kinds["content"] == "Answer." and "long enough" in kinds["reasoning"]
    assert not parser.in_reasoning and budget.count(parser) is False
    assert ThinkingBudget(None).count(OutputParser([], True)) is False


def test_close_retry_rule():
    from serve.generation.passes import needs_close_retry
    parser = OutputParser([], True)
    parser.feed("thinking and never closing")
    assert needs_close_retry(parser, "stop", answered=False, enabled=True, tried=False)
    assert not needs_close_retry(parser, "stop", answered=False, enabled=False, tried=False)
    assert not needs_close_retry(parser, "stop", answered=False, enabled=True, tried=True)
    assert not needs_close_retry(parser, "length", answered=False, enabled=True, tried=False)


def test_resolve_effort_order():
    from serve.core.effort import resolve_effort
    assert resolve_effort("low", "high", "none") == "low"
    assert resolve_effort(None, "xhigh", "none") == "high"
    assert resolve_effort(None, None, "off") == "none"
    assert resolve_effort(None) is None
    with pytest.raises(BadRequest, match="settings"):
        resolve_effort(None, "loud")

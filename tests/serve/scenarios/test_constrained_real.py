"""Grammar-constrained replies on the real engine and the default model (skipped when either is absent, or
without the `jsonschema` test dependency): hypothesis-generated schemas at temperature 0 and 1, every reply
parses and validates with an independent validator; forced tool calls on the OpenAI and Anthropic APIs give
arguments that validate 20 times out of 20; a keyword outside the subset is a 400.

The schemas are bounded (strings with maxLength, arrays with maxItems, depth 2) so a reply fits max_tokens:
a reply cut by max_tokens cannot be a whole JSON text, and the test asks for finish `stop`.
"""
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.conftest import ENGINE_EXE, model_path
from tests.serve.conftest import real_server

jsonschema = pytest.importorskip("jsonschema", reason="the independent validator (requirements-test.txt)")

ENGINE = os.environ.get("STRATA_TEST_ENGINE", ENGINE_EXE)
MODEL = model_path()
pytestmark = pytest.mark.skipif(not (os.access(ENGINE, os.X_OK) and MODEL),
                                reason="needs build/strata-engine and the SmolLM2 model")
CTX = 2048
MAX_TOKENS = 400
EXAMPLES = int(os.environ.get("STRATA_SCHEMA_EXAMPLES", "6"))  # per temperature (the CPU is slow and shared)
NAMES = st.sampled_from(["id", "name", "city", "score", "tags", "ok", "when", "kind"])

_strings = st.builds(lambda hi, lo: {"type": "string", "maxLength": hi, "minLength": min(lo, hi)},
                     st.integers(1, 12), st.integers(0, 2))
_ints = st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
                  st.integers(-50, 50), st.integers(0, 500)) | st.just({"type": "integer"})
_leaf = st.one_of(
    _strings, _ints, st.just({"type": "number"}), st.just({"type": "boolean"}), st.just({"type": "null"}),
    st.builds(lambda v: {"enum": v}, st.lists(st.sampled_from(["red", "green", 3, None, True]), min_size=1,
                                              max_size=3, unique=True)),
    st.builds(lambda v: {"const": v}, st.sampled_from(["yes", 7, False])),
    st.sampled_from([{"type": "string", "format": "date"}, {"type": "string", "format": "uuid"},
                     {"type": ["string", "null"], "maxLength": 6}]),
    st.builds(lambda a, b: {"anyOf": [a, b]}, _strings, _ints),
    st.builds(lambda a: {"oneOf": [a, {"type": "boolean"}]}, _strings))


def _object(children):
    return st.builds(lambda props, req: {"type": "object", "properties": props,
                                         "required": sorted(k for k in props if req.get(k)),
                                         "additionalProperties": False},
                     st.dictionaries(NAMES, children, min_size=1, max_size=3), st.dictionaries(NAMES, st.booleans()))


def _array(children):
    return st.builds(lambda item, lo, extra: {"type": "array", "items": item, "minItems": lo, "maxItems": lo + extra},
                     children, st.integers(0, 1), st.integers(0, 2))


SCHEMAS = st.recursive(_leaf, lambda c: _object(c) | _array(c), max_leaves=5).filter(
    lambda s: json.dumps(s).count("{") <= 9)


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    with real_server(ENGINE, MODEL, tmp_path_factory.mktemp("constrained"), CTX) as running:
        yield running


def _validate(schema, value):
    cls = jsonschema.Draft202012Validator
    cls(schema, format_checker=cls.FORMAT_CHECKER).validate(value)


def _constrained(real, schema, temperature, seed):
    body = {"messages": [{"role": "user", "content": "Give an example JSON value for this schema: " +
                          json.dumps(schema)}],
            "temperature": temperature, "seed": seed, "max_tokens": MAX_TOKENS,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    status, reply, _ = real.post("/v1/chat/completions", body, timeout=600)
    assert status == 200, reply
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    value = json.loads(choice["message"]["content"])
    _validate(schema, value)


@pytest.mark.parametrize("temperature", [0, 1])
def test_generated_schemas_give_valid_json(real, temperature):
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.filter_too_much])
    @given(schema=SCHEMAS, seed=st.integers(0, 2 ** 31))
    def check(schema, seed):
        _constrained(real, {"type": "object", "properties": {"answer": schema}, "required": ["answer"]},
                     temperature, seed)
    check()


def test_json_object_is_an_object(real):
    body = {"messages": [{"role": "user", "content": "List three fruits."}], "temperature": 1, "seed": 5,
            "max_tokens": MAX_TOKENS, "response_format": {"type": "json_object"}}
    status, reply, _ = real.post("/v1/chat/completions", body, timeout=600)
    assert status == 200, reply
    if reply["choices"][0]["finish_reason"] == "stop":  # free-form JSON may run to max_tokens
        assert isinstance(json.loads(reply["choices"][0]["message"]["content"]), dict)


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 14},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "days", "unit"]}


def test_forced_tool_calls_validate_20_of_20_on_both_apis(real):
    question = "What will the weather be in Lyon this week?"
    openai = {"messages": [{"role": "user", "content": question}], "max_tokens": 120, "temperature": 1,
              "tools": [{"type": "function", "function": {"name": "forecast", "parameters": WEATHER}}],
              "tool_choice": {"type": "function", "function": {"name": "forecast"}}}
    anthropic = {"model": "m", "max_tokens": 120, "temperature": 1,
                 "messages": [{"role": "user", "content": question}],
                 "tools": [{"name": "forecast", "input_schema": WEATHER}], "tool_choice": {"type": "any"}}
    for seed in range(20):
        status, reply, _ = real.post("/v1/chat/completions", {**openai, "seed": seed}, timeout=600)
        assert status == 200, reply
        calls = reply["choices"][0]["message"].get("tool_calls") or []
        assert len(calls) == 1 and calls[0]["function"]["name"] == "forecast", reply
        _validate(WEATHER, json.loads(calls[0]["function"]["arguments"]))
        status, reply, _ = real.post("/v1/messages", {**anthropic, "seed": seed}, timeout=600)
        assert status == 200, reply
        uses = [b for b in reply["content"] if b["type"] == "tool_use"]
        assert len(uses) == 1 and uses[0]["name"] == "forecast", reply
        _validate(WEATHER, uses[0]["input"])


def test_strict_tools_in_auto_mode_give_text_or_valid_calls(real):
    # the default model seldom calls a tool unforced (it answers in prose, constrained or not): this checks
    # that the text-or-calls grammar leaves prose whole and never lets a call opening through as text; calls
    # under a schema are the forced tests' and test_constrain.py's
    tools = [{"type": "function", "function": {"name": "forecast", "parameters": WEATHER, "strict": True}}]
    for seed in range(3):
        body = {"messages": [{"role": "user", "content": "What will the weather be in Lyon this week?"}],
                "max_tokens": 150, "temperature": 1, "seed": seed, "tools": tools}
        status, reply, _ = real.post("/v1/chat/completions", body, timeout=600)
        assert status == 200, reply
        msg = reply["choices"][0]["message"]
        assert "<tool_call>" not in (msg.get("content") or "")
        assert msg.get("content") or msg.get("tool_calls")
        for call in msg.get("tool_calls") or []:
            _validate(WEATHER, json.loads(call["function"]["arguments"]))


def test_a_keyword_outside_the_subset_is_a_400(real):
    body = {"messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "object", "properties": {"a": {"type": "string", "pattern": "(?=a)"}}}}}}
    status, reply, _ = real.post("/v1/chat/completions", body, timeout=60)
    assert status == 400 and "pattern: " in reply["error"]["message"] and "lookaround" in reply["error"]["message"]


# Unbounded schemas (free-length strings, longer arrays) under budgets that cut most replies: every reply parses
# and validates all the same (the engine closes the grammar's shortest completion when the budget binds), and a
# reply the budget ended says `length`.
_open_leaf = st.one_of(st.just({"type": "string"}), st.just({"type": "integer"}), st.just({"type": "number"}),
                       st.just({"type": "boolean"}), st.builds(lambda v: {"enum": v}, st.lists(
                           st.sampled_from(["red", "green", "blue"]), min_size=1, max_size=3, unique=True)))
OPEN_SCHEMAS = st.recursive(_open_leaf, lambda c: _object(c) | st.builds(
    lambda item: {"type": "array", "items": item}, c), max_leaves=5)


def test_replies_cut_by_the_budget_still_parse(real):
    cut = []

    @settings(max_examples=2 * EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(schema=OPEN_SCHEMAS, seed=st.integers(0, 2 ** 31), budget=st.integers(24, 64))
    def check(schema, seed, budget):
        schema = {"type": "object", "properties": {"answer": schema}, "required": ["answer"]}
        body = {"messages": [{"role": "user", "content": "Write a long example JSON value for: " + json.dumps(schema)}],
                "temperature": 1, "seed": seed, "max_tokens": budget,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
        status, reply, _ = real.post("/v1/chat/completions", body, timeout=600)
        assert status == 200, reply
        choice = reply["choices"][0]
        assert choice["finish_reason"] in ("stop", "length"), choice
        assert reply["usage"]["completion_tokens"] <= budget
        _validate(schema, json.loads(choice["message"]["content"]))
        cut.append(choice["finish_reason"] == "length")
    check()
    assert any(cut), "no reply reached its budget: the test did not test the cut"


def test_a_looping_constrained_reply_is_closed_not_cut(tmp_path):
    # the loop guard stops a reply that repeats itself; a constrained one is closed instead (BCLOSE: the engine
    # writes the grammar's shortest completion), so what the client gets still parses
    with real_server(ENGINE, MODEL, tmp_path, CTX, args=("--batch", "2")) as running:
        body = {"messages": [{"role": "user", "content": "Write a list of ones."}], "max_tokens": 600,
                "temperature": 0, "grammar": 'root ::= "[" "1" ( "," "1" )* "]"',
                # no end of turn and no closing bracket unless forced: only the loop guard can end it early
                "logit_bias": {str(i): -100 for i in [0, 2] + [t for t in range(running.svc.tok.n_vocab)
                                                               if b"]" in running.svc.tok.token_bytes(t)]}}
        status, reply, _ = running.post("/v1/chat/completions", body, timeout=600)
        assert status == 200, reply
        text = reply["choices"][0]["message"]["content"]
        value = json.loads(text)
        assert value == [1] * len(value) and 3 < len(value) < 300, text
        assert reply["usage"]["completion_tokens"] < 600    # the loop guard ended it, not max_tokens
        assert reply["choices"][0]["finish_reason"] == "stop" and reply["choices"][0]["strata_finish"] == "loop_guard"

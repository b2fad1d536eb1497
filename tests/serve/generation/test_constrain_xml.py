"""Forced tool calls in the XML form (Qwen3.5 / Qwen3-Coder: `<function=NAME>` + `<parameter=P>` blocks) are
grammar-constrained too (serve/generation/constrain.py): the grammar that reaches the (fake) engine, the opening, the
call as the client reads it; and on the real engine and model, with the XML form switched on, every forced
call's arguments validate against the tool's schema (jsonschema), greedy and sampled."""
import json
import os

import pytest

from serve.generation.constrain import forced_call
from serve.core.events import ToolSpec
from serve.prompt.chatml import ChatTemplate
from tests.conftest import ENGINE_EXE, model_path
from tests.serve.conftest import chat, real_server

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "when": {"type": "string", "format": "date"},
    "detail": {"type": "object", "properties": {"hourly": {"type": "boolean"}}, "required": ["hourly"],
               "additionalProperties": False}},
    "required": ["city", "days"], "additionalProperties": False}


def test_the_opening_and_the_grammar_of_a_named_xml_call():
    opening, grammar = forced_call({"name": "weather"}, [ToolSpec("weather", "", WEATHER)], "xml")
    assert opening == "<tool_call>\n<function=weather>\n<parameter="  # forced_opening's, as before
    root = grammar.splitlines()[0]
    # required parameters first and always, the optional ones each optional, then the closing tags
    assert root.startswith('root ::= "city>\\x0a" t0-p0-root "\\x0a</parameter>\\x0a" '
                           '"<parameter=days>\\x0a" t0-p1-root')
    assert root.count(")?") == 3 and root.endswith('"</function>\\x0a</tool_call>"')
    rules = dict(line.split(" ::= ", 1) for line in grammar.splitlines())
    assert rules["t0-p0-root"] == "[^<]{0,24}"                      # raw text, no quotes
    assert rules["t0-p2-root"] == '"celsius" | "fahrenheit"'
    assert rules["t0-p3-root"] == "t0-p3-date" and "t0-p3-date" in rules
    assert '"true"' in grammar  # the object value is JSON per its schema


def test_forced_xml_call_reaches_the_engine_and_reads_back(cserver):
    s, grammars = cserver({"turns": [{"text": "city>\nParis\n</parameter>\n<parameter=days>\n3\n"
                                              "</parameter>\n</function>\n</tool_call>"}]})
    s.svc.template = ChatTemplate(tool_format="xml")
    tools = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}}]
    status, body, _ = s.post("/v1/chat/completions", chat("weather?", tools=tools, tool_choice="required"))
    assert status == 200, body
    call = body["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "weather" and json.loads(call["arguments"]) == {"city": "Paris", "days": 3}
    assert grammars() == [forced_call("required", [ToolSpec("weather", "", WEATHER)], "xml")[1]]


def test_xml_schema_outside_the_subset_is_a_400(cserver):
    s, grammars = cserver()
    s.svc.template = ChatTemplate(tool_format="xml")
    tools = [{"type": "function", "function": {"name": "t", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "^a"}}}}}]
    status, body, _ = s.post("/v1/chat/completions", chat("x", tools=tools, tool_choice="required"))
    assert status == 400 and "pattern" in body["error"]["message"] and grammars() == []


MODEL = model_path()


@pytest.mark.skipif(not (os.access(ENGINE_EXE, os.X_OK) and MODEL), reason="needs build/strata-engine and the model")
@pytest.mark.parametrize("temperature", [0, 1])
def test_real_model_xml_calls_validate(tmp_path, temperature):
    jsonschema = pytest.importorskip("jsonschema", reason="the independent validator (requirements-test.txt)")
    with real_server(ENGINE_EXE, MODEL, tmp_path, 2048) as run:
        run.svc.template.tool_format = "xml"  # SmolLM2's template is JSON-form; the XML grammar is the test
        tools = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
                 {"type": "function", "function": {"name": "alarm", "parameters": {
                     "type": "object", "properties": {"at": {"type": "string", "format": "time"}},
                     "required": ["at"]}}}]
        schemas = {"weather": WEATHER, "alarm": tools[1]["function"]["parameters"]}
        for k, choice in enumerate(["required", {"type": "function", "function": {"name": "weather"}}, "required"]):
            body = chat(["Weather in Oslo for 3 days?", "Forecast please", "Wake me at 7"][k], tools=tools,
                        tool_choice=choice, temperature=temperature, max_tokens=200)
            status, out, _ = run.post("/v1/chat/completions", body, timeout=600)
            assert status == 200, out
            calls = out["choices"][0]["message"].get("tool_calls")
            assert calls and out["choices"][0]["finish_reason"] == "tool_calls", out
            fn = calls[0]["function"]
            jsonschema.validate(json.loads(fn["arguments"]), schemas[fn["name"]])

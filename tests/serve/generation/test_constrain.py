"""Structured output over the fake engines: which grammar reaches the engine (`grammar=`, recorded by the fake
as it decodes it) for response_format, llama.cpp's json_schema / grammar, forced tool calls on both APIs, on
one slot and in several; the 400s for schemas outside the subset, engine-refused grammars and the output
fields Strata does not implement, and bad log-probability and choice counts."""
import json

import pytest

from serve.generation.constrain import auto_tools_grammar, forced_call
from serve.core.events import BadRequest, ToolSpec
from serve.generation.json_schema import ANY_OBJECT_GRAMMAR, schema_grammar
from tests.serve.conftest import chat

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name"]}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_response_format_json_schema_and_json_object_send_their_grammars(cserver):
    s, grammars = cserver({"turns": [{"text": '{"name": "Ann"}'}]})
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    status, body, _ = s.post("/v1/chat/completions", chat("who?", response_format=rf))
    assert status == 200 and body["choices"][0]["message"]["content"] == '{"name": "Ann"}'
    status, _, _ = s.post("/v1/chat/completions", chat("who?", response_format={"type": "json_object"}))
    assert status == 200
    status, _, _ = s.post("/v1/chat/completions", chat("who?", response_format={"type": "text"}))
    assert status == 200
    assert grammars() == [schema_grammar(PERSON), ANY_OBJECT_GRAMMAR]  # "text" asks for nothing


def test_json_object_with_a_schema_beside_it_follows_that_schema(cserver):
    # llama.cpp's extension {"type": "json_object", "schema": {...}}: its schema, checked like any other
    s, grammars = cserver({"turns": [{"text": '{"name": "Ann"}'}]})
    rf = {"type": "json_object", "schema": PERSON}
    assert s.post("/v1/chat/completions", chat("who?", response_format=rf))[0] == 200
    assert grammars() == [schema_grammar(PERSON)]
    for bad in (123, {"type": 123}, {"type": "hiccup"}):
        status, err, _ = s.post("/v1/chat/completions", chat("who?", response_format={"type": "json_object",
                                                                                      "schema": bad}))
        assert status == 400 and "response_format.schema" in err["error"]["message"]


def test_completions_and_llama_fields_and_streaming(cserver):
    s, grammars = cserver({"turns": [{"text": "yes"}]})
    gbnf = 'root ::= "yes" | "no"\n'
    status, _, _ = s.post("/v1/completions", {"prompt": "ok?", "grammar": gbnf})
    assert status == 200
    status, _, _ = s.post("/v1/completions", {"prompt": "ok?", "response_format": {"type": "json_object"}})
    assert status == 200
    status, events, raw = s.stream(chat("who?", json_schema=PERSON))
    assert status == 200 and raw.endswith("data: [DONE]\n\n")
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) == "yes"
    assert grammars() == [gbnf, ANY_OBJECT_GRAMMAR, schema_grammar(PERSON)]


def test_slots_carry_the_grammar(cserver):
    s, grammars = cserver({"slots": 2}, slots=True)
    status, _, _ = s.post("/v1/chat/completions", chat("q1", response_format={"type": "json_object"}))
    assert status == 200 and grammars() == [ANY_OBJECT_GRAMMAR]


@pytest.mark.parametrize("body, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "(?=a)"}}}},
     "response_format.json_schema.schema", "lookaround"),
    ({"json_schema": {"type": "object", "properties": {"a": {"not": {}}}}}, "json_schema", "'not'"),
    ({"response_format": {"type": "yaml"}}, "response_format", "json_schema"),
    ({"response_format": {"type": "json_object"}, "grammar": 'root ::= "a"'}, "response_format", "one of them"),
    ({"logprobs": "yes"}, "logprobs", "true or false"),
    ({"top_logprobs": 3}, "top_logprobs", "needs logprobs: true"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "from 0 to 20"),
    ({"logprobs": True, "top_logprobs": 2.5}, "top_logprobs", "an integer"),
    ({"n": 0}, "n", "from 1 to 8"),
    ({"n": 9}, "n", "from 1 to 8"),
    ({"n": True}, "n", "an integer"),
    ({"n_probs": 21}, "n_probs", "from 0 to 20"),
    ({"n_probs": 2, "post_sampling_probs": True}, "post_sampling_probs", "not supported"),
    ({"n": 2, "best_of": 3}, "best_of", "not supported"),
])
def test_what_cannot_be_honoured_is_a_400_naming_the_field(cserver, body, param, words):
    s, grammars = cserver()
    status, reply, _ = s.post("/v1/chat/completions", chat("hi", **body))
    assert status == 400 and reply["error"]["param"] == param and words in reply["error"]["message"], reply
    assert grammars() == []


def test_completions_refuse_best_of_and_bad_counts_but_take_their_defaults(cserver):
    s, _ = cserver()
    for field, value, words in (("logprobs", 21, "from 0 to 20"), ("logprobs", True, "an integer"),
                                ("n", 9, "from 1 to 8"), ("best_of", 2, "best_of: not supported"),
                                ("suffix", "x", "not supported")):
        status, reply, _ = s.post("/v1/completions", {"prompt": "hi", field: value})
        assert status == 400 and reply["error"]["param"] == field and words in reply["error"]["message"], reply
    status, reply, _ = s.post("/v1/completions", {"prompt": "hi", "n": 2, "best_of": 3})
    assert status == 400 and reply["error"]["param"] == "best_of"
    status, _, _ = s.post("/v1/completions", {"prompt": "hi", "logprobs": None, "n": 1, "best_of": 1})
    assert status == 200
    status, _, _ = s.post("/v1/chat/completions", chat("hi", logprobs=False, n=1))
    assert status == 200


def test_a_grammar_the_engine_refuses_is_a_400(cserver):
    s, _ = cserver()
    status, reply, _ = s.post("/v1/completions", {"prompt": "hi", "grammar": 'start ::= "a"'})
    assert status == 400 and "root" in reply["error"]["message"]


def test_forced_call_follows_the_tool_schema_on_both_apis(cserver):
    # the opening ends after "arguments": ; the engine (here scripted) writes the arguments and the close
    s, grammars = cserver({"turns": [{"text": '{"city": "Paris"}}\n</tool_call>'}]})
    tools = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}}]
    status, body, _ = s.post("/v1/chat/completions", chat("weather?", tools=tools, tool_choice="required"))
    assert status == 200, body
    call = body["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    anthropic = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "weather?"}],
                 "tools": [{"name": "weather", "input_schema": WEATHER}],
                 "tool_choice": {"type": "tool", "name": "weather"}}
    status, body, _ = s.post("/v1/messages", anthropic)
    assert status == 200, body
    use = [b for b in body["content"] if b["type"] == "tool_use"]
    assert use and use[0]["name"] == "weather" and use[0]["input"] == {"city": "Paris"}
    expected = forced_call({"name": "weather"}, [ToolSpec("weather", "", WEATHER)], "json")[1]
    assert grammars() == [expected, expected]
    assert expected.startswith('root ::= t0-root "}" "\\n" "</tool_call>"')


def test_forced_call_schema_outside_the_subset_is_a_400(cserver):
    s, _ = cserver()
    anthropic = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "x"}],
                 "tools": [{"name": "t", "input_schema": {"type": "object", "properties": {
                     "a": {"type": "string", "pattern": "(a)\\1"}}}}], "tool_choice": {"type": "any"}}
    status, body, _ = s.post("/v1/messages", anthropic)
    assert status == 400 and "pattern: " in body["error"]["message"] and "back references" in body["error"]["message"]


def test_required_choice_over_several_tools_lets_the_grammar_pick_the_name():
    tools = [ToolSpec("a", "", {}), ToolSpec("b", "", WEATHER)]
    opening, grammar = forced_call("required", tools, "json")
    assert opening.endswith('{"name": "')
    assert grammar.splitlines()[0] == ('root ::= ( "a\\", \\"arguments\\": " t0-root | "b\\", \\"arguments\\": " '
                                       't1-root ) "}" "\\n" "</tool_call>"')
    opening, grammar = forced_call("required", tools, "xml")  # the XML form lets the grammar pick it too
    assert opening == "<tool_call>\n<function=" and grammar.startswith('root ::= ( "a>\\x0a" "" | "b>\\x0a" ')


def test_strict_tools_in_auto_mode_send_the_text_or_calls_grammar(cserver):
    s, grammars = cserver({"turns": [{"text": "No call needed."}]})
    tools = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER, "strict": True}}]
    status, body, _ = s.post("/v1/chat/completions", chat("hi", tools=tools))
    assert status == 200 and body["choices"][0]["message"]["content"] == "No call needed."
    status, _, _ = s.post("/v1/chat/completions", chat("hi", tools=tools, parallel_tool_calls=False))
    assert status == 200
    spec = [ToolSpec("weather", "", WEATHER)]
    assert grammars() == [auto_tools_grammar(spec, "json", True), auto_tools_grammar(spec, "json", False)]
    tools[0]["function"]["strict"] = False
    s.post("/v1/chat/completions", chat("hi", tools=tools))
    assert len(grammars()) == 2  # not strict: unconstrained, as before


def test_strict_tools_grammar_shape_and_the_xml_form_is_a_400():
    g = auto_tools_grammar([ToolSpec("weather", "", WEATHER)], "json", False)
    assert g.splitlines()[0] == "root ::= text0 ( call )?"
    assert 'text10 ::= "<" text1 | [^<>] text0 | ' in g.splitlines()  # "<tool_call" cannot go on as text
    with pytest.raises(BadRequest) as e:
        auto_tools_grammar([ToolSpec("weather", "", WEATHER)], "xml", True)
    assert e.value.param == "tools"

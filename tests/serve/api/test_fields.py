"""serve/api/fields.py: the shared request fields are read once, each bad value a 400 naming its field."""
import json

import pytest

from serve.api import fields
from serve.core.events import BadRequest
from serve.generation.json_schema import ANY_OBJECT_GRAMMAR


def _param(fn, *args):
    with pytest.raises(BadRequest) as e:
        fn(*args)
    return e.value.param


def test_n_and_best_of():
    assert fields.check_n({}) == 1 and fields.check_n({"n": 8}) == 8
    assert fields.check_n({"n_cmpl": 3}, "n_cmpl") == 3
    for bad in (0, 9, True, 1.5, "2"):
        assert _param(fields.check_n, {"n": bad}) == "n"
    fields.check_best_of({"best_of": 2}, 2)
    fields.check_best_of({}, 3)
    assert _param(fields.check_best_of, {"best_of": 3}, 2) == "best_of"


def test_logprob_asks():
    assert fields.chat_logprobs({}) is None
    assert fields.chat_logprobs({"logprobs": True}) == 0
    assert fields.chat_logprobs({"logprobs": True, "top_logprobs": 5}) == 5
    assert _param(fields.chat_logprobs, {"top_logprobs": 2}) == "top_logprobs"
    assert _param(fields.chat_logprobs, {"logprobs": 1}) == "logprobs"
    assert fields.completions_logprobs({"logprobs": 3}) == 3
    assert fields.llama_n_probs({"n_probs": 0}) is None and fields.llama_n_probs({"n_probs": 4}) == 4
    assert _param(fields.llama_n_probs, {"post_sampling_probs": True}) == "post_sampling_probs"
    assert fields.llama_n_probs({"n_probs": 2, "post_sampling_probs": True}, True) == 2
    assert fields.responses_logprobs({"include": [fields.RESPONSES_INCLUDE]}) == 0
    assert fields.responses_logprobs({"top_logprobs": 3}) == 3
    assert _param(fields.responses_logprobs, {"include": "x"}) == "include"


def test_openai_grammar():
    assert fields.openai_grammar({}) is None
    assert fields.openai_grammar({"response_format": {"type": "text"}}) is None
    assert fields.openai_grammar({"response_format": {"type": "json_object"}}) == ANY_OBJECT_GRAMMAR
    g = fields.openai_grammar({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}})
    assert g.startswith("root ::=")
    assert fields.openai_grammar({"grammar": 'root ::= "a"'}) == 'root ::= "a"'
    assert _param(fields.openai_grammar, {"grammar": 'root ::= "a"', "json_schema": {}}) == "response_format"
    assert _param(fields.openai_grammar, {"response_format": {"type": "xml"}}) == "response_format"
    assert _param(fields.openai_grammar, {"json_schema": {"type": "object", "patternProperties": {}}}) \
        == "json_schema"


def test_strict_unsupported_and_model():
    assert fields.strict_requested([{"type": "function", "function": {"name": "f", "strict": True}}])
    assert not fields.strict_requested([{"type": "function", "function": {"name": "f"}}])
    fields.refuse_unsupported({"suffix": ""}, ("suffix",))
    assert _param(fields.refuse_unsupported, {"suffix": "x"}, ("suffix",)) == "suffix"
    assert fields.model_field({}) is None and fields.model_field({"model": "m"}) == "m"
    assert _param(fields.model_field, {"model": 3}) == "model"
    assert _param(fields.model_field, {}, True) == "model"


def test_vllm_guided_fields():
    choice = fields.openai_grammar({"guided_choice": ["yes", "no", "yes"]})
    assert choice == 'root ::= "yes" | "no"\n'
    assert fields.openai_grammar({"structured_outputs": {"choice": ["a\"b"]}}) == 'root ::= "a\\"b"\n'
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert fields.openai_grammar({"guided_json": schema}) == fields.openai_grammar({"json_schema": schema})
    assert fields.openai_grammar({"guided_json": json.dumps(schema)}) == fields.openai_grammar({"json_schema": schema})
    assert fields.openai_grammar({"structured_outputs": {"json": schema}}) == fields.openai_grammar({"json_schema": schema})
    assert fields.openai_grammar({"structured_outputs": {"json_object": True}}) == ANY_OBJECT_GRAMMAR
    assert fields.openai_grammar({"guided_grammar": 'root ::= "x"', "guided_decoding_backend": "xgrammar"}) \
        == 'root ::= "x"'
    assert fields.openai_grammar({"guided_regex": r"\d{2}"}) == "root ::= ( [0-9] ){2}\n"
    assert fields.openai_grammar({"structured_outputs": {"regex": "a|b"}}) == 'root ::= "a" | "b"\n'
    for body, param in (({"guided_regex": "(a"}, "guided_regex"),
                        ({"structured_outputs": {"regex": r"(a)\1"}}, "structured_outputs.regex"),
                        ({"structured_outputs": {"lark": "a"}}, "structured_outputs.lark"),
                        ({"guided_choice": []}, "guided_choice"), ({"guided_json": "{no"}, "guided_json"),
                        ({"guided_choice": ["a"], "guided_json": schema}, "response_format"),
                        ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern")):
        assert _param(fields.openai_grammar, body) == param, body

"""Structured output on the Responses and Ollama routes (serve/generation/constrain.py): `text.format` json_object /
json_schema and Ollama `format` "json" / a schema send their grammar to the (fake) engine on chat, generate
and streams; on the real model the replies parse and validate against the schema (jsonschema)."""
import json
import os

import pytest

from serve.generation.json_schema import ANY_OBJECT_GRAMMAR, schema_grammar
from tests.conftest import ENGINE_EXE, model_path
from tests.serve.conftest import real_server

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


def test_responses_text_format_sends_its_grammar(cserver):
    s, grammars = cserver({"turns": [{"text": '{"name": "Ann", "age": 3}'}]})
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    status, body, _ = s.post("/v1/responses", {"input": "who?", "text": {"format": fmt}})
    assert status == 200 and body["text"] == {"format": fmt}, body
    assert json.loads(body["output"][-1]["content"][0]["text"]) == {"name": "Ann", "age": 3}
    status, _, _ = s.post("/v1/responses", {"input": "who?", "stream": True,
                                            "text": {"format": {"type": "json_object"}}})
    assert status == 200
    assert s.post("/v1/responses", {"input": "x", "text": {"format": {"type": "text"}}})[0] == 200
    assert grammars() == [schema_grammar(PERSON), ANY_OBJECT_GRAMMAR]


def test_ollama_format_sends_its_grammar_on_chat_and_generate(cserver):
    s, grammars = cserver({"turns": [{"text": '{"name": "Ann", "age": 3}'}]})
    chat = {"model": "m", "messages": [{"role": "user", "content": "who?"}], "stream": False}
    status, body, _ = s.post("/api/chat", {**chat, "format": PERSON})
    assert status == 200 and json.loads(body["message"]["content"]) == {"name": "Ann", "age": 3}
    assert s.post("/api/generate", {"model": "m", "prompt": "who?", "format": "json", "stream": False})[0] == 200
    assert s.post("/api/chat", {**chat, "format": ""})[0] == 200  # "" asks for nothing
    assert grammars() == [schema_grammar(PERSON), ANY_OBJECT_GRAMMAR]


MODEL = model_path()


@pytest.mark.skipif(not (os.access(ENGINE_EXE, os.X_OK) and MODEL), reason="needs build/strata-engine and the model")
def test_real_model_replies_validate(tmp_path):
    jsonschema = pytest.importorskip("jsonschema", reason="the independent validator (requirements-test.txt)")
    with real_server(ENGINE_EXE, MODEL, tmp_path, 2048) as run:
        fmt = {"type": "json_schema", "name": "person", "schema": PERSON}
        status, body, _ = run.post("/v1/responses", {"input": "Invent a person.", "text": {"format": fmt},
                                                     "max_output_tokens": 120, "temperature": 1}, timeout=600)
        assert status == 200 and body["status"] == "completed", body
        jsonschema.validate(json.loads(body["output"][-1]["content"][0]["text"]), PERSON)
        for path, extra in (("/api/chat", {"messages": [{"role": "user", "content": "Invent a person."}]}),
                            ("/api/generate", {"prompt": "A person as JSON:"})):
            status, body, _ = run.post(path, {"model": "smollm2", "format": PERSON, "stream": False,
                                              "options": {"num_predict": 120, "temperature": 0}, **extra},
                                       timeout=600)
            assert status == 200 and body["done_reason"] == "stop", body
            text = body["message"]["content"] if path == "/api/chat" else body["response"]
            jsonschema.validate(json.loads(text), PERSON)

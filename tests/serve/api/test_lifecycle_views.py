"""With a Lifecycle, the routes that read a model's tokenizer, template or settings (/tokenize, /detokenize,
/v1/messages/count_tokens, /props, /apply-template, input_tokens) answer for the model the body (or the query)
names, never start an engine for it, and answer 404 listing the known models for an unknown name."""
import os

import pytest

from serve.prompt.llama3_gemma import FamilyTemplate
from tests.serve.conftest import lifecycle_servers


@pytest.fixture
def lifecycle_server(tmp_path):
    yield from lifecycle_servers(tmp_path)

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}


def _server(lifecycle_server):
    return lifecycle_server(names=("alpha", "beta"), templates={"beta": FamilyTemplate("llama3")})


def test_template_and_count_routes_answer_for_the_named_model_without_loading_it(lifecycle_server):
    run = _server(lifecycle_server)
    status, alpha, _ = run.post("/apply-template", CHAT)
    assert status == 200 and "<|im_start|>user\nHi<|im_end|>" in alpha["prompt"]   # none named: the default
    status, beta, _ = run.post("/apply-template", {**CHAT, "model": "beta-alias"})
    assert status == 200 and "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" in beta["prompt"]
    counts = {}
    for name in ("alpha", "beta"):
        status, body, _ = run.post("/v1/messages/count_tokens", {**CHAT, "model": name})
        assert status == 200
        counts[name] = body["input_tokens"]
        status, body, _ = run.post("/v1/chat/completions/input_tokens", {**CHAT, "model": name})
        assert status == 200 and body["input_tokens"] == counts[name]
    assert counts["alpha"] != counts["beta"]     # each model's own template, counted by its own tokenizer
    assert run.svc.loads == 0 and not any(os.path.exists(run.rec(n)) for n in ("alpha", "beta"))


def test_tokenize_and_props_name_the_model_and_keep_engines_down(lifecycle_server):
    run = _server(lifecycle_server)
    status, body, _ = run.post("/tokenize", {"content": "Hi", "model": "beta"})
    assert status == 200 and body["tokens"]
    status, text, _ = run.post("/detokenize", {"tokens": body["tokens"], "model": "beta"})
    assert status == 200 and text["content"] == "Hi"
    status, props, _ = run.request("GET", "/props?model=beta-alias")
    assert status == 200 and props["model_alias"] == "beta" and props["is_sleeping"] is True
    assert run.svc.loads == 0 and not os.path.exists(run.rec("beta"))
    assert run.post("/v1/chat/completions", {**CHAT, "model": "beta"})[0] == 200
    status, props, _ = run.request("GET", "/props?model=beta")
    assert status == 200 and props["is_sleeping"] is False
    status, props, _ = run.request("GET", "/props")                      # none named: the loaded one
    assert status == 200 and props["model_alias"] == "beta"


def test_an_unknown_model_is_a_404_listing_the_known_ones(lifecycle_server):
    run = _server(lifecycle_server)
    for method, path, body in (("POST", "/tokenize", {"content": "x", "model": "nope"}),
                               ("POST", "/detokenize", {"tokens": [1], "model": "nope"}),
                               ("POST", "/v1/messages/count_tokens", {**CHAT, "model": "nope"}),
                               ("POST", "/apply-template", {**CHAT, "model": "nope"}),
                               ("GET", "/props?model=nope", None)):
        status, err, _ = run.request(method, path, body)
        assert status == 404, path
        message = err["error"]["message"] if isinstance(err.get("error"), dict) else str(err)
        assert "alpha, alpha-alias, beta, beta-alias" in message, path
    assert run.post("/tokenize", {"content": "x", "model": 7})[0] == 400
    assert run.svc.loads == 0

"""Ollama's routes and /v1/models with several models (a Lifecycle over fake engines): /api/show answers for any
configured model by name, alias or NAME:latest (`model` or the older `name`) without loading it; /api/tags lists
every model and alias; a request naming NAME:latest runs on that model; /v1/models lists each model once with
its `aliases`, as llama-server does."""
import json

import pytest

from tests.serve.conftest import lifecycle_servers


@pytest.fixture
def lifecycle_server(tmp_path):
    yield from lifecycle_servers(tmp_path)


def test_show_answers_for_every_configured_model_without_loading_it(lifecycle_server):
    run = lifecycle_server()
    for body in ({"model": "beta:latest"}, {"model": "beta-alias"}, {"name": "beta-alias:latest"},
                 {"model": "alpha"}):
        status, show, _ = run.post("/api/show", body)
        want = body.get("model", body.get("name")).split(":")[0].replace("-alias", "")
        assert status == 200 and show["model_info"]["general.name"] == want, body
        assert "completion" in show["capabilities"]
    assert run.svc.loads == 0   # nothing was loaded to answer
    status, err, _ = run.post("/api/show", {"model": "gamma:latest"})
    assert status == 404 and isinstance(err["error"], str) and "alpha" in err["error"]


def test_tags_list_every_model_and_latest_names_run(lifecycle_server):
    run = lifecycle_server()
    names = [m["name"] for m in run.request("GET", "/api/tags")[1]["models"]]
    assert names == ["alpha:latest", "alpha-alias:latest", "beta:latest", "beta-alias:latest"]
    for name, want in (("beta:latest", "I am beta."), ("alpha-alias:latest", "I am alpha.")):
        status, raw, _ = run.post("/api/chat", {"model": name, "stream": False,
                                                "messages": [{"role": "user", "content": "hi"}]})
        assert status == 200 and raw["message"]["content"] == want, name
    status, body, _ = run.post("/v1/chat/completions", {"model": "beta:latest",
                                                        "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and body["choices"][0]["message"]["content"] == "I am beta."


def test_v1_models_lists_each_model_once_with_its_aliases(lifecycle_server, server):
    run = lifecycle_server()
    data = run.request("GET", "/v1/models")[1]["data"]
    assert [(m["id"], m["aliases"]) for m in data] == [("alpha", ["alpha-alias"]), ("beta", ["beta-alias"])]
    one = server(config={"aliases": ["smol", "tiny"]})
    data = one.request("GET", "/v1/models")[1]["data"]
    assert [(m["id"], m["aliases"]) for m in data] == [("fake-model", ["smol", "tiny"])]
    assert json.dumps(data).count("alias_of") == 0


def test_one_model_answers_any_name_on_request_routes_but_show_stays_strict(lifecycle_server):
    """With one model every request route (tokenizer and template ones too) runs on it whatever `model` says,
    as llama-server; Ollama's /api/show answers only its own names (clients ask it whether a model exists)."""
    run = lifecycle_server(names=("alpha",))
    msg = {"model": "claude-test", "messages": [{"role": "user", "content": "hi"}]}
    status, body, _ = run.post("/v1/messages/count_tokens", msg)
    assert status == 200 and body["input_tokens"] > 0
    assert run.post("/tokenize", {"model": "gpt-3.5-turbo", "content": "hi"})[0] == 200
    assert run.post("/api/show", {"model": "alpha:latest"})[0] == 200
    assert run.post("/api/show", {"model": "llama3"})[0] == 404
    assert run.post("/v1/load", {"model": "llama3"})[0] == 404

"""Ollama's routes and /v1/models with several models (a Lifecycle over fake engines): /api/show answers for any
configured model by name, alias or NAME:latest (`model` or the older `name`) without loading it; /api/tags lists
every model and alias; a request naming NAME:latest runs on that model; /v1/models lists each model once with
its `aliases`, as llama-server does."""
import hashlib
import http.client
import ipaddress
import json
import socket
import stat
import time
from datetime import datetime

import psutil
import pytest

from tests.serve.conftest import lifecycle_servers, wait_until


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


# ---------------------------------------------------------------- model management (serve/api/ollama_models.py)
def _prompt(rec_file) -> str:
    """The text of the last BGEN the fake engine was sent (byte tokenizer: ids under 256 are bytes)."""
    gens = [ln for ln in open(rec_file, encoding="utf-8").read().splitlines() if ln.split()[:1] == ["BGEN"]]
    ids = [int(x) for x in gens[-1].split()[-1].split(",")]
    return bytes(i for i in ids if i < 256).decode("utf-8", "replace")


def _ndjson_post(run, path, body):
    """(status, the NDJSON lines) of a streamed answer."""
    c = run.conn()
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    lines = [json.loads(line) for line in r.read().decode().splitlines() if line.strip()]
    c.close()
    return r.status, lines


def test_create_from_a_model_with_settings_applies_them_on_ollama_routes(lifecycle_server, tmp_path):
    run = lifecycle_server(store=tmp_path / "store")
    status, lines = _ndjson_post(run, "/api/create", {
        "model": "pirate", "from": "alpha", "system": "Talk like a pirate.",
        "parameters": {"temperature": 0.25, "stop": ["<end>"]},
        "messages": [{"role": "user", "content": "Ahoy?"}, {"role": "assistant", "content": "Arr."}]})
    assert status == 200 and lines[-1] == {"status": "success"}
    status, body, _ = run.post("/api/chat", {"model": "pirate:latest", "stream": False,
                                             "messages": [{"role": "user", "content": "hello"}]})
    assert status == 200 and body["message"]["content"] == "I am alpha.", body
    prompt = _prompt(run.gen("alpha"))
    assert prompt.index("Talk like a pirate.") < prompt.index("Ahoy?") < prompt.index("Arr.") < prompt.index("hello")
    gens = open(run.gen("alpha")).read().splitlines()
    assert "temp=0.25" in gens[-1] or "temperature=0.25" in gens[-1], gens[-1]
    # the request's own system turn and options win
    run.post("/api/chat", {"model": "pirate", "stream": False, "options": {"temperature": 0.5},
                           "messages": [{"role": "system", "content": "Be terse."},
                                        {"role": "user", "content": "hi"}]})
    prompt = _prompt(run.gen("alpha"))
    assert "Be terse." in prompt and "pirate" not in prompt and "Ahoy?" in prompt
    status, show, _ = run.post("/api/show", {"model": "pirate"})
    assert status == 200 and show["system"] == "Talk like a pirate." and show["details"]["parent_model"] == "alpha"
    assert "temperature" in show["parameters"] and '"<end>"' in show["parameters"]
    assert show["modelfile"].startswith("FROM alpha\n") and 'SYSTEM "Talk like a pirate."' in show["modelfile"]
    names = [m["name"] for m in run.request("GET", "/api/tags")[1]["models"]]
    assert "pirate:latest" in names


def test_a_created_models_settings_apply_on_the_openai_chat_route_as_ollamas_do(lifecycle_server, tmp_path):
    """/v1/chat/completions naming a created model runs through the same settings as Ollama's chat (Ollama's
    OpenAI route is its chat handler): the system turn, the turns, and the parameters the request leaves out
    (num_predict as max_tokens); not temperature or top_p, which Ollama's OpenAI route sets to 1.0 itself. The
    request's own fields and system turn win, and a model not created gets nothing."""
    run = lifecycle_server(store=tmp_path / "store")
    status, body, _ = run.post("/api/create", {
        "model": "pirate", "from": "alpha", "system": "Talk like a pirate.", "stream": False,
        "parameters": {"temperature": 0.25, "top_k": 7, "seed": 11, "num_predict": 5},
        "messages": [{"role": "user", "content": "Ahoy?"}, {"role": "assistant", "content": "Arr."}]})
    assert status == 200 and body == {"status": "success"}
    status, body, _ = run.post("/v1/chat/completions", {"model": "pirate",
                                                        "messages": [{"role": "user", "content": "hello"}]})
    assert status == 200 and body["choices"][0]["message"]["content"] == "I am "   # 5 tokens (num_predict)
    prompt = _prompt(run.gen("alpha"))
    assert prompt.index("Talk like a pirate.") < prompt.index("Ahoy?") < prompt.index("Arr.") < prompt.index("hello")
    gen = open(run.gen("alpha")).read().splitlines()[-1].split()
    assert gen[2] == "5" and "top_k=7" in gen and "seed=11" in gen and not any("0.25" in w for w in gen), gen
    run.post("/v1/chat/completions", {"model": "pirate", "max_tokens": 3, "top_k": 2, "temperature": 0.5,
                                      "messages": [{"role": "system", "content": "Be terse."},
                                                   {"role": "user", "content": "hi"}]})
    prompt = _prompt(run.gen("alpha"))
    assert "Be terse." in prompt and "pirate" not in prompt and "Ahoy?" in prompt
    gen = open(run.gen("alpha")).read().splitlines()[-1].split()
    assert gen[2] == "3" and "top_k=2" in gen, gen
    run.post("/v1/chat/completions", {"model": "alpha", "messages": [{"role": "user", "content": "plain"}]})
    prompt = _prompt(run.gen("alpha"))
    assert "Ahoy?" not in prompt and "pirate" not in prompt and "plain" in prompt
    assert "top_k=7" not in open(run.gen("alpha")).read().splitlines()[-1].split()


def test_a_modelfile_is_read_and_what_strata_does_not_do_is_refused_by_name(lifecycle_server, tmp_path):
    run = lifecycle_server(store=tmp_path / "store")
    text = ('# a comment\nFROM beta\nPARAMETER temperature 0.7\nPARAMETER stop "<x>"\nPARAMETER stop "<y>"\n'
            'SYSTEM """Line one.\nLine two."""\nMESSAGE user Hi there\nMESSAGE assistant "Hello!"\n')
    status, body, _ = run.post("/api/create", {"model": "mf", "modelfile": text, "stream": False})
    assert status == 200 and body == {"status": "success"}
    show = run.post("/api/show", {"model": "mf"})[1]
    assert show["system"] == "Line one.\nLine two." and show["messages"][1] == {"role": "assistant",
                                                                                "content": "Hello!"}
    assert show["parameters"].count("stop") == 2
    for extra, named in (({"modelfile": "FROM beta\nTEMPLATE {{ .Prompt }}"}, "TEMPLATE"),
                         ({"modelfile": "FROM beta\nADAPTER ./lora.gguf"}, "ADAPTER"),
                         ({"from": "beta", "quantize": "q4_K_M"}, "quantize"),
                         ({"from": "beta", "template": "{{ .Prompt }}"}, "template"),
                         ({"from": "beta", "adapters": {"a": "sha256:" + "0" * 64}}, "adapters"),
                         ({"modelfile": "FROM beta\nPARAMETER mirostat_gamma 2"}, "mirostat_gamma"),
                         ({"modelfile": "PARAMETER temperature 1"}, "FROM"),
                         ({"from": "gamma"}, "not found")):
        status, err, _ = run.post("/api/create", {"model": "bad", "stream": False, **extra})
        assert status in (400, 404) and named in err["error"], (extra, err)
    assert run.post("/api/create", {"model": "alpha", "from": "beta", "stream": False})[0] == 409


def _outside_address() -> str | None:
    """An IPv4 address of this machine other than loopback, None when it has none."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback:
                return a.address
    return None


def test_create_from_a_file_path_is_only_for_a_trusted_client(lifecycle_server, tmp_path):
    """`from: /abs/path.gguf` reads a file of the server's machine: a keyless server allows it to a client on
    loopback and refuses it (403 naming `from`, the way to upload instead) to one that comes over another
    address; that client may still create from a model. A keyed server allows it with the key."""
    address = _outside_address()
    if address is None:
        pytest.skip("this machine has no address but loopback: no client can come from elsewhere")
    gguf = tmp_path / "own.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))
    run = lifecycle_server(store=tmp_path / "store", host="0.0.0.0", allowed_hosts=[address])
    outside = http.client.HTTPConnection(address, run.port, timeout=10)
    outside.request("POST", "/api/create", body=json.dumps({"model": "far", "from": str(gguf), "stream": False}),
                    headers={"Content-Type": "application/json"})
    r = outside.getresponse()
    err = json.loads(r.read())
    assert r.status == 403 and "trusted" in err["error"] and "blob" in err["error"], err
    outside.request("POST", "/api/create", body=json.dumps({"model": "far", "from": "alpha", "stream": False}),
                    headers={"Content-Type": "application/json"})
    r = outside.getresponse()
    assert r.status == 200 and json.loads(r.read()) == {"status": "success"}
    outside.close()
    status, body, _ = run.post("/api/create", {"model": "near", "from": str(gguf), "stream": False})
    assert status == 200 and body == {"status": "success"}
    keyed = lifecycle_server(store=tmp_path / "store-keyed", api_keys=["k"])
    assert keyed.post("/api/create", {"model": "near", "from": str(gguf), "stream": False})[0] == 401
    status, body, _ = keyed.post("/api/create", {"model": "near", "from": str(gguf), "stream": False},
                                 headers={"Authorization": "Bearer k"})
    assert status == 200 and body == {"status": "success"}


def test_blobs_copy_delete_and_a_restart_keep_the_created_models(lifecycle_server, tmp_path):
    store = tmp_path / "store"
    run = lifecycle_server(store=store)
    data = b"GGUF" + bytes(range(256)) * 64
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert run.request("HEAD", f"/api/blobs/{digest}")[0] == 404
    status, err, _ = run.post(f"/api/blobs/sha256:{'0' * 64}", data)
    assert status == 400 and "sha256" in err["error"]
    assert run.post(f"/api/blobs/{digest}", data)[0] == 201
    assert run.request("HEAD", f"/api/blobs/{digest}")[0] == 200
    assert run.request("HEAD", "/api/blobs/sha256:xyz")[0] == 400
    blob = store / "blobs" / f"sha256-{digest[7:]}"
    assert blob.read_bytes() == data and stat.S_IMODE(blob.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.stat().st_mode) == 0o700
    status, _, _ = run.post("/api/create", {"model": "mine", "files": {"m.gguf": digest}, "stream": False,
                                            "parameters": {"num_ctx": 1024}})
    assert status == 200
    status, body, _ = run.post("/api/chat", {"model": "mine", "stream": False,
                                             "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and body["message"]["content"] == "I am mine."   # its own engine
    assert run.post("/api/copy", {"source": "mine", "destination": "mine2"})[0] == 200
    assert run.post("/api/copy", {"source": "nope", "destination": "x"})[0] == 404
    records = list((store / "models").iterdir())
    assert len(records) == 2 and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in records)
    status, err, _ = run.request("DELETE", "/api/delete", {"model": "alpha"})
    assert status == 400 and "only models made with /api/create" in err["error"]
    assert run.request("DELETE", "/api/delete", {"model": "nope"})[0] == 404
    assert run.request("DELETE", "/api/delete", {"model": "mine"})[0] == 200
    status, body, _ = run.post("/api/chat", {"model": "mine2", "stream": False,
                                             "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and body["message"]["content"] == "I am mine."   # the copy keeps the file's engine
    assert run.post("/api/show", {"model": "mine"})[0] == 404
    # a new server over the same folder serves what was created
    again = lifecycle_server(store=store)
    names = [m["name"] for m in again.request("GET", "/api/tags")[1]["models"]]
    assert "mine2:latest" in names and "mine:latest" not in names
    assert again.post("/api/show", {"model": "mine2"})[1]["parameters"].startswith("num_ctx")


def test_keep_alive_unloads_keeps_or_times_a_model(lifecycle_server, tmp_path):
    run = lifecycle_server(lazy=False, store=tmp_path / "store")
    assert [m["name"] for m in run.request("GET", "/api/ps")[1]["models"]] == ["alpha:latest"]
    assert run.request("GET", "/api/ps")[1]["models"][0]["expires_at"].startswith("2318")   # never idle-unloaded
    chat = {"model": "alpha", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
    assert run.post("/api/chat", {**chat, "keep_alive": "10m"})[0] == 200
    expires = run.request("GET", "/api/ps")[1]["models"][0]["expires_at"]
    left = datetime.fromisoformat(expires.replace("Z", "+00:00")).timestamp() - time.time()
    assert 590 < left <= 600, expires
    status, body, _ = run.post("/api/generate", {"model": "alpha", "prompt": "", "keep_alive": 0})
    assert status == 200 and body["done_reason"] == "unload"
    assert run.request("GET", "/api/ps")[1]["models"] == [] and run.svc.loaded_entries() == []
    assert run.post("/api/chat", {**chat, "keep_alive": -1})[0] == 200     # loads it again, to stay
    assert run.request("GET", "/api/ps")[1]["models"][0]["expires_at"].startswith("2318")
    assert run.post("/api/chat", {**chat, "keep_alive": 0})[0] == 200      # answered, then unloaded
    assert wait_until(lambda: run.svc.loaded_entries() == [])
    assert run.post("/api/chat", {**chat, "keep_alive": "soon"})[0] == 400


def test_pull_and_push_say_there_are_no_downloads(lifecycle_server):
    run = lifecycle_server()
    for path in ("/api/pull", "/api/push"):
        status, err, _ = run.post(path, {"model": "llama3"})
        assert status == 501 and "no downloads" in err["error"] and "/api/create" in err["error"]

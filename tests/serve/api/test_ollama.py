"""The Ollama API over the fake engine: views, options mapping, refusals, NDJSON, figures.
The exact answers of chat / generate are golden files (tests/serve/api/test_dialect_golden.py)."""
import http.client
import json

import pytest

from serve.api import ollama


def _lines(raw: str):
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


def _post(s, path, body):
    c = s.conn()
    c.request("POST", path, body=json.dumps(body))
    r = c.getresponse()
    try:
        raw = r.read()
    except http.client.IncompleteRead as e:   # a stream cut short (an error line): no last chunk
        raw = e.partial
    c.close()
    return r.status, r.getheader("Content-Type"), raw.decode()


def test_views(server, tmp_path):
    s = server(config={"aliases": ["smol"]})
    gguf = tmp_path / "Model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    s.svc.model_path = str(gguf)
    assert s.request("GET", "/api/version")[1] == {"version": ollama.API_VERSION}
    models = s.request("GET", "/api/tags")[1]["models"]
    assert [m["name"] for m in models] == ["fake-model:latest", "smol:latest"]
    assert models[0]["size"] == 64 and models[0]["details"]["quantization_level"] == "Q4_1"
    assert len(models[0]["digest"]) == 64 and models[0]["details"]["format"] == "gguf"
    status, show, _ = s.post("/api/show", {"model": "smol:latest"})
    assert status == 200 and "completion" in show["capabilities"] and "tools" in show["capabilities"]
    assert show["modelfile"].startswith("FROM ") and "model_info" in show
    status, err, _ = s.post("/api/show", {"model": "llama3"})
    assert status == 404 and isinstance(err["error"], str) and "fake-model" in err["error"]
    ps = s.request("GET", "/api/ps")[1]["models"]
    assert ps[0]["name"] == "fake-model:latest" and ps[0]["context_length"] == 2048


@pytest.mark.parametrize("method,path", [("POST", "/api/pull"), ("POST", "/api/push")])
def test_no_hub_is_a_clear_501(server, method, path):
    s = server()
    status, err, _ = s.request(method, path, {"model": "x"})
    assert status == 501 and isinstance(err["error"], str) and "no downloads" in err["error"]


def test_stream_is_the_default_and_ndjson(server):
    s = server({"turns": [{"text": "Hi."}]})
    status, ctype, raw = _post(s, "/api/chat", {"model": "m", "messages": [{"role": "user", "content": "x"}]})
    lines = _lines(raw)
    assert status == 200 and ctype == "application/x-ndjson" and lines[-1]["done"] is True
    assert "".join(line["message"]["content"] for line in lines) == "Hi."


def test_options_map_onto_the_engine_and_durations_are_nanoseconds(server, tmp_path):
    gens = tmp_path / "gens.txt"
    s = server({"turns": [{"text": "abcdefgh"}], "record_gen": str(gens)})
    status, body, _ = s.post("/api/generate", {
        "model": "m", "prompt": "x", "stream": False, "keep_alive": "10m",
        "options": {"temperature": 0.3, "top_k": 5, "top_p": 0.9, "seed": 7, "repeat_penalty": 1.2,
                    "num_predict": 3, "num_ctx": 4096, "stop": ["zz"], "mirostat": 2}})
    assert status == 200, body
    line = gens.read_text().splitlines()[-1]
    assert line.startswith("BGEN 0 3 ")
    for key in ("temperature=0.3", "top_k=5", "top_p=0.9", "seed=7", "penalty_repeat=1.2", "mirostat=2",
                "mirostat_tau=5.0", "mirostat_eta=0.1"):
        assert key in line.split()
    assert body["response"] == "abc" and body["done_reason"] == "length" and body["eval_count"] == 3
    timings = s.svc.history[-1]["timings"]
    assert body["eval_duration"] == int(timings["predicted_ms"] * 1_000_000)
    assert body["prompt_eval_duration"] == int(timings["prompt_ms"] * 1_000_000)
    assert body["total_duration"] >= body["eval_duration"] and body["prompt_eval_count"] == timings["prompt_n"]


@pytest.mark.parametrize("body,status,param_word", [
    ({"options": {"temperature": "hot"}}, 400, "options"),
    ({"options": {"num_predict": 1.5}}, 400, "num_predict"),
    ({"options": {"num_ctx": 4}}, 400, "num_ctx"),       # the prompt is longer: never truncated
    ({"options": {"tfs_z": 0.9}}, 400, "tfs_z"),         # a sampler this server does not have: named, not ignored
    ({"options": {"mirostat": 3}}, 400, "mirostat"),
    ({"options": []}, 400, "options"),
    ({"keep_alive": "soon"}, 400, "keep_alive"),
    ({"format": "yaml"}, 400, "format"),
    ({"format": {"type": "string", "pattern": "(?=a)"}}, 400, "format"),  # outside the schema subset
    ({"think": "very"}, 400, "think"),
    ({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, 400, "images"),
])
def test_refusals_name_the_field(server, body, status, param_word):
    s = server()
    got, err, _ = s.post("/api/chat", {"model": "m", "messages": [{"role": "user", "content": "x" * 20}],
                                       "stream": False, **body})
    assert got == status and param_word in err["error"], err


def test_keep_alive_forms_are_accepted(server):
    s = server()
    for value in ("5m", "1h30m", "-1", 300, -1, 0, None, "0"):
        status, err, _ = s.post("/api/chat", {"model": "m", "messages": [], "keep_alive": value})
        assert status == 200, (value, err)


def test_empty_messages_or_prompt_answer_load(server):
    s = server()
    assert s.post("/api/chat", {"model": "m", "messages": []})[1]["done_reason"] == "load"
    assert s.post("/api/generate", {"model": "m"})[1]["done_reason"] == "load"


def test_think_and_tool_history(server):
    assert ollama._think(True) == "medium" and ollama._think(False) == "none" and ollama._think("high") == "high"
    msgs = ollama._messages([{"role": "user", "content": "w?"},
                             {"role": "assistant", "content": "", "thinking": "need tool",
                              "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "P"}}}]},
                             {"role": "tool", "content": "sunny", "tool_name": "get_weather"}])
    assert msgs[1].reasoning == "need tool" and msgs[1].tool_calls[0].arguments == {"city": "P"}
    assert msgs[2].name == "get_weather"


def test_thinking_comes_as_its_own_field(server):
    s = server({"turns": [{"text": "<think>Hm.</think>Yes."}]})
    status, _, raw = _post(s, "/api/chat", {"model": "m", "messages": [{"role": "user", "content": "q"}],
                                            "think": True})
    lines = _lines(raw)
    assert "".join(line["message"].get("thinking", "") for line in lines) == "Hm."
    assert "".join(line["message"]["content"] for line in lines) == "Yes."


def test_error_after_the_first_line_is_a_last_error_line(server):
    s = server({"turns": [{"text": "abcdef", "die_after": 2}]})
    _, _, raw = _post(s, "/api/generate", {"model": "m", "prompt": "x", "raw": True})
    assert "error" in _lines(raw)[-1]
    c = s.conn()   # the error line ends the stream visibly incomplete: no last chunk
    c.request("POST", "/api/generate", body=json.dumps({"model": "m", "prompt": "x", "raw": True}))
    with pytest.raises(http.client.IncompleteRead):
        c.getresponse().read()
    c.close()

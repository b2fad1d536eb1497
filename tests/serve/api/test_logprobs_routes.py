"""Log-probabilities on the Responses and Ollama routes over the fake engine (its T lines carry lp=-0.5 and
the top ids tok, tok+1, ... at -0.5, -1.5, ...): Responses `include: ["message.output_text.logprobs"]` /
`top_logprobs` on the output_text part and each text delta; Ollama's `logprobs` / `top_logprobs` (0.12.11's
shape) on /api/chat and /api/generate, JSON and NDJSON; the engine is asked only when the request asks; bad
values are a 400 naming the field."""
import json

from tests.serve.conftest import gen_keys

H = {"token": "h", "logprob": -0.5, "bytes": [104]}
I = {"token": "i", "logprob": -0.5, "bytes": [105]}


def _asked(record):
    return [gen_keys(line).get("logprobs") for line in record.read_text().splitlines()]


def test_responses_logprobs_json_and_stream(server, tmp_path):
    record = tmp_path / "gen.txt"
    s = server({"turns": [{"text": "hi"}], "record_gen": str(record)})
    status, body, _ = s.post("/v1/responses", {"input": "q", "include": ["message.output_text.logprobs"],
                                               "top_logprobs": 1})
    assert status == 200, body
    part = body["output"][-1]["content"][0]
    assert part["text"] == "hi"
    assert part["logprobs"] == [{**H, "top_logprobs": [H]}, {**I, "top_logprobs": [I]}]
    status, text, _ = s.post("/v1/responses", {"input": "q", "top_logprobs": 2, "stream": True})
    events = [json.loads(b.split("data: ", 1)[1]) for b in text.split("\n\n") if "data: " in b]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [[t["token"] for t in d["logprobs"]] for d in deltas] == [["h"], ["i"]]
    assert [t["token"] for t in deltas[0]["logprobs"][0]["top_logprobs"]] == ["h", "i"]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert [t["token"] for t in done["logprobs"]] == ["h", "i"]
    status, body, _ = s.post("/v1/responses", {"input": "q", "include": ["reasoning.encrypted_content"]})
    assert status == 200 and body["output"][-1]["content"][0]["logprobs"] == []
    assert _asked(record) == ["1", "2", None]  # nothing asked, nothing computed
    for bad, param in (({"top_logprobs": 21}, "top_logprobs"), ({"include": "message.output_text.logprobs"},
                                                                "include")):
        status, body, _ = s.post("/v1/responses", {"input": "q", **bad})
        assert status == 400 and body["error"]["param"] == param, body


def test_ollama_logprobs_chat_and_generate(server, tmp_path):
    record = tmp_path / "gen.txt"
    s = server({"turns": [{"text": "hi"}], "record_gen": str(record)})
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": "q"}], "stream": False}
    status, body, _ = s.post("/api/chat", {**chat, "logprobs": True, "top_logprobs": 1})
    assert status == 200, body
    assert body["message"]["content"] == "hi"
    assert body["logprobs"] == [{**H, "top_logprobs": [H]}, {**I, "top_logprobs": [I]}]
    c = s.conn()
    c.request("POST", "/api/generate", body=json.dumps({"model": "fake-model", "prompt": "q", "logprobs": True}))
    lines = [json.loads(line) for line in c.getresponse().read().decode().splitlines() if line.strip()]
    c.close()
    pieces = [obj for obj in lines if not obj["done"]]
    assert [obj["logprobs"] for obj in pieces] == [[{**H, "top_logprobs": []}], [{**I, "top_logprobs": []}]]
    assert "logprobs" not in lines[-1]
    status, body, _ = s.post("/api/chat", chat)
    assert status == 200 and "logprobs" not in body
    assert _asked(record) == ["1", "0", None]
    for bad, param in (({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": "yes"}, "logprobs"),
                       ({"logprobs": True, "top_logprobs": 21}, "top_logprobs")):
        status, body, _ = s.post("/api/chat", {**chat, **bad})
        assert status == 400 and param in body["error"], body


def test_ollama_partial_utf8_token_bytes(server):
    s = server({"turns": [{"text": "é"}]})
    status, body, _ = s.post("/api/generate", {"model": "fake-model", "prompt": "q", "stream": False,
                                               "logprobs": True})
    assert status == 200 and body["response"] == "é"
    assert [(t["token"], t["bytes"]) for t in body["logprobs"]] == [("\ufffd", [195]), ("\ufffd", [169])]


def test_llama_post_sampling_probs(server, tmp_path):
    """/completion's post_sampling_probs: the engine is asked for the draw's distribution (lp_post=1) and the
    answer has llama-server's `prob` / `top_probs` (probabilities); elsewhere it stays a 400."""
    record = tmp_path / "gen.txt"
    s = server({"turns": [{"text": "ab"}], "record_gen": str(record)})
    status, body, _ = s.post("/completion", {"prompt": "q", "n_probs": 2, "post_sampling_probs": True})
    assert status == 200, body
    first = body["completion_probabilities"][0]
    assert first["id"] == 97 and first["token"] == "a" and abs(first["prob"] - 0.6065307) < 1e-6
    assert "logprob" not in first and [(p["token"], round(p["prob"], 4)) for p in first["top_probs"]] == [
        ("a", 0.6065), ("b", 0.2231)]
    status, events, _ = s.stream({"prompt": "q", "n_probs": 1, "post_sampling_probs": True}, path="/completion")
    assert [e["completion_probabilities"][0]["top_probs"][0]["token"] for e in events if not e["stop"]] == ["a", "b"]
    assert [gen_keys(line).get("lp_post") for line in record.read_text().splitlines()] == ["1", "1"]
    status, body, _ = s.post("/completion", {"prompt": "q", "n_probs": 2, "post_sampling_probs": "yes"})
    assert status == 400 and "post_sampling_probs" in json.dumps(body)

"""Log-probabilities and several choices over the fake engines: the `logprobs=K` key reaches the engine only
when asked; the fakes' T/BT log-probabilities come back in OpenAI chat (JSON and stream), completions' legacy
shape and llama.cpp's `completion_probabilities`; partial UTF-8 tokens carry their bytes; `n` choices (one slot:
one after another; several slots: the later ones admitted once the first has read the prompt, reusing it), their
`index` in streams, seeds seed, seed+1, ... and usage that counts the prompt once; a client that leaves stops
every choice."""
import json
import random
import time
from tests.serve.conftest import chat
from tests.serve.conftest import gen_keys


def _lines(path, word):
    return [line.split(" ", 1)[1] for line in path.read_text().splitlines() if line.split(" ", 2)[1] == word]


def test_chat_logprobs_json_and_stream(server, tmp_path):
    record = tmp_path / "gen.txt"
    s = server({"turns": [{"text": "hi"}], "record_gen": str(record)})
    status, body, _ = s.post("/v1/chat/completions", chat("q", logprobs=True, top_logprobs=2))
    assert status == 200, body
    content = body["choices"][0]["logprobs"]["content"]
    assert content == [
        {"token": "h", "logprob": -0.5, "bytes": [104], "top_logprobs": [
            {"token": "h", "logprob": -0.5, "bytes": [104]}, {"token": "i", "logprob": -1.5, "bytes": [105]}]},
        {"token": "i", "logprob": -0.5, "bytes": [105], "top_logprobs": [
            {"token": "i", "logprob": -0.5, "bytes": [105]}, {"token": "j", "logprob": -1.5, "bytes": [106]}]}]
    status, events, _ = s.stream(chat("q", logprobs=True))
    assert status == 200
    streamed = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert [e["choices"][0]["logprobs"]["content"][0]["token"] for e in streamed] == ["h", "i"]
    assert all(e["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == [] for e in streamed)
    status, body, _ = s.post("/v1/chat/completions", chat("q"))
    assert status == 200 and "logprobs" not in body["choices"][0]
    status, body, _ = s.post("/v1/chat/completions", chat("q", n_probs=1))  # llama.cpp's name on this route
    assert [len(c["top_logprobs"]) for c in body["choices"][0]["logprobs"]["content"]] == [1, 1]
    keys = [gen_keys(line).get("logprobs") for line in record.read_text().splitlines()]
    assert keys == ["2", "0", None, "1"]  # nothing asked, nothing computed


def test_partial_utf8_tokens_carry_their_bytes(server):
    s = server({"turns": [{"text": "é!"}]})
    status, body, _ = s.post("/v1/chat/completions", chat("q", logprobs=True))
    assert status == 200 and body["choices"][0]["message"]["content"] == "é!"
    content = body["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == ["bytes:\\xc3", "bytes:\\xa9", "!"]
    assert bytes(b for c in content for b in c["bytes"]) == "é!".encode()
    status, body, _ = s.post("/completion", {"prompt": "q", "n_probs": 1})
    probs = body["completion_probabilities"]
    assert [p["token"] for p in probs] == ["", "", "!"] and [p["bytes"] for p in probs] == [[195], [169], [33]]
    assert probs[0]["id"] == 195 and probs[0]["top_logprobs"] == [{"id": 195, "token": "", "bytes": [195],
                                                                  "logprob": -0.5}]


def test_completions_legacy_logprobs(server):
    s = server({"turns": [{"text": "ok"}]})
    status, body, _ = s.post("/v1/completions", {"prompt": "hey", "logprobs": 1})
    assert status == 200, body
    assert body["choices"][0]["logprobs"] == {"tokens": ["o", "k"], "token_logprobs": [-0.5, -0.5],
                                              "top_logprobs": [{"o": -0.5}, {"k": -0.5}], "text_offset": [0, 1]}
    status, body, _ = s.post("/v1/completions", {"prompt": "hey", "logprobs": 0, "echo": True})
    assert body["choices"][0]["logprobs"]["text_offset"] == [3, 4]
    assert body["choices"][0]["logprobs"]["top_logprobs"] == [{}, {}]
    status, events, _ = s.stream({"prompt": "hey", "logprobs": 0}, path="/v1/completions")
    pieces = [e["choices"][0] for e in events if e["choices"] and e["choices"][0]["text"]]
    assert [(p["text"], p["logprobs"]["text_offset"]) for p in pieces] == [("o", [0]), ("k", [1])]
    status, body, _ = s.post("/v1/completions", {"prompt": "hey"})
    assert body["choices"][0]["logprobs"] is None


def test_llama_completion_n_probs_stream_and_settings(server):
    s = server({"turns": [{"text": "ab"}]})
    status, body, _ = s.post("/completion", {"prompt": "q", "n_probs": 2})
    assert status == 200 and body["generation_settings"]["n_probs"] == 2
    assert [p["token"] for p in body["completion_probabilities"]] == ["a", "b"]
    assert body["completion_probabilities"][1]["top_logprobs"][1] == {"id": 99, "token": "c", "bytes": [99],
                                                                      "logprob": -1.5}
    status, events, _ = s.stream({"prompt": "q", "n_probs": 1}, path="/completion")
    chunks = [e for e in events if e.get("content")]
    assert [e["completion_probabilities"][0]["token"] for e in chunks] == ["a", "b"]
    status, body, _ = s.post("/completion", {"prompt": "q", "n_probs": 0})
    assert "completion_probabilities" not in body


def test_n_choices_on_a_one_slot_engine_run_one_after_another(server, tmp_path):
    record = tmp_path / "gen.txt"
    s = server({"turns": [{"text": "one"}, {"text": "two"}, {"text": "three"}], "record_gen": str(record)})
    status, body, _ = s.post("/v1/chat/completions", chat("q", n=3, seed=41))
    assert status == 200, body
    assert [(c["index"], c["message"]["content"]) for c in body["choices"]] == [(0, "one"), (1, "two"),
                                                                                  (2, "three")]
    gens = record.read_text().splitlines()
    assert [gen_keys(g)["seed"] for g in gens] == ["41", "42", "43"]
    assert len({g.split()[-1] for g in gens}) == 1  # one prompt
    assert body["usage"]["completion_tokens"] == 3 + 3 + 5 + 3  # each answer + its end-of-turn token
    assert body["usage"]["prompt_tokens"] == len(gens[0].split()[-1].split(","))
    reused = [r["figures"]["reused"] for r in list(s.svc.history)[-2:]]
    assert reused == [body["usage"]["prompt_tokens"] - 1] * 2  # the later choices reuse the first one's read


def test_n_choices_stream_index_and_usage(server):
    s = server({"turns": [{"text": "ab"}, {"text": "cd"}]})
    status, events, raw = s.stream(chat("q", n=2, stream_options={"include_usage": True}))
    assert status == 200 and raw.endswith("data: [DONE]\n\n")
    text = {0: "", 1: ""}
    finishes = []
    for e in events:
        for c in e["choices"]:
            text[c["index"]] += c["delta"].get("content") or ""
            if c["finish_reason"]:
                finishes.append(c["index"])
    assert text == {0: "ab", 1: "cd"} and sorted(finishes) == [0, 1]
    assert events[-1]["usage"]["completion_tokens"] == 6 and events[-1]["choices"] == []


def test_n_choices_in_slots_read_the_prompt_once(slot_server, tmp_path):  # noqa: F811
    record = tmp_path / "cmds.txt"
    s = slot_server({"slots": 4, "repeat": 3, "record": str(record), "step_delay_s": 0.01})
    status, body, _ = s.post("/v1/chat/completions", chat("q7", n=3, logprobs=True))
    assert status == 200, body
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert {c["message"]["content"] for c in body["choices"]} == {"<q7><q7><q7>"}
    assert all(len(c["logprobs"]["content"]) == 12 for c in body["choices"])
    bgens = [line for line in _lines(record, "BGEN")]
    assert len(bgens) == 3 and "seed=" not in " ".join(bgens)  # no seed: each choice the engine's own
    n_prompt = body["usage"]["prompt_tokens"]
    reused = sorted(r["figures"]["reused"] for r in list(s.svc.history)[-3:])
    assert reused[1:] == [n_prompt - 1] * 2  # admitted after the first one's read: its prefix, taken from a busy slot
    status, events, _ = s.stream(chat("q8", n=2))
    text = {0: "", 1: ""}
    for e in events:
        for c in e["choices"]:
            text[c["index"]] += c["delta"].get("content") or ""
    assert text == {0: "<q8><q8><q8>", 1: "<q8><q8><q8>"}


def test_llama_completion_n_cmpl(slot_server):  # noqa: F811
    s = slot_server({"slots": 2})
    status, body, _ = s.post("/completion", {"prompt": "<|im_start|>q3\n", "n": 2})
    assert status == 200 and [b["index"] for b in body] == [0, 1] and body[0]["content"] == body[1]["content"]
    status, body, _ = s.post("/completion", {"prompt": "<|im_start|>q3\n", "n_cmpl": 9})
    assert status == 400 and body["error"]["message"].startswith("n_cmpl")


def test_a_client_that_leaves_stops_every_choice(slot_server):  # noqa: F811
    rng = random.Random(5)
    question = "".join(rng.choice("abcdefghij") for _ in range(300))  # no cycle the repeat guard sees
    s = slot_server({"slots": 4, "repeat": 100, "step_delay_s": 0.005, "rules": [{"match": "q2", "repeat": 2}]})
    c = s.conn()
    c.request("POST", "/v1/chat/completions", json.dumps({**chat(question), "n": 3, "stream": True}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    seen = b""
    while seen.count(b'"index": 2') < 2:  # every choice is decoding (its 4,096-token reply takes 20 s)
        seen += r.fp.read1(4096)
    r.close()  # the response holds the socket too
    c.close()
    batch = s.svc.engine.batch
    deadline = time.monotonic() + 5
    while batch.stats()["busy"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert batch.stats()["busy"] == 0
    status, body, _ = s.post("/v1/chat/completions", chat("q2", n=2))
    assert status == 200 and [c["message"]["content"] for c in body["choices"]] == ["<q2><q2>"] * 2

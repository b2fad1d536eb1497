"""llama.cpp's native routes over the fake engine: /completion's fields and refusals, prompt progress,
/infill, /apply-template, /tokenize pieces, /props extras. Exact answers: tests/serve/api/test_dialect_golden.py."""
import json

import pytest

from serve.api import llama_routes
from serve.api.openai import parse_chat
from serve.prompt.chatml import ChatTemplate
from tests.serve.conftest import chat


def _data(text):
    return [json.loads(b[6:]) for b in text.split("\n\n") if b.startswith("data: ")]


def test_token_id_prompt_goes_to_the_engine_as_sent(server, tmp_path):
    gens = tmp_path / "gens.txt"
    s = server({"turns": [{"text": "ok"}], "record_gen": str(gens)})
    status, body, _ = s.post("/completion", {"prompt": [72, 105, 258, 33], "n_predict": 5,
                                             "samplers": ["top_k", "temperature"], "mirostat": 0,
                                             "cache_prompt": True, "n_probs": 0, "id_slot": -1})
    assert status == 200 and body["content"] == "ok" and body["stop_type"] == "eos"
    assert gens.read_text().split()[-1] == "72,105,258,33" and gens.read_text().startswith("BGEN 0 5 ")
    assert body["tokens_evaluated"] == 4 and body["truncated"] is False


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "n_predict": "9"}, "n_predict"), ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"), ({"prompt": 5}, "prompt"),
    ({"prompt": [True]}, "prompt"), ({"prompt": [1, 99999]}, "prompt"),
    ({"prompt": "x", "return_progress": 1}, "return_progress"), ({"prompt": "x", "stop": "S" * 0 or 3}, "stop"),
])
def test_wrong_types_are_400_in_llama_servers_shape(server, body, param):
    s = server()
    status, err, _ = s.post("/completion", body)
    assert status == 400 and err["error"]["code"] == 400 and err["error"]["type"] == "invalid_request_error"
    assert param in err["error"]["message"]


def test_stop_types_and_response_fields(server):
    s = server({"turns": [{"text": "abcdefgh"}]})
    body = s.post("/completion", {"prompt": "x", "n_predict": 3})[1]
    assert body["stop_type"] == "limit" and body["content"] == "abc" and body["tokens_predicted"] == 3
    body = s.post("/completion", {"prompt": "x", "response_fields": ["content", "generation_settings/n_predict",
                                                                      "nope"]})[1]
    assert body == {"content": "abcdefgh", "generation_settings/n_predict": -1}


def _progress(reports):
    assert reports, "no prompt_progress chunk"
    first, last = reports[0], reports[-1]
    assert first["cache"] == first["processed"] and last["processed"] == last["total"]
    assert all(b["processed"] > a["processed"] and b["total"] == a["total"] for a, b in zip(reports, reports[1:]))
    return reports


def test_return_progress_on_completion_and_chat(server):
    s = server({"turns": [{"text": "ok", "pp_chunk": 16}]})
    _, text, _ = s.post("/completion", {"prompt": "y" * 70, "stream": True, "return_progress": True})
    reports = _progress([d["prompt_progress"] for d in _data(text) if "prompt_progress" in d])
    assert [r["processed"] for r in reports] == [0, 16, 32, 48, 64, 70]
    _, text, _ = s.post("/v1/chat/completions", chat("z" * 70, stream=True, return_progress=True))
    first = _progress([d["prompt_progress"] for d in _data(text[:-len("data: [DONE]\n\n")])
                       if "prompt_progress" in d])
    assert first[0]["total"] > 70
    # a second, longer chat reuses the first one's prompt: its first report starts at the cache
    _, text, _ = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "z" * 70},
                                                              {"role": "assistant", "content": "ok"},
                                                              {"role": "user", "content": "more"}],
                                                 "stream": True, "return_progress": True})
    second = _progress([d["prompt_progress"] for d in _data(text[:-len("data: [DONE]\n\n")])
                        if "prompt_progress" in d])
    assert second[0]["cache"] > 0
    _, text, _ = s.post("/completion", {"prompt": "y" * 70, "stream": True})
    assert not any("prompt_progress" in d for d in _data(text))


def test_infill_without_fim_tokens_is_501(server):
    s = server()
    status, err, _ = s.post("/infill", {"input_prefix": "def f(", "input_suffix": ")"})
    assert status == 501 and err["error"]["type"] == "not_supported_error" and "Infill" in err["error"]["message"]


class _FimTok:
    """A tokenizer with fill-in-the-middle tokens: one id per character, specials 1000+."""
    specials = {"<fim_prefix>": 1000, "<fim_suffix>": 1001, "<fim_middle>": 1002, "<file_sep>": 1003,
                "<reponame>": 1004}

    def token_to_id(self, text):
        return self.specials.get(text)

    def encode(self, text, parse_special=False):
        return [ord(c) for c in text]


def test_infill_layout_is_llama_cpps_repo_level_form():
    tok = _FimTok()
    fim = llama_routes.fim_ids(tok)
    assert fim == {"pre": 1000, "suf": 1001, "mid": 1002, "rep": 1004, "sep": 1003}
    ids = llama_routes.infill_ids(tok, fim, "a(", ")", [{"filename": "u.py", "text": "X"}], "p")
    enc = lambda t: [ord(c) for c in t]
    assert ids == ([1004] + enc("myproject\n") + [1003] + enc("u.py\n") + enc("X") + [1003] + enc("filename\n") +
                   [1000] + enc("a(") + enc("p") + [1001] + enc(")") + [1002])
    assert llama_routes.fim_ids(type("T", (), {"token_to_id": lambda self, t: None})()) is None


def test_apply_template_and_effort_levels(server):
    s = server()
    _, body, _ = s.post("/apply-template", chat("hi"))
    assert body["prompt"].endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    s.svc.template = ChatTemplate(knows_think=True)  # a thinking template (the default model has none)
    prompts = {e: s.post("/apply-template", chat("hi", reasoning_effort=e))[1]["prompt"]
               for e in ("none", "low", "medium", "high")}
    assert len(set(prompts.values())) == 4
    assert prompts["none"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert prompts["medium"].endswith("<|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert "<|im_start|>system\nReasoning effort is set to low." in prompts["low"]
    assert "<|im_start|>system\nReasoning effort is set to high." in prompts["high"]
    # the history is the same text in each: switching effort keeps the cached prefix
    head = prompts["medium"][:prompts["medium"].rindex("<|im_start|>assistant")]
    assert prompts["low"].startswith(head) and prompts["high"].startswith(head)


def test_tokenize_pieces_and_detokenize(server):
    s = server()
    _, body, _ = s.post("/tokenize", {"content": "hé", "with_pieces": True})
    # ByteTokenizer: one token per byte; the two halves of é are not UTF-8 alone: byte lists
    assert body["tokens"] == [{"id": 104, "piece": "h"}, {"id": 195, "piece": [195]}, {"id": 169, "piece": [169]}]
    assert s.post("/tokenize", {"content": ["a", 258, "b"]})[1]["tokens"] == [97, 258, 98]
    assert s.post("/tokenize", {})[1] == {"tokens": []}
    assert s.post("/detokenize", {})[1] == {"content": ""}
    assert s.post("/tokenize", {"content": "a", "with_pieces": "y"})[0] == 400


def test_props_extras(server):
    s = server(config={"aliases": ["smol"]})
    _, p, _ = s.request("GET", "/props")
    assert p["chat_template_caps"]["supports_tools"] is True and p["aliases"] == ["smol"]
    assert "model_path" not in p and p["endpoint_slots"] is True  # the fake engine is started without a file
    s.svc.engine.args = [*s.svc.engine.args, "--model", "/home/someone/models/m.Q4_1.gguf"]
    assert s.request("GET", "/props")[1]["model_path"] == "m.Q4_1.gguf"  # the file's name, not its folders


def test_several_prompts_answer_a_list_in_order(server):
    s = server({"turns": [{"text": "a"}, {"text": "b"}, {"text": "c"}]})
    status, body, _ = s.post("/completion", {"prompt": [[72, 105], "Hi", {"prompt_string": "Hi"}]})
    assert status == 200 and [b["content"] for b in body] == ["a", "b", "c"] and [b["index"] for b in body] == [0, 1, 2]
    assert s.post("/completion", {"prompt": [72, "i"]})[1]["content"] == "c"  # ids and text: one prompt
    assert s.post("/completion", {"prompt": ["a", "b"], "stream": True})[0] == 400
    assert s.post("/completion", {"prompt": [{"multimodal_data": ["x"], "prompt_string": "a"}]})[0] == 400


def test_system_fingerprint_and_timings_on_the_openai_completions_too(server):
    s = server({"turns": [{"text": "ok"}]})
    body = s.post("/v1/completions", {"prompt": "x"})[1]
    fp = body["system_fingerprint"]
    assert fp.startswith("b") and body["timings"]["predicted_n"] >= 2  # "b": llama-server's build prefix
    _, events, _ = s.stream({"prompt": "x"}, path="/v1/completions")
    assert all(e["system_fingerprint"] == fp for e in events) and "timings" in events[-1]
    assert s.post("/v1/chat/completions", chat("x"))[1]["system_fingerprint"] == fp
    s.svc.engine.args = [*s.svc.engine.args, "--kv", "q8_0"]  # another backend configuration: another print
    assert s.post("/v1/chat/completions", chat("x"))[1]["system_fingerprint"] != fp


def test_logit_bias_by_text_or_id_reaches_the_engine(server, tmp_path):
    gens = tmp_path / "gens.txt"
    s = server({"turns": [{"text": "ok"}], "record_gen": str(gens)})
    for bias in ([[" a", -100], [98, False]], {" a": -100, "98": False}):
        assert s.post("/completion", {"prompt": "x", "logit_bias": bias})[0] == 200
        keys = [w for w in gens.read_text().splitlines()[-1].split() if w.startswith("logit_bias=")]
        assert keys == ["logit_bias=32:-100,97:-100,98:-100"]  # " a" is two byte tokens here
    assert s.post("/completion", {"prompt": "x", "logit_bias": [[" a", "much"]]})[0] == 400


def test_input_tokens_count_the_prompt_a_request_would_have(server):
    s = server()
    n = s.post("/chat/completions/input_tokens", chat("hello"))[1]["input_tokens"]
    assert n == s.svc.count_tokens(parse_chat(chat("hello")))
    m = s.post("/v1/responses/input_tokens", {"input": "hello"})[1]["input_tokens"]
    assert m == n  # the same chat either way
    assert s.post("/v1/responses/input_tokens", {"input": 3})[0] == 400


def test_return_progress_on_the_batch_path(slot_server):
    s = slot_server({"slots": 2, "step_tokens": 16})
    _, text, _ = s.post("/completion", {"prompt": "y" * 70, "stream": True, "return_progress": True})
    reports = _progress([d["prompt_progress"] for d in _data(text) if "prompt_progress" in d])
    assert len(reports) >= 3 and reports[-1]["total"] == 70
    # the same prompt again: the slot kept it, so the read starts past the reused prefix (BACC's count)
    _, text, _ = s.post("/completion", {"prompt": "y" * 70, "stream": True, "return_progress": True})
    reports = _progress([d["prompt_progress"] for d in _data(text) if "prompt_progress" in d])
    assert reports[0]["cache"] > 0 and reports[-1]["total"] == 70


def test_a_final_assistant_message_is_continued_as_llama_server_and_vllm_ask(server):
    # llama-server continues a trailing assistant message; vLLM's continue_final_message /
    # add_generation_prompt say so explicitly, and false / true ask for a new turn
    s = server()
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    new_turn = "Hel<|im_end|>\n<|im_start|>assistant\n"
    for extra, tail in (({}, "assistant\nHel"), ({"continue_final_message": True}, "assistant\nHel"),
                        ({"add_generation_prompt": False}, "assistant\nHel"),
                        ({"continue_final_message": False}, new_turn), ({"add_generation_prompt": True}, new_turn)):
        status, body, _ = s.post("/apply-template", {"messages": msgs, **extra})
        assert status == 200 and body["prompt"].endswith(tail), extra
    for extra, name in (({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
                        ({"continue_final_message": "yes"}, "continue_final_message")):
        status, err, _ = s.post("/v1/chat/completions", {"messages": msgs, **extra})
        assert status == 400 and err["error"]["param"] == name
    for name, value in (("continue_final_message", True), ("add_generation_prompt", False)):
        status, err, _ = s.post("/v1/chat/completions", {"messages": msgs[:1], name: value})
        assert status == 400 and err["error"]["param"] == name and "assistant message at the end" in \
            err["error"]["message"]
    # a continued message is past the reply's first token, where a grammar starts: refused by name
    status, err, _ = s.post("/v1/chat/completions", {"messages": msgs, "response_format": {"type": "json_object"}})
    assert status == 400 and "continued" in err["error"]["message"]


def test_return_tokens_and_the_stream_chunks_carry_the_generated_ids(server):
    # llama-server: `tokens` is empty unless return_tokens; each stream chunk carries the ids of its text
    s = server({"turns": [{"text": "ok"}, {"text": "ok"}, {"text": "hé"}]})
    assert s.post("/completion", {"prompt": "x", "return_tokens": True})[1]["tokens"] == [111, 107]
    assert s.post("/completion", {"prompt": "x"})[1]["tokens"] == []
    _, text, _ = s.post("/completion", {"prompt": "x", "stream": True})
    chunks = [d for d in _data(text) if not d["stop"]]
    # é is two byte tokens here: its chunk carries both, once the character is whole
    assert [c["tokens"] for c in chunks] == [[104], [195, 169]] and chunks[-1]["tokens_predicted"] == 3
    assert s.post("/completion", {"prompt": "x", "return_tokens": 1})[0] == 400


def test_ignore_eos_bans_the_end_tokens_and_shows_them(server, tmp_path):
    # llama-server: ignore_eos adds the end-of-generation tokens to logit_bias, shown with bias null (-inf)
    gens = tmp_path / "gens.txt"
    s = server({"turns": [{"text": "ok"}, {"text": "ok"}], "record_gen": str(gens)})
    body = s.post("/completion", {"prompt": "x", "ignore_eos": True})[1]
    ends = sorted(s.svc.stop_ids)
    assert ends and body["generation_settings"]["logit_bias"] == [{"token": t, "bias": None} for t in ends]
    keys = [w for w in gens.read_text().splitlines()[-1].split() if w.startswith("logit_bias=")]
    assert keys == ["logit_bias=" + ",".join(f"{t}:-100" for t in ends)]
    assert s.post("/completion", {"prompt": "x"})[1]["generation_settings"]["logit_bias"] == []
    assert s.post("/completion", {"prompt": "x", "ignore_eos": "yes"})[0] == 400


def test_ignore_eos_on_the_openai_routes_and_unimplemented_samplers_refused_by_name(server, tmp_path):
    # vLLM and llama-server take ignore_eos on the OpenAI routes too: the same ban as /completion's
    gens = tmp_path / "gens.txt"
    s = server({"turns": [{"text": "ok"}] * 8, "record_gen": str(gens)})
    ends = ",".join(f"{t}:-100" for t in sorted(s.svc.stop_ids))
    for path, body in (("/v1/chat/completions", chat(ignore_eos=True)),
                       ("/v1/completions", {"prompt": "x", "ignore_eos": True})):
        assert s.post(path, body)[0] == 200
        assert "logit_bias=" + ends in gens.read_text().splitlines()[-1].split(), path
    assert s.post("/v1/chat/completions", chat(ignore_eos=1))[0] == 400
    # samplers and vLLM parameters the engine does not have: a 400 naming them unless they ask for nothing
    for path, body in (("/v1/chat/completions", chat()), ("/v1/completions", {"prompt": "x"}),
                       ("/completion", {"prompt": "x"})):
        for name, value in (("dynatemp_range", 0.5), ("dynatemp_exponent", 2), ("tfs_z", 0.9)):
            status, err, _ = s.post(path, {**body, name: value})
            assert status == 400 and name in json.dumps(err), (path, name)
        assert s.post(path, {**body, "dynatemp_range": 0, "dynatemp_exponent": 1, "tfs_z": 1.0})[0] == 200
    for name, value in (("min_tokens", 5), ("use_beam_search", True), ("allowed_token_ids", [1]),
                        ("stop_token_ids", [2]), ("bad_words", ["x"]), ("prompt_logprobs", 1)):
        status, err, _ = s.post("/v1/chat/completions", chat(**{name: value}))
        assert status == 400 and err["error"]["param"] == name, name


def test_timings_per_token_on_completion_progress_and_chunks(server):
    # llama-server: with timings_per_token the prompt_progress chunks carry the read's timings (the first all
    # zero, never going back) and each content chunk running figures
    s = server({"turns": [{"text": "abc", "pp_chunk": 16}]})
    body = {"prompt": "y" * 60, "stream": True, "return_progress": True, "timings_per_token": True}
    data = _data(s.post("/completion", body)[1])
    progress = [d["timings"] for d in data if "prompt_progress" in d]
    assert len(progress) > 1 and progress[0]["prompt_n"] == 0 and progress[0]["prompt_ms"] == 0.0
    assert all(b["prompt_ms"] >= a["prompt_ms"] for a, b in zip(progress, progress[1:]))
    assert progress[-1]["prompt_n"] == 60 and all(t["predicted_n"] == 0 for t in progress)
    content = [d["timings"]["predicted_n"] for d in data if d.get("content")]
    assert content == [1, 2, 3]


def test_the_decode_rate_is_over_the_steps_after_the_first_token():
    # decode_ms runs from the first token: n tokens are n - 1 decode steps (llama-server's rate); one token: 0
    from serve.core.engine_api import EngineFigures
    one = EngineFigures(prompt_ms=5.0, decode_ms=0.0).timings(10, 1)
    assert one["predicted_per_second"] == 0.0 and one["predicted_per_token_ms"] == 0.0
    t = EngineFigures(prompt_ms=5.0, decode_ms=150.0).timings(10, 16)
    assert t["predicted_per_second"] == 1e3 * 15 / 150.0 and t["predicted_per_token_ms"] == 10.0


def test_the_engines_samplers_reach_it_under_llama_servers_names(server, tmp_path):
    # typical_p, top_n_sigma, XTC, Mirostat and DRY go to the engine as its keys (docs/PROTOCOL.md); DRY's
    # breaker strings as the ids of every token whose text holds one (ByteTokenizer: a byte is its own token)
    gens = tmp_path / "gens.txt"
    s = server({"turns": [{"text": "ok"}], "record_gen": str(gens)})
    status, body, _ = s.post("/completion", {
        "prompt": "x", "n_predict": 4, "temperature": 0.8, "typical_p": 0.9, "top_n_sigma": 1.5,
        "xtc_probability": 0.5, "xtc_threshold": 0.2, "mirostat": 2, "mirostat_tau": 4, "mirostat_eta": 0.2,
        "dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 3, "dry_penalty_last_n": 128,
        "dry_sequence_breakers": ["\n", "*"]})
    assert status == 200, body
    words = gens.read_text().splitlines()[-1].split()
    for key in ("typical_p=0.9", "top_n_sigma=1.5", "xtc_probability=0.5", "xtc_threshold=0.2", "mirostat=2",
                "mirostat_tau=4.0", "mirostat_eta=0.2", "dry_multiplier=0.8", "dry_base=1.75",
                "dry_allowed_length=3", "dry_penalty_last_n=128", f"dry_breakers={ord(chr(10))},{ord('*')}"):
        assert key in words, (key, words)
    # off values send nothing
    s.post("/completion", {"prompt": "x", "n_predict": 2, "typical_p": 1, "mirostat": 0, "dry_multiplier": 0})
    words = gens.read_text().splitlines()[-1].split()
    assert not [w for w in words if w.split("=")[0] in ("typical_p", "mirostat", "dry_multiplier", "dry_breakers")]


@pytest.mark.parametrize("field,value", [("typical_p", 2), ("mirostat", 3), ("dry_base", 0.5),
                                         ("dry_sequence_breakers", "\n"), ("xtc_probability", -1)])
def test_sampler_values_out_of_range_are_400_naming_them(server, field, value):
    status, err, _ = server().post("/completion", {"prompt": "x", field: value})
    assert status == 400 and field in err["error"]["message"], err

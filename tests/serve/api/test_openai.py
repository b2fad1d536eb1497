"""The OpenAI API over the fake engine: shapes, stream rules, errors, limits, auth, views."""
import json

from serve.api.openai import parse_chat
from tests.serve.conftest import chat


def test_chat_non_stream_shape(server):
    s = server({"turns": [{"text": "Paris."}]})
    status, body, r = s.post("/v1/chat/completions", chat("capital?"))
    # HTTP/1.1: the connection stays open, the answer's length is given (serve/http/keepalive.py)
    assert status == 200 and r.getheader("Connection") is None and int(r.getheader("Content-Length")) > 0
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    ch = body["choices"][0]
    assert ch["message"] == {"role": "assistant", "content": "Paris."} and ch["finish_reason"] == "stop"
    u = body["usage"]
    assert u["prompt_tokens"] > 0 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert u["prompt_tokens_details"]["cached_tokens"] == 0
    t = body["timings"]
    assert t["prompt_n"] == u["prompt_tokens"] and t["predicted_n"] == u["completion_tokens"]


def test_stream_rules_and_usage_chunk(server):
    s = server({"turns": [{"text": "héllo"}]})
    status, events, raw = s.stream(chat(stream_options={"include_usage": True}))
    assert status == 200 and raw.endswith("data: [DONE]\n\n")
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert len({e["id"] for e in events}) == 1
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text == "héllo"  # the two bytes of é arrive in two tokens and are held until whole
    finish = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["choices"][0]["delta"] == {} and "timings" in finish[0]
    usage = events[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 7  # 6 bytes + the end token and "timings" in usage


def test_stream_without_include_usage_has_no_usage_chunk(server):
    s = server()
    _, events, _ = s.stream(chat())
    assert all(e["choices"] for e in events)


def test_second_turn_reports_cached_tokens(server):
    s = server({"turns": [{"text": "one"}]})
    _, first, _ = s.post("/v1/chat/completions", chat("a question"))
    msgs = [{"role": "user", "content": "a question"}, {"role": "assistant", "content": "one"},
            {"role": "user", "content": "and another"}]
    _, second, _ = s.post("/v1/chat/completions", {"messages": msgs})
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > first["usage"]["prompt_tokens"] - 5


def test_max_tokens_exact_and_length(server):
    s = server({"turns": [{"text": "abcdefghij"}]})
    _, body, _ = s.post("/v1/chat/completions", chat(max_tokens=4))
    assert body["choices"][0]["message"]["content"] == "abcd"
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 4


def test_stop_string_held_back_and_cut(server):
    s = server({"turns": [{"text": "one two STOP three"}]})
    _, events, _ = s.stream(chat(stop=["STOP"]))
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert text == "one two " and events[-1]["choices"][0]["finish_reason"] == "stop"
    _, body, _ = s.post("/v1/chat/completions", chat(stop="tw"))
    assert body["choices"][0]["message"]["content"] == "one "


def test_repeat_guard(server):
    s = server({"turns": [{"text": "a", "repeat": 400}]}, config={"repeat_stop_tokens": 50})
    _, body, _ = s.post("/v1/chat/completions", chat())
    # the loop guard's stop is its own reason (issue 29): stop, and strata_finish says which guard, never length
    assert body["choices"][0]["finish_reason"] == "stop" and body["choices"][0]["strata_finish"] == "loop_guard"
    assert len(body["choices"][0]["message"]["content"]) == 49


def test_literal_special_tags_are_plain_text(server):
    s = server()
    _, body, _ = s.post("/tokenize", {"content": "<|im_end|>", "parse_special": False})
    assert 258 not in body["tokens"]
    _, body, _ = s.post("/tokenize", {"content": "<|im_end|>"})  # llama-server's default: parse_special true
    assert body["tokens"] == [258]
    svc = s.svc
    from serve.core.events import ChatRequest, Message
    ids = svc.prepare(ChatRequest([Message("user", "x<|im_end|>y")])).ids
    assert ids.count(258) == 1  # only the template's own end of the user turn


def test_context_rule(server):
    s = server(ctx=64)
    status, body, _ = s.post("/v1/chat/completions", chat("x" * 100))
    assert status == 400 and "never truncated" in body["error"]["message"]
    assert "context (64)" in body["error"]["message"] and body["error"]["code"] == "context_length_exceeded"
    # llama-server's type and figures beside OpenAI's code (llama.cpp's clients and suite read them)
    assert body["error"]["type"] == "exceed_context_size_error" and body["error"]["n_ctx"] == 64
    assert body["error"]["n_prompt_tokens"] > 64 and "exceeds the available context size" in body["error"]["message"]
    status, body, _ = s.post("/v1/chat/completions", chat("x", max_tokens=60))
    assert status == 400 and "max tokens (60)" in body["error"]["message"]
    status, err, _ = s.post("/completion", {"prompt": "x" * 100})  # llama.cpp's own route: the same figures
    assert status == 400 and err["error"]["type"] == "exceed_context_size_error" and err["error"]["n_ctx"] == 64
    status, err, _ = s.post("/v1/messages", {"max_tokens": 60, "messages": [{"role": "user", "content": "x"}]})
    assert status == 400 and err["error"]["type"] == "invalid_request_error"  # Anthropic's types are fixed
    status, body, _ = s.post("/v1/chat/completions", chat("x", max_tokens=0))
    assert status == 200  # 0 = the rest of the context


def test_bad_requests_name_the_field(server):
    s = server()
    cases = [(b"{nope", "not valid JSON"), (b"[1]", "JSON object"), ({"messages": "hi"}, "messages"),
             ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
             ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
             (chat(max_tokens="lots"), "max_tokens"), (chat(stream="yes"), "stream"),
             (chat(temperature="hot"), "temperature"), (chat(stop=[1]), "stop")]
    for body, word in cases:
        status, out, _ = s.post("/v1/chat/completions", body)
        assert status == 400 and word in out["error"]["message"], (body, out)
        assert out["error"]["type"] == "invalid_request_error"


def test_body_limit_413(server, monkeypatch):
    monkeypatch.setenv("STRATA_MAX_BODY_MIB", "0.001")
    s = server()
    status, out, _ = s.post("/v1/chat/completions", chat("x" * 5000))
    assert status == 413 and "limit" in out["error"]["message"]


def test_engine_err_is_400(server):
    s = server({"turns": [{"err": "bad ids"}]})
    status, out, _ = s.post("/v1/chat/completions", chat())
    assert status == 400 and "bad ids" in out["error"]["message"]


def test_api_key(server):
    s = server(api_keys=["k1", "k2"])
    assert s.request("GET", "/health")[0] == 200
    status, out, _ = s.request("GET", "/v1/models")
    assert status == 401 and out["error"]["type"] == "authentication_error"
    assert s.request("GET", "/v1/models", headers={"Authorization": "Bearer k2"})[0] == 200
    assert s.request("GET", "/v1/models", headers={"X-Api-Key": "k1"})[0] == 200
    assert s.request("GET", "/v1/models", headers={"Authorization": "Bearer k3"})[0] == 401
    # with a key, any Host is fine (the key is the protection)
    assert s.request("GET", "/v1/models", headers={"X-Api-Key": "k1", "Host": "evil.example"})[0] == 200


def test_host_check_and_cors(server):
    s = server(cors_origins=["https://app.example"], allowed_hosts=[".lan.example"])
    assert s.request("GET", "/v1/models", headers={"Host": "evil.example"})[0] == 403
    assert s.request("GET", "/v1/models", headers={"Host": "box.lan.example:8080"})[0] == 200
    assert s.request("GET", "/v1/models", headers={"Host": "localhost:8080"})[0] == 200
    status, _, r = s.request("OPTIONS", "/v1/chat/completions", headers={"Origin": "https://app.example"})
    assert status == 200 and r.getheader("Access-Control-Allow-Origin") == "https://app.example"
    _, _, r = s.request("OPTIONS", "/v1/chat/completions", headers={"Origin": "https://other.example"})
    assert r.getheader("Access-Control-Allow-Origin") is None
    assert s.post("/v1/chat/completions", chat(), headers={"Origin": "https://other.example"})[0] == 403
    page = {"Origin": "https://app.example", "Content-Type": "application/json"}  # what a browser SDK sends
    assert s.post("/v1/chat/completions", chat(), headers=page)[0] == 200


def test_views(server):
    s = server()
    status, h, _ = s.request("GET", "/health")
    assert status == 200 and h["status"] == "ok" and h["max_context"] == 2048
    _, m, _ = s.request("GET", "/v1/models")
    assert m["data"][0]["id"] == "fake-model" and m["data"][0]["meta"]["n_ctx"] == 2048
    s.post("/v1/chat/completions", chat())
    _, st, _ = s.request("GET", "/v1/status")
    assert st["loaded"] and st["activity"]["requests"] == 1 and st["engine"] == "fake-1"
    assert st["concurrency"] == {"serving": 1, "requested": 1}  # a one-slot engine: one request at a time
    _, mj, _ = s.request("GET", "/metrics?format=json")
    assert mj["totals"]["requests"] == 1 and mj["live"]["state"] == "idle" and mj["requests"][0]["finish"] == "stop"
    status, text, r = s.request("GET", "/metrics/prometheus")
    assert r.getheader("Content-Type").startswith("text/plain; version=0.0.4")
    assert "llamacpp:tokens_predicted_total 28\n" in text and "# TYPE llamacpp:requests_processing gauge" in text
    rate = float(text.split("\nllamacpp:predicted_tokens_seconds ")[1].split()[0])
    assert rate > 0
    _, text2, _ = s.request("GET", "/metrics/prometheus")  # nothing ran since the last scrape
    assert "llamacpp:predicted_tokens_seconds 0\n" in text2
    _, d, _ = s.post("/detokenize", {"tokens": [104, 105]})
    assert d == {"content": "hi"}
    assert s.post("/detokenize", {"tokens": [99999]})[0] == 400
    assert s.request("GET", "/nope")[0] == 404


def test_completions(server):
    s = server({"turns": [{"text": " world"}]})
    _, body, _ = s.post("/v1/completions", {"prompt": "hello", "max_tokens": 3, "echo": True})
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "hello wo"
    _, events, raw = s.stream({"prompt": "hello"}, path="/v1/completions")
    assert "".join(e["choices"][0]["text"] for e in events) == " world" and raw.endswith("[DONE]\n\n")


def test_anthropic_routes_exist_or_404_in_anthropic_shape(server):
    s = server()
    status, out, _ = s.post("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "hi"}]})
    assert status in (200, 404)
    if status == 404:
        assert out["type"] == "error"


def test_web_pages(server):
    s = server()
    for path in ("/", "/monitor", "/about"):
        status, text, r = s.request("GET", path)
        assert status == 200 and "<html" in text.lower(), path


def test_loop_guard_ends_a_short_cycle(server):
    s = server({"turns": [{"text": "la femme, ", "repeat": 1000}]})
    _, body, _ = s.post("/v1/chat/completions", chat())
    assert body["choices"][0]["finish_reason"] == "stop" and body["choices"][0]["strata_finish"] == "loop_guard"
    assert body["usage"]["completion_tokens"] < 200  # not the rest of the context


def test_default_system_prompt_is_the_templates(server):
    from serve.prompt.chatml import ChatTemplate
    smol = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\\nYou are SmolLM<|im_end|>\\n' }}{% endif %}{% endfor %}")
    t = ChatTemplate.from_text(smol)
    from serve.core.events import Message
    assert t.render([Message("user", "q")]).text.startswith("<|im_start|>system\nYou are SmolLM<|im_end|>\n")
    assert t.render([Message("system", "S"), Message("user", "q")]).text.startswith("<|im_start|>system\nS<")


def test_unknown_tool_choice_acts_as_auto_and_a_wrong_type_is_400(server):
    s = server({"turns": [{"text": "Plain answer."}]})
    tools = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]
    for choice in ("whatever", {"type": "function", "function": {}}, {"type": "sometimes"}):
        status, body, _ = s.post("/v1/chat/completions", chat(tools=tools, tool_choice=choice))
        assert status == 200, (choice, body)
        assert body["choices"][0]["message"]["content"] == "Plain answer."   # no forced opening: auto
        assert "acting as auto" in s.svc.history[-1]["notes"][0]
    assert s.svc.prepare(parse_chat(chat(tools=tools, tool_choice="required"))).forced_opening.startswith(
        "<tool_call>")
    for choice in (3, ["auto"], True):
        status, body, _ = s.post("/v1/chat/completions", chat(tools=tools, tool_choice=choice))
        assert status == 400 and "tool_choice" in body["error"]["message"] and body["error"]["param"] == "tool_choice"


def test_usage_reports_reasoning_tokens(server):
    s = server({"turns": [{"text": "<think>abc</think>Yes."}]})
    _, body, _ = s.post("/v1/chat/completions", chat())
    assert body["choices"][0]["message"]["content"] == "Yes."
    # the model opened its own thinking: "abc</think>" is read while in it (11 tokens); "<think>" is not
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": len("abc</think>")}
    _, body, _ = s.post("/v1/completions", {"prompt": "x"})
    assert "completion_tokens_details" not in body["usage"]


def test_verbose_echoes_the_prompt_the_engine_read(server):
    # llama-server's `verbose: true` debug echo (its web UI and suite read __verbose.prompt)
    s = server({"turns": [{"text": "ok"}, {"text": "ok"}]})
    body = s.post("/v1/chat/completions", chat("hi", verbose=True))[1]
    assert body["__verbose"]["prompt"].endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert body["__verbose"]["content"] == "ok"
    assert "__verbose" not in s.post("/v1/chat/completions", chat("hi", verbose=False))[1]


def test_two_assistant_messages_at_the_end_are_a_400(server):
    # llama-server refuses them ("cannot have 2 or more assistant messages at the end"); one is a plain turn
    s = server({"turns": [{"text": "ok"}]})
    two = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
           {"role": "assistant", "content": "c"}]
    status, err, _ = s.post("/v1/chat/completions", {"messages": two})
    assert status == 400 and err["error"]["param"] == "messages" and "two assistant" in err["error"]["message"]
    assert s.post("/v1/chat/completions", {"messages": two[:2]})[0] == 200


def test_timings_per_token_on_the_chat_stream(server):
    # llama-server's timings_per_token: running timings on each content chunk, the final figures at the end
    s = server({"turns": [{"text": "abc"}, {"text": "abc"}]})
    _, events, _ = s.stream(chat("hi", timings_per_token=True))
    content = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert [e["timings"]["predicted_n"] for e in content] == [1, 2, 3]
    assert "timings" not in events[0] and "predicted_per_second" in content[-1]["timings"]
    _, events, _ = s.stream(chat("hi"))
    assert not any("timings" in e for e in events if e["choices"] and e["choices"][0]["delta"].get("content"))

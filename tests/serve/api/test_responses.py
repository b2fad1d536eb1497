"""OpenAI Responses over the fake engine: request parsing, refusals, the in-progress beat, failures.
The exact event sequences are golden files (tests/serve/api/test_dialect_golden.py)."""
import json
import stat
import time

import pytest

from serve.api import responses
from serve.api.response_store import ResponseStore
from serve.core.events import BadRequest, Event, KIND_CONTENT


def _events(text):
    out = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":") and ": " in line)
        if "data" in lines:
            out.append(json.loads(lines["data"]))
    return out


def test_function_call_round_trip_input_becomes_one_assistant_turn_and_its_result():
    req = responses.parse_responses({"instructions": "Be brief.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "need the tool"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": "rain"},
        {"type": "message", "role": "developer", "content": "Answer in French."}],
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
                  {"type": "web_search"}]})
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool", "tool", "system"]
    turn = req.messages[2]
    assert [c.arguments for c in turn.tool_calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert turn.reasoning == "need the tool"
    assert req.messages[3].tool_call_id == "call_1" and req.messages[3].name == "get_weather"
    assert [t.name for t in req.tools] == ["get_weather"] and "web_search" in req.notes[0]


@pytest.mark.parametrize("body,status,param,code", [
    ({"input": "x", "previous_response_id": "resp_1"}, 400, "previous_response_id", "previous_response_not_found"),
    ({"input": "x", "background": True}, 400, "background", None),
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {"pattern": "(?=a)"}}}}, 400,
     "text.format.schema", None),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, 400, "text.format", None),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, 400, "input", None),
    ({"input": [{"type": "computer_call"}]}, 400, "input", None),
    ({"input": 3}, 400, "input", None),
    ({"input": [{"role": {"x": 1}, "content": "hi"}]}, 400, "input", None),   # found by the schemathesis fuzz
    ({"input": [{"type": {"x": 1}}]}, 400, "input", None),
    ({"input": "x", "max_output_tokens": "many"}, 400, "max_output_tokens", None),
])
def test_refusals_in_openai_error_shape(server, body, status, param, code):
    s = server()
    got, err, _ = s.post("/v1/responses", body)
    assert got == status and err["error"]["param"] == param and err["error"]["code"] == code
    assert err["error"]["type"] == "invalid_request_error" and err["error"]["message"]


def test_an_unknown_response_id_is_404_and_cancel_is_400(server):
    s = server()
    status, err, _ = s.request("GET", "/v1/responses/resp_abc")
    assert status == 404 and "not found" in err["error"]["message"] and err["error"]["code"] == "response_not_found"
    assert s.request("DELETE", "/v1/responses/resp_abc")[0] == 404
    assert s.request("GET", "/v1/responses/resp_abc/input_items")[0] == 404
    status, err, _ = s.request("POST", "/v1/responses/resp_abc/cancel", {})
    assert status == 400 and "background" in err["error"]["message"]


def _prompt_text(gen_file) -> str:
    ids = [int(x) for x in open(gen_file, encoding="utf-8").read().splitlines()[-1].split()[-1].split(",")]
    return bytes(i for i in ids if i < 256).decode("utf-8", "replace")


def test_stored_responses_continue_by_previous_response_id(server, tmp_path):
    """store is on by default: the response is kept (GET), its chain continues a conversation (the prompt holds
    the earlier turns, their instructions not carried), input_items lists the request's own items, DELETE
    forgets it; `store: false` keeps nothing."""
    gen = tmp_path / "gen.txt"
    s = server({"record_gen": str(gen), "turns": [{"text": "Paris."}, {"text": "Lyon."}, {"text": "Nice."}]})
    status, first, _ = s.post("/v1/responses", {"input": "Capital of France?", "instructions": "Be brief."})
    assert status == 200 and first["store"] is True and first["previous_response_id"] is None
    assert s.request("GET", f"/v1/responses/{first['id']}")[1] == first
    status, second, _ = s.post("/v1/responses", {"input": "And the second city?",
                                                 "previous_response_id": first["id"], "stream": True})
    assert status == 200
    done = [json.loads(b[b.index("data: ") + 6:]) for b in second.split("\n\n") if "response.completed" in b][-1]
    second_id = done["response"]["id"]
    assert done["response"]["previous_response_id"] == first["id"]
    prompt = _prompt_text(gen)
    assert prompt.index("Capital of France?") < prompt.index("Paris.") < prompt.index("And the second city?")
    assert "Be brief." not in prompt
    status, third, _ = s.post("/v1/responses", {"input": [{"role": "user", "content": "A third?"}],
                                                "previous_response_id": second_id, "store": False})
    assert status == 200 and third["store"] is False
    prompt = _prompt_text(gen)
    assert prompt.index("Paris.") < prompt.index("Lyon.") < prompt.index("A third?")
    assert s.request("GET", f"/v1/responses/{third['id']}")[0] == 404       # store: false
    items = s.request("GET", f"/v1/responses/{second_id}/input_items")[1]
    assert [it["content"] for it in items["data"]] == [[{"type": "input_text", "text": "And the second city?"}]]
    assert items["has_more"] is False and items["first_id"] == items["data"][0]["id"]
    assert s.request("DELETE", f"/v1/responses/{first['id']}")[1] == {"id": first["id"],
                                                                       "object": "response.deleted",
                                                                       "deleted": True}
    status, err, _ = s.post("/v1/responses", {"input": "x", "previous_response_id": second_id})
    assert status == 400 and err["error"]["code"] == "previous_response_not_found"   # its chain lost a link
    assert s.post("/v1/responses", {"input": "x", "store": "yes"})[0] == 400


def test_item_references_name_kept_input_and_output_items(server, tmp_path):
    """An `item_reference` input item is the kept item it names, as OpenAI's: an input item of a stored request
    (the id its input_items listing gives) or an output item of a stored response; the new request keeps the
    items themselves; an id that is no kept item is a 400 naming `input`."""
    gen = tmp_path / "gen.txt"
    s = server({"record_gen": str(gen), "turns": [{"text": "Paris."}, {"text": "Lyon."}, {"text": "Nice."}]})
    status, first, _ = s.post("/v1/responses", {"input": "Capital of France?"})
    assert status == 200
    asked = s.request("GET", f"/v1/responses/{first['id']}/input_items")[1]["data"][0]["id"]
    answered = first["output"][0]["id"]
    assert answered.startswith("msg_")
    status, second, _ = s.post("/v1/responses", {"input": [
        {"type": "item_reference", "id": asked}, {"type": "item_reference", "id": answered},
        {"role": "user", "content": "And the second city?"}]})
    assert status == 200 and second["previous_response_id"] is None
    prompt = _prompt_text(gen)
    assert prompt.index("Capital of France?") < prompt.index("Paris.") < prompt.index("And the second city?")
    kept = s.request("GET", f"/v1/responses/{second['id']}/input_items")[1]["data"][::-1]
    assert [it.get("type", "message") for it in kept] == ["message"] * 3
    assert [it["role"] for it in kept] == ["user", "assistant", "user"]
    assert kept[1]["content"] == [{"type": "output_text", "text": "Paris."}] and kept[1]["id"] == answered
    status, err, _ = s.post("/v1/responses", {"input": [{"type": "item_reference", "id": "msg_gone"}]})
    assert status == 400 and err["error"]["param"] == "input" and "msg_gone" in err["error"]["message"]
    s.request("DELETE", f"/v1/responses/{first['id']}")      # the second request keeps a copy of the item
    assert s.post("/v1/responses", {"input": [{"type": "item_reference", "id": answered},
                                              {"role": "user", "content": "Sure?"}], "store": False})[0] == 200
    s.request("DELETE", f"/v1/responses/{second['id']}")
    status, err, _ = s.post("/v1/responses", {"input": [{"type": "item_reference", "id": answered}]})
    assert status == 400 and "not found" in err["error"]["message"]


def test_the_store_is_bounded_by_count_size_and_age_and_kept_in_its_folder(tmp_path):
    now = [1000.0]
    folder = tmp_path / "responses"
    store = ResponseStore(str(folder), max_count=3, max_bytes=1 << 20, max_age_s=100, clock=lambda: now[0])
    out = [{"type": "message", "content": [{"type": "output_text", "text": "ok"}]}]
    for i in range(5):
        store.put({"id": f"resp_{i:024x}", "output": out}, [{"type": "message", "role": "user", "content": f"q{i}"}],
                  f"resp_{i - 1:024x}" if i else None)
        now[0] += 10
    assert [store.get(f"resp_{i:024x}") is not None for i in range(5)] == [False, False, True, True, True]
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = sorted(folder.iterdir())
    assert len(files) == 3 and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    again = ResponseStore(str(folder), max_count=3, max_age_s=100, clock=lambda: now[0])   # a restart reads them
    assert again.conversation(f"resp_{4:024x}") is None                        # its chain starts at a lost one
    assert again.input_items(f"resp_{3:024x}") == [{"type": "message", "role": "user", "content": "q3"}]
    now[0] += 85                                                               # resp 2 is now past 100 s
    assert again.get(f"resp_{2:024x}") is None and again.get(f"resp_{4:024x}") is not None
    small = ResponseStore(None, max_count=100, max_bytes=600, clock=lambda: now[0])
    for i in range(5):
        small.put({"id": f"resp_{i:024x}", "output": out}, [], None)
    assert small.view()["bytes"] <= 600 and small.get(f"resp_{4:024x}") is not None
    assert small.get(f"resp_{0:024x}") is None


def test_in_progress_beat_while_the_prompt_is_read(server, monkeypatch):
    # every ping becomes a response.in_progress when the gap is 0: one per prompt chunk here (pp_chunk 16)
    monkeypatch.setattr(responses, "IN_PROGRESS_EVERY_S", 0.0)
    s = server({"turns": [{"text": "ok", "pp_chunk": 16}]})
    _, text, _ = s.post("/v1/responses", {"input": "x" * 100, "stream": True})
    evs = _events(text)
    n_chunks = -(-evs[-1]["response"]["usage"]["input_tokens"] // 16)
    kinds = [e["type"] for e in evs]
    first_item = kinds.index("response.output_item.added")
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[:first_item].count("response.in_progress") == 1 + n_chunks
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))


def test_ping_gives_in_progress_only_after_the_quiet_gap():
    b = responses.ResponseBuilder({"id": "resp_x"})
    b.start()
    assert b.ping() == []  # an event just went out
    b.last_frame_at = time.monotonic() - responses.IN_PROGRESS_EVERY_S - 0.1
    [frame] = b.ping()
    assert frame.startswith("event: response.in_progress\n") and '"sequence_number": 2' in frame
    assert responses.IN_PROGRESS_EVERY_S < 15.0 - 10.0 + 1e-9  # pings come every <= 10 s: gaps stay under 15 s


def test_stream_that_fails_after_the_headers_ends_with_response_failed(server):
    s = server({"turns": [{"text": "abcdef", "die_after": 2}]})
    _, text, _ = s.post("/v1/responses", {"input": "x", "stream": True})
    last = _events(text)[-1]
    assert last["type"] == "response.failed" and last["response"]["status"] == "failed"
    assert last["response"]["error"]["message"]


def test_non_stream_and_stream_carry_the_same_output(server):
    s = server({"turns": [{"text": "<think>Hm.</think>Yes."}]})
    _, one, _ = s.post("/v1/responses", {"input": "q", "reasoning": {"effort": "high"}})
    _, text, _ = s.post("/v1/responses", {"input": "q", "stream": True, "reasoning": {"effort": "high"}})
    streamed = _events(text)[-1]["response"]
    strip = lambda out: [{k: v for k, v in it.items() if k != "id"} for it in out]
    assert strip(one["output"]) == strip(streamed["output"])
    assert one["reasoning"]["effort"] == "high" and one["usage"]["output_tokens_details"]["reasoning_tokens"] > 0


def test_builder_skips_an_unfinished_call_and_empty_text():
    b = responses.ResponseBuilder({})
    assert b.feed(Event(KIND_CONTENT, "")) == []
    b.feed(Event("tool_start", index=0, call_id="call_1", name="f"))
    from serve.core.events import Done
    b.finish(Done("length", 3, 3))
    assert b.output == []


def test_llama_telemetry_progress_and_timings_per_token(server, monkeypatch):
    # llama-server's return_progress / timings_per_token on /v1/responses (its suite's telemetry test)
    monkeypatch.setattr(responses, "IN_PROGRESS_EVERY_S", 1000.0)  # only the progress reports, no beats
    s = server({"turns": [{"text": "abc", "pp_chunk": 16}]})
    body = {"input": "y" * 60, "stream": True, "return_progress": True, "timings_per_token": True}
    _, text, _ = s.post("/v1/responses", body)
    evs = _events(text)
    progress = [e["prompt_progress"] for e in evs if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" for e in evs if "prompt_progress" in e)
    assert progress[-1]["processed"] == progress[-1]["total"] == evs[-1]["response"]["usage"]["input_tokens"]
    deltas = [e for e in evs if e["type"] == "response.output_text.delta"]
    assert [d["timings"]["predicted_n"] for d in deltas] == [1, 2, 3]
    assert all("prompt_per_second" in d["timings"] and "predicted_per_second" in d["timings"] for d in deltas)
    assert evs[-1]["type"] == "response.completed" and evs[-1]["timings"] == evs[-1]["response"]["timings"]
    _, text, _ = s.post("/v1/responses", {"input": "y", "stream": True})  # without them: neither
    assert not any("prompt_progress" in e or "timings" in e for e in _events(text)[:-1])
    assert s.post("/v1/responses", {"input": "y", "stream": True, "return_progress": "yes"})[0] == 400


# ---------------------------------------------------------------- parity with chat/completions (official SDK)
def _sdk(s):
    openai = pytest.importorskip("openai", reason="the openai SDK is a test-only dependency (requirements-test.txt)")
    return openai, openai.OpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="unused", max_retries=0,
                                 timeout=30)


def test_the_loop_guards_stop_is_said_on_the_response_never_as_max_output_tokens(server):
    # chat/completions says finish_reason stop + strata_finish loop_guard; here: status completed and the same
    # strata field, streamed or not; a reply its budget cut stays incomplete (max_output_tokens) without it
    loop = {"ids": [104, 105] * 600}
    s = server({"turns": [loop, loop, {"text": "x" * 40}]})
    openai, client = _sdk(s)
    r = client.responses.create(model="fake-model", input="hi", max_output_tokens=1000)
    assert r.status == "completed" and r.incomplete_details is None
    assert r.model_extra["strata_finish"] == "loop_guard" and r.output_text.startswith("hihi")
    with client.responses.create(model="fake-model", input="hi", max_output_tokens=1000, stream=True) as events:
        last = [e for e in events][-1]
    assert last.type == "response.completed" and last.response.model_extra["strata_finish"] == "loop_guard"
    cut = client.responses.create(model="fake-model", input="hi", max_output_tokens=10)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert "strata_finish" not in (cut.model_extra or {})


def test_a_final_assistant_message_is_continued_and_the_chain_keeps_it_one_turn(server, tmp_path):
    gens = tmp_path / "gens.txt"
    s = server({"turns": [{"text": "lo there"}, {"text": "Fine."}, {"text": "New."}], "record_gen": str(gens)})
    openai, client = _sdk(s)

    def prompt(n):   # the n-th BGEN's prompt, as text: BGEN <slot> <max_new> [k=v ...] <ids>
        ids = gens.read_text().splitlines()[n].split()[-1]
        return s.svc.tok.decode([int(x) for x in ids.split(",")])
    r = client.responses.create(model="fake-model", input=[{"role": "user", "content": "Hi"},
                                                            {"role": "assistant", "content": "Hel"}])
    assert r.output_text == "lo there" and r.status == "completed"   # only the new text
    assert prompt(0).endswith("<|im_start|>assistant\nHel")          # no end of turn, no new turn
    nxt = client.responses.create(model="fake-model", previous_response_id=r.id, input="And you?")
    assert nxt.output_text == "Fine."
    assert "<|im_start|>assistant\nHello there<|im_end|>\n<|im_start|>user\nAnd you?" in prompt(1)
    client.responses.create(model="fake-model", input=[{"role": "user", "content": "Hi"},
                                                        {"role": "assistant", "content": "Hel"}],
                            extra_body={"continue_final_message": False})
    assert prompt(2).endswith("Hel<|im_end|>\n<|im_start|>assistant\n")   # asked for a new turn
    with pytest.raises(openai.BadRequestError) as refused:  # a grammar starts at the reply's first token
        client.responses.create(model="fake-model", text={"format": {"type": "json_object"}},
                                input=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "{"}])
    assert refused.value.body["param"] == "input" and "continued" in refused.value.body["message"]

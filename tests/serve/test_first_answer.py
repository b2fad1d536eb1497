"""The first answer (issue 10): reply limits and their validation, the loop guard's reach, a forced call that
ends the turn, the default lanes, the chat template's own system prompt and the family refusal.
Fake engine throughout (the real model's side is tests/serve/scenarios/test_first_answer_real.py)."""
import json
import random
import sys
import types

import pytest
from hypothesis import given, settings, strategies as st

from serve.generation.guards import LOOP_PERIOD_MAX, LoopGuard, loop_need
from tests.serve.conftest import chat
from tests.serve.conftest import FAKE_SLOTS


def _letters(n, seed=3):
    rnd = random.Random(seed)
    return [rnd.randrange(97, 123) for _ in range(n)]


LONG = {"turns": [{"ids": _letters(3000)}]}   # no loop in it, no end token before 3,000 tokens


# ---------------------------------------------------------------- max_tokens: the cap and the checks
@pytest.mark.parametrize("limit", [None, 0, -1])
def test_a_request_with_no_limit_runs_to_the_configured_cap(server, limit):
    s = server(LONG, config={"default_max_tokens": 40})
    body = chat() if limit is None else chat(max_tokens=limit)
    status, got, _ = s.post("/v1/chat/completions", body)
    assert status == 200, got
    assert got["usage"]["completion_tokens"] == 40 and got["choices"][0]["finish_reason"] == "length"
    status, got, _ = s.post("/v1/completions", {"prompt": "x", **({} if limit is None else {"max_tokens": limit})})
    assert status == 200 and got["usage"]["completion_tokens"] == 40


def test_props_reports_the_default_cap(server):
    assert server(LONG).request("GET", "/props")[1]["default_generation_settings"]["params"]["n_predict"] == 4096
    s = server(LONG, config={"default_max_tokens": 77})
    assert s.request("GET", "/props")[1]["default_generation_settings"]["params"]["n_predict"] == 77


def test_config_default_max_tokens_is_checked():
    from strata_control.runconfig_file import ConfigError, check_config
    assert check_config({"default_max_tokens": 512})[0]["default_max_tokens"] == 512
    for bad in (0, -1, 1.5, "4096", True):
        with pytest.raises(ConfigError, match="default_max_tokens"):
            check_config({"default_max_tokens": bad})


BAD_LIMITS = ['-2', '-100', '1.5', 'true', '"many"', '"1e999"', 'Infinity', '-Infinity', 'NaN', '1e999', '[5]',
              '{"n": 5}']


def test_bad_limits_are_a_400_naming_the_field(server):
    s = server(LONG)
    for path, field in [("/v1/chat/completions", "max_tokens"), ("/v1/chat/completions", "max_completion_tokens"),
                        ("/v1/completions", "max_tokens"), ("/v1/messages", "max_tokens")]:
        base = '"prompt": "x"' if path == "/v1/completions" else '"messages": [{"role": "user", "content": "x"}]'
        for raw in BAD_LIMITS:
            status, got, _ = s.post(path, '{%s, "%s": %s}' % (base, field, raw),
                                    headers={"Content-Type": "application/json"})
            assert status == 400 and field in json.dumps(got), (path, field, raw, got)
            if path != "/v1/messages":
                assert got["error"]["param"] == field


def test_max_completion_tokens_wins_and_an_invalid_one_is_never_hidden(server):
    s = server(LONG)
    status, got, _ = s.post("/v1/chat/completions", chat(max_completion_tokens=3, max_tokens=50))
    assert status == 200 and got["usage"]["completion_tokens"] == 3
    status, got, _ = s.post("/v1/chat/completions", chat(max_completion_tokens=3, max_tokens=-5))
    assert status == 400 and got["error"]["param"] == "max_tokens"
    status, got, _ = s.post("/v1/chat/completions", chat(max_completion_tokens="1e999", max_tokens=5))
    assert status == 400 and got["error"]["param"] == "max_completion_tokens"
    status, got, _ = s.post("/v1/chat/completions", chat(max_completion_tokens=None, max_tokens=4))
    assert status == 200 and got["usage"]["completion_tokens"] == 4
    status, got, _ = s.post("/v1/chat/completions", chat(max_tokens=5.0))  # an integral number is an integer
    assert status == 200 and got["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize("limit", [None, 0, -1])
def test_messages_requires_a_positive_max_tokens(server, limit):
    s = server(LONG)
    body = {"messages": [{"role": "user", "content": "x"}]}
    if limit is not None:
        body["max_tokens"] = limit
    status, got, _ = s.post("/v1/messages", body)
    assert status == 400 and got["type"] == "error" and "max_tokens" in got["error"]["message"]
    status, got, _ = s.post("/v1/messages/count_tokens", body)  # count_tokens takes no max_tokens
    assert status == 200 and got["input_tokens"] > 0


# ---------------------------------------------------------------- the loop guard
def _guard_stops_at(ids, limit=256):
    guard = LoopGuard(limit)
    for n, tid in enumerate(ids, 1):
        if guard.looping(tid):
            return n
    return None


@pytest.mark.parametrize("period", [2, 5, 16, 27, 100, 200, LOOP_PERIOD_MAX])
def test_the_loop_guard_catches_cycles_up_to_256_tokens(period):
    cycle = _letters(period, seed=period)
    while len(set(cycle)) < 2 or any(cycle == cycle[:d] * (period // d) for d in range(1, period)
                                     if period % d == 0):
        cycle = _letters(period, seed=period + 1000)  # a cycle that is not itself a shorter one repeated
    stopped = _guard_stops_at(_letters(50, seed=1) + cycle * (1 + 1000 // period))
    assert stopped is not None and stopped <= 50 + max(128, 3 * period) + 1


def test_the_loop_guard_lets_text_that_quotes_itself_once_run():
    para = _letters(200, seed=9)
    ids = _letters(100, seed=8) + para + para + _letters(500, seed=7)  # one paragraph twice, then new text
    assert _guard_stops_at(ids) is None
    assert _guard_stops_at([1, 2] * 400, limit=0) is None  # repeat_stop_tokens 0 turns the guard off


def test_the_loop_guard_stop_is_its_own_reason_on_every_dialect(server):
    # a reply the loop guard ends is not "length" (no budget cut it): the dialect's reason says stop and
    # strata_finish says loop_guard; a reply cut by its budget keeps "length" and has no such field
    loop = {"ids": [104, 105] * 600}
    s = server({"turns": [loop] * 4 + [{"ids": _letters(60)}]})
    body = chat(max_tokens=1000)
    got = s.post("/v1/chat/completions", body)[1]["choices"][0]
    assert got["finish_reason"] == "stop" and got["strata_finish"] == "loop_guard"
    assert s.post("/v1/completions", {"prompt": "x", "max_tokens": 1000})[1]["choices"][0]["strata_finish"] \
        == "loop_guard"
    msg = s.post("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000})[1]
    assert msg["stop_reason"] == "end_turn" and msg["strata_finish"] == "loop_guard"
    ol = s.post("/api/chat", {"model": "fake-model", "stream": False, "messages": [{"role": "user", "content": "hi"}],
                              "options": {"num_predict": 1000}})[1]
    assert ol["done_reason"] == "stop" and ol["strata_finish"] == "loop_guard"
    cut = s.post("/v1/chat/completions", chat(max_tokens=10))[1]["choices"][0]
    assert cut["finish_reason"] == "length" and "strata_finish" not in cut


def _scan_stops_at(ids, limit=256):
    """The guard's rule read directly off the ids: where `limit` equal ids in a row, or for some period p in
    2..LOOP_PERIOD_MAX loop_need(p) newest positions in a row each equal to the one p earlier, first occur."""
    for t in range(len(ids)):
        run = 1
        while run <= t and ids[t - run] == ids[t]:
            run += 1
        if run >= limit:
            return t + 1
        for p in range(2, min(t, LOOP_PERIOD_MAX) + 1):
            k = 0
            while t - k - p >= 0 and ids[t - k] == ids[t - k - p]:
                k += 1
            if k >= loop_need(p):
                return t + 1
    return None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=40), st.integers(1, 12), st.integers(0, 300),
       st.integers(0, 3))
def test_the_loop_guard_stops_where_the_rule_says(cycle, times, noise_seed, alphabet_extra):
    """Cycles over a small alphabet (so ids recur at many periods at once) after and between random text."""
    rnd = random.Random(noise_seed)
    head = [rnd.randrange(0, 6 + alphabet_extra) for _ in range(rnd.randrange(0, 400))]
    tail = [rnd.randrange(0, 6 + alphabet_extra) for _ in range(rnd.randrange(0, 400))]
    ids = head + cycle * times + tail
    limit = rnd.choice([256, 7, 3])
    assert _guard_stops_at(ids, limit) == _scan_stops_at(ids, limit)


def test_a_long_cycle_ends_the_reply_by_the_loop_guard(server):
    cycle = _letters(200, seed=11)
    s = server({"turns": [{"ids": _letters(30) + cycle * 20}]})
    status, got, _ = s.post("/v1/chat/completions", chat())
    assert status == 200 and got["choices"][0]["finish_reason"] == "stop"
    assert got["choices"][0]["strata_finish"] == "loop_guard"
    assert got["usage"]["completion_tokens"] <= 30 + 3 * 200 + 1


# ---------------------------------------------------------------- a forced call ends the turn
WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string"}}, "required": ["city"]}}}]
AFTER_OPENING = "city>\nRome\n</parameter>\n</function>\n</tool_call>\nThe weather in Rome is sunny, I think."


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
@pytest.mark.parametrize("parallel", [True, False])
def test_a_forced_call_ends_the_turn_openai(server, choice, parallel):
    s = server({"turns": [{"text": AFTER_OPENING}]})
    body = chat("weather in Rome?", tools=WEATHER, tool_choice=choice, parallel_tool_calls=parallel)
    status, got, _ = s.post("/v1/chat/completions", body)
    assert status == 200, got
    choice0 = got["choices"][0]
    assert choice0["finish_reason"] == "tool_calls" and not choice0["message"]["content"]
    assert json.loads(choice0["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Rome"}
    status, events, _ = s.stream(body)
    assert not "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "tool_calls"


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_a_forced_call_ends_the_turn_anthropic(server, choice):
    s = server({"turns": [{"text": AFTER_OPENING}]})
    tools = [{"name": "get_weather", "description": "weather of a city", "input_schema":
              WEATHER[0]["function"]["parameters"]}]
    body = {"max_tokens": 200, "messages": [{"role": "user", "content": "weather in Rome?"}], "tools": tools,
            "tool_choice": choice}
    status, got, _ = s.post("/v1/messages", body)
    assert status == 200, got
    assert got["stop_reason"] == "tool_use" and [b["type"] for b in got["content"]] == ["tool_use"]
    assert got["content"][0]["input"] == {"city": "Rome"}


def test_a_forced_call_may_be_followed_by_another_call_only():
    from serve.generation.output_parser import OutputParser
    from serve.prompt.tool_text import forced_opening
    from serve.core.events import ToolSpec
    tools = [ToolSpec("get_weather", "", WEATHER[0]["function"]["parameters"])]
    opening = forced_opening("required", tools, "xml")
    second = "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"
    parser = OutputParser(tools, False, opening, parallel=True)
    events = []
    for piece in (AFTER_OPENING.split("The weather")[0], second[:9], second[9:], "\nAnd more text."):
        events += parser.feed(piece)
    events += parser.finish()
    kinds = [e.kind for e in events]
    assert kinds.count("tool_call") == 2 and "content" not in kinds and parser.done


# ---------------------------------------------------------------- lanes by default
def test_parallel_defaults_to_four_lanes_on_two_cores(tmp_path, monkeypatch):
    from serve import bootstrap
    from strata_cli import parser
    assert bootstrap.default_parallel(1) == 1 and bootstrap.default_parallel(2) == 4
    assert bootstrap.default_parallel(64) == 4
    monkeypatch.setattr(bootstrap.os, "cpu_count", lambda: 2)
    ns = parser().parse_args(["serve", "--tokenizer", "bytes", "--engine", f"{sys.executable} {FAKE_SLOTS}",
                              "--log", str(tmp_path / "e.log")])
    svc, _ = bootstrap.build(ns)
    assert svc.engine.args[-2:] == ["--batch", "4"] and svc.config["parallel"] == 4
    monkeypatch.setattr(bootstrap.os, "cpu_count", lambda: 1)
    svc, _ = bootstrap.build(ns)
    assert svc.engine.args[-2:] == ["--batch", "1"]   # one lane is one slot: there is no solo path
    ns = parser().parse_args(["serve", "--tokenizer", "bytes", "--engine", f"{sys.executable} {FAKE_SLOTS}",
                              "--log", str(tmp_path / "e.log"), "--parallel", "1"])
    monkeypatch.setattr(bootstrap.os, "cpu_count", lambda: 2)
    assert bootstrap.build(ns)[0].engine.args[-2:] == ["--batch", "1"]


# ---------------------------------------------------------------- the template: system prompt and family
SMOL_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                 "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                 "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                 "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
                 "{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3_TEMPLATE = ("{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
                   "'<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}{% endfor %}")
MISTRAL_TEMPLATE = "{% for message in messages %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endfor %}"


def _template(text, **flags):
    from serve.bootstrap import chat_template
    ns = types.SimpleNamespace(system_prompt=flags.pop("system_prompt", None),
                               chat_template=flags.pop("chat_template", None))
    return chat_template(types.SimpleNamespace(chat_template=text), ns, flags)


def test_the_template_s_own_system_prompt_is_the_default():
    from serve.core.events import Message
    default = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert _template(SMOL_TEMPLATE).default_system == default
    text = _template(SMOL_TEMPLATE).render([Message("user", "Hi")]).text
    assert text.startswith(f"<|im_start|>system\n{default}<|im_end|>\n<|im_start|>user\nHi")
    assert _template(SMOL_TEMPLATE, system_prompt="none").default_system is None
    assert _template(SMOL_TEMPLATE, system_prompt="Be brief.").default_system == "Be brief."
    assert _template(SMOL_TEMPLATE, system_prompt="model").default_system == default
    assert _template(SMOL_TEMPLATE, **{"system_prompt": None}).default_system == default
    assert _template(SMOL_TEMPLATE, **{"default_system_prompt": "none"}).default_system is None


def test_a_template_of_another_family_is_rendered_by_its_own_jinja_text():
    from serve.bootstrap import SetupError
    from serve.core.events import Message
    mistral = _template(MISTRAL_TEMPLATE)
    assert (type(mistral).__name__, mistral.family) == ("JinjaChat", "mistral")
    assert mistral.render([Message("user", "Hi")]).text == "[INST] Hi [/INST]"
    assert _template("{{ messages[0]['content'] }}").family == "unknown"
    with pytest.raises(SetupError, match="does not compile.*endfor"):
        _template("{% for m in messages %}{{ m.content }}")
    assert _template(MISTRAL_TEMPLATE, chat_template="chatml").default_system is None  # forced: served as ChatML
    with pytest.raises(SetupError, match="renders chatml, llama3, gemma natively, or jinja"):
        _template(SMOL_TEMPLATE, chat_template="mistral")
    assert type(_template(LLAMA3_TEMPLATE)).__name__ == "FamilyTemplate"  # rendered natively
    assert type(_template(LLAMA3_TEMPLATE, chat_template="jinja")).__name__ == "JinjaChat"  # unless asked
    assert _template(MISTRAL_TEMPLATE, system_prompt="Be brief.").default_system == "Be brief."
    assert type(_template(None)).__name__ == "NoTemplate"  # a real model without a template: chat routes 400
    with pytest.raises(SetupError, match="no chat template of its own"):
        _template(None, chat_template="jinja")


def test_serve_starts_a_model_of_another_family_with_its_own_template(tmp_path, monkeypatch):
    from serve import bootstrap
    from strata_cli import parser
    from tokenizer import bpe as strata_tokenizer

    class MistralTok(strata_tokenizer.ByteTokenizer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.chat_template = MISTRAL_TEMPLATE
    monkeypatch.setattr(strata_tokenizer, "ByteTokenizer", MistralTok)
    argv = ["serve", "--tokenizer", "bytes", "--engine", f"{sys.executable} {FAKE_SLOTS}",
            "--log", str(tmp_path / "e.log")]
    svc, _ = bootstrap.build(parser().parse_args(argv))
    assert svc.template.family == "mistral" and svc.template.renderer == "jinja"
    svc, _ = bootstrap.build(parser().parse_args(argv + ["--chat-template", "chatml"]))
    assert svc.template.default_system is None

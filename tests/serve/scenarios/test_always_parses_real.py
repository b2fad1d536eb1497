"""Structured output that always parses, on the real engine and the default model over batch slots (the
default; skipped when either is absent): Ollama's `format: "json"` through the official client, "Describe a
cat as JSON" over 12 seeds, parses 12 times whether the reply ended, hit `num_predict` or was stopped by the
loop guard (whose stop is `strata_finish: "loop_guard"`, never `length`); a schema with numeric ranges
(numbers and integers, exclusive bounds, multipleOf) is honoured over 12 seeds at temperature 1, checked by
an independent validator; vLLM's guided_choice / guided_regex and a schema's `pattern` are followed."""
import json
import math
import os

import pytest

from tests.serve.conftest import real_server
from tests.serve.scenarios.conftest import ENGINE, MODEL

pytestmark = pytest.mark.skipif(not (os.access(ENGINE, os.X_OK) and MODEL),
                                reason="needs build/strata-engine and the SmolLM2 model")
CTX = 1024
SEEDS = range(12)
CHOICE_SEEDS = range(200)   # ~2 s on 2 cores: a reply of one or two tokens each
CHOICE_SIGMAS = 4.5         # a split the engine really draws lands outside this less than once in 100,000 runs


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    with real_server(ENGINE, MODEL, tmp_path_factory.mktemp("parses"), CTX, args=("--batch", "2")) as running:
        yield running


def test_ollama_format_json_parses_for_every_seed(real):
    ollama = pytest.importorskip("ollama", reason="the ollama client is a test-only dependency (requirements-test.txt)")
    client = ollama.Client(host=f"http://127.0.0.1:{real.port}", timeout=600)
    reasons = []
    for seed in SEEDS:
        r = client.chat(model="smollm2", messages=[{"role": "user", "content": "Describe a cat as JSON"}],
                        format="json", options={"seed": seed, "temperature": 1, "num_predict": 96})
        assert isinstance(json.loads(r.message.content), dict), (seed, r.message.content)
        assert r.done_reason in ("stop", "length")
        reasons.append(r.done_reason)
    # the raw route says why each ended: a cut has no strata_finish, the loop guard's stop is its own
    status, raw, _ = real.post("/api/chat", {"model": "smollm2", "stream": False, "format": "json",
                                             "messages": [{"role": "user", "content": "Describe a cat as JSON"}],
                                             "options": {"seed": 0, "temperature": 1, "num_predict": 96}})
    assert status == 200 and raw.get("strata_finish") in (None, "loop_guard")
    assert raw["done_reason"] == ("stop" if raw.get("strata_finish") else raw["done_reason"])


def test_numeric_ranges_are_honoured_over_seeds(real):
    jsonschema = pytest.importorskip("jsonschema", reason="the independent validator (requirements-test.txt)")
    schema = {"type": "object", "properties": {
        "score": {"type": "number", "minimum": 0, "maximum": 10},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "delta": {"type": "number", "minimum": -2.5, "maximum": 2.5},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
        "step": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 50}},
        "required": ["score", "ratio", "delta", "stars", "step"], "additionalProperties": False}
    for seed in SEEDS:
        body = {"messages": [{"role": "user", "content": "Rate a film as JSON: " + json.dumps(schema)}],
                "temperature": 1, "seed": seed, "max_tokens": 120,
                "response_format": {"type": "json_schema", "json_schema": {"name": "rating", "schema": schema}}}
        status, reply, _ = real.post("/v1/chat/completions", body, timeout=600)
        assert status == 200, reply
        value = json.loads(reply["choices"][0]["message"]["content"])
        jsonschema.Draft202012Validator(schema).validate(value)


def test_vllm_guided_choice_returns_one_of_the_choices(real):
    openai = pytest.importorskip("openai", reason="the openai SDK is a test-only dependency (requirements-test.txt)")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{real.port}/v1", api_key="unused", timeout=300)
    choices = ["heads", "tails"]
    got = [client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Toss a coin: heads or tails?"}], temperature=1,
        seed=seed, max_tokens=8, extra_body={"guided_choice": choices}).choices[0].message.content for seed in SEEDS]
    assert set(got) <= set(choices), got


def _first_token_share(top: list, choices: list[str]) -> tuple[float, float]:
    """The bounds on the first choice's share that the engine's masked draw should give: the mass of the first
    tokens that begin each choice (from the model's own top 20, before the mask), normalised over both; a
    beginning token outside the top 20 weighs at most the 20th's probability, at most one per prefix length."""
    floor = math.exp(top[-1]["logprob"])
    mass = [sum(math.exp(t["logprob"]) for t in top if t["token"] and c.startswith(t["token"])) for c in choices]
    a, b = mass
    return a / (a + b + len(choices[1]) * floor), (a + len(choices[0]) * floor) / (a + len(choices[0]) * floor + b)


@pytest.mark.parametrize("question, choices", [
    ("Answer yes or no: is the sky green?", ["yes", "no"]),        # near 50/50: each choice one token
    ("Toss a coin. Reply Heads or Tails.", ["Heads", "Tails"])])  # "Head"+"s" or "H"+... against "T"+"ails"
def test_guided_choice_split_follows_the_models_first_token_mass(real, question, choices):
    """guided_choice at temperature 1 over 200 seeds: every reply is exactly one choice, and the split is
    the one the engine's draw promises (the grammar's mask, then the draw over what is left): within
    CHOICE_SIGMAS binomial deviations of the share the model's own first-token probabilities give. top_p 1:
    the family default (0.9) would drop a choice under 10 % of the masked mass."""
    body = {"messages": [{"role": "user", "content": question}], "temperature": 1, "top_p": 1, "max_tokens": 8,
            "guided_choice": choices}
    status, first, _ = real.post("/v1/chat/completions", {**body, "seed": 0, "logprobs": True, "top_logprobs": 20})
    assert status == 200, first
    low, high = _first_token_share(first["choices"][0]["logprobs"]["content"][0]["top_logprobs"], choices)
    got = []
    for seed in CHOICE_SEEDS:
        status, reply, _ = real.post("/v1/chat/completions", {**body, "seed": seed})
        assert status == 200, reply
        got.append(reply["choices"][0]["message"]["content"])
    assert set(got) <= set(choices), sorted(set(got) - set(choices))
    n, k = len(got), got.count(choices[0])
    assert 0 < k < n, (k, n, low, high)   # both appear
    lo = n * low - CHOICE_SIGMAS * math.sqrt(n * low * (1 - low))
    hi = n * high + CHOICE_SIGMAS * math.sqrt(n * high * (1 - high))
    assert lo <= k <= hi, f"{choices[0]} {k}/{n}, expected {n * low:.0f}..{n * high:.0f} (bounds {lo:.0f}..{hi:.0f})"


def test_vllm_guided_regex_and_schema_patterns_match(real):
    import re
    jsonschema = pytest.importorskip("jsonschema", reason="the independent validator (requirements-test.txt)")
    for seed in range(4):
        status, reply, _ = real.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Give a phone number."}], "temperature": 1, "seed": seed,
            "max_tokens": 16, "guided_regex": r"\(\d{3}\) \d{3}-\d{4}"})
        assert status == 200 and re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", reply["choices"][0]["message"]["content"])
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": r"^[A-Z]{3}-\d{2}$"},
                                               "note": {"type": "string", "pattern": r'[a-z "]{1,12}'}},
              "required": ["code", "note"], "additionalProperties": False}
    for seed in range(4):
        status, reply, _ = real.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "A product code as JSON"}], "temperature": 1, "seed": seed,
            "max_tokens": 60, "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}})
        assert status == 200, reply
        jsonschema.Draft202012Validator(schema).validate(json.loads(reply["choices"][0]["message"]["content"]))

"""Log-probabilities and several choices on the real engine (4 decode slots) and model, through the official
openai client (a test-only dependency; skipped without it, the engine or the model): chat logprobs with
top_logprobs (greedy = the top entry, the entries' bytes are the content), completions' legacy shape, n=3
choices that differ at temperature 1 without a seed, two seeded requests that give the same choices, a
stream whose chunks carry their index, and the later choices reading the prompt once. Short replies: 2
shared cores."""
import os

import pytest

from tests.serve.conftest import real_server
from tests.serve.scenarios.conftest import ENGINE, MODEL

pytestmark = pytest.mark.skipif(not (os.access(ENGINE, os.X_OK) and MODEL),
                                reason="needs build/strata-engine and the SmolLM2 model")
openai = pytest.importorskip("openai", reason="the openai SDK is a test-only dependency (requirements-test.txt)")
CTX = 1024
POEM = [{"role": "user", "content": "Write one line of a poem about the sea."}]


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    with real_server(ENGINE, MODEL, tmp_path_factory.mktemp("logprobs"), CTX, ["--batch", "4"]) as running:
        yield running


@pytest.fixture(scope="module")
def oai(real):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{real.port}/v1", api_key="unused", timeout=300)


def test_chat_logprobs_greedy_is_the_top_entry(oai):
    r = oai.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}], temperature=0,
                                    max_tokens=8, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert content and all(len(e.top_logprobs) == 3 for e in content)
    for e in content:
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob <= 0.0
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
    assert bytes(b for e in content for b in e.bytes) == r.choices[0].message.content.encode()


def test_completions_legacy_logprobs(oai):
    r = oai.completions.create(model="smollm2", prompt="The capital of France is", temperature=0, max_tokens=4,
                               logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) >= 1
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset[0] == 0
    assert all(len(top) <= 2 and max(top.values()) == v for top, v in zip(lp.top_logprobs, lp.token_logprobs))


def _texts(oai, **kw):
    r = oai.chat.completions.create(model="smollm2", messages=POEM, temperature=1, max_tokens=12, n=3, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    return [c.message.content for c in r.choices], r


def test_n_choices_differ_without_a_seed_and_a_seed_repeats_them(oai, real):
    unseeded, r = _texts(oai)
    assert len(set(unseeded)) >= 2, unseeded
    n_prompt = r.usage.prompt_tokens
    reused = sorted(rec["figures"]["reused"] for rec in list(real.svc.history)[-3:])
    assert reused[1:] == [n_prompt - 1] * 2  # the later choices reused the first one's read
    first, _ = _texts(oai, seed=7)
    again, _ = _texts(oai, seed=7)
    assert first == again and len(set(first)) >= 2  # seeds 7, 8, 9: reproducible, still independent


def test_n_choices_stream_carry_their_index(oai):
    r = oai.chat.completions.create(model="smollm2", messages=POEM, temperature=1, max_tokens=12, n=2, seed=11)
    stream = oai.chat.completions.create(model="smollm2", messages=POEM, temperature=1, max_tokens=12, n=2,
                                         seed=11, stream=True, stream_options={"include_usage": True})
    text, finished, usage = {0: "", 1: ""}, set(), None
    for chunk in stream:
        usage = chunk.usage or usage
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1} and [text[0], text[1]] == [c.message.content for c in r.choices]
    assert usage.completion_tokens == r.usage.completion_tokens and usage.prompt_tokens == r.usage.prompt_tokens

"""Prefill with the official SDKs on the real engine and the default model (skipped when either, or an SDK, is
absent): a final assistant message is continued on the OpenAI (llama-server's default, vLLM's
`continue_final_message`), Anthropic (its documented prefill), Ollama and Responses routes, the reply holding
only the new text. The reference is exact: greedy, the continued reply equals the raw completion of the prompt
/apply-template renders for the same chat, and all four dialects give the same text."""
import os

import pytest

from tests.serve.conftest import real_server
from tests.serve.scenarios.conftest import ENGINE, MODEL

pytestmark = pytest.mark.skipif(not (os.access(ENGINE, os.X_OK) and MODEL),
                                reason="needs build/strata-engine and the SmolLM2 model")
CTX = 1024
QUESTION = "What is the capital of France? Answer in one sentence."
PREFIX = "The capital of France is"
N = 8


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    with real_server(ENGINE, MODEL, tmp_path_factory.mktemp("prefill"), CTX) as running:
        yield running


@pytest.fixture(scope="module")
def continued(real):
    """The reference: the prompt of the continued chat, and its greedy raw completion."""
    chat = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": PREFIX}]
    status, body, _ = real.post("/apply-template", {"messages": chat})
    assert status == 200 and body["prompt"].endswith("assistant\n" + PREFIX)
    status, done, _ = real.post("/v1/completions", {"prompt": body["prompt"], "max_tokens": N, "temperature": 0})
    assert status == 200
    return chat, done["choices"][0]["text"]


def test_openai_sdk_continues_the_final_message(real, continued):
    openai = pytest.importorskip("openai", reason="the openai SDK is a test-only dependency (requirements-test.txt)")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{real.port}/v1", api_key="unused", timeout=300)
    chat, reference = continued
    r = client.chat.completions.create(model="smollm2", messages=chat, max_tokens=N, temperature=0)
    text = r.choices[0].message.content
    assert text == reference and "Paris" in text and not text.startswith(PREFIX)
    again = client.chat.completions.create(model="smollm2", messages=chat, max_tokens=N, temperature=0,
                                           extra_body={"continue_final_message": True,
                                                       "add_generation_prompt": False})
    assert again.choices[0].message.content == reference
    # continue_final_message: false asks for a new turn after it (vLLM's meaning): another prompt, more tokens
    new = client.chat.completions.create(model="smollm2", messages=chat, max_tokens=N, temperature=0,
                                         extra_body={"continue_final_message": False})
    assert new.usage.prompt_tokens > r.usage.prompt_tokens


def test_anthropic_sdk_prefill(real, continued):
    anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is a test-only dependency")
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{real.port}", api_key="unused", timeout=300)
    chat, reference = continued
    greedy = {"extra_body": {"temperature": 0}}   # (this SDK version has no temperature argument)
    m = client.messages.create(model="smollm2", max_tokens=N, messages=chat, **greedy)
    assert m.content[0].type == "text" and m.content[0].text == reference
    with client.messages.stream(model="smollm2", max_tokens=N, messages=chat, **greedy) as stream:
        assert "".join(stream.text_stream) == reference
    with pytest.raises(anthropic.BadRequestError):   # as Anthropic: a prefill may not end in white space
        client.messages.create(model="smollm2", max_tokens=N, messages=[
            chat[0], {"role": "assistant", "content": PREFIX + " "}], **greedy)


def test_ollama_client_continues_the_final_message(real, continued):
    ollama = pytest.importorskip("ollama", reason="the ollama client is a test-only dependency (requirements-test.txt)")
    client = ollama.Client(host=f"http://127.0.0.1:{real.port}", timeout=300)
    chat, reference = continued
    r = client.chat(model="smollm2", messages=chat, options={"temperature": 0, "num_predict": N})
    assert r.message.content == reference


def test_openai_sdk_responses_continue_the_final_message(real, continued):
    openai = pytest.importorskip("openai", reason="the openai SDK is a test-only dependency (requirements-test.txt)")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{real.port}/v1", api_key="unused", timeout=300)
    chat, reference = continued
    r = client.responses.create(model="smollm2", input=chat, max_output_tokens=N, temperature=0)
    assert r.output_text == reference
    with client.responses.create(model="smollm2", input=chat, max_output_tokens=N, temperature=0,
                                 stream=True) as events:
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == reference

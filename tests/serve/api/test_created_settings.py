"""A created model's settings under a request's own (serve/api/created_settings.py); the routes that apply them
are tested over fake engines in tests/serve/api/test_ollama_models.py."""
from serve.api.created_settings import under_ollama, under_openai_chat

MADE = {"system": "Be a pirate.", "messages": [{"role": "user", "content": "Ahoy?"}],
        "parameters": {"temperature": 0.2, "top_p": 0.5, "num_ctx": 512, "num_thread": 2, "stop": ["<x>"],
                       "num_predict": 9, "repeat_penalty": 1.3}}
ASK = [{"role": "user", "content": "hi"}]


def test_openai_chat_takes_what_ollamas_openai_route_takes_and_the_request_wins():
    out = under_openai_chat({"model": "m", "messages": ASK}, MADE)
    assert out["messages"] == [{"role": "system", "content": "Be a pirate."}, MADE["messages"][0], ASK[0]]
    assert {k: out.get(k) for k in ("stop", "max_tokens", "repeat_penalty")} == {
        "stop": ["<x>"], "max_tokens": 9, "repeat_penalty": 1.3}
    assert not {"temperature", "top_p", "num_ctx", "num_thread", "num_predict"} & set(out)
    own = under_openai_chat({"messages": ASK, "max_completion_tokens": 4, "stop": "<y>", "repeat_penalty": 1.0},
                            MADE)
    assert own["stop"] == "<y>" and own["repeat_penalty"] == 1.0 and "max_tokens" not in own
    uncapped = under_openai_chat({"messages": ASK}, {"parameters": {"num_predict": -1}})
    assert "max_tokens" not in uncapped and uncapped["messages"] == ASK


def test_nothing_created_changes_nothing_and_ollama_keeps_its_options_shape():
    body = {"messages": ASK, "options": {"top_k": 3}}
    assert under_openai_chat(body, None) is body and under_ollama(body, None, True) is body
    out = under_ollama(body, MADE, True)
    assert out["options"] == {**MADE["parameters"], "top_k": 3} and out["messages"][0]["role"] == "system"
    gen = under_ollama({"prompt": "p", "options": {"temperature": 1.0}}, MADE, False)
    assert gen["system"] == "Be a pirate." and gen["options"]["temperature"] == 1.0

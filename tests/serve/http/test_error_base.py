"""One error base (serve/core/errors.py): a StrataError raised anywhere below the shell is answered at the one
boundary in the caller's dialect, with its status and message; anything else is a bug: a 500 whose text names
only its type ("internal error (KeyError)"), never a 400 that blames the client, never a traceback in the
answer, and one entry in the server log with the traceback. Text the tokenizer cannot take is bad input (400)."""
import json
import sys

import pytest

from serve.api import anthropic, openai
from serve.api.replies import RequestContext
from serve.core.errors import ServiceUnavailable, StrataError, client_error
from serve.core.events import BadRequest
from tests.serve.conftest import StubService, chat, sse_events

TEXT = "Hello there, friend."

# one POST route per dialect, with a body the route accepts up to the point the planted failure is raised
DIALECT_ROUTES = {
    "openai": "/v1/chat/completions",
    "anthropic": "/v1/messages",
    "ollama": "/api/chat",
    "llama.cpp": "/completion",
}


def _shape(dialect, body):
    """(message, type-ish) read the way each dialect's clients read an error body."""
    if dialect == "anthropic":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        return body["error"]["message"], body["error"]["type"]
    if dialect == "ollama":
        assert set(body) == {"error"} and isinstance(body["error"], str)
        return body["error"], None
    if dialect == "llama.cpp":
        assert set(body["error"]) >= {"code", "message", "type"}
        return body["error"]["message"], body["error"]["type"]
    assert set(body["error"]) >= {"message", "type", "param", "code"}
    return body["error"]["message"], body["error"]["type"]


def _plant(monkeypatch, path, exc):
    """The route at `path` raises `exc` (as a translator or the Service below it would)."""
    def route(svc, body, ctx):
        raise exc
    monkeypatch.setitem(sys.modules["serve.http.routes"].POST_ROUTES, path, route)


@pytest.mark.parametrize("dialect", list(DIALECT_ROUTES))
def test_a_client_error_is_a_400_in_each_dialects_shape(server, monkeypatch, dialect):
    s = server({"turns": [{"text": "ok"}]})
    path = DIALECT_ROUTES[dialect]
    _plant(monkeypatch, path, BadRequest("temperature: a number from 0 to 2", param="temperature"))
    status, body, _ = s.post(path, chat())
    message, kind = _shape(dialect, body)
    assert status == 400 and message == "temperature: a number from 0 to 2"
    assert kind in (None, "invalid_request_error")
    if dialect == "openai":
        assert body["error"]["param"] == "temperature"


@pytest.mark.parametrize("dialect", list(DIALECT_ROUTES))
@pytest.mark.parametrize("bug", [KeyError("choices"), TypeError("'NoneType' object is not subscriptable"),
                                 AttributeError("'dict' object has no attribute 'req'"),
                                 ValueError("invalid literal for int() with base 10: 'x'")])
def test_a_bug_is_a_500_with_a_short_reason_and_a_logged_traceback(server, monkeypatch, capfd, dialect, bug):
    s = server({"turns": [{"text": "ok"}]})
    path = DIALECT_ROUTES[dialect]
    _plant(monkeypatch, path, bug)
    status, body, _ = s.post(path, chat())
    message, kind = _shape(dialect, body)
    name = type(bug).__name__
    assert status == 500 and message == f"internal error ({name}); see the server log"
    assert kind in (None, "server_error", "api_error")
    assert "Traceback" not in str(body) and str(bug.args[0]) not in str(body)
    log = capfd.readouterr().err
    assert f"strata: internal error ({name}: " in log and f"POST {path}" in log
    assert "Traceback (most recent call last)" in log and "in route" in log   # where it was raised


def test_statuses_and_types_of_the_error_family_travel_unchanged(server, monkeypatch):
    s = server({"turns": [{"text": "ok"}]})
    cases = [(ServiceUnavailable("the engine is starting; try again shortly"), 503, "unavailable_error"),
             (BadRequest("prompt is too long", status=413), 413, "invalid_request_error"),
             (StrataError("model 'x' is busy", status=409, err_type="model_busy", code="model_busy"), 409,
              "model_busy")]
    for exc, status_want, type_want in cases:
        _plant(monkeypatch, "/v1/chat/completions", exc)
        status, body, _ = s.post("/v1/chat/completions", chat())
        assert (status, body["error"]["type"], body["error"]["message"]) == (status_want, type_want, exc.message)


def test_a_lone_surrogate_is_a_400_naming_it(server):
    s = server({"turns": [{"text": "ok"}]})
    raw = '{"messages": [{"role": "user", "content": "a\\ud800b"}]}'   # valid JSON, not encodable as UTF-8
    status, body, _ = s.post("/v1/chat/completions", raw, headers={"Content-Type": "application/json"})
    assert status == 400 and "lone surrogate U+D800" in body["error"]["message"]
    status, body, _ = s.post("/tokenize", '{"content": "\\udfff"}', headers={"Content-Type": "application/json"})
    assert status == 400 and "lone surrogate U+DFFF" in body["error"]["message"] and body["error"]["code"] == 400


def test_the_tokenizers_text_error_is_a_client_error_and_other_exceptions_are_not():
    from tokenizer.base import ByteTokenizer, TextError
    with pytest.raises(TextError) as info:
        ByteTokenizer().encode("x\ud83d")
    err = client_error(info.value)
    assert err is not None and err.status == 400 and "lone surrogate" in err.message
    with pytest.raises(TextError):
        ByteTokenizer().decode([10, 99999])
    assert client_error(RecursionError()).message == "the request is nested too deeply"
    for bug in (KeyError("x"), TypeError("y"), AttributeError("z"), ValueError("w"), RuntimeError("v")):
        assert client_error(bug) is None


def _openai_data(frames):
    return [json.loads(block[6:]) for block in "".join(frames).split("\n\n")
            if block.startswith("data: ") and block != "data: [DONE]"]


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_a_bug_after_the_headers_ends_the_stream_with_the_short_reason(dialect, capfd):
    svc = StubService(TEXT, pieces=list(TEXT), fail_after=3, failure=KeyError("secret-detail"))
    body = {"model": "m", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    if dialect == "openai":
        frames = list(openai.chat_completions(svc, body, RequestContext()).frames)
        last = _openai_data(frames)[-1]
    else:
        frames = list(anthropic.messages(svc, body, RequestContext()).frames)
        last = sse_events(frames)[-1][1]
    assert last["error"]["message"] == "internal error (KeyError); see the server log"
    assert "secret-detail" not in "".join(frames)
    assert "strata: internal error (KeyError: 'secret-detail')" in capfd.readouterr().err

"""The first five minutes on the real engine and the default model, with `strata serve`'s own defaults (the
chat template's system prompt, the default lanes): "Hi" gets a short greeting that ends, on every API, and a
second client gets its answer while a long reply runs (issue 10). Skips without the engine or the model."""
import http.client
import json
import os
import threading
import time

import pytest

from tests.conftest import ENGINE_EXE, model_path
from tools.bench_server import start_server, stop_server

HI = {"messages": [{"role": "user", "content": "Hi"}]}
GREETING_MAX_TOKENS = 40   # "Hello! How can I assist you today?" is 10 tokens; a runaway reply is thousands


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    if model_path() is None or not os.access(ENGINE_EXE, os.X_OK):
        pytest.skip("needs build/strata-engine and the default model")
    tmp = tmp_path_factory.mktemp("real")
    proc, port = start_server(["--log", str(tmp / "engine.log")], ready_s=300)
    try:
        yield port
    finally:
        stop_server(proc)


def _post(port, path, body, timeout=180):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    return r.status, json.loads(r.read())


def test_hi_gets_a_short_greeting_that_ends(port):
    for _ in range(3):
        status, got = _post(port, "/v1/chat/completions", HI)
        assert status == 200, got
        text = got["choices"][0]["message"]["content"]
        assert got["choices"][0]["finish_reason"] == "stop", text
        assert 0 < got["usage"]["completion_tokens"] <= GREETING_MAX_TOKENS, text
        assert any(w in text.lower() for w in ("hello", "hi", "hey", "greetings")), text
    status, got = _post(port, "/v1/messages", {**HI, "max_tokens": 200})
    assert status == 200 and got["stop_reason"] == "end_turn", got
    assert got["usage"]["output_tokens"] <= GREETING_MAX_TOKENS
    status, props = _post_get(port, "/props")
    assert props["total_slots"] == (4 if (os.cpu_count() or 1) >= 2 else 1)


def _post_get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, json.loads(r.read())


def test_a_second_client_is_answered_while_a_long_reply_runs(port):
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: the default is one lane")
    long_body = {"messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
                 "max_tokens": 1200, "stream": True, "temperature": 0.8, "seed": 7,
                 "logit_bias": {"0": -100, "2": -100}}   # <|endoftext|>, <|im_end|>: it cannot end early
    marks = {}
    started = threading.Event()

    def long_client():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        c.request("POST", "/v1/chat/completions", json.dumps(long_body), {"Content-Type": "application/json"})
        r = c.getresponse()
        n = 0
        for line in r:
            if line.startswith(b"data: {"):
                n += 1
                if n == 5:
                    started.set()
        marks["long_end"], marks["long_chunks"] = time.monotonic(), n
        started.set()

    t = threading.Thread(target=long_client)
    t.start()
    assert started.wait(120)
    status, got = _post(port, "/v1/chat/completions", HI)
    marks["short_end"] = time.monotonic()
    t.join(300)
    assert status == 200 and got["choices"][0]["finish_reason"] == "stop"
    assert marks["long_chunks"] > 100
    assert marks["short_end"] < marks["long_end"], "the second client waited for the long reply"

"""Fixtures for the server tests: an in-process server over a scripted fake engine, and HTTP helpers."""
import contextlib
import http.client
import json
import threading

import pytest

from serve.engine_client.engine import StrataEngine
from serve.http.server import Options, make_server
from serve.generation.service import Service
from tests.conftest import fake_argv
from tokenizer.bpe import ByteTokenizer


class Running:
    def __init__(self, httpd, svc):
        self.httpd, self.svc = httpd, svc
        self.port = httpd.server_address[1]

    def conn(self, timeout=10):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=10):
        c = self.conn(timeout)
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        c.request(method, path, body=data, headers=headers or {})
        r = c.getresponse()
        raw = r.read()
        c.close()
        ctype = r.getheader("Content-Type") or ""
        return r.status, (json.loads(raw) if "json" in ctype and raw else raw.decode()), r

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def stream(self, body, path="/v1/chat/completions", headers=None):
        """(status, list of parsed data events, raw text)."""
        status, text, _ = self.post(path, {**body, "stream": True}, headers=headers)
        events = []
        for block in text.split("\n\n") if isinstance(text, str) else []:
            if block.startswith("data: ") and block != "data: [DONE]":
                events.append(json.loads(block[6:]))
        return status, events, text


def start_http(svc, started, **opts) -> Running:
    """An in-process server over `svc` (a Service or a Lifecycle) on a free port, added to `started`."""
    httpd = make_server(svc, Options(host="127.0.0.1", port=0, quiet=True, **opts))
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    run = Running(httpd, svc)
    started.append(run)
    return run


def stop_http(run) -> None:
    run.httpd.stopping.set()
    run.httpd.shutdown()
    run.httpd.server_close()


@pytest.fixture
def server(tmp_path):
    """server(script=None, **options) -> Running; everything is stopped after the test."""
    started = []

    def start(script=None, config=None, ctx=2048, silence_s=300.0, **opts):
        engine = StrataEngine(fake_argv(tmp_path, script), ["--max-context", str(ctx)],
                              log_path=str(tmp_path / "engine.log"), silence_s=silence_s)
        engine.start()
        svc = Service(engine, ByteTokenizer(), "fake-model", config=config or {})
        return start_http(svc, started, **opts)

    yield start
    for run in started:
        stop_http(run)
        run.svc.engine.close()


def chat(text="hi", **extra):
    return {"messages": [{"role": "user", "content": text}], **extra}


@contextlib.contextmanager
def real_server(engine_exe, model, tmp, ctx, args=()):
    """An in-process server over the real engine and model (the callers skip when either is absent); `args`:
    more engine flags (e.g. --batch 4)."""
    from serve.prompt.chatml import ChatTemplate
    from tokenizer.bpe import Tokenizer
    tok = Tokenizer.from_gguf(model, cache_dir=str(tmp))
    engine = StrataEngine([engine_exe], ["--model", model, "--max-context", str(ctx), *args],
                          log_path=str(tmp / "e.log"))
    engine.start()
    svc = Service(engine, tok, "smollm2", ChatTemplate.from_text(tok.chat_template), arch="llama")
    httpd = make_server(svc, Options(port=0, quiet=True))
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield Running(httpd, svc)
    finally:
        httpd.shutdown()
        httpd.server_close()
        engine.close()

"""Fixtures for the server tests: an in-process server over a scripted fake engine, and HTTP helpers."""
import contextlib
import http.client
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from serve.core.errors import ServiceUnavailable
from serve.core.events import Done, Event, KIND_PING, ToolSpec
from serve.engine_client.engine import StrataEngine
from serve.engine_client.replicas import ReplicaEngine
from serve.generation.output_parser import OutputParser
from serve.generation.service import Service
from serve.http.server import Options, make_server
from serve.lifecycle import Lifecycle, ModelEntry
from serve.prompt.chatml import ChatTemplate
from tests.conftest import ROOT, fake_argv
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
        try:
            raw, r.cut_short = r.read(), False
        except http.client.IncompleteRead as e:   # a stream cut short ends without its last chunk
            raw, r.cut_short = e.partial, True
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
    """An in-process server over `svc` (a Service or a Lifecycle) on a free port (of 127.0.0.1 unless `host`
    says otherwise), added to `started`."""
    httpd = make_server(svc, Options(**{"host": "127.0.0.1", "port": 0, "quiet": True, **opts}))
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    run = Running(httpd, svc)
    started.append(run)
    return run


def stop_http(run) -> None:
    run.httpd.begin_stop()
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
def real_server(engine_exe, model, tmp, ctx, args=(), **opts):
    """An in-process server over the real engine and model (the callers skip when either is absent); `args`:
    more engine flags (e.g. --batch 4); `opts`: more server Options (e.g. slot_save_path)."""
    from serve.prompt.chatml import ChatTemplate
    from tokenizer.bpe import Tokenizer
    tok = Tokenizer.from_gguf(model, cache_dir=str(tmp))
    engine = StrataEngine([engine_exe], ["--model", model, "--max-context", str(ctx), *args],
                          log_path=str(tmp / "e.log"))
    engine.start()
    svc = Service(engine, tok, "smollm2", ChatTemplate.from_text(tok.chat_template), arch="llama")
    httpd = make_server(svc, Options(port=0, quiet=True, **opts))
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield Running(httpd, svc)
    finally:
        httpd.shutdown()
        httpd.server_close()
        engine.close()


FAKE_SLOTS = os.path.join(ROOT, "tests", "fake_engine_slots.py")


def q(text):
    return [257] + list(text.encode()) + [10]


def answer(text, repeat=1):
    return f"<{text}>".encode() * repeat


def text_of(ids):
    return bytes(t for t in ids if t < 256)


@pytest.fixture
def slots_engine(tmp_path):
    made = []

    def make(script=None, **kw):
        script = dict(script or {})
        script.setdefault("record", str(tmp_path / "rec.txt"))
        script.setdefault("ctx", 8192)
        path = tmp_path / f"slots-{len(made)}.json"
        path.write_text(json.dumps(script))
        e = StrataEngine([sys.executable, FAKE_SLOTS, "--script", str(path)], [], **kw)
        e.start()
        e.record = tmp_path / "rec.txt"
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def long_q(text, n):
    """A prompt of about n tokens whose question (and answer) is short: the filler is an earlier turn."""
    return [257] + [122] * n + [10] + q(text)


def run(e, text, max_new=1000, res=None, cancelled=None, firsts=None, name=None, ids=None):
    res = {} if res is None else res
    out = []
    for t in e.generate(ids or q(text), max_new, cancelled=cancelled, result=res):
        if t is None:
            continue
        if firsts is not None and not out:
            firsts[text if name is None else name] = time.monotonic()
        out.append(t)
    return out


def commands(e):
    return [ln.split(" ", 1)[1] for ln in e.record.read_text().splitlines()] if e.record.exists() else []


@pytest.fixture
def slot_server(tmp_path):
    started = []

    def start(script, replicas=1, **opts):
        engines = []
        for i in range(replicas):
            path = tmp_path / f"s{i}.json"
            path.write_text(json.dumps(script))
            engines.append(StrataEngine([sys.executable, FAKE_SLOTS, "--script", str(path)],
                                        ["--max-context", "8192"]))
        engine = engines[0] if replicas == 1 else ReplicaEngine(engines)
        engine.start()
        svc = Service(engine, ByteTokenizer(), "fake-model")
        httpd = make_server(svc, Options(host="127.0.0.1", port=0, quiet=True, **opts))
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        run = Running(httpd, svc)
        started.append(run)
        return run

    yield start
    for run in started:
        run.httpd.begin_stop()
        run.httpd.shutdown()
        run.httpd.server_close()
        run.svc.engine.close()


@pytest.fixture
def lifecycle_server(tmp_path):
    yield from lifecycle_servers(tmp_path)


@pytest.fixture
def cserver(server, slot_server, tmp_path):
    """cserver(script, slots=False) -> (Running, recorded grammars()); JSON-form tool calls."""
    def start(script=None, slots=False):
        record = tmp_path / f"grammars-{len(list(tmp_path.glob('grammars-*')))}.txt"
        record.touch()
        script = {**(script or {}), "record_grammar": str(record)}
        run = slot_server(script) if slots else server(script, ctx=4096)
        run.svc.template = ChatTemplate(tool_format="json")

        def grammars():
            return [json.loads(line) for line in record.read_text().splitlines()]
        return run, grammars
    return start


def sse_events(frames):
    """SSE text -> [(event name, data)]; comments are skipped as an SSE reader does."""
    out = []
    for frame in "".join(frames).split("\n\n"):
        if not frame or frame.startswith(":"):
            continue
        name, data = None, None
        for line in frame.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        assert name == data["type"], "the event name repeats the data's type"
        out.append((name, data))
    return out


def assemble(events):
    """What the SDK's message accumulator builds, with the order checks its state machine relies on."""
    assert events[0][0] == "message_start"
    message = events[0][1]["message"]
    assert message["content"] == [] and message["stop_reason"] is None
    open_index, partial = None, {}
    seen_delta = seen_stop = False
    for name, data in events[1:]:
        assert not seen_stop, "nothing after message_stop"
        if name == "ping":
            continue
        if name == "content_block_start":
            assert open_index is None and not seen_delta, "one block at a time, before message_delta"
            assert data["index"] == len(message["content"]), "block indexes count from 0"
            block = dict(data["content_block"])
            assert block["type"] in ("text", "thinking", "tool_use")
            if block["type"] == "tool_use":
                assert block["input"] == {} and block["id"] and block["name"]
                partial[data["index"]] = ""
            message["content"].append(block)
            open_index = data["index"]
        elif name == "content_block_delta":
            assert data["index"] == open_index, "deltas go to the open block"
            block, delta = message["content"][open_index], data["delta"]
            kind = {"text": "text_delta", "thinking": "thinking_delta", "tool_use": "input_json_delta"}
            assert delta["type"] == kind[block["type"]]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            else:   # the SDK re-parses the buffer after every piece (jiter, partial mode)
                partial[open_index] += delta["partial_json"]
                try:
                    block["input"] = json.loads(partial[open_index])
                except ValueError:
                    block["input"] = {"__partial__": partial[open_index]}
        elif name == "content_block_stop":
            assert data["index"] == open_index
            open_index = None
        elif name == "message_delta":
            assert open_index is None, "every block is stopped before message_delta"
            message["stop_reason"] = data["delta"]["stop_reason"]
            message["stop_sequence"] = data["delta"]["stop_sequence"]
            message["usage"].update(data["usage"])
            seen_delta = True
        elif name == "message_stop":
            assert seen_delta
            seen_stop = True
        else:
            raise AssertionError(f"unexpected event {name}")
    assert seen_stop, "the stream ends with message_stop"
    return message


TOOLS = [
    ToolSpec("get_weather", "Weather for a city", {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}),
    ToolSpec("write_file", "Write a file", {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"}}}),
    ToolSpec("run", "", {}),
    ToolSpec("list_files", "", {"type": "object", "properties": {}}),
]


def counter_ids():
    n = itertools.count()
    return lambda: f"call_{next(n):024x}"


def assemble_openai_stream(deltas):
    """How the OpenAI SDK's stream accumulator builds message.tool_calls: by index, id/type/name from the
    first delta that has them, argument strings concatenated."""
    calls = {}
    for d in deltas:
        slot = calls.setdefault(d["index"], {"id": None, "type": None, "function": {"name": None,
                                                                                  "arguments": ""}})
        if "id" in d:
            assert slot["id"] is None, "id only on the first delta of a call"
            slot["id"], slot["type"] = d["id"], d["type"]
            slot["function"]["name"] = d["function"]["name"]
        else:
            assert slot["id"] is not None, "the first delta of a call carries its id"
            assert set(d) == {"index", "function"} and set(d["function"]) == {"arguments"}
        slot["function"]["arguments"] += d["function"].get("arguments", "")
    return [calls[i] for i in sorted(calls)]


class StubService:
    """The service surface a translator uses, scripted: `run` parses `text` (fed in `pieces`) as the model's
    output, with deterministic call ids."""

    def __init__(self, text, thinking=False, pieces=None, fail_after=None, prompt_tokens=12, finish="stop",
                 failure=None):
        self.pieces = pieces if pieces is not None else [text]
        self.thinking, self.fail_after, self.n, self.finish = thinking, fail_after, prompt_tokens, finish
        self.failure = failure   # what `run` raises at piece `fail_after` (default: a dead engine's 503)
        self.config, self.model_name = {"aliases": ["claude-x"]}, "smollm2"

    def prepare(self, req):
        return SimpleNamespace(req=req, prompt_tokens=self.n)

    def count_tokens(self, req):
        return self.n

    def run(self, prep, cancelled=None, on_wait=None):
        parser = OutputParser(prep.req.tools, self.thinking, parallel=prep.req.parallel_tool_calls,
                              new_id=counter_ids())
        yield Event(KIND_PING)
        for i, piece in enumerate(self.pieces):
            if self.fail_after is not None and i == self.fail_after:
                raise self.failure or ServiceUnavailable("engine died")   # as Service.run turns a dead engine
            yield from parser.feed(piece)
        yield from parser.finish()
        yield Done(self.finish, self.n, len(self.pieces), cached_tokens=3)


@pytest.fixture(scope="module")
def nvml_stub(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stub NVML library")
    d = tmp_path_factory.mktemp("nvml")
    src, lib = d / "nvml_stub.c", d / "libnvidia-ml-stub.so"
    src.write_text(NVML_STUB_C)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return str(lib)


def gen_keys(line):
    return {w.split("=", 1)[0]: w.split("=", 1)[1] for w in line.split()[1:-1] if "=" in w}


SPECIMENS_PATH = os.path.join(ROOT, "tests", "data", "toolcall_specimens.json")
with open(SPECIMENS_PATH, encoding="utf-8") as _f:
    SPECIMENS = json.load(_f)   # the tool-call specimens several dialects' tests replay


NVML_STUB_C = r"""
/* A stand-in for libnvidia-ml.so: two GPUs; GPU 1 has no power reading (the call fails). */
#include <string.h>
typedef struct { unsigned int gpu, memory; } util_t;
typedef struct { unsigned long long total, free, used; } mem_t;
static int inited = 0;
int nvmlInit_v2(void) { inited = 1; return 0; }
int nvmlShutdown(void) { inited = 0; return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { if (!inited) return 1; *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) { *h = (void *)(long)(i + 1); return 0; }
int nvmlDeviceGetName(void *h, char *name, unsigned int len) {
    strncpy(name, (long)h == 1 ? "Stub GPU A" : "Stub GPU B", len); return 0; }
int nvmlDeviceGetUtilizationRates(void *h, util_t *u) { u->gpu = 40 + (unsigned)(long)h; u->memory = 5; return 0; }
int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) {
    m->total = 80ull << 30; m->used = (unsigned long long)(long)h << 30; m->free = m->total - m->used; return 0; }
int nvmlDeviceGetTemperature(void *h, int sensor, unsigned int *t) { *t = sensor == 0 ? 60 + (unsigned)(long)h : 0; return 0; }
int nvmlDeviceGetPowerUsage(void *h, unsigned int *mw) { if ((long)h == 2) return 3; *mw = 250500; return 0; }
"""


# ---------------------------------------------------------------- fake-engine Lifecycle servers
WAIT_S = 20.0   # generous: the machine is shared; nothing below depends on speed


def engine_pid(rec_file):
    with open(rec_file) as f:
        return int(f.readlines()[-1].split()[0])


def process_gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:   # a zombie until its parent reaps it counts as gone
        import psutil
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except Exception:
        return True
    return False


def wait_until(check, timeout_s=WAIT_S):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return False


def lifecycle_servers(tmp_path):
    """Yields start(names, lazy, idle_s, turn, ...) -> Running over a Lifecycle of fake engines; everything it
    started is stopped after the test."""
    started = []

    def start(names=("alpha", "beta"), lazy=True, idle_s=0.0, turn=None, config_path=None, lease_wait=False,
              max_loaded=1, ram_budget_bytes=None, info=None, templates=None, store=None, **opts):
        """`turn`: one turn for every model, or {name: turn}; `info`: {name: extra ModelEntry.info};
        `templates`: {name: chat template} (default ChatML); `store`: a folder for Ollama's created models
        (serve/lifecycle/created.py; a created model's own file runs on a fake engine named after it)."""
        def entry(n, own=None, aliases=()):
            script = {"record": str(tmp_path / f"{n}.rec"), "record_gen": str(tmp_path / f"{n}.gen"),
                      "turns": [own or {"text": f"I am {n}."}]}
            argv = fake_argv(tmp_path, script)

            def make(argv=argv, n=n):
                engine = StrataEngine(argv, ["--max-context", "2048"], log_path=str(tmp_path / f"{n}.log"))
                return Service(engine, ByteTokenizer(), n, (templates or {}).get(n))
            return ModelEntry(n, make, aliases=list(aliases),
                              info={"n_ctx": 2048, "config_path": config_path, **(info or {}).get(n, {})})
        entries = [entry(n, turn.get(n) if isinstance(turn, dict) and "text" not in turn else turn, [f"{n}-alias"])
                   for n in names]
        lc = Lifecycle(entries, lazy_load=lazy, idle_unload_s=idle_s, lease_wait=lease_wait, max_loaded=max_loaded,
                       ram_budget_bytes=ram_budget_bytes)
        lc.lease_token = "the-token"
        if store is not None:
            from serve.lifecycle.created import ModelStore
            lc.entry_factory = lambda name, path: entry(name)
            ModelStore(str(store)).attach(lc)
        run = start_http(lc, started, **opts)
        lc.boot()
        run.rec = lambda n: str(tmp_path / f"{n}.rec")
        run.gen = lambda n: str(tmp_path / f"{n}.gen")   # every BGEN line whole
        return run

    yield start
    for run in started:
        stop_http(run)
        run.svc.close()
        run.svc.stop_engine()

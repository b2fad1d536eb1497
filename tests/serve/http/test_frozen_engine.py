"""The SIGSTOP matrix (issue 25): a frozen engine is always caught, whatever waits on it.

For each engine (the fake, one slot and several; the real engine on the default model, one slot and `--batch 2`,
skipped when either is absent) and each moment (idle; a request sent right after the freeze, so it waits for
its admission or its one-slot answer; mid-stream), under STRATA_ENGINE_STALL_S=STALL_S:
- every request is answered within STALL_S + 5 s: 200, or the dialect's error (503; a stream's error event);
- `/health` is truthful: 503 with the freeze in its message once it is caught (idle: within the stall limit
  of the SIGSTOP, plus a tick), 200 again after the supervisor's replacement;
- the frozen process is gone (SIGKILL works on a stopped process) and the next request is 200.
Each case prints its figures (seconds to the answer, the /health transitions) for the record (`pytest -s`).
"""
import http.client
import json
import os
import signal
import sys
import threading
import time

import pytest

from serve.engine_client.engine import StrataEngine
from serve.generation.service import Service
from tests.conftest import ENGINE_EXE, fake_argv, model_path
from tests.serve.conftest import FAKE_SLOTS, chat, process_gone, start_http, stop_http, wait_until

STALL_S = 3.0               # small, so the matrix runs in seconds; the engine answers PING in milliseconds
ANSWER_LIMIT_S = STALL_S + 5  # the bound on every request's answer
CAUGHT_LIMIT_S = STALL_S + 1.5  # idle: /health 503 within the stall limit of the freeze, plus a tick and a poll
REPLACED_LIMIT_S = 60.0     # a new engine answers /health 200 (the real model loads in a second or two)
KINDS = ("fake-one-slot", "fake-slots", "real-one-slot", "real-slots")
REAL_ENGINE = os.environ.get("STRATA_TEST_ENGINE") or ENGINE_EXE


class HealthWatch:
    """Polls /health every 50 ms on its own thread; `changes` are (seconds since start, status, message)."""

    def __init__(self, run):
        self.run, self.t0, self.changes = run, time.monotonic(), []
        self.lock = threading.Lock()  # guards changes
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self):
        while not self.stop.wait(0.05):
            try:
                status, body, _ = self.run.request("GET", "/health", timeout=5)
            except OSError:
                continue
            msg = body.get("error", {}).get("message", "") if isinstance(body, dict) else ""
            with self.lock:
                if not self.changes or self.changes[-1][1] != status:
                    self.changes.append((round(time.monotonic() - self.t0, 2), status, msg[:120]))

    def first(self, status, after_s=0.0):
        with self.lock:
            return next((c for c in self.changes if c[1] == status and c[0] >= after_s), None)

    def close(self):
        self.stop.set()
        self.thread.join(5)
        return list(self.changes)


def _service(kind, tmp_path):
    if kind.startswith("real"):
        model = model_path()
        if model is None or not os.access(REAL_ENGINE, os.X_OK):
            pytest.skip("needs build/strata-engine (or STRATA_TEST_ENGINE) and the default model")
        from serve.prompt.chatml import ChatTemplate
        from tokenizer.bpe import Tokenizer
        tok = Tokenizer.from_gguf(model, cache_dir=str(tmp_path))
        args = ["--model", model, "--max-context", "2048"] + (["--batch", "2"] if kind == "real-slots" else [])
        engine = StrataEngine([REAL_ENGINE], args, log_path=str(tmp_path / "e.log"))
        return engine, lambda: Service(engine, tok, "smollm2", ChatTemplate.from_text(tok.chat_template),
                                       arch="llama")
    from tokenizer.bpe import ByteTokenizer
    if kind == "fake-one-slot":
        argv = fake_argv(tmp_path, {"turns": [{"text": "abcdefgh" * 50, "token_delay_s": 0.02}]})
    else:
        path = tmp_path / "slots.json"
        path.write_text(json.dumps({"repeat": 100, "step_delay_s": 0.02}))
        argv = [sys.executable, FAKE_SLOTS, "--script", str(path)]
    engine = StrataEngine(argv, ["--max-context", "8192"], log_path=str(tmp_path / "e.log"))
    return engine, lambda: Service(engine, ByteTokenizer(), "fake-model")


@pytest.fixture
def frozen(tmp_path, monkeypatch):
    """frozen(kind) -> Running over a started engine of that kind with its supervisor; stopped after."""
    monkeypatch.setenv("STRATA_ENGINE_STALL_S", str(STALL_S))
    started, pids = [], []

    def make(kind):
        engine, service = _service(kind, tmp_path)
        engine.start()
        svc = service()
        svc.start_engine()  # the engine runs: this starts the supervisor
        run = start_http(svc, started)
        run.pids = pids
        return run

    yield make
    for run in started:
        if run.svc.supervisor is not None:
            run.svc.supervisor.stop()
        stop_http(run)
        run.svc.engine.close()
    for pid in pids:  # a failed case must not leave a stopped process behind
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _freeze(run):
    pid = run.svc.engine.current().popen.pid
    run.pids.append(pid)
    os.kill(pid, signal.SIGSTOP)
    return pid, time.monotonic()


def _body(kind, **extra):
    body = chat("Count from one to fifty, one number per line.", max_tokens=400, **extra)
    if kind.startswith("real"):
        body["logit_bias"] = {"2": -100, "0": -100}  # SmolLM2's <|im_end|> and <|endoftext|>: a long answer
    return body


def _stream_until_frozen(run, kind, freeze_after_events):
    """Streams a long answer, SIGSTOPs the engine after that many data events, reads to the end: (status,
    events, seconds from the freeze to the stream's end, pid)."""
    conn = http.client.HTTPConnection("127.0.0.1", run.port, timeout=ANSWER_LIMIT_S + 5)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(_body(kind, stream=True)),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    events, pid, t_freeze = [], None, None
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        events.append(json.loads(line[6:]))
        if pid is None and len(events) >= freeze_after_events:
            pid, t_freeze = _freeze(run)
    conn.close()
    return r.status, events, time.monotonic() - t_freeze if t_freeze else None, pid


def _replaced(run, watch, pid, after_s):
    """The frozen process is gone, /health came back to 200, the next request is 200."""
    assert wait_until(lambda: process_gone(pid), 10), "the frozen engine was not ended"
    assert wait_until(lambda: watch.first(200, after_s) is not None, REPLACED_LIMIT_S), watch.changes
    status, body, _ = run.post("/v1/chat/completions", chat("Say hi.", max_tokens=8), timeout=30)
    assert status == 200, body


def _report(kind, case, answered_s, watch):
    print(f"\n[sigstop] {kind:10s} {case:10s} answered in {answered_s if answered_s is None else round(answered_s, 2)}"
          f" s; /health: {watch.close()}")


@pytest.mark.parametrize("kind", KINDS)
def test_frozen_while_idle(frozen, kind):
    run = frozen(kind)
    watch = HealthWatch(run)
    time.sleep(0.3)
    pid, t0 = _freeze(run)
    caught = t0 - watch.t0
    assert wait_until(lambda: watch.first(503, caught) is not None, CAUGHT_LIMIT_S + 2)
    at, _, message = watch.first(503, caught)
    assert at - caught <= CAUGHT_LIMIT_S, f"/health 503 came {at - caught:.1f} s after the freeze"
    assert "froze" in message and "PING" in message
    _replaced(run, watch, pid, at)
    _report(kind, "idle", None, watch)
    assert watch.changes[0][1] == 200


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("kind", KINDS)
def test_frozen_at_admission(frozen, kind, stream):
    run = frozen(kind)
    watch = HealthWatch(run)
    pid, t0 = _freeze(run)
    status, body, _ = run.post("/v1/chat/completions", _body(kind, stream=stream), timeout=ANSWER_LIMIT_S + 5)
    answered = time.monotonic() - t0
    assert answered <= ANSWER_LIMIT_S, f"answered after {answered:.1f} s"
    if status == 200:  # a stream whose headers went out: its last event is the error
        events = [json.loads(b[6:]) for b in body.split("\n\n") if b.startswith("data: {")]
        assert stream and "error" in events[-1] and "froze" in events[-1]["error"]["message"], body[-400:]
    else:
        assert status == 503 and "froze" in body["error"]["message"], body
    assert wait_until(lambda: watch.first(503) is not None, 3), (watch.changes, answered, body)
    _replaced(run, watch, pid, watch.first(503)[0])
    _report(kind, "admission" + ("/stream" if stream else ""), answered, watch)


@pytest.mark.parametrize("kind", KINDS)
def test_frozen_mid_stream(frozen, kind):
    run = frozen(kind)
    watch = HealthWatch(run)
    status, events, after_freeze_s, pid = _stream_until_frozen(run, kind, 3)
    assert status == 200 and pid is not None, "the answer ended before the freeze"
    assert after_freeze_s <= ANSWER_LIMIT_S, f"the stream ended {after_freeze_s:.1f} s after the freeze"
    assert "error" in events[-1], events[-3:]
    assert any(e["choices"][0]["delta"].get("content") for e in events if e.get("choices"))
    assert wait_until(lambda: watch.first(503) is not None, 3), watch.changes
    _replaced(run, watch, pid, watch.first(503)[0])
    _report(kind, "mid-stream", after_freeze_s, watch)


@pytest.mark.parametrize("kind", ("fake-one-slot", "real-one-slot"))
def test_frozen_with_a_request_queued(frozen, kind):
    """One slot: a stream runs in it and a second request waits for it; then the engine freezes. The running
    stream ends with an error event within the limit; the waiting request was sent nowhere, so it keeps its
    place and is answered in full by the supervisor's replacement engine (200, never an error)."""
    run = frozen(kind)
    watch = HealthWatch(run)
    queued = {}

    def second():
        time.sleep(0.3)  # after the stream has taken the slot
        queued["answer"] = run.post("/v1/chat/completions", chat("Say hi.", max_tokens=8),
                                    timeout=REPLACED_LIMIT_S + ANSWER_LIMIT_S)
        queued["t"] = time.monotonic()

    waiter = threading.Thread(target=second)
    waiter.start()
    status, events, after_freeze_s, pid = _stream_until_frozen(run, kind, 12)
    waiter.join(REPLACED_LIMIT_S + ANSWER_LIMIT_S + 5)
    assert status == 200 and pid is not None, "the answer ended before the freeze"
    assert after_freeze_s <= ANSWER_LIMIT_S and "error" in events[-1], (after_freeze_s, events[-3:])
    got, body, _ = queued["answer"]
    assert got == 200 and body["choices"][0]["message"]["content"], body
    assert run.svc.engine.current().popen.pid != pid and run.svc.engine.batch.stats()["requeued"] == 1
    _replaced(run, watch, pid, watch.first(503)[0])
    _report(kind, "queued", round(queued["t"] - watch.t0, 2), watch)

"""Server benchmarks: the server's own cost per streamed token (fake engine) and TTFT / total time (real engine).

    python tools/bench_server.py fake [--tokens 20000] [--runs 3]
    python tools/bench_server.py real [--engine build/strata-engine] [--model FILE.gguf] [--runs 3]
    python tools/bench_server.py all

fake: the server runs over tests/fake_engine.py, which writes its `T` lines as fast as it can; one client
streams a long answer over SSE. Tokens/s received there is what one client can get through the server at
most, and 1/rate is the server's overhead per streamed token (pipe read, decode, parser, JSON, socket).
The same answer without streaming is measured too.
real: the real engine on the default model; a short chat request, streamed: time to the first content
delta (TTFT), total time, and the engine's own prompt/decode figures from `timings`, so the server's share
(total - prompt_ms - predicted_ms) shows.
Each run starts `python -m strata_cli serve` on a free port and ends it with SIGTERM. Prints one JSON
object per measurement and a summary line.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def start_server(extra, env=None, ready_s=120):
    cmd = [sys.executable, "-m", "strata_cli", "serve", "--port", "0", "--quiet", *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})
    end = time.monotonic() + ready_s
    while time.monotonic() < end:
        line = proc.stdout.readline().decode()
        if line.startswith("strata: listening on http://"):
            return proc, int(line.rsplit(":", 1)[1])
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit("the server did not start")


def stop_server(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def stream_chat(port, body):
    """(ttft_s, total_s, content tokens seen, last usage, last timings)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body=json.dumps({**body, "stream": True,
                                                               "stream_options": {"include_usage": True}}))
    r = c.getresponse()
    ttft, deltas, usage, timings, buf = None, 0, None, None, b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            block, buf = buf.split(b"\n\n", 1)
            if not block.startswith(b"data: ") or block == b"data: [DONE]":
                continue
            ev = json.loads(block[6:])
            if ev.get("choices") and ev["choices"][0]["delta"].get("content"):
                deltas += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
            if ev.get("usage"):
                usage, timings = ev["usage"], ev.get("timings")
    return ttft, time.perf_counter() - t0, deltas, usage, timings


def plain_chat(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body=json.dumps(body))
    out = json.loads(c.getresponse().read())
    return time.perf_counter() - t0, out


def bench_fake(tokens, runs):
    tmp = tempfile.mkdtemp(prefix="strata-bench-")
    script = os.path.join(tmp, "script.json")
    with open(script, "w") as f:
        json.dump({"turns": [{"text": "abcdefghij", "repeat": tokens // 10, "eos": False}]}, f)
    engine = f"{sys.executable} {os.path.join(ROOT, 'tests', 'fake_engine.py')} --script {script}"
    proc, port = start_server(["--tokenizer", "bytes", "--engine", engine, "--ctx", str(tokens + 1024),
                               "--log", os.path.join(tmp, "engine.log")])
    body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": tokens}
    rates, plain = [], []
    try:
        for _ in range(runs):
            ttft, total, deltas, usage, _ = stream_chat(port, body)
            rates.append(usage["completion_tokens"] / total)
            print(json.dumps({"bench": "fake_stream", "tokens": usage["completion_tokens"], "deltas": deltas,
                              "total_s": round(total, 3), "tok_s": round(rates[-1], 1)}))
            total, out = plain_chat(port, body)
            plain.append(out["usage"]["completion_tokens"] / total)
            print(json.dumps({"bench": "fake_non_stream", "total_s": round(total, 3), "tok_s": round(plain[-1], 1)}))
    finally:
        stop_server(proc)
    rate = statistics.median(rates)
    print(f"fake engine: one streaming client receives {rate:.0f} tok/s ({1e6 / rate:.0f} us per token of "
          f"server+fake overhead); non-stream {statistics.median(plain):.0f} tok/s")


def bench_real(engine, model, runs):
    from serve.bootstrap import ENGINE_EXE, default_model_path
    engine = engine or ENGINE_EXE
    model = model or default_model_path()
    if not (os.access(engine, os.X_OK) and model):
        print("real: skipped (no engine binary or model)")
        return
    proc, port = start_server(["--engine", engine, "--model", model, "--ctx", "2048"])
    body = {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                         {"role": "user", "content": "Write two sentences about the sea."}],
            "temperature": 0, "max_tokens": 48}
    rows = []
    try:
        for i in range(runs):
            # a different user text each run keeps the prompt cache honest: only the system part is reused
            run_body = {**body, "messages": body["messages"][:1] + [
                {"role": "user", "content": f"Write two sentences about the sea, number {i + 1}."}]}
            ttft, total, deltas, usage, t = stream_chat(port, run_body)
            engine_s = ((t.get("prompt_ms") or 0) + (t.get("predicted_ms") or 0)) / 1e3
            rows.append((ttft, total, total - engine_s))
            print(json.dumps({"bench": "real_stream", "prompt_tokens": usage["prompt_tokens"],
                              "cached": usage["prompt_tokens_details"]["cached_tokens"],
                              "tokens": usage["completion_tokens"], "ttft_s": round(ttft or -1, 3),
                              "total_s": round(total, 3), "engine_prompt_ms": t.get("prompt_ms"),
                              "engine_decode_tok_s": round(t.get("predicted_per_second") or 0, 1),
                              "server_share_s": round(total - engine_s, 3)}))
    finally:
        stop_server(proc)
    print(f"real engine: TTFT median {statistics.median(r[0] for r in rows):.3f} s, total median "
          f"{statistics.median(r[1] for r in rows):.3f} s, outside the engine's own figures "
          f"{statistics.median(r[2] for r in rows) * 1e3:.1f} ms per request")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["fake", "real", "all"])
    p.add_argument("--tokens", type=int, default=20000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--engine")
    p.add_argument("--model")
    a = p.parse_args()
    if a.what in ("fake", "all"):
        bench_fake(a.tokens, a.runs)
    if a.what in ("real", "all"):
        bench_real(a.engine, a.model, a.runs)


if __name__ == "__main__":
    main()

"""Benchmark parallel serving: Strata's decode slots (serve/batch.py over `strata-engine --batch N`).

Figures (a readable table, then one JSON line):
  decode_tok_s[c]   aggregate decode tokens/s with c = 1, 2, 4, 8 concurrent clients (each its own prompt,
                    greedy, --tokens new tokens each): tokens after each client's first token over the span
                    from the first first-token to the last end; median of --rounds passes
  ratio_8_over_1    median of each pass's own 8-client / 1-client ratio
  ttft_short_ms     p50/p95 time to first token of short requests sent while long prompts are read,
                    with short-first admission on and off (STRATA_ADMIT_SHORT_FIRST)
  peer              the same decode figures for llama.cpp's `llama-server -np 8` when its binary is present
                    (/root/.cache/strata-peer/srvbuild/bin/llama-server, or --peer PATH)
Bar from issue 3: 8 clients >= 3x one client's aggregate tok/s.

Usage: python3 tools/bench_serving.py [--model PATH] [--engine PATH] [--tokens 64] [--long 3000]
       [--shorts 6] [--threads N] [--rounds 3] [--no-peer]
"""
import argparse
import http.client
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from serve.engine import StrataEngine  # noqa: E402
from serve.bootstrap import ENGINE_EXE, default_model_path  # noqa: E402

PEER_SERVER = "/root/.cache/strata-peer/srvbuild/bin/llama-server"
CLIENTS = (1, 2, 4, 8)
BAR_8_OVER_1 = 3.0
PEER_READY_S = 120.0


def prompt(i, n=48):
    """A distinct chat-like id stream per client (1 = <|im_start|>, 2 = <|im_end|> in SmolLM2)."""
    return [1, 9690, 198] + [(1000 + 53 * i + 7 * k) % 40000 + 100 for k in range(n)] + [2, 198, 1, 520, 9531, 198]


def _client(gen_fn, ids, n_new, out, key):
    t0 = time.monotonic()
    first, n = None, 0
    for t in gen_fn(ids, n_new):
        if t is None:
            continue
        n += 1
        if first is None:
            first = time.monotonic()
    out[key] = (t0, first, time.monotonic(), n)


def decode_rate(gen_fn, clients, n_new, base=0):
    """Aggregate decode tok/s of `clients` concurrent requests: tokens after each first token over the span
    from the earliest first token to the last end."""
    out = {}
    ts = [threading.Thread(target=_client, args=(gen_fn, prompt(base + i), n_new, out, i)) for i in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    firsts = [v[1] for v in out.values() if v[1] is not None]
    span = max(v[2] for v in out.values()) - min(firsts)
    tokens = sum(max(0, v[3] - 1) for v in out.values())
    return tokens / span if span > 0 else 0.0


def ttft_while_long(engine, short_first, n_short, long_len, base):
    """p50/p95 ms to first token of short requests sent one by one while two long prompts are read (fresh
    prompts each run: nothing of them is cached)."""
    engine.batch.short_first = short_first
    longs = [[1, 9690, 198] + [(base + 17 * k + 1000 * j) % 40000 + 100 for k in range(long_len)] + [2, 198]
             for j in range(2)]
    sink = {}
    tl = [threading.Thread(target=_client, args=(engine.generate, ids, 4, sink, f"L{j}"))
          for j, ids in enumerate(longs)]
    for t in tl:
        t.start()
    time.sleep(0.3)
    got = {}
    ts = []
    for i in range(n_short):
        ts.append(threading.Thread(target=_client, args=(engine.generate, prompt(base + i, 16), 4, got, i)))
        ts[-1].start()
        time.sleep(0.15)
    for t in ts + tl:
        t.join()
    ms = sorted((v[1] - v[0]) * 1000 for v in got.values() if v[1] is not None)
    p95 = ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))]
    return {"p50": round(statistics.median(ms), 1), "p95": round(p95, 1)}


def _rounds(rate_fn, rounds):
    """Medians over `rounds` passes of 1, 2, 4, 8 clients (a shared machine's load drifts), and the median
    of each pass's own 8-over-1 ratio."""
    seen = {n: [] for n in CLIENTS}
    ratios = []
    for r in range(rounds):
        one = {n: rate_fn(n, r) for n in CLIENTS}
        for n in CLIENTS:
            seen[n].append(one[n])
        ratios.append(one[8] / one[1] if one[1] else 0.0)
    return {str(n): round(statistics.median(v), 1) for n, v in seen.items()}, statistics.median(ratios)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peer_rates(path, model, threads, n_new, rounds):
    """llama-server -np 8 (continuous batching): the same decode figures over its /completion endpoint."""
    port = _free_port()
    cmd = [path, "-m", model, "-np", "8", "-c", str(8 * 1024), "--port", str(port), "-t", str(threads),
           "--host", "127.0.0.1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + PEER_READY_S
        while time.monotonic() < end:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            return {"error": "llama-server did not become ready"}

        def gen(ids, n):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            body = {"prompt": ids, "n_predict": n, "temperature": 0, "stream": True, "cache_prompt": False,
                    "ignore_eos": True}
            c.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            for raw in r:
                if raw.startswith(b"data: "):
                    ev = json.loads(raw[6:])
                    if ev.get("content") is not None and not ev.get("stop"):
                        yield 0
                    if ev.get("stop"):
                        break
            c.close()
        return _rounds(lambda n, r: decode_rate(gen, n, n_new, base=200 + 10 * n + 100 * r), rounds)[0]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=default_model_path())
    ap.add_argument("--engine", default=os.environ.get("STRATA_ENGINE") or ENGINE_EXE)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--long", type=int, default=3000)
    ap.add_argument("--shorts", type=int, default=6)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--peer", default=PEER_SERVER)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="passes over 1, 2, 4, 8 clients (medians)")
    ns = ap.parse_args(argv)
    if not ns.model or not os.access(ns.engine, os.X_OK):
        print("bench_serving: needs the engine binary and the model", file=sys.stderr)
        return 2
    e = StrataEngine([ns.engine], ["--model", ns.model, "--batch", "8", "--threads", str(ns.threads)])
    e.start()
    try:
        if not e.info.get("batch_slots"):
            print("bench_serving: this engine has no batch slots", file=sys.stderr)
            return 2
        e.batch.solo_again_on = False  # measure the slots themselves
        rates, ratio = _rounds(lambda n, r: decode_rate(e.generate, n, ns.tokens, base=10 * n + 100 * r),
                               ns.rounds)
        ttft = {"short_first_on": ttft_while_long(e, True, ns.shorts, ns.long, 300),
                "short_first_off": ttft_while_long(e, False, ns.shorts, ns.long, 7300)}
    finally:
        e.close()
    peer = None
    if not ns.no_peer and os.access(ns.peer, os.X_OK):
        peer = peer_rates(ns.peer, ns.model, ns.threads, ns.tokens, ns.rounds)
    print(f"{'clients':>8} {'strata tok/s':>13} {'peer tok/s':>11}")
    for n in CLIENTS:
        print(f"{n:>8} {rates[str(n)]:>13} {(peer or {}).get(str(n), '-'):>11}")
    for k, v in ttft.items():
        print(f"TTFT of short requests during long reads, {k}: p50 {v['p50']} ms, p95 {v['p95']} ms")
    print(f"8 clients / 1 client: {ratio:.2f}x (bar {BAR_8_OVER_1}x: {'met' if ratio >= BAR_8_OVER_1 else 'NOT met'})")
    print(json.dumps({"decode_tok_s": rates, "ttft_short_ms": ttft, "peer_decode_tok_s": peer,
                      "ratio_8_over_1": round(ratio, 2), "bar_met": ratio >= BAR_8_OVER_1}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark parallel serving: Strata's decode slots (serve/batch.py over `strata-engine --batch N`).

Figures (a readable table, then one JSON line):
  decode_tok_s[c]   aggregate decode tokens/s with c = 1, 2, 4, 8 concurrent clients (each its own prompt,
                    greedy, --tokens new tokens each, end-of-turn ignored as the peer's ignore_eos): tokens
                    produced while all c clients were decoding, over that window (from the last client's
                    first token to the first client's end); best of --rounds passes
  e2e_tok_s[c]      the same tokens over the whole span from the first first-token to the last end: it also
                    holds the other clients' prompt reads (7 of them at 8 clients), so it is lower
  ratio_8_over_1    decode_tok_s[8] / decode_tok_s[1] (and the e2e ratio beside it)
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
from serve.batch import eos_ids  # noqa: E402
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
    stamps = []
    for t in gen_fn(ids, n_new):
        if t is not None:
            stamps.append(time.monotonic())
    out[key] = (t0, stamps)


def decode_rate(gen_fn, clients, n_new, base=0):
    """(steady, e2e) aggregate decode tok/s of `clients` concurrent requests: tokens while all of them were
    decoding over that window, and tokens after each first token over the whole span."""
    out = {}
    ts = [threading.Thread(target=_client, args=(gen_fn, prompt(base + i), n_new, out, i)) for i in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    runs = [v[1] for v in out.values() if v[1]]
    if not runs:
        return 0.0, 0.0
    first, last = min(r[0] for r in runs), max(r[-1] for r in runs)
    e2e = sum(len(r) - 1 for r in runs) / (last - first) if last > first else 0.0
    lo, hi = max(r[0] for r in runs), min(r[-1] for r in runs)
    if len(runs) < clients or hi <= lo:
        return 0.0, e2e
    # tokens strictly after lo (a client's first token at lo opens the window, it is not part of it)
    steady = sum(sum(1 for x in r if lo < x <= hi) for r in runs) / (hi - lo)
    return steady, e2e


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
    ms = sorted((v[1][0] - v[0]) * 1000 for v in got.values() if v[1])
    p95 = ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))]
    return {"p50": round(statistics.median(ms), 1), "p95": round(p95, 1)}


def _rounds(rate_fn, rounds):
    """Best of `rounds` passes over 1, 2, 4, 8 clients (a shared machine's load only ever slows a pass down),
    for the steady and the end-to-end figures."""
    steady = {n: 0.0 for n in CLIENTS}
    e2e = {n: 0.0 for n in CLIENTS}
    for r in range(rounds):
        for n in CLIENTS:
            s_, e_ = rate_fn(n, r)
            steady[n], e2e[n] = max(steady[n], s_), max(e2e[n], e_)
    return ({str(n): round(v, 1) for n, v in steady.items()}, {str(n): round(v, 1) for n, v in e2e.items()})


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
        return _rounds(lambda n, r: decode_rate(gen, n, n_new, base=200 + 10 * n + 100 * r), rounds)
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
    ap.add_argument("--tokens", type=int, default=128)
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
        no_eos = "logit_bias=" + ",".join(f"{i}:-100" for i in sorted(eos_ids(e.info)))  # as ignore_eos

        def gen(ids, n):
            return e.generate(ids, n, no_eos)
        rates, e2e = _rounds(lambda n, r: decode_rate(gen, n, ns.tokens, base=10 * n + 100 * r), ns.rounds)
        ratio = rates["8"] / rates["1"] if rates["1"] else 0.0
        ratio_e2e = e2e["8"] / e2e["1"] if e2e["1"] else 0.0
        ttft = {"short_first_on": ttft_while_long(e, True, ns.shorts, ns.long, 300),
                "short_first_off": ttft_while_long(e, False, ns.shorts, ns.long, 7300)}
    finally:
        e.close()
    peer = peer_e2e = None
    if not ns.no_peer and os.access(ns.peer, os.X_OK):
        got = peer_rates(ns.peer, ns.model, ns.threads, ns.tokens, ns.rounds)
        peer, peer_e2e = (got, None) if isinstance(got, dict) else got
    print(f"{'clients':>8} {'strata decode':>14} {'peer decode':>12} {'strata e2e':>11} {'peer e2e':>9}  (tok/s)")
    for n in CLIENTS:
        k = str(n)
        print(f"{n:>8} {rates[k]:>14} {(peer or {}).get(k, '-'):>12} {e2e[k]:>11} {(peer_e2e or {}).get(k, '-'):>9}")
    for k, v in ttft.items():
        print(f"TTFT of short requests during long reads, {k}: p50 {v['p50']} ms, p95 {v['p95']} ms")
    print(f"8 clients / 1 client: decode {ratio:.2f}x, e2e {ratio_e2e:.2f}x "
          f"(bar {BAR_8_OVER_1}x on decode: {'met' if ratio >= BAR_8_OVER_1 else 'NOT met'})")
    print(json.dumps({"decode_tok_s": rates, "e2e_tok_s": e2e, "ttft_short_ms": ttft, "peer_decode_tok_s": peer,
                      "peer_e2e_tok_s": peer_e2e, "ratio_8_over_1": round(ratio, 2),
                      "ratio_e2e_8_over_1": round(ratio_e2e, 2), "bar_met": ratio >= BAR_8_OVER_1}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

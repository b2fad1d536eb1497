"""Benchmark parallel serving: Strata's decode slots (serve/engine_client/batch.py over `strata-engine --batch N`).

Figures (a readable table, then one JSON line):
  decode_tok_s[c]   aggregate decode tokens/s with c = 1, 2, 4, 8 concurrent clients (each its own prompt,
                    greedy, --tokens new tokens each, end-of-turn ignored as the peer's ignore_eos): tokens
                    produced while all c clients were decoding, over that window (from the last client's
                    first token to the first client's end); best of --rounds passes
  e2e_tok_s[c]      the same tokens over the whole span from the first first-token to the last end: it also
                    holds the other clients' prompt reads (7 of them at 8 clients), so it is lower
  peer              the same figures for llama.cpp's `llama-server -np 8` when its binary is present
                    (/root/.cache/strata-peer/srvbuild/bin/llama-server, or --peer PATH); both servers are up
                    at once and each pass runs Strata then the peer at the same client count, so a machine
                    whose speed drifts (a shared host) moves both sides of a ratio together
  busy_slot_over_one_slot  one client on the 8-slot engine over one client on a one-slot engine (`--batch 1`,
                    the server's --parallel 1): the median of --pairs back-to-back pairs of --pair-tokens
                    (256) each (issue 17's bar: >= 0.95)
  server_over_raw   one client through `strata serve` (HTTP, its default slot engine, --drafting off) over the
                    raw engine's single stream (BGEN 0 over its pipes, no Python client): median of --pairs
                    back-to-back pairs (issue 17's bar: >= 0.95; tools/bench_server_overhead.py alone)
  ttft_short_ms     p50/p95 time to first token of short questions sent one by one while two long prompts
                    (--long, ~4K tokens) are read: the engine's slot steps read the short ones first
                    (issue 17's bar: p95 <= 500 ms)
Bar: aggregate decode at 8 clients against llama-server in the same run (about 3x at wave 1's close); the
8-clients-over-1 ratio is printed for reference only. On a shared machine every figure is noisy; say so
with them.

Usage: python3 tools/bench_serving.py [--model PATH] [--engine PATH] [--tokens 64] [--long 4000]
       [--shorts 8] [--threads N] [--rounds 2] [--pairs 6] [--pair-tokens 256] [--step-tokens N] [--no-peer]
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

from serve.engine_client.engine import StrataEngine  # noqa: E402
from serve.engine_client.batch import eos_ids  # noqa: E402
from serve.bootstrap import ENGINE_EXE, default_model_path  # noqa: E402
from tools.bench_server_overhead import server_over_raw  # noqa: E402
from tools.health import wait_healthy  # noqa: E402

PEER_SERVER = "/root/.cache/strata-peer/srvbuild/bin/llama-server"
CLIENTS = (1, 2, 4, 8)
BAR_OVER_PEER = 3.0   # aggregate decode at 8 clients over llama-server's, same run
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


def ttft_while_long(gen_fn, n_short, long_len, base, gap_s=0.5):
    """p50/p95 ms to first token of short questions sent one by one (`gap_s` apart) while two long prompts
    are read (fresh prompts each run: nothing of them is cached)."""
    longs = [[1, 9690, 198] + [(base + 17 * k + 1000 * j) % 40000 + 100 for k in range(long_len)] + [2, 198]
             for j in range(2)]
    sink = {}
    tl = [threading.Thread(target=_client, args=(gen_fn, ids, 4, sink, f"L{j}"))
          for j, ids in enumerate(longs)]
    for t in tl:
        t.start()
    time.sleep(1.0)
    got = {}
    ts = []
    for i in range(n_short):
        ts.append(threading.Thread(target=_client, args=(gen_fn, prompt(base + i, 16), 4, got, i)))
        ts[-1].start()
        time.sleep(gap_s)
    for t in ts + tl:
        t.join()
    reads_done = max((v[1][0] for v in sink.values() if v[1]), default=None)
    if reads_done is not None and any(v[1] and v[1][0] > reads_done for v in got.values()):
        print("bench_serving: some short questions got their first token after the long reads' (they waited "
              "for them, or --long is too short)", file=sys.stderr)
    ms = sorted((v[1][0] - v[0]) * 1000 for v in got.values() if v[1])
    p95 = ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))]
    return {"p50": round(statistics.median(ms), 1), "p95": round(p95, 1)}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def busy_over_one_slot(engine_path, model, threads, n_new, pairs, slot_gen):
    """One client on a one-slot engine and one on the slot engine, back to back, `pairs` times: (median one-slot
    tok/s, median slot tok/s, median of the pairs' ratios)."""
    e = StrataEngine([engine_path], ["--model", model, "--threads", str(threads), "--batch", "1"])
    e.start()
    try:
        no_eos = "logit_bias=" + ",".join(f"{i}:-100" for i in sorted(eos_ids(e.info)))
        one, slot = [], []
        for r in range(pairs):
            one.append(decode_rate(lambda ids, n: e.generate(ids, n, no_eos), 1, n_new, base=900 + r)[0])
            slot.append(decode_rate(slot_gen, 1, n_new, base=950 + r)[0])
        ratios = [b / a for a, b in zip(one, slot) if a > 0]
        return (round(statistics.median(one), 1), round(statistics.median(slot), 1),
                round(statistics.median(ratios), 3) if ratios else 0.0)
    finally:
        e.close()


class Peer:
    """llama-server -np 8 (continuous batching) over /completion, up for the whole run."""

    def __init__(self, path, model, threads):
        self.port = _free_port()
        cmd = [path, "-m", model, "-np", "8", "-c", str(8 * 8192), "--port", str(self.port), "-t", str(threads),
               "--host", "127.0.0.1"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if wait_healthy(self.port, PEER_READY_S, self.proc):
            return
        self.close()
        raise RuntimeError("llama-server did not become ready")

    def gen(self, ids, n):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
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

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _rates_side_by_side(strata_gen, peer, n_new, rounds):
    """Best-of-`rounds` steady and e2e rates per client count, Strata then the peer at each count."""
    sides = {"strata": strata_gen, "peer": peer.gen if peer else None}
    best = {k: ({n: 0.0 for n in CLIENTS}, {n: 0.0 for n in CLIENTS}) for k, g in sides.items() if g}
    for r in range(rounds):
        for n in CLIENTS:
            for k, (steady, e2e) in best.items():
                s_, e_ = decode_rate(sides[k], n, n_new, base=10 * n + 100 * r + (200 if k == "peer" else 0))
                steady[n], e2e[n] = max(steady[n], s_), max(e2e[n], e_)
    return {k: ({str(n): round(v, 1) for n, v in st.items()}, {str(n): round(v, 1) for n, v in ee.items()})
            for k, (st, ee) in best.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=default_model_path())
    ap.add_argument("--engine", default=os.environ.get("STRATA_ENGINE") or ENGINE_EXE)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--long", type=int, default=4000)
    ap.add_argument("--shorts", type=int, default=8)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--step-tokens", type=int, default=None, help="the engine's --step-tokens (default: its own)")
    ap.add_argument("--peer", default=PEER_SERVER)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--rounds", type=int, default=2, help="passes over 1, 2, 4, 8 clients (best of)")
    ap.add_argument("--pairs", type=int, default=6, help="one-slot / 8-slot engine pairs (median)")
    ap.add_argument("--pair-tokens", type=int, default=256, help="tokens per run of each pair")
    ap.add_argument("--ttft-only", action="store_true", help="only Strata's TTFT workload (to compare budgets)")
    ns = ap.parse_args(argv)
    if not ns.model or not os.access(ns.engine, os.X_OK):
        print("bench_serving: needs the engine binary and the model", file=sys.stderr)
        return 2
    step = ["--step-tokens", str(ns.step_tokens)] if ns.step_tokens else []
    e = StrataEngine([ns.engine], ["--model", ns.model, "--batch", "8", "--threads", str(ns.threads),
                                   "--max-context", "8192", *step])
    e.start()
    peer = None
    try:
        if not e.info.get("batch_slots"):
            print("bench_serving: this engine has no batch slots", file=sys.stderr)
            return 2
        if ns.ttft_only:
            print(json.dumps({"step_tokens": e.info.get("step_tokens"),
                              "ttft_short_ms": ttft_while_long(e.generate, ns.shorts, ns.long, 300)}))
            return 0
        no_eos = "logit_bias=" + ",".join(f"{i}:-100" for i in sorted(eos_ids(e.info)))  # as ignore_eos

        def gen(ids, n):
            return e.generate(ids, n, no_eos)
        pairs = busy_over_one_slot(ns.engine, ns.model, ns.threads, ns.pair_tokens, ns.pairs, gen)
        pairs = (*pairs, server_over_raw(ns.engine, ns.model, ns.threads, ns.pair_tokens, ns.pairs))
        if not ns.no_peer and os.access(ns.peer, os.X_OK):
            peer = Peer(ns.peer, ns.model, ns.threads)
        rates = _rates_side_by_side(gen, peer, ns.tokens, ns.rounds)
        ttft = ttft_while_long(e.generate, ns.shorts, ns.long, 300)
        peer_ttft = ttft_while_long(peer.gen, ns.shorts, ns.long, 9300) if peer else None
        step_tokens = e.info.get("step_tokens")
    finally:
        e.close()
        if peer:
            peer.close()
    _report(ns, pairs, rates, ttft, step_tokens, peer_ttft)
    return 0


def _report(ns, pairs, rates, ttft, step_tokens, peer_ttft):
    (st, e2e), (pst, pe2e) = rates["strata"], rates.get("peer", (None, None))
    over_peer = {k: round(st[k] / pst[k], 2) for k in st if pst and pst.get(k)} if pst else {}
    print(f"{'clients':>8} {'strata decode':>14} {'peer decode':>12} {'ratio':>6} {'strata e2e':>11} "
          f"{'peer e2e':>9}  (tok/s)")
    for n in CLIENTS:
        k = str(n)
        print(f"{n:>8} {st[k]:>14} {(pst or {}).get(k, '-'):>12} {over_peer.get(k, '-'):>6} {e2e[k]:>11} "
              f"{(pe2e or {}).get(k, '-'):>9}")
    print(f"one busy slot of 8 vs a one-slot engine, median of {ns.pairs} pairs: {pairs[1]} vs {pairs[0]} tok/s, "
          f"ratio {pairs[2]:.2f} (bar 0.95)")
    over = pairs[3]
    print(f"one client through strata serve vs the raw engine, median of {ns.pairs} pairs: {over['server_tok_s']} "
          f"vs {over['raw_tok_s']} tok/s, ratio {over['server_over_raw']:.2f} (bar 0.95); the server's CPU "
          f"{over['server_cpu_us_per_token']} us a token")
    print(f"TTFT of short questions while two {ns.long}-token prompts are read (step_tokens={step_tokens}): "
          f"strata p50 {ttft['p50']} ms, p95 {ttft['p95']} ms (bar p95 <= 500 ms); peer {peer_ttft or '-'}")
    ratio_8 = over_peer.get("8")
    print(f"8 clients over llama-server: {ratio_8 or '-'}x (bar about {BAR_OVER_PEER}x); 8 clients / 1 client: "
          f"{st['8'] / st['1'] if st['1'] else 0:.2f}x (reference)")
    print(json.dumps({"decode_tok_s": st, "e2e_tok_s": e2e, "one_slot_engine_tok_s": pairs[0],
                      "busy_slot_of_8_tok_s": pairs[1], "busy_slot_over_one_slot": pairs[2],
                      "server_over_raw": pairs[3], "ttft_short_ms": ttft, "step_tokens": step_tokens,
                      "peer_decode_tok_s": pst, "peer_e2e_tok_s": pe2e, "peer_ttft_short_ms": peer_ttft,
                      "over_peer": over_peer}))


if __name__ == "__main__":
    sys.exit(main())

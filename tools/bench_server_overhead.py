"""One client through `strata serve` (HTTP, the default slot engine) against the raw engine's single stream.

Issue 17's bar: one client through the server decodes at >= 95 % of the raw engine's single-stream speed. The
raw side is `strata-engine` driven over its pipes by bench_engine's line reader (a `BGEN 0` on one slot, no
Python engine client); the server side is `strata serve` with its defaults except `--drafting off` (drafting
changes the engine's work per token, not the server's), one streamed `/completion` at a time. Both sides read
the same prompt ids, greedy, end-of-turn banned (the peer's ignore_eos), and are measured back to back in
pairs (which side goes first alternates) so a host whose speed drifts moves both sides of each ratio together;
the figure is the median of the pairs' ratios. Rates are tokens after the first over first-token-to-last (the
prompt read is not in them), counted from each event's `tokens` (a token that ends inside a character has no
text of its own and rides in the next event). The server's CPU time per token (its Python process: pump,
request thread, HTTP) is printed beside them. The server's repeat guard stays on (it is part of its work a
token), so a reply that loops ends early there; the engine's rate of that pair is then taken over the same
positions. The server's defaults include its stream pacing (`--stream-interval-ms 20`: a burst of tokens a write,
README "Streaming"); `STRATA_STREAM_INTERVAL_MS=0` in the environment measures one write a token.

Usage: python3 tools/bench_server_overhead.py [--pairs 10] [--tokens 256] [--threads N] [--model PATH]
It is also called by tools/bench_serving.py (the `server_over_raw` row).
"""
import argparse
import json
import os
import pathlib
import re
import socket
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serve.bootstrap import ENGINE_EXE, default_model_path  # noqa: E402
from tools.bench_engine import Engine, ban_eos_bias  # noqa: E402
from tools.bench_server import start_server, stop_server  # noqa: E402

READY_S = 120.0
_TOKENS = re.compile(rb'"tokens":\s*\[([^\]]*)\]')
_STOP = re.compile(rb'"stop":\s*true')


def prompt_ids(i, n=48):
    """A chat-like id stream (1 = <|im_start|>, 2 = <|im_end|> in SmolLM2), distinct per `i`."""
    return [1, 9690, 198] + [(3000 + 61 * i + 11 * k) % 40000 + 100 for k in range(n)] + [2, 198, 1, 520, 9531, 198]


def _rate(stamps):
    """Tokens after the first arrival over first-arrival-to-last; `stamps` has one entry a token (the tokens
    of one server event share its time; the engine's token lines each have their own)."""
    if len(stamps) < 2 or stamps[-1] <= stamps[0]:
        return 0.0
    return (len(stamps) - stamps.count(stamps[0])) / (stamps[-1] - stamps[0])


class Server:
    """`strata serve` on a free port with --drafting off; streamed /completion."""

    def __init__(self, model, threads):
        self.p, self.port = start_server(["--model", model, "--threads", str(threads), "--drafting", "off"],
                                         ready_s=READY_S)

    def cpu_s(self):
        """User + system seconds of the server's Python process so far (/proc, no dependency)."""
        with open(f"/proc/{self.p.pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def run(self, ids, n):
        """One streamed /completion; a time stamp a token (the tokens of one event share its arrival time).
        Read as lightly as the raw side's pipe reader: recv into a buffer, events split on blank lines and
        their `tokens` counted by a regular expression over the bytes (no JSON decode an event): the figure
        is meant to be the server's cost, not this client's."""
        body = json.dumps({"prompt": ids, "n_predict": n, "temperature": 0, "stream": True, "cache_prompt": False,
                           "ignore_eos": True}).encode()
        # HTTP/1.0: events arrive unchunked, and the stream ends with the connection
        head = (f"POST /completion HTTP/1.0\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        stamps, buf, seen_head = [], b"", False
        with socket.create_connection(("127.0.0.1", self.port), timeout=300) as sock:
            sock.sendall(head + body)
            while True:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                now = time.monotonic()
                buf += chunk
                if not seen_head:
                    if b"\r\n\r\n" not in buf:
                        continue
                    status, _, rest = buf.partition(b"\r\n\r\n")
                    if b" 200 " not in status.split(b"\r\n", 1)[0]:
                        raise SystemExit(f"bench_server_overhead: the server answered {status[:200]!r}")
                    buf, seen_head = rest, True
                *events, buf = buf.split(b"\n\n")
                for ev in events:
                    # tokens, not events: a token that ends inside a character (two tokens a Hebrew letter
                    # in SmolLM2) has no text of its own and rides in the next event
                    if ev.startswith(b"data: ") and not _STOP.search(ev):
                        m = _TOKENS.search(ev)
                        k = len(m.group(1).split(b",")) if m and m.group(1).strip() else 0
                        stamps.extend([now] * k)
        return stamps

    def close(self):
        stop_server(self.p)


def _served(srv, ids, n_new):
    c0 = srv.cpu_s()
    stamps = srv.run(ids, n_new)
    return stamps, srv.cpu_s() - c0


def server_over_raw(engine, model, threads, n_new=256, pairs=6):
    """{raw, server (median tok/s), ratio (median of the pairs'), python_us_per_token (the server's CPU)}."""
    raw, srv = Engine(engine, model, threads), Server(model, threads)
    no_eos = "temperature=0 logit_bias=" + ban_eos_bias(model)

    try:
        raw.gen(8, prompt_ids(0, 8), no_eos)
        srv.run(prompt_ids(0, 8), 8)
        a, b, ratios, cpu = [], [], [], []
        for r in range(pairs):
            ids = prompt_ids(r + 1)  # both sides the same prompt: greedy, the same tokens
            if r % 2:  # the order alternates: a drift within a pair favours neither side
                served, spent = _served(srv, ids, n_new)
                engine_stamps = raw.gen_stamps(n_new, ids, no_eos)
            else:
                engine_stamps = raw.gen_stamps(n_new, ids, no_eos)
                served, spent = _served(srv, ids, n_new)
            # the server's repeat guard may end a looping reply early: both rates over the same positions
            n = min(len(served), len(engine_stamps))
            cpu.append(spent / max(len(served), 1) * 1e6)
            a.append(_rate(engine_stamps[:n]))
            b.append(_rate(served[:n]))
            if a[-1] > 0:
                ratios.append(b[-1] / a[-1])
        return {"raw_tok_s": round(statistics.median(a), 1), "server_tok_s": round(statistics.median(b), 1),
                "server_over_raw": round(statistics.median(ratios), 3) if ratios else 0.0,
                "server_cpu_us_per_token": round(statistics.median(cpu)),
                "pairs": [[round(x, 1), round(y, 1)] for x, y in zip(a, b)]}
    finally:
        raw.close()
        srv.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=default_model_path())
    ap.add_argument("--engine", default=os.environ.get("STRATA_ENGINE") or ENGINE_EXE)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--pairs", type=int, default=10)
    ns = ap.parse_args(argv)
    if not ns.model or not os.access(ns.engine, os.X_OK):
        print("bench_server_overhead: needs the engine binary and the model", file=sys.stderr)
        return 2
    r = server_over_raw(ns.engine, ns.model, ns.threads, ns.tokens, ns.pairs)
    print(f"{'raw engine (BGEN)':>18} {'strata serve':>13} {'ratio':>6} {'server CPU/token':>17}")
    print(f"{r['raw_tok_s']:>18} {r['server_tok_s']:>13} {r['server_over_raw']:>6.2f} "
          f"{r['server_cpu_us_per_token']:>14} us   (tok/s, median of {ns.pairs} pairs; bar 0.95)")
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Load judged by SLOs: the highest request rate at which >= 95 % of requests meet a TTFT and a TPOT limit.

Sends Poisson arrivals of a realistic mix at rising rates to `strata serve` and to llama.cpp's `llama-server`
side by side (both up for the whole run; at each rate Strata's pass, then the peer's, so a shared machine's
drift moves both) over the same OpenAI route, `POST /v1/chat/completions` with `stream: true`:
  chat      a short question, up to 64 new tokens
  read      a ~1,500-token document and a question about it, up to 32 new tokens
  tool      a question with two tools offered (tool_choice auto), up to 64 new tokens
  story     a short prompt, up to 160 new tokens (a long stream)
in the proportions 4 : 2 : 2 : 2, the same seeded sequence for both servers.

Per request: TTFT = the first streamed delta that carries text, reasoning or a tool call; TPOT = (end - first
delta) / (output tokens - 1), output tokens from the final `usage` (stream_options.include_usage), else the
deltas counted; a reply of one token meets any TPOT limit (vLLM's `bench serve` definition). A request meets
the SLO when it finished with 200 and TTFT <= --ttft-ms and TPOT <= --tpot-ms. Goodput (vLLM's sense, as a
rate): the highest offered rate at which >= --attain (95 %) of that rate's requests meet the SLO. A server's
sweep stops after the first rate it misses by far (under half meeting the SLO).

Prints one table per server (rate, met %, achieved req/s, TTFT and TPOT p50/p95/p99), the goodput of each, and
one JSON line. Figures on a shared machine are noisy: say so with them (docs/BENCHMARKS.md).

Usage: python3 tools/bench_load.py [--model PATH] [--rates 0.5,1,2,3,4,6] [--requests 30] [--parallel 4]
       [--threads N] [--ttft-ms 2000] [--tpot-ms 100] [--attain 0.95] [--peer PATH | --no-peer] [--seed 7]
"""
import argparse
import http.client
import json
import os
import pathlib
import random
import socket
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serve.bootstrap import default_model_path  # noqa: E402
from strata_control.host import host_limits  # noqa: E402
from tools.health import wait_healthy  # noqa: E402

PEER_PATHS = ("/root/.cache/strata-peer-server/build/bin/llama-server",
              "/root/.cache/strata-peer/srvbuild/bin/llama-server")
READY_S = 180.0          # a server's start (model load) may take this long on a busy machine
REQUEST_TIMEOUT_S = 600  # one request's whole answer; past it the request counts as failed
FAR_MISS = 0.5           # a rate where under half the requests meet the SLO ends that server's sweep
READ_WORDS = 240         # the read's document: ~1,500 tokens (500 words were ~3,100: over the 2 s TTFT alone)
MIX = (("chat", 4), ("read", 2), ("tool", 2), ("story", 2))
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                           "parameters": {"type": "object", "properties": {
                                               "a": {"type": "number"}, "b": {"type": "number"}},
                                               "required": ["a", "b"]}}}]
TOPICS = ("rivers", "bread", "the moon", "trains", "bees", "glass", "maps", "clocks", "salt", "kites")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_request(kind: str, i: int, rng: random.Random) -> dict:
    """One request body of the mix; `i` makes its text distinct (no prefix reuse across requests)."""
    topic = TOPICS[i % len(TOPICS)]
    if kind == "chat":
        messages, n = [{"role": "user", "content": f"Request {i}: in two sentences, why do people like {topic}?"}], 64
    elif kind == "read":
        # READ_WORDS words of `topic-NNNN` are ~1,500 tokens in SmolLM2's vocabulary (digits one token each)
        words = " ".join(f"{rng.choice(TOPICS)}-{rng.randrange(10000)}" for _ in range(READ_WORDS))
        messages, n = [{"role": "user", "content": f"Document {i}: {words}\n\nWhich word comes first?"}], 32
    elif kind == "tool":
        messages, n = [{"role": "user", "content": f"Request {i}: what is the weather in Paris, and what is "
                                                   f"{i} plus 17?"}], 64
    else:
        messages, n = [{"role": "user", "content": f"Request {i}: tell a story about {topic}."}], 160
    body = {"messages": messages, "max_tokens": n, "temperature": 0.7, "seed": i, "stream": True,
            "stream_options": {"include_usage": True}}
    if kind == "tool":
        body["tools"] = TOOLS
    return body


def schedule(n: int, rate: float, seed: int) -> list[tuple[float, str, dict]]:
    """`n` Poisson arrivals at `rate` per second: (offset s, kind, body), the same for every server."""
    rng = random.Random(seed)
    kinds = [k for k, w in MIX for _ in range(w)]
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        kind = rng.choice(kinds)
        out.append((t, kind, make_request(kind, seed * 1000 + i, rng)))
    return out


def one_request(port: int, body: dict) -> dict:
    """Send one streamed chat request -> {ok, ttft_s, e2e_s, n_out}."""
    t0 = time.monotonic()
    first, n_deltas, n_usage, ok, status, error = None, 0, None, False, None, None
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
        c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        status = r.status
        if r.status == 200:
            for raw in r:
                if not raw.startswith(b"data: ") or raw.strip() == b"data: [DONE]":
                    continue
                ev = json.loads(raw[6:])
                if ev.get("usage"):
                    n_usage = ev["usage"].get("completion_tokens")
                for ch in ev.get("choices") or []:
                    d = ch.get("delta") or {}
                    if d.get("content") or d.get("reasoning_content") or d.get("tool_calls"):
                        n_deltas += 1
                        if first is None:
                            first = time.monotonic()
            ok = first is not None
        else:
            error = r.read()[:300].decode("utf-8", "replace")
        c.close()
    except (OSError, ValueError, http.client.HTTPException) as e:
        ok, error = False, repr(e)
    end = time.monotonic()
    return {"ok": ok, "status": status, "error": error, "ttft_s": (first - t0) if first else None, "e2e_s": end - t0,
            "n_out": n_usage or n_deltas, "tpot_s": ((end - first) / ((n_usage or n_deltas) - 1))
            if first and (n_usage or n_deltas) > 1 else 0.0}


def run_rate(port: int, plan) -> tuple[list[dict], float]:
    """Send `plan` at its offsets (one thread per request) -> (results, wall seconds until the last ended)."""
    results, threads = [None] * len(plan), []
    t0 = time.monotonic()
    for k, (offset, kind, body) in enumerate(plan):
        time.sleep(max(0.0, t0 + offset - time.monotonic()))

        def go(k=k, kind=kind, body=body):
            results[k] = {**one_request(port, body), "kind": kind}
        th = threading.Thread(target=go, daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join(REQUEST_TIMEOUT_S)
    return [r or {"ok": False, "ttft_s": None, "tpot_s": None, "kind": "?"} for r in results], time.monotonic() - t0


def pct(values, q):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def judge(results, wall_s, ttft_s, tpot_s) -> dict:
    met = [r["ok"] and r["ttft_s"] <= ttft_s and r["tpot_s"] <= tpot_s for r in results]
    ttft = [r["ttft_s"] * 1000 for r in results if r["ok"]]
    tpot = [r["tpot_s"] * 1000 for r in results if r["ok"] and r["tpot_s"]]
    return {"met": sum(met) / len(met), "failed": sum(not r["ok"] for r in results),
            "achieved_rps": round(len(results) / wall_s, 2), "goodput_rps": round(sum(met) / wall_s, 2),
            **{f"ttft_p{q}_ms": round(pct(ttft, q) or 0) for q in (50, 95, 99)},
            **{f"tpot_p{q}_ms": round(pct(tpot, q) or 0, 1) for q in (50, 95, 99)}}


class Server:
    """One server process (Strata or llama-server) on its own port, up until close()."""

    def __init__(self, name, cmd, port):
        self.name, self.port = name, port
        self.log = open(f"/tmp/bench_load-{name}-{port}.log", "w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        if wait_healthy(port, READY_S, self.proc):
            return
        self.close()
        raise RuntimeError(f"{name} did not become ready (log: {self.log.name})")

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(15)
        self.log.close()


def start_servers(ns) -> list[Server]:
    servers = []
    port = _free_port()
    servers.append(Server("strata", [sys.executable, "-m", "strata_cli", "serve", "--model", ns.model, "--port",
                                     str(port), "--parallel", str(ns.parallel), "--threads", str(ns.threads),
                                     "--ctx", "4096", "--quiet"], port))
    peer = ns.peer or next((p for p in PEER_PATHS if os.access(p, os.X_OK)), None)
    if not ns.no_peer and peer:
        port = _free_port()
        servers.append(Server("llama-server", [peer, "-m", ns.model, "-np", str(ns.parallel), "-c",
                                               str(ns.parallel * 4096), "-t", str(ns.threads), "--jinja",
                                               "--host", "127.0.0.1", "--port", str(port)], port))
    return servers


def report(ns, table: dict) -> dict:
    goodput = {}
    for name, rows in table.items():
        print(f"\n{name}: SLO TTFT <= {ns.ttft_ms} ms, TPOT <= {ns.tpot_ms} ms, {ns.requests} requests per rate")
        print(f"{'rate':>5} {'met':>5} {'fail':>4} {'rps':>5} {'good':>5} {'ttft p50/p95/p99 ms':>22} "
              f"{'tpot p50/p95/p99 ms':>22}")
        for rate, j in rows:
            print(f"{rate:>5g} {j['met']:>5.0%} {j['failed']:>4} {j['achieved_rps']:>5} {j['goodput_rps']:>5} "
                  f"{j['ttft_p50_ms']:>8}/{j['ttft_p95_ms']}/{j['ttft_p99_ms']:<8} "
                  f"{j['tpot_p50_ms']:>8}/{j['tpot_p95_ms']}/{j['tpot_p99_ms']}")
        passing = [rate for rate, j in rows if j["met"] >= ns.attain]
        goodput[name] = max(passing) if passing else 0.0
    names = list(goodput)
    print("\ngoodput (highest rate with >= {:.0%} meeting the SLO): ".format(ns.attain) +
          ", ".join(f"{n} {goodput[n]:g} req/s" for n in names))
    ratio = goodput["strata"] / goodput["llama-server"] if goodput.get("llama-server") else None
    if ratio is not None:
        print(f"strata over llama-server: {ratio:.2f}x")
    return {"goodput_rps": goodput, "over_peer": ratio}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--rates", default="0.5,1,2,3,4,6")
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--ttft-ms", type=float, default=2000)
    ap.add_argument("--tpot-ms", type=float, default=100)
    ap.add_argument("--attain", type=float, default=0.95)
    ap.add_argument("--peer", default=None)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--seed", type=int, default=7)
    ns = ap.parse_args()
    ns.model = ns.model or default_model_path()
    ns.threads = ns.threads or host_limits().cpus
    rates = [float(r) for r in ns.rates.split(",")]
    load_before = os.getloadavg()[0]   # other work on the machine: say it with the figures
    servers = start_servers(ns)
    table = {s.name: [] for s in servers}
    live = list(servers)
    try:
        for step, rate in enumerate(rates):
            plan = schedule(ns.requests, rate, ns.seed + step)
            for s in list(live):
                results, wall = run_rate(s.port, plan)
                j = judge(results, wall, ns.ttft_ms / 1000, ns.tpot_ms / 1000)
                table[s.name].append((rate, j))
                print(f"{s.name} at {rate:g} req/s: {j['met']:.0%} met the SLO", file=sys.stderr, flush=True)
                if j["met"] < FAR_MISS:
                    live.remove(s)
            if not live:
                break
    finally:
        for s in servers:
            s.close()
    summary = report(ns, table)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               "unknown CPU")
    print(f"load average (1 min) before / after: {load_before:.1f} / {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")
    print(json.dumps({"bench": "load", "cpu": cpu, "threads": ns.threads, "parallel": ns.parallel,
                      "loadavg_before_after": [round(load_before, 1), round(os.getloadavg()[0], 1)],
                      "slo": {"ttft_ms": ns.ttft_ms, "tpot_ms": ns.tpot_ms, "attain": ns.attain},
                      "rates": {n: [[r, j] for r, j in rows] for n, rows in table.items()}, **summary}))


if __name__ == "__main__":
    main()

"""The clients of a cluster run (tools/cluster_figures.py, tests/tools/test_cluster_ns.py), run inside the
balancer's namespace (tools/cluster_ns.py): multi-turn chats through HAProxy at 127.0.0.1:8080.

    python3 tools/cluster_drive.py --clients 24 --turns 8 --tag a [--seconds S] [--max-tokens 32] [--echo]
                                   [--first greet|ask]

Each client keeps one HTTP/1.1 connection (reopened after an error) and chats: a short first message (a few
words, unique to the conversation: `Hi, I am a7-0.` with --first greet, the default; `I am a7-0. Describe a
harbour.` with --first ask, a request the model answers at length, its topic from TOPICS by client and
conversation number), then short follow-ups, each turn resending the whole conversation with the assistant's
replies, in a body whose other fields come before `messages` (the affinity key must not depend on either). Odd
turns stream (with usage), even turns do not. With --seconds, a client starts a new conversation after its last
turn (or after a failed turn) until the time is up or SIGUSR1 says stop (tools/cluster_figures.py's failover
phase stops the clients once the host it restarted has answered); without, it chats one conversation of --turns
turns.
--echo: every user message carries a unique `#N#` marker and the fake hosts answer with it (cluster_host.py
--echo), so a reply given to the wrong request shows.

Output (stdout): one JSON object per request —
  {"c", "conv", "turn", "t0", "t1" (wall time), "stream", "status", "host" (X-Strata-Host), "outcome", "prompt",
   "cached", "completion", "crossed"}
  outcome: done (a clean end: `[DONE]` or a whole JSON body), error_event (a stream that ended with an error
  event), cut (a stream that stopped without its end: the chunked body ended short or the connection dropped),
  http_error (a status other than 200), conn_error (no answer at all)
— then one line {"metrics": {host: {name: value}}} with each host's /metrics counters (strata:http_*,
llamacpp:prompt_tokens_*), read from the hosts directly.
"""
from __future__ import annotations

import argparse
import http.client
import json
import re
import signal
import sys
import threading
import time

BALANCER = ("127.0.0.1", 8080)
FOLLOW_UPS = ("Tell me more.", "Why is that?", "Give an example.", "And then?", "Say it in one line.",
              "What else?", "One more fact, please.", "Thanks. Anything to add?", "Go on.", "Summarise.")
TOPICS = ("Describe a harbour.", "Explain how bread rises.", "Tell me about volcanoes.", "How do tides work?",
          "Describe a desert at night.", "Explain how a bicycle works.", "Tell me about honeybees.",
          "How does rain form?")   # --first ask: short first messages that ask for a longer reply than a greeting
FIRSTS = ("greet", "ask")   # --first: greetings (the default), or the requests above
TIMEOUT_S = 120.0    # one request's limit (a reply of a loaded 2-core machine); a cut is seen sooner
METRICS = ("strata:http_connections_accepted_total", "strata:http_requests_total",
           "strata:http_requests_reused_total", "llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total")
MARKER = re.compile(r"#[0-9]+#")

_out_lock = threading.Lock()   # guards stdout: one whole line per record
STOP = threading.Event()       # set by SIGUSR1: no client starts another request


def emit(obj) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def body_of(messages, stream: bool, max_tokens: int) -> str:
    """Other fields first, `messages` last (json.dumps keeps this order)."""
    body = {"model": "default", "temperature": 0, "max_tokens": max_tokens, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    body["messages"] = messages
    return json.dumps(body)


def read_stream(r) -> tuple[str, str, dict]:
    """(outcome, text, usage) of an SSE chat stream."""
    text, usage = [], {}
    try:
        while True:
            line = r.readline()
            if not line:
                return "cut", "".join(text), usage
            line = line.decode("utf-8", "replace").strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":   # and then the chunked body's own end: without it, the stream was cut
                r.read()
                return "done", "".join(text), usage
            event = json.loads(line[6:])
            if "error" in event:
                return "error_event", "".join(text), {"error": (event["error"] or {}).get("message")}
            usage = event.get("usage") or usage
            for choice in event.get("choices") or []:
                text.append((choice.get("delta") or {}).get("content") or "")
    except (OSError, http.client.HTTPException, ValueError):
        return "cut", "".join(text), usage


def ask(conn, messages, stream, max_tokens) -> dict:
    conn.request("POST", "/v1/chat/completions", body=body_of(messages, stream, max_tokens),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    rec = {"status": r.status, "host": r.getheader("X-Strata-Host")}
    if r.status != 200:
        r.read()
        return {**rec, "outcome": "http_error", "text": ""}
    if stream:
        outcome, text, usage = read_stream(r)
    else:
        try:
            out = json.loads(r.read())
            outcome, text, usage = "done", out["choices"][0]["message"]["content"], out.get("usage") or {}
        except (OSError, http.client.HTTPException, ValueError, KeyError):
            outcome, text, usage = "cut", "", {}
    if outcome != "done":
        conn.close()   # the connection ended with the cut reply
    return {**rec, "outcome": outcome, "text": text, "prompt": usage.get("prompt_tokens"),
            "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
            "completion": usage.get("completion_tokens"), **({"error": usage["error"]} if "error" in usage else {})}


def first_message(args, c: int, conv: int) -> str:
    """Conversation `conv` of client `c`'s first user message: a few words, unique to the conversation (its
    affinity key), a greeting (--first greet) or a request for something (--first ask)."""
    who = f"{args.tag}{c}-{conv}"
    if args.first == "ask":
        return f"I am {who}. {TOPICS[(c + conv) % len(TOPICS)]}"
    return f"Hi, I am {who}."


def client(c: int, args, stop_at: float | None, counter) -> None:
    conn = http.client.HTTPConnection(*BALANCER, timeout=TIMEOUT_S)
    conv = 0
    while True:
        messages = []
        for turn in range(args.turns):
            if stop_at is not None and (time.time() >= stop_at or STOP.is_set()):
                conn.close()
                return
            marker = f"#{counter()}#" if args.echo else ""
            words = first_message(args, c, conv) if turn == 0 else FOLLOW_UPS[(c + turn) % len(FOLLOW_UPS)]
            messages.append({"role": "user", "content": f"{words} {marker}".strip()})
            t0 = time.time()
            try:
                rec = ask(conn, messages, stream=turn % 2 == 0, max_tokens=args.max_tokens)
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                rec = {"status": None, "host": None, "outcome": "conn_error", "text": "", "error": str(e)}
            text = rec.pop("text")
            crossed = bool(args.echo and rec["outcome"] == "done" and set(MARKER.findall(text)) != {marker})
            emit({"c": c, "conv": conv, "turn": turn, "t0": t0, "t1": time.time(), "stream": turn % 2 == 0,
                  "crossed": crossed, **rec})
            if rec["outcome"] != "done":
                break   # this conversation failed: a new one (after a pause: the failure may repeat at once)
            messages.append({"role": "assistant", "content": text})
        conv += 1
        if stop_at is None:
            conn.close()
            return
        if rec["outcome"] != "done":
            time.sleep(0.5)


def host_metrics(n_hosts: int) -> dict:
    out = {}
    for i in range(1, n_hosts + 1):
        try:
            conn = http.client.HTTPConnection(f"10.231.{i}.2", 8080, timeout=10)
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
            conn.close()
            out[f"h{i}"] = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                            if line.split(" ", 1)[0] in METRICS}
        except (OSError, http.client.HTTPException, ValueError) as e:
            out[f"h{i}"] = {"error": str(e)}
    return out


def wait_balancer(timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = http.client.HTTPConnection(*BALANCER, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                conn.close()
                return
        except (OSError, http.client.HTTPException):
            pass
        if time.monotonic() > deadline:
            sys.exit("cluster_drive: the balancer did not answer /health")
        time.sleep(0.2)


def parse(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=24)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--tag", default="a", help="makes this run's conversations differ from another run's")
    ap.add_argument("--seconds", type=float, help="keep chatting (new conversations) for this long")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--echo", action="store_true")
    ap.add_argument("--first", choices=FIRSTS, default=FIRSTS[0],
                    help="first messages: greetings, or short requests the model answers at length")
    ap.add_argument("--hosts", type=int, default=3)
    return ap.parse_args(argv)


def main() -> int:
    args = parse()
    signal.signal(signal.SIGUSR1, lambda *_: STOP.set())
    wait_balancer(30.0)
    lock, n = threading.Lock(), [0]   # lock guards n: the next marker

    def counter() -> int:
        with lock:
            n[0] += 1
            return n[0]
    stop_at = time.time() + args.seconds if args.seconds else None
    threads = [threading.Thread(target=client, args=(c, args, stop_at, counter), daemon=True)
               for c in range(args.clients)]
    for t in threads:
        t.start()
    limit = time.monotonic() + (args.seconds or 0) + args.turns * TIMEOUT_S
    for t in threads:
        t.join(max(0.0, limit - time.monotonic()))
    emit({"metrics": host_metrics(args.hosts)})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Soak: many mixed requests at many concurrent clients against a server whose engine is killed at random.

    python3 tools/soak.py --fake --requests 10000            # the slot fake engine (tests/fake_engine_slots.py)
    python3 tools/soak.py --requests 1000                    # the real engine and the default model
    python3 tools/soak.py --fake --hosts 3                   # three servers behind HAProxy (deploy/haproxy.cfg)

It starts `strata serve --port 0` itself, then sends N requests from `--clients` threads: chat, completions and
messages, plain and streamed, hang-ups (the client leaves after the first bytes), bad bodies (each must be a
400), slow readers (a small receive buffer read in small pieces). A killer thread SIGKILLs the server's engine
process at random moments (`--kill-every` seconds on average; 0 = never). It prints one table:

  lost     a request with no answer: the connection ended before a status line, or a 200 stream ended
           without its last event (`[DONE]` / `message_stop` / an error event)
  crossed  a reply that holds another request's canary: every prompt carries its own `zqNNNNNN` word (the
           fake answers with the question itself, so any canary in a reply that is not its own crossed over)
  hung     a request still unanswered after `--hang-s` seconds (the client gives up)
  5xx      answers with a 5xx status (an engine killed under a request is a 503 or a stream error event)
  wrong    a bad body not answered 400, or (fake engine) a finished reply that is not the expected answer

With --hosts N (2..3) it starts N servers and HAProxy in front of them on loopback (deploy/haproxy.cfg, as
shipped), sends every request through HAProxy, and the killer picks a server's engine at random each time.

Exit status 0 when lost, crossed and hung are all 0. Knows nothing of the server's insides: HTTP only, plus
the process tree to find the engine.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tools.bench_server import start_server, stop_server  # noqa: E402  (the same `strata serve --port 0`)

FAKE_SLOTS = os.path.join(ROOT, "tests", "fake_engine_slots.py")
CANARY = re.compile(r"zq\d{6}")
KINDS = ("chat", "chat_stream", "completion", "completion_stream", "messages", "messages_stream", "hangup",
         "bad_body", "slow_reader")
FAKE_REPEAT = 2            # the slot fake answers the question this many times
START_S = 300.0            # the server must print its listening line within this (the real engine loads)
SLOW_READ_BYTES = 256      # a slow reader takes this much ...
SLOW_READ_PAUSE_S = 0.02   # ... then pauses this long
BAD_BODIES = ('{"messages": "hi"}', '{"messages": [{"role": "user", "content": "x"}], "max_tokens": -7}',
              '{"messages": [', '[1, 2]', '{"prompt": ""}', '{"messages": [{"role": "alien", "content": "x"}]}')


class Tally:
    """The figures, shared by the client threads (`lock` guards `counts` and `notes`)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts: collections.Counter = collections.Counter()
        self.notes: list[str] = []

    def add(self, key: str, note: str | None = None) -> None:
        with self.lock:
            self.counts[key] += 1
            if note and len(self.notes) < 20:
                self.notes.append(note)


# ---------------------------------------------------------------- the server under test
def start_server_for(fake: bool, parallel: int | None, workdir: str) -> tuple[subprocess.Popen, int]:
    """`strata serve --port 0` on the slot fake (FAKE_REPEAT answers, some time per step) or the real engine."""
    extra = ["--log", os.path.join(workdir, "engine.log")]
    if fake:
        script = os.path.join(workdir, "slots.json")
        with open(script, "w", encoding="utf-8") as f:
            json.dump({"slots": 4, "ctx": 8192, "repeat": FAKE_REPEAT, "step_delay_s": 0.002,
                       "token_delay_s": 0.001}, f)
        extra += ["--tokenizer", "bytes", "--engine", f"{sys.executable} {FAKE_SLOTS} --script {script}"]
    if parallel:
        extra += ["--parallel", str(parallel)]
    return start_server(extra, ready_s=START_S)


def engine_pids(server_pid: int) -> list[int]:
    import psutil
    try:
        return [c.pid for c in psutil.Process(server_pid).children(recursive=True)]
    except psutil.Error:
        return []


def start_haproxy(ports: list[int], workdir: str) -> tuple[subprocess.Popen, int]:
    """HAProxy with deploy/haproxy.cfg on a free loopback port in front of the servers on `ports`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "STRATA_LUA": os.path.join(ROOT, "deploy", "strata_affinity.lua"),
           "STRATA_BIND": f"127.0.0.1:{port}", **{f"STRATA_H{i}": f"127.0.0.1:{p}" for i, p in enumerate(ports, 1)}}
    with open(os.path.join(workdir, "haproxy.log"), "w") as log:
        proc = subprocess.Popen(["haproxy", "-db", "-f", os.path.join(ROOT, "deploy", "haproxy.cfg")], env=env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"haproxy did not start: {open(os.path.join(workdir, 'haproxy.log')).read()}")
            time.sleep(0.1)


def killer(server_pids: list[int], every_s: float, stop: threading.Event, tally: Tally,
           rnd: random.Random) -> None:
    """SIGKILL one server's engine at random moments (uniform 0.2..2x `every_s` apart) until `stop`."""
    while not stop.wait(rnd.uniform(0.2, 2.0) * every_s):
        for pid in engine_pids(rnd.choice(server_pids)):
            try:
                os.kill(pid, signal.SIGKILL)
                tally.add("kills")
            except OSError:
                pass


# ---------------------------------------------------------------- one request
def body_for(kind: str, canary: str, max_tokens: int) -> tuple[str, dict | str]:
    question = f"Repeat the word {canary}"
    chat = {"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens}
    if kind.startswith("completion"):  # a question line as the fake reads it (tests/fake_engine_slots.py)
        return "/v1/completions", {"prompt": f"<|im_start|>{canary}\n", "max_tokens": max_tokens,
                                   "stream": kind.endswith("stream")}
    if kind.startswith("messages"):
        return "/v1/messages", {**chat, "stream": kind.endswith("stream")}
    if kind == "bad_body":
        return "/v1/chat/completions", BAD_BODIES[int(canary[2:]) % len(BAD_BODIES)]
    return "/v1/chat/completions", {**chat, "stream": kind in ("chat_stream", "hangup", "slow_reader")}


def _raw(port: int, path: str, body, timeout_s: float, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout_s)
    sock.connect(("127.0.0.1", port))
    data = (body if isinstance(body, str) else json.dumps(body)).encode()
    # HTTP/1.0: the reply is read to the connection's close, unchunked (an HTTP/1.1 stream is chunked)
    sock.sendall(f"POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Connection: close\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def read_all(sock: socket.socket, deadline: float, slow: bool) -> bytes:
    got = bytearray()
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        part = sock.recv(SLOW_READ_BYTES if slow else 65536)
        if not part:
            return bytes(got)
        got += part
        if slow:
            time.sleep(SLOW_READ_PAUSE_S)


def reply_text(path: str, status: int, body: bytes) -> tuple[str, bool]:
    """(the reply's text, whether it ended properly) of one response body."""
    text = body.decode("utf-8", "replace")
    if status != 200:
        return text, True
    if text.lstrip().startswith("{"):  # a JSON answer; else server-sent events
        obj = json.loads(text)
        if path == "/v1/messages":
            return "".join(b.get("text", "") for b in obj.get("content", [])), True
        choice = obj["choices"][0]
        return choice.get("text") or (choice.get("message") or {}).get("content") or "", True
    out, ended = [], False
    for block in text.split("\n\n"):
        data = next((ln[6:] for ln in block.split("\n") if ln.startswith("data: ")), None)
        if block.startswith("event: error") or block.startswith("event: message_stop") or data == "[DONE]":
            ended = True
        if not data or data == "[DONE]":
            continue
        obj = json.loads(data)
        if "error" in obj and path != "/v1/messages":
            ended = True
        for c in obj.get("choices") or []:
            out.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
        out.append((obj.get("delta") or {}).get("text") or "")
    return "".join(out), ended


def one(port: int, kind: str, n: int, args, tally: Tally) -> None:
    canary = f"zq{n:06d}"
    path, body = body_for(kind, canary, args.max_tokens)
    deadline = time.monotonic() + args.hang_s
    try:
        sock = _raw(port, path, body, args.hang_s, rcvbuf=4096 if kind == "slow_reader" else None)
        with sock:
            if kind == "hangup":
                sock.recv(1)
                tally.add("ok")
                return
            raw = read_all(sock, deadline, slow=kind == "slow_reader")
    except socket.timeout:
        tally.add("hung", f"{kind} #{n}: no end after {args.hang_s:.0f} s")
        return
    except OSError as e:
        tally.add("lost", f"{kind} #{n}: {e}")
        return
    judge(kind, n, canary, path, raw, args, tally)


def judge(kind, n, canary, path, raw: bytes, args, tally: Tally) -> None:
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1."):
        tally.add("lost", f"{kind} #{n}: no status line ({raw[:80]!r})")
        return
    status = int(head.split()[1])
    if b"chunked" in head.lower():
        body = _unchunk(body)
    if status >= 500:
        tally.add("5xx")
        tally.add(f"status {status}")
    if kind == "bad_body":
        tally.add("ok" if status == 400 else "wrong", None if status == 400 else f"bad body #{n}: {status}")
        return
    try:
        text, ended = reply_text(path, status, body)
    except (ValueError, KeyError, IndexError) as e:
        tally.add("lost", f"{kind} #{n}: unreadable reply ({e}): {body[:120]!r}")
        return
    if not ended:
        tally.add("lost", f"{kind} #{n}: the stream ended without its last event")
        return
    others = {c for c in CANARY.findall(text) if c != canary}
    if others:
        tally.add("crossed", f"{kind} #{n}: reply holds {sorted(others)[:3]}")
    elif status == 200 and args.fake and not fake_answer(kind, canary).startswith(text):
        tally.add("wrong", f"{kind} #{n}: {text[:80]!r}")
    else:
        tally.add("ok")


def fake_answer(kind: str, canary: str) -> str:
    """The slot fake's whole answer: the question in angle brackets, FAKE_REPEAT times (a reply cut by
    max_tokens or by a killed engine is a start of it)."""
    question = canary if kind.startswith("completion") else f"Repeat the word {canary}"
    return f"<{question}>" * FAKE_REPEAT


def _unchunk(body: bytes) -> bytes:
    out, rest = bytearray(), body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        try:
            size = int(size_line.split(b";")[0], 16)
        except ValueError:
            break
        if size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2:]
    return bytes(out)


# ---------------------------------------------------------------- the run
def soak(args) -> Tally:
    tally = Tally()
    rnd = random.Random(args.seed)
    kinds = [rnd.choice(KINDS) for _ in range(args.requests)]
    with tempfile.TemporaryDirectory(prefix="strata-soak-") as workdir:
        servers, balancer = [], None
        try:
            for i in range(args.hosts):
                os.makedirs(os.path.join(workdir, f"h{i + 1}"), exist_ok=True)
                servers.append(start_server_for(args.fake, args.parallel, os.path.join(workdir, f"h{i + 1}")))
            port = servers[0][1]
            if args.hosts > 1:
                balancer, port = start_haproxy([p for _, p in servers], workdir)
            run(args, tally, kinds, port, [proc.pid for proc, _ in servers])
        finally:
            if balancer is not None:
                balancer.terminate()
                balancer.wait(10)
            for proc, _ in servers:
                stop_server(proc)
    return tally


def run(args, tally: Tally, kinds: list[str], port: int, server_pids: list[int]) -> None:
    """Every request of `kinds` to `port` from the client threads, while the killer runs."""
    stop = threading.Event()
    kill_thread = threading.Thread(target=killer, args=(server_pids, args.kill_every, stop, tally,
                                                        random.Random(args.seed + 1)), daemon=True)
    t0 = time.monotonic()
    try:
        if args.kill_every > 0:
            kill_thread.start()
        with ThreadPoolExecutor(args.clients) as pool:
            futures = [pool.submit(one, port, kind, n, args, tally) for n, kind in enumerate(kinds)]
            for k, f in enumerate(as_completed(futures), 1):
                f.result()
                if k % max(1, args.requests // 10) == 0:
                    print(f"soak: {k}/{args.requests} in {time.monotonic() - t0:.0f} s", file=sys.stderr,
                          flush=True)
    finally:
        stop.set()
        tally.counts["seconds"] = round(time.monotonic() - t0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--fake", action="store_true", help="the slot fake engine (byte tokenizer) instead of the real")
    p.add_argument("--parallel", type=int, help="lanes (default: the server's default)")
    p.add_argument("--kill-every", type=float, default=5.0, help="mean seconds between engine kills (0 = none)")
    p.add_argument("--max-tokens", type=int, help="per request (default 64 fake, 24 real)")
    p.add_argument("--hang-s", type=float, default=120.0, help="a request unanswered this long is hung")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hosts", type=int, choices=[1, 2, 3], default=1, help="servers; 2..3: behind HAProxy")
    args = p.parse_args(argv)
    args.max_tokens = args.max_tokens or (64 if args.fake else 24)
    tally = soak(args)
    c = tally.counts
    print(f"requests {args.requests}  clients {args.clients}  engine {'fake' if args.fake else 'real'}  "
          f"hosts {args.hosts}{' (HAProxy)' if args.hosts > 1 else ''}  "
          f"kills {c['kills']}  seconds {c['seconds']}")
    print(f"lost {c['lost']}  crossed {c['crossed']}  hung {c['hung']}  5xx {c['5xx']}  wrong {c['wrong']}  "
          f"ok {c['ok']}")
    statuses = {k: v for k, v in c.items() if k.startswith("status ")}
    if statuses:
        print("  " + "  ".join(f"{k} x{v}" for k, v in sorted(statuses.items())))
    for note in tally.notes:
        print(f"  {note}")
    return 0 if c["lost"] == c["crossed"] == c["hung"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

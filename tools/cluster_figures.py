"""Figures for docs/DEPLOY.md: three Strata hosts behind HAProxy (deploy/haproxy.cfg), each in its own network
namespace on this machine (tools/cluster_ns.py), driven by tools/cluster_drive.py from the balancer's namespace.

    sudo python3 tools/cluster_figures.py                 # the real engine and default model on each host
    sudo python3 tools/cluster_figures.py --fake          # the fake engine (tools/cluster_host.py --echo)
    sudo python3 tools/cluster_figures.py --first ask     # first messages that ask for something (default: greet)

Phases:
  affinity     the shipped configuration: --clients clients x --turns turns; for turns 2.. the share of prompt
               tokens the host had cached (usage.prompt_tokens_details.cached_tokens), and whether every turn of a
               conversation was answered by one host (X-Strata-Host); each turn's mean reply length (tokens)
  round robin  the same file with STRATA_BALANCE=roundrobin (affinity off), new conversations
  failover     affinity again, clients chatting for --failover-s seconds: the busiest host is SIGKILLed
               (server and engine: a host that dies), later the busiest other host's engine alone (the server
               stays: its streams end with an error event, /health is 503 until the engine is back), then the
               dead host is started again; the clients go on past --failover-s until HAProxy has logged a
               request the returned host answered (at most RETURN_LIMIT_S more: on a loaded machine a few slow
               conversations may all hash to the survivors in the seconds left). Reported: how the streams in
               flight on it ended, requests failed after the kill, seconds until HAProxy marked it DOWN and UP
               again, requests it answered after its return, and POSTs a host answered with 503 (a request sent
               to a host whose /health was not 200)
Everything is bounded (each phase has a time limit) and cleaned up (namespaces, processes) on any exit. Exit
0 with `skipped: REASON` where namespaces cannot be made. --json FILE writes every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools import cluster_drive, cluster_ns  # noqa: E402

HOST_START_S = 180.0    # a real host loads its model (a loaded 2-core machine)
PHASE_LIMIT_S = 900.0   # one phase's driver, at most
RETURN_LIMIT_S = 60.0   # past --failover-s, the clients go on at most this long for the returned host to answer
ENGINE_BACK_S = 3.0     # a killed engine is restarted within this (1 s pause + start): requests on its host that
                        # began before that may end with an error event (one admitted to a queue already has its
                        # 200 and heartbeats, so HAProxy cannot send it elsewhere)


def host_argv_for(args, log_dir):
    def argv(i, name, addr, port):
        if args.fake:
            return [sys.executable, os.path.join(ROOT, "tools", "cluster_host.py"), "--host", addr, "--port",
                    str(port), "--name", name, "--seconds", "3600", "--echo", "--repeat", "8",
                    "--token-delay-s", "0.02"]
        cfg = os.path.join(log_dir, f"{name}.json")
        with open(cfg, "w") as f:   # the host's own engine log; parked conversations kept in RAM
            json.dump({"log": os.path.join(log_dir, f"{name}-engine.log"),
                       "args": ["--conversation-cache-slots", str(args.parked)]}, f)
        return [sys.executable, "-m", "strata_cli", "serve", "--host", addr, "--port", str(port), "--host-name",
                name, "--threads", str(args.threads), "--ctx", str(args.ctx), "--config", cfg]
    return argv


def drive_argv(args, tag, seconds=None) -> list[str]:
    """The command of one phase's clients (tools/cluster_drive.py), before it is put in the balancer's namespace."""
    argv = [sys.executable, os.path.join(ROOT, "tools", "cluster_drive.py"), "--clients", str(args.clients),
            "--turns", str(args.turns), "--tag", tag, "--max-tokens", str(args.max_tokens), "--hosts", "3",
            "--first", args.first]
    argv += ["--echo"] if args.fake else []
    argv += ["--seconds", str(seconds)] if seconds else []
    return argv


def drive(cluster, args, tag, seconds=None) -> subprocess.Popen:
    return subprocess.Popen(cluster.lb_argv(drive_argv(args, tag, seconds)), stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)


def collect(proc) -> tuple[list[dict], dict]:
    out, _ = proc.communicate(timeout=PHASE_LIMIT_S)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    metrics = next((r["metrics"] for r in rows if "metrics" in r), {})
    return [r for r in rows if "metrics" not in r], metrics


def reuse_figures(rows) -> dict:
    later = [r for r in rows if r["turn"] > 0 and r["outcome"] == "done" and r.get("prompt")]
    prompt = sum(r["prompt"] for r in later)
    cached = sum(r["cached"] or 0 for r in later)
    per_turn = {}
    for t in sorted({r["turn"] for r in later}):
        sel = [r for r in later if r["turn"] == t]
        per_turn[t] = round(sum(r["cached"] or 0 for r in sel) / max(1, sum(r["prompt"] for r in sel)), 3)
    done, reply_per_turn = [r for r in rows if r["outcome"] == "done" and r.get("completion") is not None], {}
    for t in sorted({r["turn"] for r in done}):   # mean reply length: what the next turn's prompt grows by
        sel = [r["completion"] for r in done if r["turn"] == t]
        reply_per_turn[t] = round(sum(sel) / len(sel), 1)
    convs, prev, reusable = {}, {}, 0
    for r in sorted(rows, key=lambda r: (r["c"], r["conv"], r["turn"])):
        convs.setdefault((r["c"], r["conv"]), set()).add(r["host"])
        p = prev.get((r["c"], r["conv"]))
        if r in later and p and p.get("prompt") and p.get("completion") is not None:
            reusable += min(r["prompt"], p["prompt"] + p["completion"])   # what the previous turn left behind
        prev[(r["c"], r["conv"])] = r
    return {"requests": len(rows), "lost": sum(r["outcome"] != "done" for r in rows),
            "crossed": sum(r["crossed"] for r in rows), "reuse": round(cached / max(1, prompt), 3),
            "reuse_of_reusable": round(cached / max(1, reusable), 3),
            "reuse_per_turn": per_turn, "reply_tokens_per_turn": reply_per_turn,
            "conversations_on_one_host": sum(len(h) == 1 for h in convs.values()),
            "conversations": len(convs), "hosts": sorted({r["host"] for r in rows if r["host"]})}


def engine_pid(server_pid: int) -> int | None:
    try:
        with open(f"/proc/{server_pid}/task/{server_pid}/children") as f:
            kids = [int(p) for p in f.read().split()]
    except OSError:
        return None
    return kids[0] if kids else None


def balancer_event(cluster, pattern, after) -> float | None:
    """Monotonic time of HAProxy's first stdout line matching `pattern` after `after`."""
    return next((t for t, line in cluster.lines() if t >= after and re.search(pattern, line)), None)


def busiest(cluster, exclude=()) -> int:
    """The host that answered the most requests so far (HAProxy's log), of those not in `exclude`."""
    counts = {i: 0 for i in (1, 2, 3) if i not in exclude}
    for _, line in cluster.lines():
        m = re.search(r" strata_hosts/h([0-9]) .*\"POST ", line)
        if m and int(m.group(1)) in counts:
            counts[int(m.group(1))] += 1
    return max(counts, key=lambda i: (counts[i], -i))


def outcomes(rows) -> dict:
    return {o: sum(r["outcome"] == o for r in rows) for o in ("done", "cut", "error_event", "conn_error",
                                                              "http_error")}


def failover(cluster, args, log_dir) -> dict:
    """Kill the busiest host (server and engine: a host that dies), then the busiest other host's engine alone
    (its server stays and restarts it), then start the dead host again; the clients chat throughout."""
    t_start, t_mono = time.time(), time.monotonic()
    proc = drive(cluster, args, "f", seconds=args.failover_s + RETURN_LIMIT_S)
    time.sleep(args.failover_s * 0.2)
    victim = busiest(cluster)
    kill_wall, kill_mono = time.time(), time.monotonic()
    cluster.kill_host(victim)
    time.sleep(args.failover_s * 0.15)
    other, engine_kill_wall = busiest(cluster, exclude=(victim,)), None
    pid = engine_pid(cluster.hosts[other].pid)
    if pid:
        engine_kill_wall = time.time()
        os.kill(pid, signal.SIGKILL)
    time.sleep(args.failover_s * 0.1)
    back_wall, back_mono = time.time(), time.monotonic()
    cluster.start_host(victim)
    name = f"h{victim}"
    while time.monotonic() < t_mono + args.failover_s + RETURN_LIMIT_S and proc.poll() is None:
        if time.monotonic() >= t_mono + args.failover_s and balancer_event(
                cluster, rf" strata_hosts/{name} .*\"POST ", back_mono) is not None:
            break   # the returned host has answered a request: the clients may stop
        time.sleep(0.2)
    if proc.poll() is None:
        proc.send_signal(signal.SIGUSR1)   # no client starts another request; those under way finish
    rows, metrics = collect(proc)
    engine_kill_at = round(engine_kill_wall, 2) if engine_kill_wall else None
    other_name = f"h{other}"
    down = balancer_event(cluster, rf"{name} is DOWN", kill_mono)
    up = balancer_event(cluster, rf"{name} is UP", back_mono)
    on_victim = [r for r in rows if r["host"] == name]
    in_flight = [r for r in on_victim if r["t0"] < kill_wall < r["t1"]]
    at_engine_kill = [r for r in rows if engine_kill_wall and r["host"] == other_name
                      and r["t0"] < engine_kill_wall + ENGINE_BACK_S and r["t1"] > engine_kill_wall]
    after = [r for r in rows if r["t0"] > kill_wall + 0.5 and r not in at_engine_kill]
    h503 = 0
    for host in ("h1", "h2", "h3"):
        with open(os.path.join(log_dir, f"{host}.log"), errors="replace") as f:
            h503 += len(re.findall(r'"POST [^"]*" 503 ', f.read()))
    return {"requests": len(rows), "seconds": round(time.time() - t_start, 1), "killed": name,
            "engine_killed": other_name, "engine_killed_at": engine_kill_at, "outcomes": outcomes(rows),
            "in_flight_at_kill": outcomes(in_flight),
            "in_flight_at_engine_kill": outcomes(at_engine_kill),
            "failed_after_kill": sum(r["outcome"] != "done" for r in after), "requests_after_kill": len(after),
            "not_done": [{"host": r["host"], "outcome": r["outcome"], "status": r["status"],
                          "after_kill_s": round(r["t0"] - kill_wall, 2), "error": r.get("error")}
                         for r in rows if r["outcome"] != "done"][:12],
            "down_after_s": round(down - kill_mono, 2) if down else None,
            "up_after_restart_s": round(up - back_mono, 2) if up else None,
            "answered_after_return": sum(r["t0"] > back_wall for r in on_victim),
            "crossed": sum(r["crossed"] for r in rows), "posts_answered_503_by_a_host": h503, "metrics": metrics}


def parse(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--fake", action="store_true", help="fake-engine hosts (tools/cluster_host.py --echo)")
    ap.add_argument("--clients", type=int, default=24)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--first", choices=cluster_drive.FIRSTS, default=cluster_drive.FIRSTS[0],
                    help="the chats' first messages (cluster_drive.py --first): greetings, or short requests")
    ap.add_argument("--parked", type=int, default=16, help="engine --conversation-cache-slots per host")
    ap.add_argument("--threads", type=int, default=1, help="engine threads per host")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--failover-s", type=float, default=40.0)
    ap.add_argument("--phases", default="affinity,roundrobin,failover")
    ap.add_argument("--json", metavar="FILE")
    return ap.parse_args(argv)


def run(args, log_dir: str) -> dict:
    """Every phase of `args.phases` on a fresh namespace cluster -> the figures (printed as each phase ends)."""
    figures = {"setup": {k: v for k, v in vars(args).items() if k != "json"}, "logs": log_dir}
    with cluster_ns.Cluster(3, host_argv_for(args, log_dir), log_dir) as cluster:
        for i in (1, 2, 3):
            cluster.start_host(i)
        for i in (1, 2, 3):
            cluster.wait_listening(i, HOST_START_S)
        for phase in args.phases.split(","):
            balance = cluster_ns.ROUND_ROBIN if phase == "roundrobin" else cluster_ns.AFFINITY
            cluster.start_balancer(balance)
            t0 = time.monotonic()
            if phase == "failover":
                figures[phase] = failover(cluster, args, log_dir)
            else:
                rows, metrics = collect(drive(cluster, args, "a" if phase == "affinity" else "r"))
                figures[phase] = {**reuse_figures(rows), "seconds": round(time.monotonic() - t0, 1),
                                  "metrics": metrics}
            cluster.stop_balancer()
            print(f"cluster_figures: {phase}: {json.dumps(figures[phase])}", flush=True)
    return figures


def main() -> int:
    args = parse()
    reason = cluster_ns.unusable()
    if reason:
        print(f"cluster_figures: skipped: {reason}")
        return 0
    figures = run(args, tempfile.mkdtemp(prefix="strata-cluster-"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

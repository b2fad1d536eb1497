"""Several Strata hosts behind HAProxy on this one machine, each host in its own network namespace.

    {prefix}lb   HAProxy (deploy/haproxy.cfg) on the namespace's own loopback 127.0.0.1:8080
    {prefix}h<i> one Strata server on 10.231.<i>.2:8080, linked to {prefix}lb by a veth pair (10.231.<i>.1 there)

Only these namespaces' addresses and their loopbacks are ever used: nothing is added to this machine's own
network, and every namespace, veth and process made here is removed by `down()` (also on an exception inside
`with Cluster(...)`). Drivers run inside {prefix}lb (`lb_argv`), where HAProxy listens.

Public surface: `Cluster(n_hosts, host_argv, log_dir)`, `unusable()` (why namespaces cannot be made here, or
None), `HOST_PORT`, `BALANCER`, `AFFINITY`, `ROUND_ROBIN`. Used by tools/cluster_figures.py and
tests/tools/test_cluster_ns.py. Needs root, iproute2 and haproxy.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST_PORT = 8080
BALANCER = "127.0.0.1:8080"          # inside the lb namespace
AFFINITY = "hash lua.strata_key"     # deploy/haproxy.cfg's own balance
ROUND_ROBIN = "roundrobin"           # the same file, affinity off: what affinity is measured against
STOP_WAIT_S = 10.0                   # a process asked to end (SIGTERM) gets this long before SIGKILL


def unusable() -> str | None:
    """Why this machine cannot run a namespace cluster (a reason to skip), or None."""
    if shutil.which("haproxy") is None:
        return "no haproxy binary (Debian package haproxy)"
    if shutil.which("ip") is None:
        return "no ip command (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"strata_probe{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        return "ip netns add failed (no namespace support here)"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def host_addr(i: int) -> str:
    return f"10.231.{i}.2"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Cluster:
    """host_argv(i, name, addr, port) -> the command of host i (1-based; name h<i>), run in its namespace."""

    def __init__(self, n_hosts: int, host_argv, log_dir: str, prefix: str | None = None):
        self.n_hosts, self.host_argv, self.log_dir = n_hosts, host_argv, log_dir
        self.prefix = prefix or f"sct{os.getpid() % 100000}_"
        self.hosts: dict[int, subprocess.Popen] = {}
        self._n_starts: dict[int, int] = {}                 # start_host calls per host (its log is appended)
        self.balancer: subprocess.Popen | None = None
        self.balancer_lines: list[tuple[float, str]] = []   # (monotonic time, line) of HAProxy's stdout
        self._lines_lock = threading.Lock()                 # guards balancer_lines
        self._made: list[str] = []

    def ns(self, which) -> str:
        return f"{self.prefix}{which if isinstance(which, str) else f'h{which}'}"

    def __enter__(self):
        self.up()
        return self

    def __exit__(self, *exc):
        self.down()

    def up(self) -> None:
        os.makedirs(self.log_dir, exist_ok=True)
        for which in ["lb", *range(1, self.n_hosts + 1)]:
            _ip("netns", "add", self.ns(which))
            self._made.append(self.ns(which))
            _ip("-n", self.ns(which), "link", "set", "lo", "up")
        for i in range(1, self.n_hosts + 1):
            lb_end, host_end = f"{self.prefix}l{i}"[-15:], f"{self.prefix}h{i}"[-15:]
            _ip("link", "add", lb_end, "netns", self.ns("lb"), "type", "veth", "peer", "name", host_end,
                "netns", self.ns(i))
            _ip("-n", self.ns("lb"), "addr", "add", f"10.231.{i}.1/24", "dev", lb_end)
            _ip("-n", self.ns("lb"), "link", "set", lb_end, "up")
            _ip("-n", self.ns(i), "addr", "add", f"{host_addr(i)}/24", "dev", host_end)
            _ip("-n", self.ns(i), "link", "set", host_end, "up")

    def start_host(self, i: int) -> None:
        """Host i (again after a kill: its log is appended to)."""
        argv = self.host_argv(i, f"h{i}", host_addr(i), HOST_PORT)
        log = open(os.path.join(self.log_dir, f"h{i}.log"), "a")
        self.hosts[i] = subprocess.Popen(["ip", "netns", "exec", self.ns(i), *argv], stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, start_new_session=True, cwd=ROOT)
        log.close()
        self._n_starts[i] = self._n_starts.get(i, 0) + 1

    def wait_listening(self, i: int, timeout_s: float) -> None:
        """Until host i's log says `listening on` (printed once its /health answers 200) after its last start."""
        path = os.path.join(self.log_dir, f"h{i}.log")
        deadline, proc = time.monotonic() + timeout_s, self.hosts[i]
        while True:
            with open(path, errors="replace") as f:
                text = f.read()
            if text.count("listening on") >= self._n_starts[i]:
                return
            if proc.poll() is not None:
                raise RuntimeError(f"host h{i} ended ({proc.returncode}): {text[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"host h{i} did not start in {timeout_s:.0f} s: {text[-2000:]}")
            time.sleep(0.2)

    def kill_host(self, i: int, sig: int = signal.SIGKILL) -> None:
        """Host i's whole process group (its server and engine) gets `sig`; SIGKILL is a host that dies."""
        proc = self.hosts[i]
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(STOP_WAIT_S)

    def start_balancer(self, balance: str = AFFINITY) -> None:
        env = {**os.environ, "STRATA_LUA": os.path.join(ROOT, "deploy", "strata_affinity.lua"),
               "STRATA_BIND": BALANCER, "STRATA_BALANCE": balance,
               **{f"STRATA_H{i}": f"{host_addr(i)}:{HOST_PORT}" for i in range(1, self.n_hosts + 1)}}
        self.balancer = subprocess.Popen(["ip", "netns", "exec", self.ns("lb"), "haproxy", "-db", "-f",
                                          os.path.join(ROOT, "deploy", "haproxy.cfg")], env=env,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        threading.Thread(target=self._read_balancer, args=(self.balancer,), daemon=True).start()

    def _read_balancer(self, proc) -> None:
        with open(os.path.join(self.log_dir, "haproxy.log"), "a") as log:
            for line in proc.stdout:
                with self._lines_lock:
                    self.balancer_lines.append((time.monotonic(), line.rstrip("\n")))
                log.write(line)

    def lines(self) -> list[tuple[float, str]]:
        with self._lines_lock:
            return list(self.balancer_lines)

    def stop_balancer(self) -> None:
        if self.balancer is not None:
            _end(self.balancer)
            self.balancer = None

    def lb_argv(self, argv: list[str]) -> list[str]:
        """`argv` run inside the lb namespace (where HAProxy listens on BALANCER)."""
        return ["ip", "netns", "exec", self.ns("lb"), *argv]

    def down(self) -> None:
        self.stop_balancer()
        for proc in self.hosts.values():
            _end(proc)
        for name in reversed(self._made):   # a namespace's veth ends go with it
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        self._made.clear()


def _end(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group, SIGKILL after STOP_WAIT_S."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(STOP_WAIT_S)
    except ProcessLookupError:
        pass

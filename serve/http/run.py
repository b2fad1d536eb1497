"""The server process's life cycle: serve until a signal or the parent's exit, then shut down in order.

Role: start the accept thread on a bound server (serve/http/server.py), start the engine in the background
(`/health` is 503 until READY), print `strata: listening on http://HOST:PORT` once `/health` answers 200; a
model that cannot be loaded ends the server with one line and exit 1. SIGTERM/SIGINT: stop accepting, end the
running streams with a final event, QUIT the engine (then terminate, kill), exit 0; a second Ctrl+C kills the
engine and exits at once. `--parent-pid PID`: the same shutdown when that process is gone.

Public surface: `run_server(svc, opts, start_engine=True, httpd=None) -> exit code`, `shutdown(httpd, svc)`.
"""
from __future__ import annotations

import contextlib
import http.client
import os
import signal
import sys
import threading
import time

from serve.core.errors import ServiceError
from serve.http.server import Options, make_server
from serve.ops import metrics_views

SHUTDOWN_STREAMS_S = 10.0       # running streams get this long to send their final event
PARENT_POLL_S = 1.0             # --parent-pid is checked this often


def _health_ok(host, port, timeout_s=2.0) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1" if host in ("0.0.0.0", "") else host, port,
                                          timeout=timeout_s)
        conn.request("GET", "/health")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def run_server(svc, opts: Options, start_engine=True, httpd=None) -> int:
    """Serve until a signal or the parent's exit; returns the exit code. `svc`: a Service, or a Lifecycle
    (serve/lifecycle/: it loads the default model unless lazy, and unloads idle ones). `httpd`: a server
    bound already (bootstrap.bind: the port is taken before anything loads)."""
    httpd = httpd or make_server(svc, opts)
    httpd.service = svc
    host, port = httpd.server_address[:2]
    stop = threading.Event()
    server_thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                     daemon=True, name="http-accept")
    server_thread.start()
    shown = f"[{host}]" if ":" in host else host

    failed = []

    def boot():
        # the Monitor's charts have a history from the start (a Lifecycle's views read its loaded model's Service)
        metrics_views.ensure_sampler(svc.view_service() if hasattr(svc, "view_service") else svc)
        if start_engine:
            try:
                svc.start_engine()  # then its supervisor restarts an engine that dies while idle
            except ServiceError as e:  # the model cannot be loaded: one clear line, exit 1, no server left
                print(f"strata: the engine did not start: {e}", file=sys.stderr, flush=True)
                failed.append(e)
                stop.set()
                return
        for _ in range(50):
            if stop.is_set() or _health_ok(host, port):
                break
            time.sleep(0.1)
        if not stop.is_set():
            print(f"strata: listening on http://{shown}:{port}", flush=True)

    threading.Thread(target=boot, daemon=True, name="engine-boot").start()
    presses = []

    def on_signal(signum, frame):
        presses.append(signum)
        if len(presses) > 1 and signum == signal.SIGINT:
            svc.kill_engine()  # a second Ctrl+C forces it
            os._exit(130)
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    if opts.parent_pid:
        threading.Thread(target=_watch_parent, args=(opts.parent_pid, stop), daemon=True,
                         name="parent-watch").start()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        shutdown(httpd, svc)
        for s, h in old.items():
            signal.signal(s, h)
    return 1 if failed else 0


def _watch_parent(pid, stop):
    import psutil
    while not stop.wait(PARENT_POLL_S):
        if not psutil.pid_exists(pid):
            print(f"strata: parent process {pid} is gone; shutting down", file=sys.stderr, flush=True)
            stop.set()
            return


def shutdown(httpd, svc):
    """Stop accepting, end the streams with a final event, QUIT the engine (terminate, kill)."""
    print("strata: shutting down", file=sys.stderr, flush=True)
    httpd.begin_stop()   # no answer keeps its connection; idle kept connections end now
    svc.close()
    t = threading.Thread(target=httpd.shutdown, daemon=True)
    t.start()
    t.join(5.0)
    end = time.monotonic() + SHUTDOWN_STREAMS_S
    while time.monotonic() < end:
        with httpd.streams_lock:
            if httpd.streams == 0:
                break
        time.sleep(0.05)
    with contextlib.suppress(Exception):
        httpd.server_close()
    try:
        svc.stop_engine()
    except ServiceError as e:
        print(f"strata: {e}", file=sys.stderr, flush=True)

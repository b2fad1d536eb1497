"""Waiting for a server to answer: GET /health polled until it says 200, its process ends, or time runs out.
Shared by the benchmarks that start servers (tools/bench_load.py, tools/bench_serving.py).

Public surface: `wait_healthy(port, timeout_s, proc=None, host="127.0.0.1", poll_s=0.5) -> bool`.
"""
from __future__ import annotations

import http.client
import time

REQUEST_TIMEOUT_S = 5.0   # one /health answer; a server that has bound its port answers it at once


def wait_healthy(port: int, timeout_s: float, proc=None, host: str = "127.0.0.1", poll_s: float = 0.5) -> bool:
    """True once GET /health on host:port answers 200; False when `proc` (a Popen, optional) has ended or
    `timeout_s` has passed first. A refused or broken connection is a server still starting."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            return False
        conn = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT_S)
        try:
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return True
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        time.sleep(poll_s)
    return False

"""A small client for a running Strata server: the one `strata ps`, `load`, `unload` and `chat` use.

Role: find servers through their activity records (strata_control.activity), call the JSON routes, and read a
chat completion stream as (kind, text) pieces. Standard library only; it knows nothing of the server's insides.

Public surface: `Server(host, port, key)`, `Server.call(method, path, body)`, `Server.chat_stream(messages,
model)`, `find_servers()`, `pick_server(port=None)`, `server_rows()`, `start_server(model, extra_args)`,
`ClientError`.
"""
from __future__ import annotations

import http.client
import json
import os
import queue
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

CALL_TIMEOUT_S = 30.0       # a JSON route answers in well under this (a load waits for READY: see LOAD_TIMEOUT_S)
LOAD_TIMEOUT_S = 900.0      # the engine's own READY limit (serve/engine_client/engine.py ENGINE_READY_S)
STREAM_READ_TIMEOUT_S = 300.0   # the server sends keep-alives far more often than this
SERVER_START_S = 900.0      # a started server prints its listening line within the engine's READY limit


class ClientError(RuntimeError):
    """The server could not be reached or answered an error; the message says which."""


class Server:
    def __init__(self, host: str = "127.0.0.1", port: int = 8080, key: str | None = None):
        self.host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
        self.port, self.key = port, key or os.environ.get("STRATA_API_KEY")

    def _headers(self) -> dict:
        h = {"Content-Type": "application/json"}
        if self.key:
            h["Authorization"] = f"Bearer {self.key}"
        return h

    def call(self, method: str, path: str, body=None, timeout_s: float = CALL_TIMEOUT_S):
        """-> (status, parsed JSON or text). Raises ClientError when the server cannot be reached."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body), headers=self._headers())
            r = conn.getresponse()
            raw = r.read()
        except OSError as e:
            raise ClientError(f"no Strata server answers on {self.host}:{self.port} ({e})") from None
        finally:
            conn.close()
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, raw.decode("utf-8", "replace")

    def chat_stream(self, messages: list, model: str | None = None, **extra):
        """Yield ("content" | "reasoning", text) pieces of one streamed chat reply; the caller may stop
        reading (close the generator) to stop the reply: the connection is closed and the server stops."""
        body = {"messages": messages, "stream": True, **extra}
        if model:
            body["model"] = model
        conn = http.client.HTTPConnection(self.host, self.port, timeout=STREAM_READ_TIMEOUT_S)
        try:
            conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=self._headers())
            r = conn.getresponse()
            if r.status != 200:
                raise ClientError(_error_text(r.status, r.read()))
            for line in r:
                line = line.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    raise ClientError(event["error"].get("message", "the reply failed"))
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if delta.get("reasoning_content"):
                        yield "reasoning", delta["reasoning_content"]
                    if delta.get("content"):
                        yield "content", delta["content"]
        except OSError as e:
            raise ClientError(f"the connection to {self.host}:{self.port} failed ({e})") from None
        finally:
            conn.close()


def _error_text(status: int, raw: bytes) -> str:
    try:
        err = json.loads(raw).get("error") or {}
        return f"{status}: {err.get('message', raw.decode('utf-8', 'replace'))}"
    except (ValueError, AttributeError):
        return f"{status}: {raw.decode('utf-8', 'replace')[:200]}"


def find_servers() -> list[dict]:
    """The activity records of the servers running for this user (stale ones are cleaned)."""
    from strata_control.activity import running
    return running()


def pick_server(port: int | None = None, key: str | None = None) -> Server:
    """The server on `port`, else the one running server (the newest when there are several)."""
    if port:
        return Server("127.0.0.1", port, key)
    found = find_servers()
    if not found:
        raise ClientError("no Strata server is running (start one with `strata serve`, or give --port)")
    rec = found[-1]
    return Server(rec.get("host") or "127.0.0.1", int(rec["port"]), key)


def server_rows(key: str | None = None) -> list[dict]:
    """One row per running server for `strata ps`: pid, address, uptime, the model loaded (or none), lanes,
    and the RAM of the server and its engines (psutil over the process tree)."""
    rows = []
    for rec in find_servers():
        row = {"pid": rec["pid"], "address": f"{rec.get('host')}:{rec['port']}", "model": rec.get("model"),
               "uptime_s": round(time.time() - rec.get("started", time.time())), "loaded": None,
               "lanes": None, "ram_bytes": _tree_rss(rec["pid"]), "lease_token_file": rec.get("lease_token_file")}
        server = Server(rec.get("host") or "127.0.0.1", int(rec["port"]), key)
        try:
            status, models = server.call("GET", "/v1/models")
            if status == 200:
                loaded = [m["id"] for m in models.get("data", []) if m.get("status", {}).get("value") == "loaded"]
                row["loaded"] = ", ".join(loaded) or "none"
            elif status == 401:
                row["loaded"] = "needs --api-key"
            status, st = server.call("GET", "/v1/status")
            if status == 200:
                row["lanes"] = (st.get("concurrency") or {}).get("serving")
        except ClientError:
            row["loaded"] = "not answering"
        rows.append(row)
    return rows


def remote_row(url: str, key: str | None = None) -> dict:
    """One row for `strata ps --url URL`: a server on another host (a cluster's member, docs/DEPLOY.md), from
    its answers alone: the name it sends (X-Strata-Host), the model loaded, lanes, requests, uptime."""
    parts = urlsplit(url if "//" in url else f"http://{url}")
    row = {"address": parts.netloc, "host_name": None, "loaded": "not answering", "lanes": None,
           "in_flight": None, "requests": None, "uptime_s": None}
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 8080, timeout=CALL_TIMEOUT_S)
    try:
        conn.request("GET", "/v1/status", headers=Server(key=key)._headers())
        r = conn.getresponse()
        raw = r.read()
    except (OSError, http.client.HTTPException):
        return row
    finally:
        conn.close()
    row["host_name"] = r.getheader("X-Strata-Host")
    if r.status == 401:
        return {**row, "loaded": "needs --api-key"}
    try:
        st = json.loads(raw)
        activity = st.get("activity") or {}
        return {**row, "loaded": st.get("model") if st.get("loaded") else "none",
                "lanes": (st.get("concurrency") or {}).get("serving"), "in_flight": activity.get("in_flight"),
                "requests": activity.get("requests"), "uptime_s": round(st.get("uptime_s") or 0)}
    except (ValueError, AttributeError):
        return {**row, "loaded": f"answered {r.status}, not as Strata"}


def _tree_rss(pid: int) -> int | None:
    try:
        import psutil
        p = psutil.Process(pid)
        return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])
    except Exception:   # psutil missing, or the process ended meanwhile
        return None


def start_server(model: str | None, extra_args=()) -> tuple[subprocess.Popen, Server]:
    """Start `strata serve --port 0` for this command (chat, bench) in its own session, so Ctrl+C reaches
    only the command; it ends with the command through --parent-pid -> (process, Server) once it listens."""
    args = [sys.executable, "-m", "strata_cli", "serve", "--port", "0", "--quiet", "--parent-pid",
            str(os.getpid()), *(["--model", model] if model and os.path.isfile(model) else []), *extra_args]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen(args, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: queue.Queue = queue.Queue()  # the console's lines, read on a thread so the wait below has its limit

    def read():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)  # the console closed: the server has ended
    threading.Thread(target=read, daemon=True, name="server-console").start()
    end = time.monotonic() + SERVER_START_S
    seen = []
    while (left := end - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            proc.wait(timeout=5)
            raise ClientError("the server did not start: " + " | ".join(s.strip() for s in seen[-5:]))
        seen.append(line)
        if line.startswith("strata: listening on http://"):
            return proc, Server("127.0.0.1", int(line.strip().rsplit(":", 1)[1]))  # the thread keeps draining
    proc.kill()
    raise ClientError(f"the server did not listen within {SERVER_START_S:.0f} s: "
                      + " | ".join(s.strip() for s in seen[-5:]))

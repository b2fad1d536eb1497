"""Activity records: how `strata ps` and a desktop host find the servers running on this machine.

Role: a server takes a record (pid, port, host, model, start time) in the user's runtime folder as soon as its
port is bound, and removes it in the same `finally` that restores the console. A record whose process is gone
(or whose pid now belongs to another process: its start time differs) is ignored and deleted by whoever reads
it. Files are 0600 in a 0700 folder. Nothing here talks HTTP.

Public surface: `runtime_dir()`, `take(port, host, model, folder=None) -> path`, `release(path)`,
`running(folder=None) -> [record]`, `RECORD_PREFIX`.
"""
from __future__ import annotations

import json
import os
import time

from strata_control.files import write_private

RECORD_PREFIX = "server-"
START_TIME_SLACK_S = 2.0   # a process's start time as psutil reads it twice may differ by rounding


def runtime_dir() -> str:
    """$XDG_RUNTIME_DIR/strata (a per-user tmpfs on most Linux desktops), else ~/.cache/strata/run; 0700."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    folder = os.path.join(base, "strata") if base and os.path.isdir(base) else \
        os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "strata", "run")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return folder


def _process_start(pid: int) -> float | None:
    """The process's start time (epoch s), None when it is gone or cannot be read."""
    try:
        import psutil
        return psutil.Process(pid).create_time()
    except ImportError:
        return 0.0 if _pid_alive(pid) else None   # without psutil: alive or not, no start time
    except Exception:   # psutil.NoSuchProcess, AccessDenied, ZombieProcess
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def take(port: int, host: str, model: str, folder: str | None = None, pid: int | None = None,
         lease_token: str | None = None) -> str:
    """Write this server's record (and its lease token file, readable only by this user) -> the record's
    path."""
    folder = folder or runtime_dir()
    pid = pid or os.getpid()
    record = {"pid": pid, "port": port, "host": host, "model": model, "started": time.time(),
              "process_started": _process_start(pid)}
    path = os.path.join(folder, f"{RECORD_PREFIX}{pid}.json")
    try:
        if lease_token:
            record["lease_token_file"] = path[:-len(".json")] + ".token"
            write_private(record["lease_token_file"], lease_token)
        write_private(path, json.dumps(record))
    except OSError:   # StorageFull among them: no token file is left without its record
        release(path)
        raise
    return path


def release(path: str | None) -> None:
    """Remove a record and its token file (twice is fine: a signal path and the finally)."""
    if path:
        for p in (path, path[:-len(".json")] + ".token"):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


def _stale(record: dict) -> bool:
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return True
    started = _process_start(pid)
    if started is None:
        return True
    was = record.get("process_started")
    return isinstance(was, (int, float)) and abs(started - was) > START_TIME_SLACK_S


def running(folder: str | None = None) -> list[dict]:
    """The records of servers that are running, oldest first; stale and unreadable records are deleted."""
    folder = folder or runtime_dir()
    out = []
    for name in sorted(os.listdir(folder)):
        if not (name.startswith(RECORD_PREFIX) and name.endswith(".json")):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError):
            record = {}
        if not isinstance(record, dict) or _stale(record):
            release(path)
            continue
        out.append({**record, "record": path})
    return sorted(out, key=lambda r: r.get("started", 0))

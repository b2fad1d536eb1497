"""The limits this process runs under: the CPUs it may use and the memory its cgroup allows (issue 25).

Role: read, never decide. A container limited to 2 CPUs on a 64-core host (cgroup v2 `cpu.max`, or an affinity
mask from `taskset` / a cpuset) must not default to 64 engine threads fighting for 2, and a cgroup
`memory.max` below what a plan allocates must be a refusal at start, not the kernel's OOM kill.
strata_control/plan.py turns these facts into decisions.

- CPUs: `len(os.sched_getaffinity(0))`, and the cgroup's `cpu.max` quota (`<quota> <period>`, `max` = none)
  rounded up to whole CPUs; the smaller wins, with its source in words.
- Memory: the smallest `memory.max` of the process's cgroup and its ancestors, and `memory.current` of its
  own cgroup (in use now, by this server among others).
The cgroup is the unified (v2) hierarchy's: `/sys/fs/cgroup` plus the `0::<path>` line of
`/proc/self/cgroup`, walked up to the root. `STRATA_CGROUP_DIR` names one directory to read instead (no
ancestors): a test's fake cgroup, or a host whose cgroup is mounted elsewhere.

Public surface: `HostLimits`, `host_limits(cgroup_dir=None)`, `CGROUP_ROOT`.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

CGROUP_ROOT = "/sys/fs/cgroup"


@dataclass
class HostLimits:
    cpus: int                        # CPUs this process may use (affinity and cgroup quota)
    cpus_source: str                 # why that many, in words
    memory_max_bytes: int | None     # the cgroup's memory limit; None: none set
    memory_used_bytes: int           # in use in the cgroup now (0 when unknown)
    memory_source: str               # where the limit was read; "" without one


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, ValueError):
        return None


def _cgroup_dirs(cgroup_dir: str | None) -> list[str]:
    """The directories to read, own cgroup first."""
    if cgroup_dir:
        return [cgroup_dir]
    text = _read("/proc/self/cgroup") or ""
    rel = next((line[3:] for line in text.splitlines() if line.startswith("0::")), None)
    if rel is None or not os.path.isfile(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
        return []  # no unified hierarchy here (cgroup v1 only): nothing read
    out, path = [], os.path.normpath(os.path.join(CGROUP_ROOT, rel.lstrip("/")))
    while path.startswith(CGROUP_ROOT):
        out.append(path)
        if path == CGROUP_ROOT:
            break
        path = os.path.dirname(path)
    return out


def _cpu_quota(dirs) -> tuple[float, str] | None:
    best = None
    for d in dirs:
        words = (_read(os.path.join(d, "cpu.max")) or "max").split()
        try:
            if words[0] != "max":
                cpus = int(words[0]) / int(words[1] if len(words) > 1 else 100000)
                if best is None or cpus < best[0]:
                    best = (cpus, f"cgroup cpu.max '{' '.join(words)}' in {d}")
        except (ValueError, ZeroDivisionError):
            continue
    return best


def _memory(dirs) -> tuple[int | None, int, str]:
    limit, source = None, ""
    for d in dirs:
        word = _read(os.path.join(d, "memory.max"))
        if word and word.isdigit() and (limit is None or int(word) < limit):
            limit, source = int(word), f"cgroup memory.max in {d}"
    used = _read(os.path.join(dirs[0], "memory.current")) if dirs else None
    return limit, int(used) if used and used.isdigit() else 0, source


def host_limits(cgroup_dir: str | None = None) -> HostLimits:
    """This process's limits now (`cgroup_dir`, else STRATA_CGROUP_DIR, else its own cgroup v2 path)."""
    dirs = _cgroup_dirs(cgroup_dir or os.environ.get("STRATA_CGROUP_DIR"))
    total = os.cpu_count() or 1
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call on this OS
        affinity = total
    cpus, source = affinity, (f"affinity allows {affinity} of {total} CPUs: taskset or a cpuset" if affinity < total
                              else f"all {total} CPUs")
    quota = _cpu_quota(dirs)
    if quota is not None and math.ceil(quota[0]) < cpus:
        cpus, source = max(1, math.ceil(quota[0])), f"{quota[1]} allows {quota[0]:g} CPUs"
    limit, used, mem_source = _memory(dirs)
    return HostLimits(cpus=cpus, cpus_source=source, memory_max_bytes=limit, memory_used_bytes=used,
                      memory_source=mem_source)

"""The limits this process runs under: the CPUs it may use and the memory its cgroup allows (issue 25).

Role: read, never decide. A container limited to 2 CPUs on a 64-core host (cgroup v2 `cpu.max`, or an affinity
mask from `taskset` / a cpuset) must not default to 64 engine threads fighting for 2, and a cgroup
`memory.max` below what a plan allocates must be a refusal at start, not the kernel's OOM kill.
strata_control/plan.py turns these facts into decisions.

- CPUs: `len(os.sched_getaffinity(0))`, and the cgroup's `cpu.max` quota (`<quota> <period>`, `max` = none)
  rounded up to whole CPUs; the smaller wins, with its source in words.
- Memory: the smallest `memory.max` of the process's cgroup and its ancestors, and the `memory.current` of the
  cgroup that sets it (in use now, by this server among others).
The cgroup is the unified (v2) hierarchy's: `/sys/fs/cgroup` plus the `0::<path>` line of
`/proc/self/cgroup`, walked up to the root. On a v1-only host the memory and cpu controllers' directories
are read instead (`memory.limit_in_bytes` / `memory.usage_in_bytes`, `cpu.cfs_quota_us` / `cpu.cfs_period_us`). `STRATA_CGROUP_DIR` names one directory to read instead (no
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


V1_UNLIMITED = 1 << 60    # cgroup v1 writes "no limit" as a page-rounded 2^63 - 1


def _v1_dirs(text: str) -> list[str]:
    """cgroup v1: the memory and cpu controllers' directories of this process (the controller's root when
    the path is not visible here, as inside a container's namespace)."""
    out = []
    for line in text.splitlines():
        _, controllers, rel = (line.split(":", 2) + ["", ""])[:3]
        for c in ("memory", "cpu"):
            if c in controllers.split(","):
                base = os.path.join(CGROUP_ROOT, c)
                path = os.path.normpath(os.path.join(base, rel.lstrip("/")))
                out.append(path if os.path.isdir(path) else base)
    return [d for d in out if os.path.isdir(d)]


def _cgroup_dirs(cgroup_dir: str | None) -> list[str]:
    """The directories to read, own cgroup first (v2: then its ancestors; v1: the memory and cpu ones)."""
    if cgroup_dir:
        return [cgroup_dir]
    text = _read("/proc/self/cgroup") or ""
    rel = next((line[3:] for line in text.splitlines() if line.startswith("0::")), None)
    if rel is None or not os.path.isfile(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
        return _v1_dirs(text)
    out, path = [], os.path.normpath(os.path.join(CGROUP_ROOT, rel.lstrip("/")))
    while path.startswith(CGROUP_ROOT):
        out.append(path)
        if path == CGROUP_ROOT:
            break
        path = os.path.dirname(path)
    return out


def _cpu_words(d: str) -> list[str]:
    """`<quota> <period>` of v2's cpu.max, or of v1's cpu.cfs_quota_us / cpu.cfs_period_us; ["max"]: none."""
    v2 = _read(os.path.join(d, "cpu.max"))
    if v2:
        return v2.split()
    quota, period = _read(os.path.join(d, "cpu.cfs_quota_us")), _read(os.path.join(d, "cpu.cfs_period_us"))
    if quota and period and quota.isdigit():
        return [quota, period]
    return ["max"]


def _cpu_quota(dirs) -> tuple[float, str] | None:
    best = None
    for d in dirs:
        words = _cpu_words(d)
        try:
            if words[0] != "max":
                cpus = int(words[0]) / int(words[1] if len(words) > 1 else 100000)
                if best is None or cpus < best[0]:
                    best = (cpus, f"cgroup cpu quota '{' '.join(words)}' in {d}")
        except (ValueError, ZeroDivisionError):
            continue
    return best


def _memory(dirs) -> tuple[int | None, int, str]:
    limit, source, used = None, "", 0
    for d in dirs:
        for name, current in (("memory.max", "memory.current"), ("memory.limit_in_bytes", "memory.usage_in_bytes")):
            word = _read(os.path.join(d, name))
            if word and word.isdigit() and int(word) < V1_UNLIMITED and (limit is None or int(word) < limit):
                limit, source = int(word), f"cgroup {name} in {d}"
                now = _read(os.path.join(d, current))
                used = int(now) if now and now.isdigit() else 0
    return limit, used, source


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

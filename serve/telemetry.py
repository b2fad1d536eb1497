"""Machine figures for /metrics and /v1/status: CPU share and RAM, read through psutil when it is there.

Public surface: `machine() -> dict` ({"cpu": percent, "ram_used": bytes, "ram_total": bytes, "gpu": None}),
`process_rss() -> (server bytes, engines bytes)` (this process and its child processes).
Values that cannot be read are None (never 0). Knows nothing of the server or the engine.
"""
from __future__ import annotations

try:
    import psutil
except ImportError:
    psutil = None


def machine() -> dict:
    out = {"cpu": None, "ram_used": None, "ram_total": None, "gpu": None}
    if psutil is None:
        return out
    try:
        out["cpu"] = psutil.cpu_percent(interval=None)  # since the previous call: never blocks
        vm = psutil.virtual_memory()
        out["ram_used"], out["ram_total"] = vm.total - vm.available, vm.total
    except (OSError, psutil.Error):
        pass
    return out


def process_rss() -> tuple[int | None, int | None]:
    """(this process's RSS, the sum over its child processes: the engines) in bytes; None when unreadable."""
    if psutil is None:
        return None, None
    try:
        me = psutil.Process()
        own = me.memory_info().rss
    except (OSError, psutil.Error):
        return None, None
    engines = 0
    for child in me.children(recursive=True):
        try:
            engines += child.memory_info().rss
        except (OSError, psutil.Error):
            pass
    return own, engines

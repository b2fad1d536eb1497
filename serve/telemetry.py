"""Machine figures for /metrics and /v1/status: CPU share and RAM, read through psutil when it is there.

Public surface: `machine() -> dict` ({"cpu": percent, "ram_used": bytes, "ram_total": bytes, "gpu": None}).
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

"""The lifecycle's values: a model the server can serve (`ModelEntry`), a request's hold on one (`Ticket`), the
refusal (`LifecycleError`), and the console line for a loaded model.

Role: the data serve/lifecycle/models.py's `Lifecycle` decides over; `ModelEntry`'s counters are guarded by the
Lifecycle's `_cv`. Knows no HTTP: the server maps `LifecycleError.status` onto its error answers.

Public surface: `LifecycleError(status, err_type, message, param, code)`, `ModelEntry(name, make, aliases,
info)`, `Ticket` (`service`, `release()`), `loaded_line(svc)`, `close_engine(svc)`, `MIB`.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from serve.core.errors import StrataError
from serve.ops import telemetry

MIB = 1 << 20


class LifecycleError(StrataError):
    """A request the lifecycle refuses: `status` 404 unknown model, 409 busy, 503 leased or timed out."""

    def __init__(self, status: int, err_type: str, message: str, param: str | None = None, code=None):
        super().__init__(message, param=param, code=code, status=status, err_type=err_type)


@dataclass
class ModelEntry:
    name: str
    make: object                        # () -> Service (engine not started); called once, on first use
    aliases: list = field(default_factory=list)
    info: dict = field(default_factory=dict)   # what /v1/models shows before it is built: n_ctx, architecture;
    #                                            ram_bytes (the plan's need), idle_unload_s (its own), config_path
    svc: object = None
    in_flight: int = 0                  # requests holding a Ticket (guarded by Lifecycle._cv)
    last_used: float = 0.0              # (guarded by Lifecycle._cv)
    draining: bool = False              # chosen to be unloaded: admits no request (guarded by Lifecycle._cv)
    _build: threading.Lock = field(default_factory=threading.Lock)   # guards the one call of `make`

    def service(self):
        with self._build:
            if self.svc is None:
                self.svc = self.make()
            return self.svc

    @property
    def ram_bytes(self) -> int:
        """What its engine needs loaded: the launch plan's weights + KV + overhead (0 = not known)."""
        memory = getattr(self.svc, "plan_memory", None) if self.svc is not None else None
        return int((memory or {}).get("total") or self.info.get("ram_bytes") or 0)


@dataclass
class Ticket:
    entry: ModelEntry
    owner: object   # the Lifecycle (serve/lifecycle/models.py) that admitted it
    released: bool = False

    @property
    def service(self):
        return self.entry.svc

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.owner._leave(self.entry)


def loaded_line(svc) -> str:
    """The console line for a loaded model: model, architecture, context, threads, lanes, kernels, RAM."""
    info = svc.engine.info
    _, engines = telemetry.process_rss()
    ram = f"{engines // MIB} MiB" if engines else "?"
    return (f"strata: loaded {svc.model_name} ({info.get('arch') or svc.arch or '?'}): context "
            f"{svc.engine.max_context or svc.engine.known_ctx}, threads {info.get('threads', '?')}, lanes "
            f"{max(1, int(info.get('batch_slots') or 0))}, kernels {info.get('kernels', '?')}, kv "
            f"{info.get('kv', '?')}, weights {info.get('weights_mib', '?')} MiB, engine RAM {ram}")



def close_engine(svc) -> None:
    """Unload: the engine ends (closed on purpose: its supervisor leaves it alone until the next start)."""
    try:
        svc.engine.close()
    except Exception as e:   # EngineStuck: as the HTTP layer sees it (ServiceUnavailable)
        raise svc.service_error(e) from None

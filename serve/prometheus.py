"""Prometheus text exposition of the service's figures, with llama.cpp's metric names (PEERS.md §1.7).

Public surface: `render(service) -> str`, `CONTENT_TYPE`. Counters are lifetime totals; the two throughput
gauges (`prompt_tokens_seconds`, `predicted_tokens_seconds`) are averages over the window since the previous
scrape (0 when nothing ran in it), so a dashboard sees the current rate rather than the lifetime mean.
`strata:` extras follow. Each metric is `# HELP`, `# TYPE`, then one sample without labels.
"""
from __future__ import annotations

import threading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_window_lock = threading.Lock()  # guards _last: the totals seen by the previous scrape, per service
_last: dict = {}


def _line(out, name, kind, help_text, value):
    out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n{name} {value:g}\n")


def render(service) -> str:
    t = dict(service.totals)
    read = t["prompt_tokens"] - t["reused"]
    now = (read, t["prompt_ms"], t["output_tokens"], t["decode_ms"])
    with _window_lock:
        prev = _last.get(id(service), (0, 0.0, 0, 0.0))
        _last[id(service)] = now
    d_read, d_pms, d_out, d_dms = (a - b for a, b in zip(now, prev))
    prompt_rate = 1e3 * d_read / d_pms if d_pms > 0 else 0.0
    predicted_rate = 1e3 * d_out / d_dms if d_dms > 0 else 0.0
    busy = 1 if service.status.get("busy") else 0
    out: list[str] = []
    _line(out, "llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.", read)
    _line(out, "llamacpp:prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache.",
          t["reused"])
    _line(out, "llamacpp:prompt_seconds_total", "counter", "Prompt process time", t["prompt_ms"] / 1e3)
    _line(out, "llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.",
          t["output_tokens"])
    _line(out, "llamacpp:tokens_predicted_seconds_total", "counter", "Predict process time", t["decode_ms"] / 1e3)
    _line(out, "strata:requests_total", "counter", "Requests finished.", t["requests"])
    _line(out, "strata:requests_cancelled_total", "counter", "Requests whose client left.", t["cancelled"])
    _line(out, "strata:requests_failed_total", "counter", "Requests that ended with an error.", t["errors"])
    _line(out, "llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", prompt_rate)
    _line(out, "llamacpp:predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
          predicted_rate)
    _line(out, "llamacpp:requests_processing", "gauge", "Number of requests processing.", busy)
    _line(out, "llamacpp:requests_deferred", "gauge", "Number of requests deferred.", service.queued)
    _line(out, "strata:model_loaded", "gauge", "1 when the engine is running.", 1 if service.engine.alive() else 0)
    _line(out, "strata:engine_max_context", "gauge", "The engine's context in tokens.",
          service.engine.max_context or service.engine.known_ctx)
    return "".join(out)

"""Prometheus text expositions (format 0.0.4): llama.cpp's names, and vLLM's names with `strata:` gauges.

- `render(svc)` (GET /metrics/prometheus): llama-server's metrics without labels (PEERS.md §1.7), counters
  first, then gauges, then `strata:` extras. `prompt_tokens_total` counts prompt tokens read (reused ones
  are `prompt_tokens_cached_total`); the two throughput gauges are averages over the window since the
  previous scrape (0 when nothing ran in it); `requests_processing` / `requests_deferred` count requests
  holding a slot or the turn / waiting for one, with any number of lanes; `n_decode_total` and
  `n_busy_slots_per_decode` are the server-side estimate described in serve/ops/live_figures.py.
- `render_vllm(svc)` (the second half of GET /metrics): vLLM's names, each sample labelled `model_name`, with the histograms
  `vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds` (one observation per gap between
  two tokens) and `vllm:e2e_request_latency_seconds` on vLLM's bucket bounds, then `strata:` gauges for
  live state, slots and hardware (a sample that cannot be read is left out, never written as 0).
Integers are written as integers (`1234567`, never `1.23457e+06`); floats in Python's shortest exact form.

- `render_all(svc, http_counts)` (GET /metrics by default, as llama-server answers it): llama.cpp's families,
  then `render_vllm`'s, then the HTTP server's connection counts (`render_http`: `strata:http_*`), in one
  exposition (no name is in both), so a llama.cpp dashboard and a vLLM one can scrape the same route.

Public surface: `render(svc)`, `render_vllm(svc)`, `render_http(counts)`, `render_all(svc, http_counts)`,
`CONTENT_TYPE`.
"""
from __future__ import annotations

import math
import threading

from serve.ops import metrics_views

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_window_lock = threading.Lock()  # guards _last: the totals seen by the previous scrape, per service
_last: dict = {}
_FINISH_REASONS = {"stop": "stop", "tool_calls": "stop", "length": "length", "cancel": "abort",
                   "shutdown": "abort", "loop": "stop"}   # Strata's finish -> vLLM's finished_reason (errors are not successes)


def number(value) -> str:
    """A sample value: integers exactly, floats shortest round-trip, +Inf / -Inf / NaN spelled out."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2 ** 53:
        return str(int(value))
    return repr(value)


def _escape_label(value) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items()) + "}"


class _Out:
    def __init__(self):
        self.parts: list[str] = []

    def family(self, name, kind, help_text, samples):
        """samples: [(labels dict, value)]; a None value is left out (unknown, never 0)."""
        samples = [(lab, v) for lab, v in samples if v is not None]
        if not samples:
            return
        help_text = help_text.replace("\\", "\\\\").replace("\n", "\\n")
        self.parts.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
        self.parts.extend(f"{name}{_labels(lab)} {number(v)}\n" for lab, v in samples)

    def histogram(self, name, help_text, hist, labels):
        self.parts.append(f"# HELP {name} {help_text}\n# TYPE {name} histogram\n")
        for bound, n in hist.cumulative():
            le = "+Inf" if math.isinf(bound) else repr(float(bound))
            self.parts.append(f"{name}_bucket{_labels({**labels, 'le': le})} {n}\n")
        self.parts.append(f"{name}_sum{_labels(labels)} {number(hist.sum)}\n")
        self.parts.append(f"{name}_count{_labels(labels)} {hist.count}\n")

    def text(self) -> str:
        return "".join(self.parts)


def _window_rates(svc, t) -> tuple[float, float]:
    read = t["prompt_tokens"] - t["reused"]
    now = (read, t["prompt_ms"], t["output_tokens"], t["decode_ms"])
    with _window_lock:
        prev = _last.get(id(svc), (0, 0.0, 0, 0.0))
        _last[id(svc)] = now
    d_read, d_pms, d_out, d_dms = (a - b for a, b in zip(now, prev))
    return (1e3 * d_read / d_pms if d_pms > 0 else 0.0), (1e3 * d_out / d_dms if d_dms > 0 else 0.0)


def render(svc, extras: bool = True) -> str:
    t = dict(svc.totals)
    counts = metrics_views.live_counts(svc)
    snap = counts["snapshot"]
    prompt_rate, predicted_rate = _window_rates(svc, t)
    busy_per_decode = snap["tokens"] / snap["decodes"] if snap["decodes"] > 0 else 0.0
    o = _Out()
    one = lambda name, kind, help_text, value: o.family(name, kind, help_text, [({}, value)])  # noqa: E731
    one("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.",
        t["prompt_tokens"] - t["reused"])
    one("llamacpp:prompt_seconds_total", "counter", "Prompt process time", t["prompt_ms"] / 1e3)
    one("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.",
        t["output_tokens"])
    one("llamacpp:tokens_predicted_seconds_total", "counter", "Predict process time", t["decode_ms"] / 1e3)
    one("llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls", round(snap["decodes"]))
    one("llamacpp:n_tokens_max", "counter", "Largest observed n_tokens.", snap["n_tokens_max"])
    one("llamacpp:prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache.",
        t["reused"])
    one("llamacpp:spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens generated",
        t["drafts_offered"])
    one("llamacpp:spec_decode_num_accepted_tokens_total", "counter",
        "Speculative: Total draft tokens accepted by the target model", t["drafts_accepted"])
    one("llamacpp:spec_decode_num_drafts_total", "counter", "Speculative: Total speculative decoding verification "
        "steps", t.get("draft_steps", 0))
    one("llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", prompt_rate)
    one("llamacpp:predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
        predicted_rate)
    one("llamacpp:requests_processing", "gauge", "Number of requests processing.", counts["processing"])
    one("llamacpp:requests_deferred", "gauge", "Number of requests deferred.", counts["deferred"])
    one("llamacpp:n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call",
        busy_per_decode)
    if not extras:   # the llama.cpp families only (GET /metrics puts vLLM's and the strata: ones after them)
        return o.text()
    one("strata:requests_total", "counter", "Requests finished.", t["requests"])
    one("strata:requests_cancelled_total", "counter", "Requests whose client left.", t["cancelled"])
    one("strata:requests_failed_total", "counter", "Requests that ended with an error.", t["errors"])
    one("strata:requests_rejected_total", "counter", "Requests refused before they ran.", snap["rejected_total"])
    one("strata:drafts_offered_total", "counter", "Draft tokens proposed and verified.", t["drafts_offered"])
    one("strata:drafts_accepted_total", "counter", "Draft tokens accepted.", t["drafts_accepted"])
    one("strata:model_loaded", "gauge", "1 when the engine is running.", 1 if svc.engine.alive() else 0)
    one("strata:engine_max_context", "gauge", "The engine's context in tokens.",
        svc.engine.max_context or svc.engine.known_ctx)
    return o.text()


def _hardware_gauges(o: _Out, hw: dict, m: dict) -> None:
    for key, name, help_text in (("cpu", "strata:cpu_percent", "CPU use of the machine in percent."),
                                 ("ram_used", "strata:ram_used_bytes", "RAM in use on the machine."),
                                 ("ram_total", "strata:ram_total_bytes", "RAM of the machine."),
                                 ("rss_server", "strata:server_rss_bytes", "Resident memory of the server."),
                                 ("rss_engine", "strata:engine_rss_bytes", "Resident memory of the engine(s).")):
        o.family(name, "gauge", help_text, [(m, hw.get(key))])
    gpus = hw.get("gpus") or []
    for key, name, help_text in (("util", "strata:gpu_util_percent", "GPU utilisation in percent."),
                                 ("mem_used", "strata:gpu_mem_used_bytes", "GPU memory in use."),
                                 ("mem_total", "strata:gpu_mem_total_bytes", "GPU memory."),
                                 ("temp", "strata:gpu_temp_celsius", "GPU temperature."),
                                 ("power", "strata:gpu_power_watts", "GPU power draw.")):
        o.family(name, "gauge", help_text,
                 [({**m, "gpu": f"{g['vendor']}{g['index']}"}, g.get(key)) for g in gpus])


def render_vllm(svc) -> str:
    t = dict(svc.totals)
    counts = metrics_views.live_counts(svc)
    snap = counts["snapshot"]
    m = {"model_name": svc.model_name}
    o = _Out()
    o.family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
             [(m, counts["processing"])])
    o.family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
             [(m, counts["deferred"])])
    o.family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
             [(m, counts["context_use"] if counts["context_use"] is not None else 0.0)])
    o.family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
             [(m, t["prompt_tokens"] - t["reused"])])
    o.family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
             [(m, t["output_tokens"])])
    o.family("vllm:prefix_cache_queries_total", "counter",
             "Prefix cache queries, in terms of number of queried tokens.", [(m, t["prompt_tokens"])])
    o.family("vllm:prefix_cache_hits_total", "counter",
             "Prefix cache hits, in terms of number of cached tokens.", [(m, t["reused"])])
    o.family("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
             [(m, 0)])
    o.family("vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.",
             [(m, t["drafts_offered"])])
    o.family("vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.",
             [(m, t["drafts_accepted"])])
    success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
    for finish, n in snap["finished"].items():
        if finish in _FINISH_REASONS:
            success[_FINISH_REASONS[finish]] += n
    o.family("vllm:request_success_total", "counter", "Count of successfully processed requests.",
             [({**m, "finished_reason": k}, v) for k, v in success.items()])
    o.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                snap["ttft"], m)
    o.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                snap["itl"], m)
    o.histogram("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
                snap["e2e"], m)
    live = svc.metrics_view()["live"]
    o.family("strata:model_loaded", "gauge", "1 when the engine is running.", [(m, int(svc.engine.alive()))])
    o.family("strata:live_state", "gauge", "1 for the state the server is in now.",
             [({**m, "state": s}, int(live["state"] == s)) for s in ("unloaded", "idle", "reading", "generating")])
    o.family("strata:live_tok_s", "gauge", "Decode tokens/s of the running request.", [(m, live.get("tok_s"))])
    o.family("strata:live_prefill_tok_s_mean", "gauge", "The engine's recent prompt-read rate in tokens/s.",
             [(m, live.get("prefill_tok_s_mean"))])
    o.family("strata:slots", "gauge", "Decode slots by state.",
             [({**m, "state": "busy"}, counts["slots_busy"]),
              ({**m, "state": "idle"}, counts["slots_total"] - counts["slots_busy"])])
    o.family("strata:engine_max_context", "gauge", "The engine's context in tokens.",
             [(m, svc.engine.max_context or svc.engine.known_ctx)])
    o.family("strata:requests_rejected_total", "counter", "Requests refused before they ran.",
             [(m, snap["rejected_total"])])
    o.family("strata:drafts_offered_total", "counter", "Draft tokens proposed and verified.",
             [(m, t["drafts_offered"])])
    o.family("strata:drafts_accepted_total", "counter", "Draft tokens accepted.", [(m, t["drafts_accepted"])])
    _hardware_gauges(o, metrics_views.ensure_sampler(svc).latest(), m)
    return o.text()


def render_http(counts: dict | None) -> str:
    """The HTTP server's connection counts (serve/http/keepalive.py `Counts.snapshot()`): keep-alive at work is
    requests well above connections accepted, and `reused` near `requests`."""
    if not counts:
        return ""
    o = _Out()
    for key, name, kind, help_text in (
            ("connections", "strata:http_connections_accepted_total", "counter", "TCP connections accepted."),
            ("requests", "strata:http_requests_total", "counter", "HTTP requests read."),
            ("reused", "strata:http_requests_reused_total", "counter",
             "HTTP requests read on a kept connection (not the connection's first)."),
            ("open", "strata:http_connections_open", "gauge", "TCP connections open now.")):
        o.family(name, kind, help_text, [({}, counts.get(key))])
    return o.text()


def render_all(svc, http_counts: dict | None = None) -> str:
    return render(svc, extras=False) + render_vllm(svc) + render_http(http_counts)

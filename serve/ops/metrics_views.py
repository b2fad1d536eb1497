"""The Monitor's and About's views: /metrics JSON (with a minute-scale history), the route list, rejections.

Role: join the Service's figures (`metrics_view()`, `status_view()`, `live` = serve/ops/live_figures.py) with the
machine's (serve/ops/telemetry.py's sampler) into what the web app reads, and give the sampler its serving probe
(decode / prefill tok/s, TTFT, running / waiting, slots busy, context use) so the charts have a history.
The route list is read from the server's own route tables at run time (`routes_view`), so routes other
modules add appear without a list kept here. Nothing here changes the Service.

Public surface: `metrics_json(svc, all_requests)`, `ensure_sampler(svc)`, `live_counts(svc)`,
`routes_view(get_routes, post_routes, pages)`, `about_view(svc, routes)`, `model_card(svc)`,
`note_rejected(svc, method, path, status, message)`.
"""
from __future__ import annotations

import os
import threading
import time

from serve.ops import llama_views, telemetry

_sampler_lock = threading.Lock()   # guards the start of each Service's one sampler (svc.sampler)
_card_lock = threading.Lock()      # guards _cards: GGUF facts per (path, size, mtime), read once
_cards: dict = {}
# GGUF general.file_type (llama.cpp's llama_ftype) -> the quantisation's name
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
              18: "Q6_K", 32: "BF16"}
# the module a route's handler lives in -> the wire dialect it speaks (a module not listed shows its name)
DIALECTS = {"serve.api.openai": "OpenAI", "serve.api.anthropic": "Anthropic", "serve.api.ollama": "Ollama",
            "serve.api.responses": "OpenAI Responses", "serve.ops.llama_views": "llama.cpp", "serve.api.embeddings": "OpenAI",
            "serve.http.stream_sessions": "llama.cpp"}
STRATA_PATHS = ("/api/health", "/v1/health")   # Strata's own aliases under other dialects' prefixes
PATH_DIALECTS = (("/v1/messages", "Anthropic"), ("/v1/responses", "OpenAI Responses"), ("/api/", "Ollama"))
LLAMA_PATHS = ("/props", "/slots", "/tokenize", "/detokenize", "/metrics/prometheus", "/health", "/completion",
               "/infill", "/embedding", "/apply-template", "/cors-proxy")


# ------------------------------------------------------------------------------------------------ live
def live_counts(svc) -> dict:
    """Requests running / waiting and slot use now, whatever the number of lanes.
    deferred: requests waiting for a free decode slot;
    processing: the running requests that are not waiting; context_use: KV positions held over the positions
    the slots have (busy slots: prompt + generated; idle slots: the conversation they keep)."""
    snap = svc.live.snapshot()
    waiting, held, room = 0, 0, 0
    for e in llama_views.engines(svc.engine):
        batch = getattr(e, "batch", None)
        ctx = e.max_context or e.known_ctx or 0
        if batch is not None and e.alive() and e.batched():
            stats = batch.stats()  # waiting: for a free slot (and admitting, where a scheduler counts it apart)
            waiting += int(stats.get("waiting") or 0) + int(stats.get("admitting") or 0)
            view = batch.slot_view()
            room += ctx * max(1, len(view))
            held += sum(int(v.get("held_tokens") or 0) if v.get("state") == "idle" else
                        int(v.get("prompt_tokens") or 0) + int(v.get("generated") or 0) for v in view)
        elif e.alive():
            room += ctx
    st = svc.status_view()
    if st.get("busy") and not any(getattr(e, "batch", None) is not None and e.batched()
                                  for e in llama_views.engines(svc.engine)):
        held += int(st.get("prompt_tokens") or 0) + int(st.get("generated") or 0)
    slots = llama_views.slots(svc)
    return {"running": snap["running"], "processing": max(0, snap["running"] - waiting), "deferred": waiting,
            "slots_total": len(slots), "slots_busy": sum(1 for s in slots if s["is_processing"]),
            "context_use": held / room if room else None, "snapshot": snap}


class _ServingProbe:
    """The serving figures of one sample: rates are deltas since the previous sample (one thread calls it)."""

    def __init__(self):
        self.prev: dict | None = None

    def __call__(self, svc) -> dict:
        counts = live_counts(svc)
        snap = counts.pop("snapshot")
        e = svc.engine
        reached, total = e.progress or (0, 0)
        now = {"t": time.monotonic(), "tokens": snap["tokens"], "ttft_sum": snap["ttft"].sum,
               "ttft_n": snap["ttft"].count, "reached": reached, "total": total}
        prev, self.prev = self.prev, now
        out = {"decode_tok_s": None, "prefill_tok_s": None, "ttft_s": None, **counts}
        if counts["context_use"] is not None:
            out["context_use"] = round(100.0 * counts["context_use"], 2)
        if prev is not None and now["t"] > prev["t"]:
            dt = now["t"] - prev["t"]
            out["decode_tok_s"] = (now["tokens"] - prev["tokens"]) / dt
            same = total == prev["total"] and reached >= prev["reached"]
            out["prefill_tok_s"] = ((reached - prev["reached"]) if same else reached) / dt
            n = now["ttft_n"] - prev["ttft_n"]
            if n > 0:
                out["ttft_s"] = (now["ttft_sum"] - prev["ttft_sum"]) / n
        return out


def ensure_sampler(svc) -> telemetry.Sampler:
    """The Service's telemetry sampler, started on first use (it ends when the Service shuts down or is
    garbage)."""
    with _sampler_lock:
        if svc.sampler is None:
            svc.sampler = telemetry.Sampler(telemetry.owned_probe(svc, _ServingProbe())).start()
        return svc.sampler


# ------------------------------------------------------------------------------------------------ views
def _cache_card(svc, records: list[dict]) -> dict:
    """The conversation-cache card: slots the engine keeps, prompt tokens reused, hits over lookups."""
    t = dict(svc.totals)
    hits = sum(int((r.get("figures") or {}).get("hits") or 0) for r in records)
    lookups = sum(int((r.get("figures") or {}).get("lookups") or 0) for r in records)
    info = svc.engine.info or {}
    return {"slots": info.get("conversation_cache_slots"), "prompt_tokens": t["prompt_tokens"],
            "reused_tokens": t["reused"], "reuse_ratio": t["reused"] / t["prompt_tokens"] if t["prompt_tokens"]
            else None, "hits": hits, "lookups": lookups, "over_requests": len(records)}


def metrics_json(svc, all_requests: bool = False) -> dict:
    """GET /metrics (JSON): the Service's metrics_view plus hardware now, a few minutes of history per series,
    running / waiting with lanes, the rejected requests and the conversation-cache card."""
    sampler = ensure_sampler(svc)
    out = svc.metrics_view(all_requests=all_requests)
    counts = live_counts(svc)
    snap = counts.pop("snapshot")
    out["live"].update(counts)
    latest = sampler.latest()
    latest.pop("extra", None)
    gpus = latest.get("gpus") or []
    out["hardware"] = {**latest, "gpu": gpus[0] if gpus else None}
    out["history"] = sampler.history()
    out["rejected"] = snap["rejected"][::-1] if all_requests else snap["rejected"][::-1][:12]
    out["rejected_total"] = snap["rejected_total"]
    out["conversation_cache"] = _cache_card(svc, out["requests"])
    out["uptime_s"] = round(time.time() - svc.started, 1)
    return out


def note_rejected(svc, method: str, path: str, status: int, message: str) -> None:
    """An API request answered with an error before it ran (a page, a GET view or a 404 is not kept)."""
    live = getattr(svc, "live", None)
    if live is not None and method == "POST" and path.startswith(("/v1/", "/api/", "/chat/", "/completion")):
        live.reject(method, path, status, message)


def _summary(handler) -> str:
    """A handler's docstring's first paragraph, whitespace folded, at most 200 characters."""
    doc = (getattr(handler, "__doc__", None) or "").strip().split("\n\n")[0]
    text = " ".join(doc.split())
    return text if len(text) <= 200 else text[:199] + "…"


def routes_view(get_routes: dict, post_routes: dict, pages: dict) -> list[dict]:
    """Every route the server answers: {method, path, dialect, what}, read from its route tables."""
    out = []
    for method, table in (("GET", get_routes), ("POST", post_routes)):
        for path, handler in sorted(table.items()):
            module = getattr(handler, "__module__", "") or ""
            dialect = DIALECTS.get(module)
            if dialect is None:  # a handler of the server itself (a wrapper, a plain view): by its path
                dialect = "Strata" if path in STRATA_PATHS else next(
                    (d for prefix, d in PATH_DIALECTS if path.startswith(prefix)),
                    "llama.cpp" if path in LLAMA_PATHS else "Strata")
            if path == "/metrics":
                dialect = "llama.cpp + vLLM Prometheus / Strata JSON"
            out.append({"method": method, "path": path, "dialect": dialect, "what": _summary(handler)})
    for path in sorted(pages):
        out.append({"method": "GET", "path": path, "dialect": "web app", "what": "page: " + pages[path]})
    return out


def model_card(svc) -> dict:
    """Architecture, quantisation, context, template family, file size: from the engine's INFO and the GGUF
    header (read once per file)."""
    info = dict(llama_views.engines(svc.engine)[0].info or {})
    path = llama_views.model_file(svc.engine)
    card = {"name": svc.model_name, "architecture": svc.arch or info.get("arch"), "file": None,
            "file_bytes": None, "quant": None, "context": svc.engine.max_context or svc.engine.known_ctx,
            "context_trained": info.get("n_ctx_train"), "n_layer": info.get("n_layer"),
            "n_embd": info.get("n_embd"), "n_vocab": info.get("n_vocab"), "weights_mib": info.get("weights_mib"),
            "template_family": getattr(svc.template, "family", "chatml"),
            "template_thinking": bool(getattr(svc.template, "knows_think", False))}
    if path and os.path.isfile(path):
        st = os.stat(path)
        key = (path, st.st_size, st.st_mtime)
        with _card_lock:
            facts = _cards.get(key)
        if facts is None:
            facts = {}
            try:
                from tokenizer.gguf_meta import read_metadata
                meta = read_metadata(path, keys=("general.file_type", "general.name"))
                ftype = meta.get("general.file_type")
                facts = {"quant": FILE_TYPES.get(ftype, f"file_type {ftype}") if ftype is not None else None,
                         "gguf_name": meta.get("general.name")}
            except (OSError, ValueError) as e:
                facts = {"quant": None, "error": str(e)[:200]}
            with _card_lock:
                _cards[key] = facts
        card.update(file=os.path.basename(path), file_bytes=st.st_size, **facts)
    return card


def about_view(svc, routes: list[dict]) -> dict:
    """GET /about.json: the model card, the engine's build and kernels, the machine, every route, uptime."""
    import platform
    info = dict(llama_views.engines(svc.engine)[0].info or {})
    engine = {k: info.get(k) for k in ("engine", "backend", "kernels", "threads", "kv", "chunk", "batch_slots",
                                       "conversation_cache_slots")}
    engine["engines"] = len(llama_views.engines(svc.engine))
    engine["loaded"] = svc.engine.alive()
    vm_total = telemetry.machine().get("ram_total")
    machine = {"os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
               "cpu": telemetry.cpu_model(), "cores_logical": os.cpu_count(),
               "ram_total": vm_total, "gpus": [g.get("name") for g in
                                               (ensure_sampler(svc).latest().get("gpus") or [])]}
    return {"model": model_card(svc), "engine": engine, "machine": machine, "routes": routes,
            "started": svc.started, "uptime_s": round(time.time() - svc.started, 1)}

"""llama.cpp-compatible read-only views: GET /props and GET /slots (llama-server's GET /props and GET /slots shapes).

Clients written for llama-server (its web UI, editors' plugins, benchmark scripts) read the context size,
the default sampling and the slot count from /props and poll /slots for `is_processing`. These views are
computed from the Service and its engine(s) on every call; nothing here changes state.

Public surface: props(svc, query) -> (status, body); slots(svc) -> list; total_slots(engine); engines(engine)
(the engine processes behind a service); model_file(engine).
"""
from __future__ import annotations

from serve.core import sampling as sampling_mod

ENGINE_VERSION_DEFAULT = "0.1.0"


def engines(engine) -> list:
    """The engine processes behind the service: a ReplicaEngine's replicas, else the one engine."""
    return engine.engines()


def model_file(engine) -> str | None:
    """The GGUF path the (first) engine was started with, or None."""
    args = list(engines(engine)[0].args or [])
    for i, a in enumerate(args[:-1]):
        if a == "--model":
            return args[i + 1]
    return None


def total_slots(engine) -> int:
    """Requests that can run at once: each live engine's decode slots (1 without slots)."""
    return sum(max(1, int(e.info.get("batch_slots") or 0)) for e in engines(engine) if e.alive())


def props(svc, query: dict, unloaded: bool = False) -> tuple[int, dict]:
    """(status, body) of GET /props; ?model= must name this model or one of its aliases. `unloaded`: a
    Lifecycle's model with no engine now (it loads on demand): 200 with `is_sleeping`, not a 503."""
    want = query.get("model")
    names = {svc.model_name, *(svc.config.get("aliases") or [])}
    if want and want not in names:
        return 404, {"error": {"code": 404, "type": "not_found_error",
                               "message": f"model {want!r} is not served here; it serves {svc.model_name!r}"}}
    e = svc.engine
    if not e.alive() and not e.starting and not unloaded:
        return 503, {"error": {"code": 503, "type": "unavailable_error", "message": "the engine is not running"}}
    defaults = svc.settings_view()["defaults"]
    merged = sampling_mod.merge_sampling(sampling_mod.card_sampling(svc.arch, False), svc.config.get("sampling"),
                                         {k: v for k, v in defaults.items() if k in sampling_mod.FIELDS}, None)
    params = {"temperature": merged.get("temperature", 0.0), "top_p": merged.get("top_p", 1.0),
              "top_k": merged.get("top_k", 0), "min_p": merged.get("min_p", 0.0), "seed": merged.get("seed", -1),
              "repeat_penalty": merged.get("repetition_penalty", 1.0),
              "presence_penalty": merged.get("presence_penalty", 0.0),
              "frequency_penalty": merged.get("frequency_penalty", 0.0),
              "repeat_last_n": merged.get("penalty_last_n", sampling_mod.PENALTY_LAST_N_DEFAULT),
              "n_predict": svc.default_max_tokens()}  # the cap of a request that names no limit
    template = getattr(svc.tok, "chat_template", None) or ""
    return 200, {
        "default_generation_settings": {"n_ctx": e.max_context or e.known_ctx, "params": params},
        "total_slots": total_slots(e),
        "model_alias": svc.model_name,
        "chat_template": template,
        "chat_template_caps": {"supports_tools": "tools" in template, "supports_system_role": True},
        "modalities": {"vision": False},
        "models_autoload": False,
        "is_sleeping": unloaded,
        "build_info": f"Strata {e.info.get('engine') or ENGINE_VERSION_DEFAULT}",
        "expert_tiers": svc.expert_tiers_view() if hasattr(svc, "expert_tiers_view") else None,
    }


def slots(svc) -> list[dict]:
    """GET /slots: one entry per decode slot of every live engine (one with --parallel 1); [] when none runs."""
    out: list[dict] = []
    busy = bool(svc.status.get("busy"))
    for e in engines(svc.engine):
        if not e.alive():
            continue
        n_ctx = e.max_context or e.known_ctx
        view = e.batch.slot_view() if e.batched() else []
        if not view:
            out.append({"id": len(out), "n_ctx": n_ctx, "is_processing": busy, "n_prompt_tokens": None})
            continue
        first = len(out)
        for v in view:
            working = v["state"] != "idle"
            out.append({"id": len(out), "n_ctx": n_ctx, "is_processing": working,
                        "n_prompt_tokens": v.get("prompt_tokens") if working else v.get("held_tokens")})
        if busy and not any(x["is_processing"] for x in out):
            # the Service counts a request busy before its slot is admitted (waiting for one, or its BGEN not yet
            # answered): shown on the engine's first slot, where llama-server would show it
            out[first].update(is_processing=True, n_prompt_tokens=svc.status.get("prompt_tokens"))
    return out

"""A created model's settings under a request's own, as Ollama lays them on its own routes and its OpenAI one.

Role: a model made with Ollama's `/api/create` (serve/lifecycle/created.py) carries `parameters` (Ollama's
option names), a `system` prompt and `messages` (turns before the conversation). The HTTP shell puts them on
`ctx.created` for any model route; the dialects that apply them call here. Ollama applies them in its chat
handler, which its OpenAI-compatible `/v1/chat/completions` also runs through, so Strata applies them on both:
- Ollama's `/api/chat` and `/api/generate` (`under_ollama`): the parameters under the request's `options`,
  the system turn when the request has none, the messages before the request's.
- OpenAI's chat completions (`under_openai_chat`): the same turns; the parameters as the top-level fields
  of the same names where the request gives none, `num_predict` as `max_tokens`; except `temperature` and
  `top_p`, which Ollama's OpenAI route sets to 1.0 whenever the request has none (so a Modelfile's never
  reach it), and `num_ctx` and the runner's load options (the server's flags set those here).
Knows nothing of HTTP or the engine: request bodies in, request bodies out.

Public surface: `under_ollama(body, made, chat)`, `under_openai_chat(body, made)`, `OPENAI_NOT_APPLIED`.
"""
from __future__ import annotations

# Ollama's OpenAI route fills temperature and top_p with 1.0 when the request has none; num_ctx and the load
# options are the runner's (the server's flags here), not a request's
OPENAI_NOT_APPLIED = frozenset({"temperature", "top_p", "num_ctx", "num_keep", "num_batch", "num_gpu",
                                "main_gpu", "num_thread", "numa", "use_mmap", "use_mlock", "low_vram", "f16_kv",
                                "vocab_only", "logits_all", "embedding_only", "penalize_newline"})


def _turns(made: dict, own: list) -> list:
    """The created model's system turn (unless the request has one) and messages, then the request's."""
    has_system = any(isinstance(m, dict) and m.get("role") == "system" for m in own)
    first = [{"role": "system", "content": made["system"]}] if made.get("system") and not has_system else []
    return first + list(made.get("messages") or []) + own


def under_ollama(body: dict, made: dict | None, chat: bool) -> dict:
    """Ollama's /api/chat (`chat`) or /api/generate body with `made`'s settings under its own."""
    if not made:
        return body
    out = dict(body)
    if isinstance(body.get("options", {}), dict):
        out["options"] = {**(made.get("parameters") or {}), **(body.get("options") or {})}
    if not chat:
        if made.get("system") is not None and body.get("system") is None:
            out["system"] = made["system"]
        return out
    own = body.get("messages") if isinstance(body.get("messages"), list) else None
    if own:   # (an empty list only loads the model)
        out["messages"] = _turns(made, own)
    return out


def under_openai_chat(body: dict, made: dict | None) -> dict:
    """An OpenAI chat completions body with `made`'s settings under its own (see the module's note)."""
    if not made:
        return body
    out = dict(body)
    for name, value in (made.get("parameters") or {}).items():
        if name in OPENAI_NOT_APPLIED or value is None:
            continue
        if name == "num_predict":   # Ollama's -1 / -2: no cap
            if isinstance(value, int) and value >= 0 and body.get("max_tokens") is None \
                    and body.get("max_completion_tokens") is None:
                out["max_tokens"] = value
        elif body.get(name) is None:
            out[name] = value
    own = body.get("messages")
    if isinstance(own, list) and own:
        out["messages"] = _turns(made, own)
    return out

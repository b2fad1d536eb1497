"""Log-probabilities of a reply's tokens: the request fields that ask for them, the entries Service hands out
with its content events, and their wire shapes (OpenAI chat, OpenAI legacy completions, llama.cpp).

What the numbers are (the engine's `logprobs=K`, docs/PROTOCOL.md): the natural log of each sampled token's
probability under the model's own distribution over the whole vocabulary after `logit_bias`, before the
repetition/frequency/presence penalties, the grammar's mask, temperature, top_k, min_p and top_p; the top K
alternatives from the same distribution. So at temperature 0 (no penalties, no grammar) the sampled token is
the top entry. A token banned by a -inf bias has -inf, written `LOGPROB_FLOOR` (JSON has no -inf).

Which tokens are listed: the reply's content tokens, in order. A token whose text went into thinking or a
tool call is not listed (OpenAI lists content only); the end-of-turn token is not; the tokens of a stop
string that ended the reply are (their text is cut from the content, the entries are not).

Token strings: OpenAI's rendering, the token's text when its bytes are whole UTF-8, else `bytes:\\xe2\\x80`
spelled out; `bytes` always the token's own bytes. llama.cpp's shape keeps llama-server's: the token's text cut
to its whole UTF-8 characters, `bytes` and `id` alongside.

Ollama's shape (0.12.11 and later: `logprobs` true and `top_logprobs` 0..20 on /api/chat and /api/generate):
[{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}] on each line; a token that is not whole
UTF-8 has U+FFFD where its bytes break (as Go's JSON encoder writes it), `bytes` exact. OpenAI Responses:
`include: ["message.output_text.logprobs"]` (or `top_logprobs` > 0) puts chat's entries on the output_text
part and on each `response.output_text.delta`.

Public surface: `LOGPROBS_TOP_MAX`, `LOGPROB_FLOOR`, `chat_logprobs(body)`, `completions_logprobs(body)`,
`llama_n_probs(body)`, `responses_logprobs(body)` (the K to ask the engine for, or None; a 400 naming the
field for a bad value), `engine_keys(req)`, `Trail` (Service's per-reply collector), `openai_content`, `legacy_logprobs`,
`llama_probs`, `ollama_logprobs`.
"""
from __future__ import annotations

import math

from serve.core.events import KIND_CONTENT, KIND_PING, BadRequest

LOGPROBS_TOP_MAX = 20     # the engine's bound (engine/logprobs.h) and OpenAI's for top_logprobs
LOGPROB_FLOOR = -9999.0   # a -inf log-prob on the wire (OpenAI's value for a token that cannot be sampled)


def _count(body: dict, name: str, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise BadRequest(f"{name}: an integer from {lo} to {hi}", param=name)
    return value


def chat_logprobs(body: dict) -> int | None:
    """OpenAI chat: `logprobs` true|false, `top_logprobs` 0..20 (only with logprobs true)."""
    on = body.get("logprobs")
    if on is not None and not isinstance(on, bool):
        raise BadRequest("logprobs: true or false", param="logprobs")
    top = _count(body, "top_logprobs", 0, LOGPROBS_TOP_MAX)
    if top is not None and not on:
        raise BadRequest("top_logprobs: needs logprobs: true", param="top_logprobs")
    return (top or 0) if on else None


def completions_logprobs(body: dict) -> int | None:
    """OpenAI completions (legacy): `logprobs` k, 0..20 alternatives per token (OpenAI allows 5)."""
    return _count(body, "logprobs", 0, LOGPROBS_TOP_MAX)


def llama_n_probs(body: dict, post_ok: bool = False) -> int | None:
    """llama.cpp: `n_probs` k > 0 (0 = none); `post_sampling_probs` (the probabilities of the distribution the
    draw used, the engine's `lp_post=1`) only where `post_ok` (/completion), else a 400."""
    post = body.get("post_sampling_probs")
    if post not in (None, False, True):
        raise BadRequest("post_sampling_probs: true or false", param="post_sampling_probs")
    if post and not post_ok:
        raise BadRequest("post_sampling_probs: not supported on this route (only /completion); n_probs here gives "
                         "the model's distribution before sampling (log-probabilities)", param="post_sampling_probs")
    k = _count(body, "n_probs", 0, LOGPROBS_TOP_MAX)
    return k or None


RESPONSES_INCLUDE = "message.output_text.logprobs"


def responses_logprobs(body: dict) -> int | None:
    """OpenAI Responses: `include` holding "message.output_text.logprobs", `top_logprobs` 0..20 (top_logprobs
    > 0 alone asks too: a count of alternatives is never ignored)."""
    include = body.get("include")
    if include is not None and not (isinstance(include, list) and all(isinstance(x, str) for x in include)):
        raise BadRequest("include: a list of strings", param="include")
    top = _count(body, "top_logprobs", 0, LOGPROBS_TOP_MAX)
    return (top or 0) if RESPONSES_INCLUDE in (include or ()) or top else None


def _floor(value: float) -> float:
    return LOGPROB_FLOOR if value < LOGPROB_FLOOR else value


def engine_keys(req) -> list[str]:
    """The engine keys of a request that asks (docs/PROTOCOL.md `logprobs=K`, `lp_post=1`), else []."""
    if getattr(req, "logprobs", None) is None:
        return []
    return [f"logprobs={int(req.logprobs)}"] + (["lp_post=1"] if getattr(req, "logprobs_post", False) else [])


class Trail:
    """One reply's sampled tokens with log-probabilities (serve.engine_client.protocol.Sampled), handed out with the
    content event their text went into: `add(tid)` per shown token, `attach(event)` per event. Entries are
    {"id", "bytes", "logprob", "top": [(id, bytes, logprob)]} (bytes: the token's own)."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.pending: list[dict] = []

    @classmethod
    def of(cls, tokenizer, req) -> Trail | None:
        """A request's trail, or None when it asks for no log-probabilities."""
        return cls(tokenizer) if getattr(req, "logprobs", None) is not None else None

    def add(self, tid) -> None:
        if not hasattr(tid, "logprob"):
            return
        self.pending.append({"id": int(tid), "bytes": self.tok.token_bytes(int(tid)), "logprob": _floor(tid.logprob),
                             "top": [(i, self.tok.token_bytes(i), _floor(v)) for i, v in tid.top]})

    def attach(self, ev) -> None:
        if ev.kind == KIND_CONTENT:
            ev.logprobs, self.pending = self.pending, []
        elif ev.kind != KIND_PING:
            self.pending = []  # thinking or a tool call: not listed


def token_text(raw: bytes) -> str:
    """OpenAI's token string: the text, or `bytes:\\xNN...` when the bytes are not whole UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def _whole_chars(raw: bytes) -> str:
    """llama-server's token string: the bytes cut before an incomplete trailing character."""
    for cut in range(len(raw), max(-1, len(raw) - 4), -1):
        try:
            return raw[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return raw.decode("utf-8", errors="replace")


def openai_content(entries: list[dict]) -> list[dict]:
    """Chat `logprobs.content`: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]."""
    return [{"token": token_text(e["bytes"]), "logprob": e["logprob"], "bytes": list(e["bytes"]),
             "top_logprobs": [{"token": token_text(b), "logprob": v, "bytes": list(b)} for _, b, v in e["top"]]}
            for e in entries]


def legacy_logprobs(entries: list[dict], offset: int) -> tuple[dict, int]:
    """Completions' `logprobs` {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset} for
    entries whose text starts at character `offset` of the choice's text; returns it and the offset after.
    A token that is part of a character counts the characters its bytes complete."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in entries:
        out["tokens"].append(token_text(e["bytes"]))
        out["token_logprobs"].append(e["logprob"])
        out["top_logprobs"].append({token_text(b): v for _, b, v in e["top"]})
        out["text_offset"].append(offset)
        offset += len(_whole_chars(e["bytes"]))
    return out, offset


def llama_probs(entries: list[dict], post: bool = False) -> list[dict]:
    """llama-server's `completion_probabilities`: [{id, token, bytes, logprob, top_logprobs: [{id, token,
    bytes, logprob}]}]; with `post` (post_sampling_probs) `prob` and `top_probs` (probabilities, not logs)."""
    value, tops = ("prob", "top_probs") if post else ("logprob", "top_logprobs")

    def number(v: float) -> float:
        return math.exp(v) if post else v
    return [{"id": e["id"], "token": _whole_chars(e["bytes"]), "bytes": list(e["bytes"]), value: number(e["logprob"]),
             tops: [{"id": i, "token": _whole_chars(b), "bytes": list(b), value: number(v)} for i, b, v in e["top"]]}
            for e in entries]


def ollama_logprobs(entries: list[dict]) -> list[dict]:
    """Ollama's `logprobs`: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]."""
    def one(raw: bytes, value: float) -> dict:
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": value, "bytes": list(raw)}
    return [{**one(e["bytes"], e["logprob"]), "top_logprobs": [one(b, v) for _, b, v in e["top"]]} for e in entries]

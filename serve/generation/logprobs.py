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

The request fields that ask (`logprobs`, `top_logprobs`, `n_probs`, `include`) are read by
serve/api/fields.py into the request's `logprobs` (K) and `logprobs_post`.

Public surface: `LOGPROBS_TOP_MAX`, `LOGPROB_FLOOR`, `engine_keys(req)`, `Trail` (Service's per-reply collector), `openai_content`, `legacy_logprobs`,
`llama_probs`, `ollama_logprobs`.
"""
from __future__ import annotations

import math

from serve.core.events import KIND_CONTENT, KIND_PING

LOGPROBS_TOP_MAX = 20     # the engine's bound (engine/logprobs.h) and OpenAI's for top_logprobs
LOGPROB_FLOOR = -9999.0   # a -inf log-prob on the wire (OpenAI's value for a token that cannot be sampled)


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

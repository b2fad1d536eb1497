"""What the floors above the engine client know of an engine: its surface (`EngineClient`) and the one typed
record of a request's end-of-request figures (`EngineFigures`).

Role: serve/generation, serve/ops and serve/http depend on this interface, not on serve/engine_client's classes.
`StrataEngine` (serve/engine_client/engine.py) and `ReplicaEngine` (serve/engine_client/replicas.py) implement
`EngineClient`; tests/serve/core/test_engine_api.py holds them to it. An engine pass fills a scratch mapping as
its lines arrive (serve/engine_client: `reused` at the slot's admission, `prompt_reached` per read line,
`finish` and the figures of the DONE / BDONE line, docs/PROTOCOL.md, `replica` from the replica set);
`EngineFigures.of(result)` turns it into the typed record once, and from there the reply's timings, the
Service's totals and the request's log record read its fields. Figures the engine never reported are None,
never 0. Knows no HTTP, pipes or tokens.

Public surface: `EngineClient`, `EngineFigures` (`of(result)`, `merged(later)`, `timings(prompt_tokens, n_out)`,
`as_dict()`), `SUMMED_FIGURES`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

# figures that add up over a reply's engine passes (a thinking wrap-up, a forced call's opening: one reply,
# several passes); the rest are the first pass's, `finish` the last's
SUMMED_FIGURES = ("prompt_ms", "decode_ms", "drafts_off", "drafts_acc", "drafts_n")
# what an engine pass leaves in its scratch mapping that is the pass's state, not a figure of the request
_SCRATCH = ("embedding", "prompt_reached")


@dataclass
class EngineFigures:
    """One request's (or one reply's, over its passes) end-of-request figures, as the engine reported them.

    finish: "stop" | "length" | "cancel" | "nonfinite" | ...; generated: tokens the engine produced; prompt: the
    prompt's tokens as the engine took them; prompt_ms / decode_ms: the read's and the decode's time; reused:
    prompt tokens taken from the cache; prompt_read: prompt tokens read this time; drafts_off / drafts_acc /
    drafts_n: draft tokens verified, accepted, and the verifications that carried a draft; hits / lookups:
    the conversation cache's; ram_blobs / file_blobs / file_mb / offloaded: the parked conversations'; experts_hits
    / experts_misses: a MoE engine's expert reads so far (engine-wide); replica: which engine of a replica set
    answered; extra: any other k=v the line carried (a newer engine's), kept as it came."""
    finish: str | None = None
    generated: int | None = None
    prompt: int | None = None
    prompt_ms: float | None = None
    decode_ms: float | None = None
    reused: int | None = None
    prompt_read: int | None = None
    drafts_off: int | None = None
    drafts_acc: int | None = None
    drafts_n: int | None = None
    hits: int | None = None
    lookups: int | None = None
    ram_blobs: int | None = None
    file_blobs: int | None = None
    file_mb: float | None = None
    offloaded: int | None = None
    experts_hits: int | None = None
    experts_misses: int | None = None
    replica: int | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def of(cls, result: Mapping) -> EngineFigures:
        """The one constructor: a pass's scratch mapping (see the module docstring) -> its figures."""
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in result.items() if k in known},
                   extra={k: v for k, v in result.items() if k not in known and k not in _SCRATCH})

    def empty(self) -> bool:
        return self == EngineFigures()

    def merged(self, later: EngineFigures) -> EngineFigures:
        """This reply's figures with a later pass's: times and drafts summed, the rest from the first pass,
        `finish` from the last (a first pass that reported nothing takes the later one whole)."""
        if self.empty():
            return dataclasses.replace(later, extra=dict(later.extra))
        out = dataclasses.replace(self, extra=dict(self.extra))
        for name in SUMMED_FIGURES:
            value = getattr(later, name)
            if value is not None:
                setattr(out, name, (getattr(out, name) or 0) + value)
        if later.finish is not None:
            out.finish = later.finish
        return out

    def timings(self, prompt_tokens: int, n_out: int) -> dict:
        """llama.cpp's `timings` of one reply: the prompt read once (cache_n = the first pass's reuse),
        `predicted_n` = the tokens the engine generated over every pass."""
        reused = self.reused or 0
        prompt_n = max(0, prompt_tokens - reused)
        pm, dm = self.prompt_ms, self.decode_ms
        t = {"cache_n": reused, "prompt_n": prompt_n}
        if pm is not None:
            t.update(prompt_ms=pm, prompt_per_token_ms=pm / prompt_n if prompt_n else 0.0,
                     prompt_per_second=1e3 * prompt_n / pm if pm else 0.0)
        t["predicted_n"] = n_out
        if dm is not None:  # decode_ms runs from the first token, so the rate is over the n_out - 1 steps after it
            steps = max(0, n_out - 1)  # (the first token comes with the prompt's last batch, as llama-server counts)
            t.update(predicted_ms=dm, predicted_per_token_ms=dm / steps if steps and dm else 0.0,
                     predicted_per_second=1e3 * steps / dm if steps and dm else 0.0)
        if self.drafts_off:
            t.update(draft_n=self.drafts_off, draft_n_accepted=self.drafts_acc or 0)
        return t

    def as_dict(self) -> dict:
        """The figures a request's log record keeps (the /metrics JSON's `requests[].figures`): the reported
        ones, under the protocol's names."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "extra" and getattr(self, f.name) is not None}
        return {**out, **self.extra}


class EngineClient(Protocol):
    """What the Service needs from an engine (StrataEngine, ReplicaEngine): its facts, its life cycle, and one
    request's token ids in, generated token ids out (`generate`, which fills `result` for `EngineFigures.of`)."""
    info: dict
    max_context: int
    known_ctx: int
    starting: bool
    progress: tuple
    prefill_tok_s: float | None

    closed: bool
    log_path: str | None     # the (first) engine's log file

    def engines(self) -> list: ...   # the single engines behind it: itself, or each replica's (in order)
    def live(self) -> list[dict] | None: ...   # per replica: alive, running, routed, lanes, cores; None for one
    def alive(self) -> bool: ...
    def batched(self) -> bool: ...
    def death_note(self) -> str: ...
    def start(self) -> None: ...
    def restart(self, tries: int = 3) -> None: ...
    def ensure_running(self) -> None: ...
    def close(self) -> None: ...
    def kill_now(self) -> None: ...
    def generate(self, ids: list[int], max_new: int, keys: str = "", cancelled: Callable | None = None,
                 result: dict | None = None, embed: bool = False,
                 on_wait: Callable | None = None, closing: Callable | None = None) -> Iterator[int | None]: ...

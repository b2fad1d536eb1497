"""Drafting plans: which drafting a model gets on this machine (engine --drafting, --draft-model), and why,
in one line per decision.

Role: `drafting_plan` is pure: the model (a strata_control.models.ModelInfo or anything with `id`,
`size_bytes`), the machine (strata_control.plan.Machine), what was asked (`--drafting`, run-config key
`drafting`: auto, lookup, model, off; None = auto) and the draft model when one is named (`DraftModel`: its
file, size and vocabulary fingerprint, read by `describe_draft`) come in; a `DraftingPlan` or a
`PlanRefused` with the reason goes out. `describe_draft` and `vocab_fingerprint` read GGUF metadata only.

The engine's side (engine/drafting.h): prompt lookup proposes the tokens that followed the latest earlier
occurrence of the last 2-4 tokens (prompt and reply); a draft model proposes its greedy continuation; k
drafts are verified in one multi-token step and greedy/seeded output equals drafting off token for token;
k adapts to the acceptance and pauses drafting on text that does not repeat.

Public surface: `DraftModel`, `DraftingPlan`, `drafting_plan(model, machine, asked, draft, model_vocab)`,
`describe_draft(path)`, `vocab_fingerprint(path)`, `MODES`, `DRAFT_SIZE_RATIO_MAX`.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

from strata_control.plan import PlanRefused

MODES = ("auto", "lookup", "model", "off")
# A draft model above this fraction of the model's weights costs, over its k sequential steps, about as much
# as the target steps it saves (decode is bound by the bytes read per token): auto leaves it out.
DRAFT_SIZE_RATIO_MAX = 0.25
MIB = 1 << 20


@dataclass
class DraftModel:
    path: str
    size_bytes: int
    vocab: str | None          # vocab_fingerprint of its file (None: no vocabulary in it)


@dataclass
class DraftingPlan:
    mode: str                  # what the engine gets: off, lookup, model or auto
    draft_model: str | None    # the draft model file the engine loads (None: none)
    reasons: list = field(default_factory=list)

    def engine_args(self) -> list[str]:
        return ["--drafting", self.mode] + (["--draft-model", self.draft_model] if self.draft_model else [])

    def view(self) -> dict:
        return {"mode": self.mode, "draft_model": self.draft_model, "reasons": list(self.reasons)}

    def render(self) -> str:
        head = f"drafting {self.mode}" + (f" with {os.path.basename(self.draft_model)}" if self.draft_model else "")
        return "\n".join([head, *(f"  - {r}" for r in self.reasons)])


def vocab_fingerprint(path: str) -> str | None:
    """sha256 of the GGUF's token texts in order (tokenizer.ggml.tokens), None when it has none."""
    from tokenizer.gguf_meta import read_metadata
    tokens = read_metadata(path).get("tokenizer.ggml.tokens")
    if not tokens:
        return None
    h = hashlib.sha256()
    for t in tokens:
        h.update(t.encode("utf-8", "surrogateescape") + b"\0")
    return h.hexdigest()


def describe_draft(path: str) -> DraftModel:
    return DraftModel(path=path, size_bytes=os.path.getsize(path), vocab=vocab_fingerprint(path))


def _machine_line(model, machine) -> str:
    mib = round((getattr(model, "size_bytes", 0) or 0) / MIB)
    where = "a GPU" if machine.gpus and machine.gpu_kernels else f"the CPU ({machine.physical_cores} cores)"
    return (f"decode on {where} reads all {mib} MiB of weights for every token: k drafts are checked in one "
            "pass over them, so each accepted draft is a token without its own pass")


def drafting_plan(model, machine, asked: str | None = None, draft: DraftModel | None = None,
                  model_vocab: str | None = None) -> DraftingPlan:
    """The drafting of `model` on `machine`; PlanRefused when `asked` cannot be honoured."""
    asked = asked or "auto"
    if asked not in MODES:
        raise PlanRefused(f"drafting {asked!r}: one of {', '.join(MODES)}")
    if asked == "off":
        return DraftingPlan("off", None, ["drafting off, as asked: one token per pass over the weights"])
    reasons = [_machine_line(model, machine)]
    lookup = ("prompt lookup: the tokens that followed the last 2-4 tokens' latest earlier occurrence in the "
              "prompt or reply; nothing is drafted where nothing repeats (k falls to 0), so free chat keeps its "
              "speed and rewrites of text in the prompt gain most")
    if draft is None:
        if asked == "model":
            raise PlanRefused("drafting model needs a draft model (--draft-model FILE, run-config draft_model)")
        reasons.append(lookup + ("" if asked == "lookup" else "; no draft model named (--draft-model FILE)"))
        return DraftingPlan("lookup", None, reasons + [_exactness_line()])
    name = os.path.basename(draft.path)
    if draft.vocab is None or draft.vocab != model_vocab:
        raise PlanRefused(f"draft model {name}: not the vocabulary of {getattr(model, 'id', 'the model')} "
                          "(its token ids would mean other tokens)")
    ratio = draft.size_bytes / max(1, getattr(model, "size_bytes", 0) or 1)
    size = f"{name} is {round(draft.size_bytes / MIB)} MiB, {ratio:.0%} of the model's weights"
    if asked == "lookup":
        reasons.append(lookup + f"; the draft model {name} is not used (--drafting lookup)")
        return DraftingPlan("lookup", None, reasons + [_exactness_line()])
    if asked == "auto" and ratio > DRAFT_SIZE_RATIO_MAX:
        reasons.append(lookup + f"; the draft model is left out: {size}, over {DRAFT_SIZE_RATIO_MAX:.0%} its "
                       "k steps cost about what they save (--drafting model uses it anyway)")
        return DraftingPlan("lookup", None, reasons + [_exactness_line()])
    if asked == "model":
        reasons.append(f"draft model only, as asked: {size}; it proposes its greedy continuation every step")
        return DraftingPlan("model", draft.path, reasons + [_exactness_line()])
    reasons.append(f"prompt lookup first, the draft model where lookup finds nothing: {size}")
    return DraftingPlan("auto", draft.path, reasons + [_exactness_line()])


def _exactness_line() -> str:
    return ("greedy and seeded replies are the same token for token as without drafting (the model's own "
            "sampling verifies each draft); grammar-constrained requests draft under their mask")

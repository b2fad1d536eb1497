"""Template families: which chat-template family a GGUF's template text belongs to, and which Strata renders.

Role: the one list of families Strata renders (`FAMILIES`) and the family detection, read before anything
runs (strata_control/models.py lists a model's family; serve/bootstrap.py refuses a model whose family it does
not render) and by the renderers (serve/prompt/chatml.py picks serve/prompt/llama3_gemma.py's renderer by
`detect_family`). Imports nothing of ours but serve.core.

Public surface: `FAMILIES`, `template_family(text)` ("chatml" for no template, as llama.cpp falls back to it,
else the family of the first mark found, or "unknown"), `detect_family(text)` ("llama3" | "gemma" | "chatml"
by llama.cpp's tag rules, None when none). The two detectors read the marks in different orders: they are
kept side by side, unchanged, by the move that brought them here; making them one is its own change.
"""
from __future__ import annotations

IM_START = "<|im_start|>"   # the ChatML turn mark (serve/prompt/chatml.py writes it)


FAMILIES = ("chatml", "llama3", "gemma")   # rendered by serve/prompt/ (chatml.py, llama3_gemma.py); others refused at start


def detect_family(text: str | None) -> str | None:
    """The family a template text belongs to (by its tags, as llama.cpp detects them), None when none."""
    if not text:
        return None
    if "<|start_header_id|>" in text and "<|end_header_id|>" in text:
        return "llama3"
    if "<start_of_turn>" in text:
        return "gemma"
    if "<|im_start|>" in text:
        return "chatml"
    return None


# A family's mark: a control string only that family's templates write (checked in this order).
_FAMILY_MARKS = (("chatml", IM_START), ("llama3", "<|start_header_id|>"), ("gemma", "<start_of_turn>"),
                 ("command-r", "<|START_OF_TURN_TOKEN|>"), ("deepseek", "<\uff5cUser\uff5c>"),
                 ("phi3", "<|end|>"), ("zephyr", "<|user|>"), ("mistral", "[INST]"))


def template_family(template: str | None) -> str:
    """The chat-template family a GGUF's template text belongs to: "chatml" (also for a model without a
    template, as llama.cpp falls back to it), "llama3", "gemma", "mistral", ..., or "unknown"."""
    if not template:
        return "chatml"
    for family, mark in _FAMILY_MARKS:
        if mark in template:
            return family
    return "unknown"

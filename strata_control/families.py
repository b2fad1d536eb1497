"""Template families: which chat-template family a GGUF's template text belongs to, and which Strata renders.

Role: the one list of families Strata renders (`FAMILIES`) and the family detection, read before anything
runs (strata_control/models.py lists a model's family and refuses a template that does not compile;
serve/bootstrap/__init__.py renders the native families natively, every other template with its own Jinja text) and by the renderers (serve/prompt/chatml.py picks serve/prompt/llama3_gemma.py's renderer by
`detect_family`). Imports nothing of ours but serve.core.

Public surface: `FAMILIES`, `JINJA`, `template_problem(text)`, `template_family(text)` ("chatml" for no template, as llama.cpp falls back to it,
else the family of the first mark found, or "unknown"), `detect_family(text)` ("llama3" | "gemma" | "chatml"
by llama.cpp's tag rules, None when none). The two detectors read the marks in different orders: they are
kept side by side, unchanged, by the move that brought them here; making them one is its own change.
"""
from __future__ import annotations

IM_START = "<|im_start|>"   # the ChatML turn mark (serve/prompt/chatml.py writes it)


FAMILIES = ("chatml", "llama3", "gemma")   # rendered natively by serve/prompt/ (chatml.py, llama3_gemma.py)
JINJA = "jinja"   # every other template: the model's own text, rendered by serve/prompt/jinja_chat.py


def template_problem(text: str | None) -> str | None:
    """Why a GGUF's template text cannot be rendered (it does not compile as Jinja), None when it can."""
    if not text or template_family(text) in FAMILIES:
        return None
    import jinja2
    import jinja2.sandbox
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    text = text.replace("{% generation %}", "").replace("{% endgeneration %}", "")  # Hugging Face's tag
    try:
        env.parse(text)
    except jinja2.TemplateSyntaxError as e:
        return f"the chat template does not compile: {e} (line {e.lineno})"
    return None


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
                 ("harmony", "<|channel|>"), ("phi3", "<|end|>"), ("zephyr", "<|user|>"), ("mistral", "[INST]"))


def template_family(template: str | None) -> str:
    """The chat-template family a GGUF's template text belongs to: "chatml" (also for a model without a
    template, as llama.cpp falls back to it), "llama3", "gemma", "mistral", ..., or "unknown"."""
    if not template:
        return "chatml"
    for family, mark in _FAMILY_MARKS:
        if mark in template:
            return family
    return "unknown"

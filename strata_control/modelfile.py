"""Ollama's Modelfile and a created model's settings: parsed, checked, and written back as text.

Role: pure decisions for Ollama's `/api/create` (serve/api/ollama_models.py): a Modelfile's `FROM`,
`PARAMETER`, `SYSTEM`, `MESSAGE` and `LICENSE` lines (Ollama's syntax: `#` comments, case-insensitive
instructions, values bare, "quoted" or in triple quotes over several lines) become one settings dict; the
instructions Strata does not do (`TEMPLATE`: a model keeps its own chat template; `ADAPTER`: no LoRA) are
refused by name. `PARAMETER` names and types are Ollama's options; an unknown one is refused by name. Nothing
here reads a file or knows HTTP.

Settings dict: `{"from": str, "parameters": {name: value}, "system": str | None, "messages": [{role,
content}], "license": str | None}` (`stop` is a list; repeated `PARAMETER stop` lines add to it).

Public surface: `parse(text) -> dict`, `check_parameters(params) -> dict`, `check_messages(messages) -> list`,
`render(settings) -> str`, `parameters_text(params) -> str`, `ModelfileError`, `INT_PARAMS`, `FLOAT_PARAMS`,
`BOOL_PARAMS`, `REFUSED`.
"""
from __future__ import annotations

import json

INT_PARAMS = ("num_ctx", "num_predict", "top_k", "seed", "repeat_last_n", "mirostat", "num_keep", "num_batch",
              "num_gpu", "main_gpu", "num_thread")
FLOAT_PARAMS = ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty",
                "typical_p", "mirostat_tau", "mirostat_eta")
BOOL_PARAMS = ("numa", "use_mmap", "use_mlock", "low_vram", "f16_kv", "vocab_only", "logits_all",
               "embedding_only", "penalize_newline")
REFUSED = {"template": "TEMPLATE: a model keeps the chat template of its GGUF here (the server renders it)",
           "adapter": "ADAPTER: LoRA adapters are not supported by this server"}
ROLES = ("system", "user", "assistant")
TEXT_MAX_CHARS = 1 << 20   # a SYSTEM or MESSAGE text: a megabyte of characters is far past any prompt


class ModelfileError(ValueError):
    """A Modelfile or settings value this server cannot take; the message names the line or field."""


def _value(rest: str, lines: list[str], i: int) -> tuple[str, int]:
    """The value that starts at `rest` (line i): triple-quoted over lines, "quoted", or bare -> (text, next i)."""
    if rest.startswith('"""'):
        body = rest[3:]
        while '"""' not in body:
            i += 1
            if i >= len(lines):
                raise ModelfileError('a """ text is not closed')
            body += "\n" + lines[i]
        text, _, tail = body.partition('"""')
        if tail.strip():
            raise ModelfileError(f'text after the closing """: {tail.strip()[:40]!r}')
        return text, i + 1
    if len(rest) >= 2 and rest[0] == '"' and rest[-1] == '"':
        try:
            return json.loads(rest), i + 1
        except ValueError:
            return rest[1:-1], i + 1
    return rest, i + 1


def _typed(name: str, raw):
    """One parameter's value in its Ollama type (strings from a Modelfile, JSON values from a body)."""
    try:
        if name in INT_PARAMS:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return int(raw)
        if name in FLOAT_PARAMS:
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        if name in BOOL_PARAMS:
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("true", "false"):
                return str(raw).lower() == "true"
            raise ValueError
    except (TypeError, ValueError):
        kind = "an integer" if name in INT_PARAMS else "a number" if name in FLOAT_PARAMS else "true or false"
        raise ModelfileError(f"parameter {name}: {kind}, not {raw!r}") from None
    if name == "stop":
        items = raw if isinstance(raw, list) else [raw]
        if not all(isinstance(s, str) and s for s in items):
            raise ModelfileError("parameter stop: non-empty strings")
        return list(items)
    raise ModelfileError(f"parameter {name}: not an Ollama option this server knows (sampling: "
                         f"{', '.join(FLOAT_PARAMS + INT_PARAMS[:6])}; stop)")


def check_parameters(params) -> dict:
    """A body's `parameters` object -> the typed parameters (ModelfileError naming the bad one)."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise ModelfileError("parameters: an object of Ollama options")
    return {k: _typed(k, v) for k, v in params.items() if v is not None}


def check_messages(messages) -> list[dict]:
    if messages is None:
        return []
    if not isinstance(messages, list):
        raise ModelfileError("messages: a list of {role, content}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ModelfileError(f"messages[{i}]: {{role: system|user|assistant, content: a string}}")
        if len(m["content"]) > TEXT_MAX_CHARS:
            raise ModelfileError(f"messages[{i}].content: at most {TEXT_MAX_CHARS} characters")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def parse(text: str) -> dict:
    """A Modelfile's text -> settings (see the module docstring); ModelfileError naming the line."""
    if not isinstance(text, str):
        raise ModelfileError("modelfile: the Modelfile's text")
    lines = text.splitlines()
    out = {"from": None, "parameters": {}, "system": None, "messages": [], "license": None}
    i = 0
    while i < len(lines):
        line, n = lines[i].strip(), i + 1
        if not line or line.startswith("#"):
            i += 1
            continue
        word, _, rest = line.partition(" ")
        word, rest = word.lower(), rest.strip()
        if word in REFUSED:
            raise ModelfileError(f"line {n}: {REFUSED[word]}")
        try:
            if word == "from":
                out["from"], i = rest, i + 1
            elif word == "parameter":
                name, _, raw = rest.partition(" ")
                value, i = _value(raw.strip(), lines, i)
                typed = _typed(name.lower(), value)
                if name.lower() == "stop":
                    out["parameters"].setdefault("stop", []).extend(typed)
                else:
                    out["parameters"][name.lower()] = typed
            elif word in ("system", "license"):
                out[word], i = _value(rest, lines, i)
            elif word == "message":
                role, _, raw = rest.partition(" ")
                content, i = _value(raw.strip(), lines, i)
                out["messages"] += check_messages([{"role": role.lower(), "content": content}])
            else:
                raise ModelfileError(f"{word.upper()}: not a Modelfile instruction (FROM, PARAMETER, SYSTEM, "
                                     "MESSAGE, LICENSE)")
        except ModelfileError as e:
            raise ModelfileError(f"line {n}: {e}") from None
    if not out["from"]:
        raise ModelfileError("the Modelfile has no FROM line")
    return out


def _quoted(text: str) -> str:
    return f'"""{text}"""' if "\n" in text or '"' in text else f'"{text}"' if " " in text or not text else text


def parameters_text(params: dict) -> str:
    """Ollama's `/api/show` `parameters`: one `name value` line each (`stop` once per string)."""
    rows = []
    for name, value in params.items():
        for v in value if isinstance(value, list) else [value]:
            shown = json.dumps(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)
            rows.append(f"{name:<30} {shown}")
    return "\n".join(rows)


def render(settings: dict) -> str:
    """Settings -> Modelfile text that `parse` reads back to the same settings."""
    rows = [f"FROM {settings['from']}"]
    for name, value in (settings.get("parameters") or {}).items():
        for v in value if isinstance(value, list) else [value]:
            rows.append(f"PARAMETER {name} {_quoted(v) if isinstance(v, str) else str(v).lower()}")
    if settings.get("system") is not None:
        rows.append(f"SYSTEM {_quoted(settings['system'])}")
    for m in settings.get("messages") or []:
        rows.append(f"MESSAGE {m['role']} {_quoted(m['content'])}")
    if settings.get("license"):
        rows.append(f"LICENSE {_quoted(settings['license'])}")
    return "\n".join(rows) + "\n"

"""The Ollama API (`/api/*`): a translator over `serve/core/events.py`, for Open WebUI, Continue, Raycast, editors.

Calling convention: the one `serve/api/openai.py` documents (`handler(service, body, ctx) -> JsonReply |
StreamReply`); errors are Ollama's `{"error": "message"}` (`error_body`), after a stream's first line a last
`{"error": ...}` line.

Routes: GET `/api/version`, GET `/api/tags` (the served model and its aliases, as `NAME:latest`), POST
`/api/show` (a created model's `modelfile`, `parameters`, `system`, `messages`, `license`), GET `/api/ps`, POST
`/api/chat`, POST `/api/generate` (an empty prompt answers `done_reason: "load"` as Ollama does; `raw: true`
skips the template; `system` is the system turn), and `/api/pull`, `/api/push`: 501 saying this server makes no
downloads. Model management (`/api/create`, `/api/blobs`, `/api/copy`, `/api/delete`, keep_alive, the
Lifecycle's `/api/ps`) is serve/api/ollama_models.py's; `/api/embed` and `/api/embeddings` are
serve/api/embeddings.py's. A created model's settings (`ctx.created`) apply under the request's own
(serve/api/created_settings.py): its parameters under `options`, its system turn when the request has none, its
messages first.

Request fields: `messages` (`role`, `content`, `thinking`, `tool_calls`, `tool_name`; `images` refused: no
vision encoder), `tools` (OpenAI's function shape), `stream` (default **true**: NDJSON, one object a line),
`think` (true/false, or "low"/"medium"/"high"), `options` (`temperature`, `top_p`, `top_k`, `min_p`,
`num_predict` (-1 or -2 = no cap), `seed`, `stop`, `repeat_penalty`, `repeat_last_n`, `presence_penalty`,
`frequency_penalty`, `typical_p`, `mirostat`, `mirostat_tau`, `mirostat_eta`; `num_ctx` is a check: a prompt
longer than it is a 400, never truncated; the runner's load options (`num_keep`, `num_batch`, `num_gpu`,
`main_gpu`, `num_thread`, `numa`, `use_mmap`, `use_mlock`, `low_vram`, `f16_kv`, `vocab_only`, `logits_all`,
`embedding_only`, `penalize_newline`) are accepted and have no effect here (the server's own flags set them);
any other option is a 400 naming it), `keep_alive` (checked here: `keep_alive_seconds`; applied by
serve/api/ollama_models.py before the model is entered), `format` ("json" = any JSON object, or a schema: the reply follows it by
grammar, serve/generation/constrain.py).

Answer lines: `{model, created_at, message: {role, content[, thinking][, tool_calls]}, done: false}` (chat) or
`{model, created_at, response[, thinking], done: false}` (generate); the last one `done: true` with
`done_reason` (stop | length), `total_duration`, `load_duration`, `prompt_eval_count`, `prompt_eval_duration`,
`eval_count`, `eval_duration` (durations in nanoseconds, as Ollama reports them). A tool call is one line
with the whole call (`{function: {name, arguments: {...}}}`), as Ollama sends it.

Public surface: `version`, `tags`, `show`, `ps`, `chat`, `generate`, `no_hub`, `error_body`, `tag_entry`,
`keep_alive_seconds`, `NDJSON`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from datetime import datetime, timezone

from serve.generation.constrain import schema_ask
from serve.core.events import (
    BadRequest, ChatRequest, CompletionRequest, Done, Message, ToolCall, KIND_CONTENT, KIND_PING, KIND_REASONING,
    KIND_TOOL_CALL)
from serve.generation.json_schema import ANY_OBJECT_GRAMMAR
from serve.api.created_settings import under_ollama
from serve.api.fields import chat_logprobs, model_field
from serve.generation.logprobs import ollama_logprobs
from serve.api.wire import error_text, text_of, parse_tools
from serve.core.effort import normalize_effort
from serve.api.replies import EventRun, JsonReply, StreamReply, cut
from serve.core.sampling import check_request_sampling
from serve.api.wire import check_stop, finish_note
from serve.prompt.tool_text import arguments_object
from strata_control import modelfile

# The Ollama API level this translator follows (clients compare versions to pick features).
API_VERSION = "0.12.6"
NDJSON = "application/x-ndjson"
_OPTIONS = ("temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty", "repeat_last_n",
            "presence_penalty", "frequency_penalty", "typical_p", "mirostat", "mirostat_tau", "mirostat_eta")
# the runner's load-time options: Ollama applies them when it starts a runner; here the server's flags do
_LOAD_OPTIONS = ("num_keep", "num_batch", "num_gpu", "main_gpu", "num_thread", "numa", "use_mmap", "use_mlock",
                 "low_vram", "f16_kv", "vocab_only", "logits_all", "embedding_only", "penalize_newline")
_OTHER_OPTIONS = ("num_predict", "num_ctx", "stop")
_NS_PER_MS = 1_000_000
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"-?\d+(\.\d+)?|-?(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+")  # Go durations


def error_body(status: int, err_type: str, message: str, param=None, code=None) -> dict:
    return {"error": message}


def _line(obj) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


# ---------------------------------------------------------------- the model's facts
def _model_file(service) -> str | None:
    return getattr(service, "model_path", None)


def _names(service) -> list[str]:
    return [service.model_name, *(service.config.get("aliases") or [])]


def _bare(name: str) -> str:
    return name[:-len(":latest")] if name.endswith(":latest") else name


def _details(service) -> dict:
    path = _model_file(service) or ""
    base = os.path.basename(path).upper()
    quant = next((q for q in ("Q4_0", "Q4_1", "Q4_K_M", "Q4_K_S", "Q5_K_M", "Q6_K", "Q8_0", "F16", "BF16", "F32")
                  if q in base), "unknown")
    family = service.arch or "unknown"
    return {"parent_model": "", "format": "gguf", "family": family, "families": [family],
            "parameter_size": "", "quantization_level": quant}


def _identity(service) -> tuple[int, str, str]:
    """(size in bytes, digest, modified_at) of the model file. The digest is a sha256 of its path, size and
    modification time (a stable identity without reading the whole file), not of its bytes."""
    path = _model_file(service)
    try:
        st = os.stat(path) if path else None
    except OSError:
        st = None
    size, mtime = (st.st_size, st.st_mtime) if st else (0, service.started)
    digest = hashlib.sha256(f"{path}|{size}|{mtime}".encode()).hexdigest()
    return size, digest, datetime.fromtimestamp(mtime, timezone.utc).isoformat().replace("+00:00", "Z")


def tag_entry(service, name: str) -> dict:
    size, digest, modified = _identity(service)
    return {"name": f"{name}:latest", "model": f"{name}:latest", "modified_at": modified, "size": size,
            "digest": digest, "details": _details(service)}


def _capabilities(service) -> list[str]:
    caps = ["completion", "tools"]
    if getattr(service.template, "knows_think", False):
        caps.append("thinking")
    if _fim_ready(service):
        caps.append("insert")
    return caps


def _fim_ready(service) -> bool:
    try:
        from serve.api.llama_routes import fim_ids
    except ImportError:
        return False
    return fim_ids(service.tok) is not None


# ---------------------------------------------------------------- read-only views
def version(service, body, ctx) -> JsonReply:
    return JsonReply(200, {"version": API_VERSION})


def tags(service, body, ctx) -> JsonReply:
    return JsonReply(200, {"models": [tag_entry(service, n) for n in _names(service)]})


def show(service, body, ctx) -> JsonReply:
    name = body.get("model", body.get("name"))
    if not isinstance(name, str) or not name:
        raise BadRequest("model: the model's name", param="model")
    if _bare(name) not in _names(service) and not getattr(ctx, "created", None):
        return JsonReply(404, {"error": f"model '{name}' not found; this server serves "
                                        f"'{service.model_name}'"})
    e = service.engine
    _, _, modified = _identity(service)
    arch = service.arch or "unknown"
    info = {"general.architecture": arch, "general.name": service.model_name,
            f"{arch}.context_length": e.info.get("n_ctx_train") or e.max_context or e.known_ctx}
    made = getattr(ctx, "created", None) or {}
    settings = {"from": made.get("from") or _model_file(service) or service.model_name, **{
        k: made.get(k) for k in ("parameters", "system", "messages", "license")}}
    out = {"license": made.get("license") or "", "modelfile": modelfile.render(settings),
           "parameters": modelfile.parameters_text(made.get("parameters") or {}),
           "template": getattr(service.tok, "chat_template", None) or "",
           "details": {**_details(service), "parent_model": made.get("from") or ""} if made else _details(service),
           "model_info": info, "capabilities": _capabilities(service), "modified_at": modified}
    if made.get("system") is not None:
        out["system"] = made["system"]
    if made.get("messages"):
        out["messages"] = made["messages"]
    return JsonReply(200, out)


def ps(service, body, ctx) -> JsonReply:
    e = service.engine
    if not e.alive():
        return JsonReply(200, {"models": []})
    entry = tag_entry(service, service.model_name)
    # loaded for as long as the server runs: Ollama's clients read a time far ahead as "stays loaded"
    entry.update(expires_at="2318-01-01T00:00:00Z", size_vram=0, context_length=e.max_context or e.known_ctx)
    return JsonReply(200, {"models": [entry]})


def no_hub(service, body, ctx) -> JsonReply:
    what = ctx.path.rsplit("/", 1)[-1]
    return JsonReply(501, {"error": f"/api/{what} is not available: this server makes no downloads or uploads "
                                    "to a registry; make a model from a local GGUF instead (POST "
                                    "/api/blobs/sha256:<digest>, then /api/create)"})


# ---------------------------------------------------------------- request parsing
def _format_grammar(value) -> str | None:
    """`format`: "json" = any JSON object, a schema = that schema's grammar (serve/generation/constrain.py)."""
    if value is None or value == "":
        return None
    if value == "json":
        return ANY_OBJECT_GRAMMAR
    if isinstance(value, dict):
        return schema_ask(value, "format")
    raise BadRequest('format: "json" or a JSON schema object', param="format")


def keep_alive_seconds(value) -> float | None:
    """`keep_alive`: a Go duration ("5m", "1h30m", "-1", "0") or seconds as a number -> seconds (negative:
    stay loaded; 0: unload now); None when absent. serve/api/ollama_models.py applies it with a Lifecycle."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = value.strip() if isinstance(value, str) else ""
    if text and _DURATION.fullmatch(text):
        if re.fullmatch(r"-?\d+(\.\d+)?", text):
            return float(text)
        sign, total = (-1.0, text[1:]) if text.startswith("-") else (1.0, text)
        seconds = sum(float(n) * _UNIT_S[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", total))
        return sign * seconds
    raise BadRequest(f"keep_alive: a duration such as \"5m\" or a number of seconds, not {value!r}",
                     param="keep_alive")


def _options(options) -> tuple[dict, int | None, int | None, list[str]]:
    """`options` -> (sampling fields, num_predict, num_ctx, stop)."""
    if options is None:
        return {}, None, None, []
    if not isinstance(options, dict):
        raise BadRequest("options: an object", param="options")
    unknown = sorted(k for k in options if k not in _OPTIONS + _LOAD_OPTIONS + _OTHER_OPTIONS)
    if unknown:
        raise BadRequest(f"options.{unknown[0]}: not supported by this server (sampling options: "
                         f"{', '.join(_OPTIONS)})", param=f"options.{unknown[0]}")
    fields = {k: options[k] for k in _OPTIONS if options.get(k) is not None}
    numbers = {}
    for name in ("num_predict", "num_ctx"):
        value = options.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise BadRequest(f"options.{name}: an integer", param=f"options.{name}")
        numbers[name] = value
    if numbers["num_ctx"] is not None and numbers["num_ctx"] < 1:
        raise BadRequest("options.num_ctx: a positive integer", param="options.num_ctx")
    predict = numbers["num_predict"]
    try:
        stop = check_stop(options.get("stop"))
    except BadRequest as e:
        raise BadRequest("options." + e.message, param="options.stop") from None
    return fields, (None if predict is None or predict < 0 else predict), numbers["num_ctx"], stop


def _sampling(fields: dict):
    try:
        return check_request_sampling(fields)
    except BadRequest as e:
        raise BadRequest(f"options: {e.message}", param=f"options.{e.param}") from None


def _think(value) -> str | None:
    if value is None:
        return None
    if value is True:
        return "medium"
    if value is False:
        return "none"
    if isinstance(value, str):
        return normalize_effort(value, "think")
    raise BadRequest('think: true, false, "low", "medium" or "high"', param="think")


def _messages(raw) -> list[Message]:
    if not isinstance(raw, list):
        raise BadRequest("messages: a list of message objects", param="messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise BadRequest(f"{where}.role: system, user, assistant or tool", param="messages")
        if m.get("images"):
            raise BadRequest(f"{where}.images: this model reads text only (no vision encoder)", param="messages")
        msg = Message(m["role"], text_of(m.get("content"), where + ".content"))
        if m["role"] == "assistant":
            msg.reasoning = m.get("thinking") if isinstance(m.get("thinking"), str) else None
            for k, c in enumerate(m.get("tool_calls") or []):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise BadRequest(f"{where}.tool_calls[{k}].function.name: a string", param="messages")
                args = fn.get("arguments") or {}
                msg.tool_calls.append(ToolCall(str(c.get("id") or ""), fn["name"], args))
        if m["role"] == "tool":
            msg.name = m.get("tool_name") or m.get("name")
        out.append(msg)
    return out


def _common(body: dict, req) -> dict:
    """The fields chat and generate share; returns what the answer needs (stream flag, num_ctx)."""
    req.grammar = _format_grammar(body.get("format"))
    keep_alive_seconds(body.get("keep_alive"))   # checked here; applied before the model is entered
    fields, predict, num_ctx, stop = _options(body.get("options"))
    req.sampling, req.max_new, req.stop = _sampling(fields), predict, stop
    stream = body.get("stream", True)
    if not isinstance(stream, bool) and stream is not None:
        raise BadRequest("stream: true or false", param="stream")
    req.model, req.stream = model_field(body, required=True), stream is not False
    req.logprobs = chat_logprobs(body)  # Ollama 0.12.11's logprobs / top_logprobs (serve/generation/logprobs.py)
    return {"num_ctx": num_ctx}


def _check_num_ctx(prep, num_ctx) -> None:
    if num_ctx is not None and prep.prompt_tokens > num_ctx:
        raise BadRequest(f"the prompt is {prep.prompt_tokens} tokens, over options.num_ctx ({num_ctx}); "
                         "this server never truncates a prompt: raise num_ctx or shorten the prompt",
                         param="options.num_ctx")


# ---------------------------------------------------------------- answers
def _final(done: Done, t0: float) -> dict:
    t = done.timings or {}
    return {"done": True, "done_reason": "length" if done.finish == "length" else "stop",
            "total_duration": int((time.monotonic() - t0) * 1e9), "load_duration": 0,
            "prompt_eval_count": done.prompt_tokens,
            "prompt_eval_duration": int((t.get("prompt_ms") or 0) * _NS_PER_MS),
            "eval_count": done.completion_tokens,
            "eval_duration": int((t.get("predicted_ms") or 0) * _NS_PER_MS), **finish_note(done)}


def _call(call: ToolCall, index: int) -> dict:
    return {"id": call.id, "function": {"index": index, "name": call.name,
                                        "arguments": arguments_object(call.arguments)}}


class _Shape:
    """Chat (`message`) or generate (`response`) lines."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model

    def piece(self, content: str = "", thinking: str = "", calls: list | None = None, **extra) -> dict:
        head = {"model": self.model, "created_at": _now()}
        if self.chat:
            msg = {"role": "assistant", "content": content}
            if thinking:
                msg["thinking"] = thinking
            if calls:
                msg["tool_calls"] = calls
            return {**head, "message": msg, **extra}
        out = {**head, "response": content}
        if thinking:
            out["thinking"] = thinking
        return {**out, **extra}


def _run(service, prep, ctx, shape: _Shape, t0: float):
    """Yields answer objects: pieces with done false, then the final one."""
    n_calls, run = 0, EventRun(service, prep, ctx)
    for ev in run:
        if ev.kind == KIND_PING:
            yield None
        elif ev.kind == KIND_CONTENT and ev.text:
            lp = {"logprobs": ollama_logprobs(ev.logprobs or [])} if prep.req.logprobs is not None else {}
            yield shape.piece(ev.text, done=False, **lp)
        elif ev.kind == KIND_REASONING and ev.text:
            yield shape.piece(thinking=ev.text, done=False)
        elif ev.kind == KIND_TOOL_CALL and ev.call is not None:
            yield shape.piece(calls=[_call(ev.call, n_calls)], done=False)
            n_calls += 1
    yield shape.piece(**_final(run.done, t0))


def _answer(service, prep, ctx, shape: _Shape, stream: bool, t0: float):
    if stream:
        return StreamReply(_lines(service, prep, ctx, shape, t0), content_type=NDJSON)
    content, thinking, calls, logprobs, last = [], [], [], [], None
    for obj in _run(service, prep, ctx, shape, t0):
        if obj is None:
            continue
        if obj.get("done"):
            last = obj
            break
        part = obj.get("message", obj)
        content.append(part.get("content", part.get("response", "")))
        thinking.append(part.get("thinking", ""))
        calls += part.get("tool_calls") or []
        logprobs += obj.get("logprobs") or []
    final = shape.piece("".join(content), "".join(thinking), calls)
    if prep.req.logprobs is not None:
        final["logprobs"] = logprobs
    return JsonReply(200, {**final, **{k: v for k, v in last.items() if k not in ("message", "response")},
                           "created_at": final["created_at"]})


def _lines(service, prep, ctx, shape, t0):
    try:
        for obj in _run(service, prep, ctx, shape, t0):
            if obj is not None:
                yield _line(obj)
    except Exception as e:  # after the first line: a last error line
        yield cut(_line({"error": error_text(service, e)}))


def chat(service, body: dict, ctx):
    t0 = time.monotonic()
    body = under_ollama(body, getattr(ctx, "created", None), True)
    req = ChatRequest(messages=_messages(body.get("messages")), tools=parse_tools(body.get("tools")), api="ollama")
    # a final assistant message is continued, as Ollama does (serve/prompt/prefill.py): the reply is the new text
    req.continue_final = bool(req.messages) and req.messages[-1].role == "assistant"
    extra = _common(body, req)
    req.reasoning_effort = _think(body.get("think"))
    if not req.messages:  # Ollama loads the model and answers at once
        return JsonReply(200, {"model": req.model, "created_at": _now(),
                               "message": {"role": "assistant", "content": ""}, "done": True,
                               "done_reason": "load"})
    prep = service.prepare(req)
    _check_num_ctx(prep, extra["num_ctx"])
    return _answer(service, prep, ctx, _Shape(True, req.model), req.stream, t0)


def generate(service, body: dict, ctx):
    t0 = time.monotonic()
    body = under_ollama(body, getattr(ctx, "created", None), False)
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise BadRequest("prompt: a string", param="prompt")
    for name in ("suffix", "images", "context", "template"):
        if body.get(name):
            raise BadRequest(f"{name}: not supported on this server", param=name)
    raw = body.get("raw", False)
    if not isinstance(raw, bool):
        raise BadRequest("raw: true or false", param="raw")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        raise BadRequest("system: a string", param="system")
    if raw:
        req = CompletionRequest(prompt=prompt)
    else:
        req = ChatRequest(messages=([Message("system", system)] if system else []) + [Message("user", prompt)],
                          api="ollama")
    extra = _common(body, req)
    if not raw:
        req.reasoning_effort = _think(body.get("think"))
    if not prompt:  # Ollama loads the model and answers at once
        return JsonReply(200, {"model": req.model, "created_at": _now(), "response": "", "done": True,
                               "done_reason": "load"})
    prep = service.prepare(req)
    _check_num_ctx(prep, extra["num_ctx"])
    return _answer(service, prep, ctx, _Shape(False, req.model), req.stream, t0)

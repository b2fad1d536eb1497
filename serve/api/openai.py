"""OpenAI Chat Completions and Completions: a translator between the wire format and `serve/core/events.py`.

Calling convention (serve/api/anthropic.py mirrors it; the server routes by path and knows nothing else):

    handler(service, body: dict, ctx: RequestContext) -> JsonReply | StreamReply     (serve/api/replies.py)

- `body` is the parsed JSON object (the server answers 400 itself when the body is not a JSON object).
- Validate and `service.prepare(req)` *before* returning: every error raised then (`BadRequest`, a
  `ServiceError` from serve/core/errors.py) becomes a plain HTTP answer built by this module's
  `error_body(status, err_type, message, param=None, code=None)`; the server picks the status
  (BadRequest.status; ServiceError.status: 503 engine down or starting, 502 a broken engine; 500 otherwise,
  with the traceback logged).
- A stream is a `StreamReply` whose frames iterate `service.run(prep, ctx.cancelled)` inside
  `contextlib.closing(...)`; a `ping` event becomes a keep-alive comment. An error after the first frame is
  this module's `stream_error(message)` frame, then the end of the stream. When the server is shutting down
  (`ctx.shutting_down()`), the stream ends with such a final error event too.
- `count_tokens`-style handlers may use `service.count_tokens(req)`.

A model made with Ollama's `/api/create` (`ctx.created`) gets its system prompt, turns and parameters under
a chat completions request's own, as Ollama's OpenAI route does (serve/api/created_settings.py).

Public surface: `chat_completions`, `completions`, `models`, `model_entries`, `error_body`, `stream_error`, `parse_chat`.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import time
from urllib.parse import unquote

from serve.api.created_settings import under_openai_chat
from serve.api.fields import (
    SAMPLER_FIELDS_REFUSED, VLLM_FIELDS_REFUSED, ban_eos, chat_logprobs, check_best_of, check_n, completions_logprobs,
    llama_n_probs, model_field, openai_grammar, refuse_unsupported, strict_requested)
from serve.generation.choices import collect_text, merge_done, prepare_choices, run_choices
from serve.core.events import (
    BadRequest, ChatRequest, CompletionRequest, Done, LiveTimings, Message, ProgressFeed, ToolCall,
    KIND_CONTENT, KIND_PING, KIND_REASONING, KIND_TOOL_ARGS, KIND_TOOL_CALL, KIND_TOOL_START)
from serve.ops.llama_views import ENGINE_VERSION_DEFAULT
from serve.generation.logprobs import legacy_logprobs, openai_content
from serve.api.replies import JsonReply, StreamReply, cut
from serve.core.sampling import check_max_tokens, check_request_sampling
from serve.api.wire import (
    KEEP_ALIVE, SHUTDOWN_TEXT, bool_field, check_stop, continue_final, cut_by_shutdown, effort_from_openai, error_text, finish_note,
    model_name,
    parse_tool_choice, parse_tools, reasoning_fields, sse, text_of)

ROLES = ("system", "developer", "user", "assistant", "tool")
def error_body(status: int, err_type: str, message: str, param=None, code=None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def stream_error(message: str, err_type: str = "server_error") -> str:
    """A stream's final error event (the stream then ends incomplete: serve/api/replies.py `cut`)."""
    return cut(sse({"error": {"message": message, "type": err_type}}))


def system_fingerprint(service) -> str:
    """OpenAI's `system_fingerprint`, the backend configuration a reply ran with: "b" (llama-server's build
    prefix, which its clients and test suite read) + the engine's version + a hash of the model's name and the
    engine's flags, so it changes when either does."""
    e = getattr(service, "engine", None)
    info = getattr(e, "info", None) or {}
    key = f"{getattr(service, 'model_name', '')} {' '.join(map(str, getattr(e, 'args', []) or []))}"
    return f"b{info.get('engine') or ENGINE_VERSION_DEFAULT}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


def _messages(raw) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages: a non-empty list of message objects", param="messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise BadRequest(f"{where}: a message object", param="messages")
        role = m.get("role")
        if role not in ROLES:
            raise BadRequest(f"{where}.role: unknown role {role!r} (system, developer, user, assistant, tool)",
                             param="messages")
        msg = Message("system" if role == "developer" else role, text_of(m.get("content"), where + ".content"))
        if role == "assistant":
            reasoning = m.get("reasoning_content", m.get("reasoning"))
            msg.reasoning = reasoning if isinstance(reasoning, str) else None
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list):
                raise BadRequest(f"{where}.tool_calls: a list", param="messages")
            for k, c in enumerate(calls):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise BadRequest(f"{where}.tool_calls[{k}].function.name: a string", param="messages")
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except ValueError:
                        args = {"arguments": args}
                msg.tool_calls.append(ToolCall(str(c.get("id") or ""), fn["name"], args))
        if role == "tool":
            msg.tool_call_id = m.get("tool_call_id")
            msg.name = m.get("name")
        out.append(msg)
    return out


def parse_chat(body: dict) -> ChatRequest:
    refuse_unsupported(body, SAMPLER_FIELDS_REFUSED + VLLM_FIELDS_REFUSED)
    req = ChatRequest(messages=_messages(body.get("messages")), tools=parse_tools(body.get("tools")))
    if [m.role for m in req.messages[-2:]] == ["assistant", "assistant"]:  # as llama-server refuses it
        raise BadRequest("messages: two assistant messages at the end; a reply follows a user or tool turn "
                         "(merge them into one)", param="messages")
    req.continue_final = continue_final(body, req.messages)
    req.tool_choice = parse_tool_choice(body.get("tool_choice", "auto"), req.notes)
    req.parallel_tool_calls = bool_field(body, "parallel_tool_calls", True)
    # both are checked; max_completion_tokens (OpenAI's current name) wins over max_tokens when both are given
    newer = check_max_tokens(body.get("max_completion_tokens"), "max_completion_tokens")
    older = check_max_tokens(body.get("max_tokens"), "max_tokens")
    req.max_new = newer if newer is not None else older
    req.stream = bool_field(body, "stream")
    req.stop = check_stop(body.get("stop"))
    req.sampling = check_request_sampling(body)
    req.reasoning_effort = effort_from_openai(body)
    reasoning_fields(body, req)  # reasoning_budget_tokens, answer_room, reasoning_close_retry
    req.model = model_field(body)
    req.extra = {k: v for k, v in body.items() if k.startswith("strata_")}
    req.logprobs = chat_logprobs(body)
    if req.logprobs is None:  # llama.cpp's native name on its OpenAI routes: logprobs with n_probs alternatives
        req.logprobs = llama_n_probs(body)
    req.n = check_n(body)  # here so that every route that parses a chat checks it
    req.grammar = openai_grammar(body)  # response_format, llama.cpp json_schema / grammar (serve/generation/constrain.py)
    req.strict_tools = strict_requested(body.get("tools"))
    return req


def _include_usage(body) -> bool:
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise BadRequest("stream_options: an object", param="stream_options")
    return bool_field(opts, "include_usage")


# ---------------------------------------------------------------- answers
def _usage(done: Done, chat: bool = True) -> dict:
    usage = {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
             "total_tokens": done.prompt_tokens + done.completion_tokens,
             "prompt_tokens_details": {"cached_tokens": done.cached_tokens or 0}}
    if chat:
        usage["completion_tokens_details"] = {"reasoning_tokens": done.reasoning_tokens}
    return usage


def _finish_reason(done: Done, calls: bool) -> str:
    if calls and done.finish in ("stop", "tool_calls"):
        return "tool_calls"
    return "length" if done.finish == "length" else "stop"


class _ChatChoice:
    """One choice's reply while its events come (the JSON answer, not a stream)."""

    def __init__(self):
        self.content, self.reasoning, self.calls, self.logprobs, self.done = [], [], [], [], None

    def feed(self, ev) -> None:
        if isinstance(ev, Done):
            self.done = ev
        elif ev.kind == KIND_CONTENT:
            self.content.append(ev.text)
            self.logprobs.extend(ev.logprobs or ())
        elif ev.kind == KIND_REASONING:
            self.reasoning.append(ev.text)
        elif ev.kind == KIND_TOOL_CALL and ev.call is not None:
            self.calls.append(ev.call)

    def choice(self, index: int, logprobs: bool) -> dict:
        message = {"role": "assistant", "content": "".join(self.content) or None}
        if self.reasoning:
            # both names: llama.cpp/DeepSeek clients read reasoning_content, vLLM/Ollama ones reasoning
            message["reasoning_content"] = message["reasoning"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.name, "arguments": c.arguments if isinstance(c.arguments, str)
                else json.dumps(c.arguments, ensure_ascii=False)}} for c in self.calls]
        out = {"index": index, "message": message, "finish_reason": _finish_reason(self.done, bool(self.calls)),
               **finish_note(self.done)}
        if logprobs:
            out["logprobs"] = {"content": openai_content(self.logprobs)}
        return out


def chat_completions(service, body: dict, ctx) -> JsonReply | StreamReply:
    body = under_openai_chat(body, getattr(ctx, "created", None))   # a model made with Ollama's /api/create
    req = parse_chat(body)
    check_best_of(body, req.n)  # vLLM's chat field: refused as on completions, never ignored
    ban_eos(body, req.sampling, lambda: service.stop_ids)
    include_usage = _include_usage(body)
    preps = prepare_choices(service, req, req.n)
    meta = {"id": "chatcmpl-" + secrets.token_hex(12), "created": int(time.time()),
            "model": model_name(service, req)}
    if req.stream:
        progress = ProgressFeed() if bool_field(body, "return_progress") else None  # llama.cpp's extensions
        live = ([LiveTimings(p.prompt_tokens) for p in preps] if bool_field(body, "timings_per_token")
                else None)  # one per choice
        return StreamReply(_chat_stream(service, preps, ctx, meta, include_usage, progress, live))
    choices = [_ChatChoice() for _ in preps]
    with contextlib.closing(run_choices(service, preps, ctx.cancelled, ctx.on_wait)) as items:
        for i, ev in items:
            choices[i].feed(ev)
    done = merge_done([c.done for c in choices])
    out = {**meta, "object": "chat.completion", "system_fingerprint": system_fingerprint(service),
           "choices": [c.choice(i, req.logprobs is not None) for i, c in enumerate(choices)],
           "usage": _usage(done), "timings": done.timings}
    if body.get("verbose") is True:  # llama-server's debug echo: the prompt the engine read, as text
        out["__verbose"] = {"prompt": service.tok.decode(preps[0].ids),
                            "content": out["choices"][0]["message"]["content"] or ""}
    return JsonReply(200, out)


def _chat_stream(service, preps, ctx, meta, include_usage, progress=None, live=None):
    logprobs = preps[0].req.logprobs is not None
    fingerprint = system_fingerprint(service)

    def chunk(i, delta, finish=None, lp=None, note=None, **extra):
        choice = {"index": i, "delta": delta, "finish_reason": finish, **(note or {})}
        if logprobs and lp is not None:
            choice["logprobs"] = {"content": openai_content(lp)}
        return sse({**meta, "object": "chat.completion.chunk", "system_fingerprint": fingerprint,
                     "choices": [choice], **extra})

    for i in range(len(preps)):
        yield chunk(i, {"role": "assistant", "content": None})  # null, as llama-server's first chunk
    started, calls, dones = set(), [0] * len(preps), [None] * len(preps)
    try:
        with contextlib.closing(run_choices(service, preps, ctx.cancelled, ctx.on_wait)) as items:
            for i, ev in items:
                if isinstance(ev, Done):
                    dones[i] = ev
                    if not cut_by_shutdown(ctx, ev):
                        yield chunk(i, {}, _finish_reason(ev, calls[i] > 0), note=finish_note(ev), timings=ev.timings)
                elif ev.kind == KIND_PING:
                    reports = progress.feed(ev.progress) if progress is not None and i == 0 else []
                    for p in reports:  # return_progress: llama-server's prompt_progress chunks
                        yield sse({**meta, "object": "chat.completion.chunk", "choices": [], "prompt_progress": p})
                    if not reports:
                        yield KEEP_ALIVE
                elif ev.kind == KIND_CONTENT:  # timings_per_token: running figures
                    timings = {"timings": live[i].token(max(1, len(ev.ids)))} if live is not None else {}
                    yield chunk(i, {"content": ev.text}, lp=ev.logprobs, **timings)
                elif ev.kind == KIND_REASONING:
                    yield chunk(i, {"reasoning_content": ev.text, "reasoning": ev.text})
                elif ev.kind == KIND_TOOL_START:
                    started.add((i, ev.index))
                    yield chunk(i, {"tool_calls": [{"index": ev.index, "id": ev.call_id, "type": "function",
                                                    "function": {"name": ev.name, "arguments": ""}}]})
                elif ev.kind == KIND_TOOL_ARGS:
                    yield chunk(i, {"tool_calls": [{"index": ev.index, "function": {"arguments": ev.text}}]})
                elif ev.kind == KIND_TOOL_CALL and ev.call is not None:
                    calls[i] += 1
                    if (i, ev.index) not in started:
                        args = ev.call.arguments
                        yield chunk(i, {"tool_calls": [{"index": ev.index, "id": ev.call.id, "type": "function",
                                                        "function": {"name": ev.call.name, "arguments": args if
                                                                     isinstance(args, str) else json.dumps(
                                                                         args, ensure_ascii=False)}}]})
    except Exception as e:  # after the headers: a final error event, then the end of the stream
        yield stream_error(error_text(service, e))
        yield "data: [DONE]\n\n"
        return
    if any(cut_by_shutdown(ctx, d) for d in dones):
        yield stream_error(SHUTDOWN_TEXT)
        yield "data: [DONE]\n\n"
        return
    if include_usage:
        done = merge_done(dones)
        yield sse({**meta, "object": "chat.completion.chunk", "system_fingerprint": fingerprint, "choices": [],
                    "usage": _usage(done), "timings": done.timings})
    yield "data: [DONE]\n\n"


# ---------------------------------------------------------------- /v1/completions
def completions(service, body: dict, ctx) -> JsonReply | StreamReply:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("prompt: a non-empty string", param="prompt")
    req = CompletionRequest(prompt=prompt, max_new=check_max_tokens(body.get("max_tokens")),
                            sampling=check_request_sampling(body),
                            stop=check_stop(body.get("stop")), stream=bool_field(body, "stream"),
                            echo=bool_field(body, "echo"), model=body.get("model"))
    refuse_unsupported(body, ("suffix",) + SAMPLER_FIELDS_REFUSED + VLLM_FIELDS_REFUSED)
    req.n = n = check_n(body)
    check_best_of(body, n)
    ban_eos(body, req.sampling, lambda: service.stop_ids)
    req.logprobs = completions_logprobs(body)
    if req.logprobs is None:
        req.logprobs = llama_n_probs(body)
    req.grammar = openai_grammar(body)
    include_usage = _include_usage(body)
    preps = prepare_choices(service, req, n)
    meta = {"id": "cmpl-" + secrets.token_hex(12), "created": int(time.time()),
            "model": model_name(service, req), "system_fingerprint": system_fingerprint(service)}
    if req.stream:
        return StreamReply(_completion_stream(service, preps, ctx, meta, include_usage, req))
    start = len(prompt) if req.echo else 0
    texts, lps, dones = collect_text(service, preps, ctx.cancelled)
    done = merge_done(dones)
    return JsonReply(200, {**meta, "object": "text_completion", "choices": [
        {"index": i, "text": (prompt if req.echo else "") + texts[i],
         "logprobs": legacy_logprobs(lps[i], start)[0] if req.logprobs is not None else None,
         "finish_reason": _finish_reason(dones[i], False), **finish_note(dones[i])} for i in range(n)],
        "usage": _usage(done, chat=False), "timings": done.timings})


def _completion_stream(service, preps, ctx, meta, include_usage, req):
    offsets = [len(req.prompt) if req.echo else 0] * len(preps)

    def chunk(i, text, finish=None, lp=None, note=None, **extra):
        logprobs = None
        if req.logprobs is not None and lp is not None:
            logprobs, offsets[i] = legacy_logprobs(lp, offsets[i])
        return sse({**meta, "object": "text_completion", "choices": [
            {"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish, **(note or {})}], **extra})

    dones = [None] * len(preps)
    try:
        if req.echo:
            for i in range(len(preps)):
                yield chunk(i, req.prompt)
        with contextlib.closing(run_choices(service, preps, ctx.cancelled, ctx.on_wait)) as items:
            for i, ev in items:
                if isinstance(ev, Done):
                    dones[i] = ev
                    if not cut_by_shutdown(ctx, ev):
                        yield chunk(i, "", _finish_reason(ev, False), note=finish_note(ev), timings=ev.timings)
                elif ev.kind == KIND_PING:
                    yield KEEP_ALIVE
                elif ev.kind == KIND_CONTENT:
                    yield chunk(i, ev.text, lp=ev.logprobs)
    except Exception as e:
        yield stream_error(error_text(service, e))
        yield "data: [DONE]\n\n"
        return
    if any(cut_by_shutdown(ctx, d) for d in dones):
        yield stream_error(SHUTDOWN_TEXT)
        yield "data: [DONE]\n\n"
        return
    if include_usage:
        yield sse({**meta, "object": "text_completion", "choices": [],
                    "usage": _usage(merge_done(dones), chat=False)})
    yield "data: [DONE]\n\n"


def model_entries(name: str, aliases, loaded: bool, n_ctx: int, created: float, **extra) -> list[dict]:
    """The `/v1/models` entry of a model: one per model, as OpenAI lists a model once and llama-server lists its
    other names in `aliases` (a model picker shows each model once; every alias still works in a request)."""
    return [{"id": name, "object": "model", "created": int(created), "owned_by": "strata",
             "aliases": list(aliases or []), "status": {"value": "loaded" if loaded else "unloaded"},
             "meta": {"n_ctx": n_ctx}, "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
             **extra}]


def models(service, body, ctx) -> JsonReply:
    data = model_entries(service.model_name, service.config.get("aliases"), service.engine.alive(),
                         service.engine.max_context or service.engine.known_ctx, service.started)
    return JsonReply(200, {"object": "list", "data": data})


def model_in(listing: JsonReply, ctx) -> JsonReply:
    """GET /v1/models/{id} from a /v1/models listing: the entry whose id (or one of its aliases) is the path's,
    as OpenAI answers it; else OpenAI's 404 `model_not_found`."""
    wanted = unquote(ctx.path[len("/v1/models/"):])
    for entry in listing.body["data"]:
        if wanted == entry["id"] or wanted in entry.get("aliases", ()):
            return JsonReply(200, entry)
    return JsonReply(404, error_body(404, "invalid_request_error", f"The model {wanted[:200]!r} does not exist",
                                     None, "model_not_found"))


def model_get(service, body, ctx) -> JsonReply:
    return model_in(models(service, body, ctx), ctx)

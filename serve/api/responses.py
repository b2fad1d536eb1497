"""OpenAI Responses (`POST /v1/responses`): a translator over `serve/core/events.py`, with stored responses.

Calling convention: the one `serve/api/openai.py` documents (`handler(service, body, ctx) -> JsonReply |
StreamReply`; validation and `service.prepare` before the reply; errors in OpenAI's `{"error": {...}}` shape,
which the Responses API shares).

Request: `input` (a string, or items: messages with `role` and string / `input_text` / `output_text` content,
`function_call {call_id, name, arguments}`, `function_call_output {call_id, output}`, `reasoning` items whose
text goes back into the next assistant turn), `instructions` (the first system turn), `tools` in the flat shape
`{type: "function", name, description, parameters}` (other tool types, such as `web_search`, are skipped and
said in the request's notes: nothing here can run them), `tool_choice`, `parallel_tool_calls`,
`max_output_tokens`, `temperature` / `top_p` (and the other sampling fields), `reasoning.effort`, `stream`,
`text.format` (json_object or json_schema: the reply follows it by grammar, serve/generation/constrain.py),
`include: ["message.output_text.logprobs"]` / `top_logprobs` 0..20 (serve/generation/logprobs.py: entries on the
output_text part and on each text delta), `store` (default true, as OpenAI's: the finished response is kept in
the server's `ResponseStore`, serve/api/response_store.py) and `previous_response_id` (the kept chain's input
and output items come before this request's `input`; `instructions` are not carried over, as OpenAI documents;
an id not kept is 400 `previous_response_not_found`). Accepted and without effect: `metadata`, `user`,
`include`'s other values, `truncation` (requests are never truncated), `prompt_cache_key`, `service_tier`. A
final assistant message is continued (prefill, as chat/completions: the reply holds only the new text;
`continue_final_message: false` asks for a new turn); an assistant message right after another is joined to it
(a continued message and its stored continuation are one turn). `item_reference` items are replaced by the
stored item they name (an output item of a kept response, or an input item of its request;
response_store.continued); one not kept is 400. Refused: `background: true` (400).
GET `/v1/responses/{id}` (the kept response), GET `/v1/responses/{id}/input_items` (its request's own input
items, OpenAI's list shape), DELETE `/v1/responses/{id}` (`{id, object: "response.deleted", deleted: true}`);
an id not kept is 404 `response_not_found`; `/cancel` is 400 (nothing runs in the background).

Answer: one `ResponseBuilder` turns the event stream into the stream's events *and* the final response object,
so a streamed and a non-streamed answer carry the same output items (`reasoning`, `message` with one
`output_text` part, `function_call` with `call_id`). Stream: `response.created`, `response.in_progress`, per
item `response.output_item.added`, (`response.content_part.added`, `response.output_text.delta`* /
`response.reasoning_text.delta`*, `.done`, `response.content_part.done`) or
(`response.function_call_arguments.delta`*, `.done`), `response.output_item.done`; last `response.completed`
(with `strata_finish: "loop_guard"` on the response when the loop guard ended the reply, as the other dialects
say it; or `response.incomplete` with `incomplete_details.reason: max_output_tokens`, or `response.failed` with
its `error`). Every event has a `sequence_number` counting from 0. While a long prompt is read, a
`response.in_progress` goes out at least every `IN_PROGRESS_EVERY_S` (Codex's idle timeout counts events, not
SSE comments).
llama-server's stream extensions: `return_progress: true` adds `response.in_progress` events with
`prompt_progress {total, cache, processed, time_ms}` beside the response while the prompt is read;
`timings_per_token: true` puts running `timings` on each `response.output_text.delta`; the last event carries
the reply's `timings` beside the response (and in it), as llama-server does.

Public surface: `responses`, `input_tokens`, `get_response`, `parse_responses`, `ResponseBuilder`, `error_body`.
"""
from __future__ import annotations

import json
import secrets
import time

from serve.generation.constrain import schema_ask
from serve.core.events import (
    BadRequest, ChatRequest, Done, LiveTimings, Message, ProgressFeed, ToolCall, KIND_CONTENT, KIND_PING,
    KIND_REASONING, KIND_TOOL_ARGS, KIND_TOOL_CALL, KIND_TOOL_START)
from serve.api.wire import (
    continue_final, error_text, finish_note, model_name, text_of, parse_tool_choice, parse_tools)
from serve.api.openai import error_body
from serve.api.wire import effort_from_openai, reasoning_fields
from serve.api.replies import EventRun, JsonReply, StreamReply, collect, cut
from serve.core.sampling import check_max_tokens, check_request_sampling
from serve.generation.json_schema import ANY_OBJECT_GRAMMAR
from serve.api.fields import model_field, responses_logprobs
from serve.api.response_store import continued, input_item_id
from serve.generation.logprobs import openai_content
from serve.prompt.tool_text import arguments_text

__all__ = ["responses", "input_tokens", "get_response", "parse_responses", "ResponseBuilder", "error_body"]

# A `response.in_progress` event goes out when the stream has said nothing for this long while the prompt
# is read or the request waits its turn. Pings reach the translator at least every 10 s (the engine's
# heartbeat, the queue's beat) and after every prompt chunk, so the gap between events stays under 15 s.
IN_PROGRESS_EVERY_S = 5.0
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


# ---------------------------------------------------------------- request parsing
def _args_object(text, where: str):
    if isinstance(text, dict):
        return text
    if not isinstance(text, str):
        raise BadRequest(f"{where}.arguments: a JSON text", param="input")
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError:
        return text  # kept as sent: the template writes it back as one argument
    return value if isinstance(value, dict) else text


def _reasoning_text(item: dict) -> str:
    parts = [p.get("text") for p in (item.get("content") or []) + (item.get("summary") or [])
             if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return "\n".join(parts)


def _input_items(raw) -> list[Message]:
    """`input` items -> internal messages; consecutive calls join one assistant turn, as the model wrote them."""
    if isinstance(raw, str):
        return [Message("user", raw)]
    if not isinstance(raw, list) or not raw:
        raise BadRequest("input: a string or a non-empty list of input items", param="input")
    out: list[Message] = []
    reasoning: list[str] = []
    names: dict[str, str] = {}
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where}: an input item object", param="input")
        kind = item.get("type", "message")
        if kind == "message":
            role = _ROLES.get(item.get("role")) if isinstance(item.get("role"), str) else None  # a dict: unhashable
            if role is None:
                raise BadRequest(f"{where}.role: user, system, developer or assistant, not {item.get('role')!r}",
                                 param="input")
            msg = Message(role, text_of(item.get("content"), where + ".content"))
            last = out[-1] if out else None
            if role == "assistant" and not reasoning and last is not None and last.role == "assistant" \
                    and not last.tool_calls:   # a continued message and its continuation: one turn
                last.content += msg.content
                continue
            if role == "assistant" and reasoning:
                msg.reasoning, reasoning = "\n".join(reasoning), []
            out.append(msg)
        elif kind == "function_call":
            name, call_id = item.get("name"), str(item.get("call_id") or item.get("id") or "")
            if not isinstance(name, str) or not name:
                raise BadRequest(f"{where}.name: a non-empty string", param="input")
            names[call_id] = name
            call = ToolCall(call_id, name, _args_object(item.get("arguments", ""), where))
            last = out[-1] if out else None
            if last is None or last.role != "assistant":
                last = Message("assistant", "")
                out.append(last)
            if reasoning:
                last.reasoning, reasoning = "\n".join(reasoning), []
            last.tool_calls.append(call)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise BadRequest(f"{where}.call_id: the call's call_id", param="input")
            output = item.get("output")
            text = output if isinstance(output, str) else text_of(output, where + ".output")
            out.append(Message("tool", text, tool_call_id=call_id, name=names.get(call_id)))
        elif kind == "reasoning":
            text = _reasoning_text(item)
            if text:
                reasoning.append(text)
        elif kind == "item_reference":
            raise BadRequest(f"{where}: an item reference is looked up in the stored responses (continued() "
                             "does it before parsing); send the item itself", param="input")
        else:
            raise BadRequest(f"{where}.type: message, function_call, function_call_output or reasoning, not "
                             f"{kind!r}", param="input")
    return out


def _function_tools(raw, notes: list) -> list:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadRequest("tools: a list of tool objects", param="tools")
    kept = []
    for t in raw:
        if isinstance(t, dict) and t.get("type", "function") != "function":
            notes.append(f"tool type {str(t.get('type'))[:40]!r} skipped: nothing here can run it")
            continue
        kept.append(t)
    return parse_tools(kept)


def _text_format_grammar(text) -> str | None:
    """`text.format` -> the reply's grammar (serve/generation/constrain.py): text = none, json_object = any object,
    json_schema {name, schema, strict} = the schema's; anything else a 400 naming the field."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise BadRequest('text: an object like {"format": {"type": "text"}}', param="text")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_OBJECT_GRAMMAR
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise BadRequest('text.format: {"type": "json_schema", "name": ..., "schema": {...}}',
                             param="text.format")
        return schema_ask(fmt["schema"], "text.format.schema")
    raise BadRequest('text.format.type: "text", "json_object" or "json_schema"', param="text.format")


def parse_responses(body: dict) -> ChatRequest:
    if body.get("background"):
        raise BadRequest("background: this server runs every response in its request, not in the background",
                         param="background")
    store = body.get("store", True)
    if not isinstance(store, bool) and store is not None:
        raise BadRequest("store: true or false", param="store")
    grammar = _text_format_grammar(body.get("text"))
    req = ChatRequest(messages=_input_items(body.get("input")), api="responses")
    req.grammar = grammar
    req.logprobs = responses_logprobs(body)
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequest("instructions: a string", param="instructions")
        req.messages.insert(0, Message("system", instructions))
    # a final assistant message is continued, as on chat/completions (prefill; continue_final_message: false
    # or add_generation_prompt: true ask for a new turn); one that ends in calls is not text to go on with
    req.continue_final = continue_final(body, req.messages) and not req.messages[-1].tool_calls
    if req.continue_final and grammar is not None:
        raise BadRequest("input: a final assistant message is continued (prefill), and a continued message "
                         "cannot also follow text.format; send one or the other", param="input")
    req.tools = _function_tools(body.get("tools"), req.notes)
    req.tool_choice = parse_tool_choice(body.get("tool_choice", "auto"), req.notes)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool) and parallel is not None:
        raise BadRequest("parallel_tool_calls: true or false", param="parallel_tool_calls")
    req.parallel_tool_calls = parallel is not False
    req.max_new = check_max_tokens(body.get("max_output_tokens"), "max_output_tokens")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise BadRequest("stream: true or false", param="stream")
    req.stream = bool(stream)
    req.sampling = check_request_sampling({k: v for k, v in body.items() if k != "logit_bias"})
    req.reasoning_effort = effort_from_openai(body)
    reasoning_fields(body, req)
    req.model = model_field(body)
    return req


# ---------------------------------------------------------------- the answer
def _usage(done: Done) -> dict:
    return {"input_tokens": done.prompt_tokens, "input_tokens_details": {"cached_tokens": done.cached_tokens or 0},
            "output_tokens": done.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": done.reasoning_tokens},
            "total_tokens": done.prompt_tokens + done.completion_tokens}


class ResponseBuilder:
    """Events -> Responses stream events and output items. `frame` numbers every event it makes."""

    def __init__(self, meta: dict):
        self.meta = meta          # the response object's fields other than status, output, usage
        self.seq = 0
        self.output: list[dict] = []
        self.open: dict | None = None   # the item being written; its text parts collect in `parts`
        self.parts: list[str] = []
        self.lps: list[dict] | None = None  # the open message's log-probability entries, when asked
        self.calls: dict[int, dict] = {}  # parser call index -> its function_call item
        self.last_frame_at = time.monotonic()
        self.live: LiveTimings | None = None     # timings_per_token: running figures on each text delta
        self.progress: ProgressFeed | None = None  # return_progress: prompt_progress on response.in_progress
        self.keep = None          # called with the finished response object (a stored response)

    def frame(self, kind: str, **fields) -> str:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        self.last_frame_at = time.monotonic()
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def response(self, status: str, done: Done | None = None, error: dict | None = None) -> dict:
        body = {**self.meta, "status": status, "error": error, "output": self.output if done else [],
                "usage": _usage(done) if done else None, "incomplete_details": None}
        if done is not None and status == "incomplete":
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        body.update(finish_note(done))   # strata_finish: "loop_guard" beside a completed status
        if done is not None:
            body["timings"] = done.timings  # llama.cpp's figures, as on the other routes
        return body

    def start(self) -> list[str]:
        return [self.frame("response.created", response=self.response("in_progress")),
                self.frame("response.in_progress", response=self.response("in_progress"))]

    def ping(self, progress: dict | None = None) -> list[str]:
        reports = self.progress.feed(progress) if self.progress is not None else []
        if reports:  # llama-server's return_progress: the prompt read so far, beside the response
            return [self.frame("response.in_progress", response=self.response("in_progress"), prompt_progress=p)
                    for p in reports]
        if time.monotonic() - self.last_frame_at >= IN_PROGRESS_EVERY_S:
            return [self.frame("response.in_progress", response=self.response("in_progress"))]
        return []

    def _index(self) -> int:
        return len(self.output) - 1

    def _open_text_item(self, kind: str) -> list[str]:
        """Opens a `message` (output_text) or `reasoning` (reasoning_text) item with one empty part."""
        if kind == "message":
            item = {"id": "msg_" + secrets.token_hex(12), "type": "message", "status": "in_progress",
                    "role": "assistant", "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            item = {"id": "rs_" + secrets.token_hex(12), "type": "reasoning", "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        self.output.append(item)
        self.open, self.parts = item, []
        self.lps = [] if self.lps is not None else None
        return [self.frame("response.output_item.added", output_index=self._index(), item=dict(item, content=[])),
                self.frame("response.content_part.added", item_id=item["id"], output_index=self._index(),
                           content_index=0, part=part)]

    def close(self, status: str = "completed") -> list[str]:
        item, self.open = self.open, None
        if item is None or item["type"] == "function_call":
            return []
        text = "".join(self.parts)
        at = {"item_id": item["id"], "output_index": self._index(), "content_index": 0}
        if item["type"] == "message":
            lps = openai_content(self.lps or [])
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": lps}
            frames = [self.frame("response.output_text.done", **at, text=text, logprobs=lps)]
            item["status"] = status
        else:
            part = {"type": "reasoning_text", "text": text}
            frames = [self.frame("response.reasoning_text.done", **at, text=text)]
        item["content"] = [part]
        frames.append(self.frame("response.content_part.done", **at, part=part))
        frames.append(self.frame("response.output_item.done", output_index=self._index(), item=item))
        return frames

    def _text(self, kind: str, text: str, n_tokens: int = 1, lps: list | None = None) -> list[str]:
        frames = []
        if self.open is None or self.open["type"] != kind:
            frames += self.close() + self._open_text_item(kind)
        self.parts.append(text)
        event = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra = {"logprobs": openai_content(lps or [])} if kind == "message" else {}
        if self.lps is not None:
            self.lps += lps or []
        if self.live is not None:
            extra["timings"] = self.live.token(n_tokens)
        frames.append(self.frame(event, item_id=self.open["id"], output_index=self._index(), content_index=0,
                                 delta=text, **extra))
        return frames

    def _call_start(self, index: int, call_id: str, name: str) -> list[str]:
        frames = self.close()
        item = {"id": "fc_" + secrets.token_hex(12), "type": "function_call", "status": "in_progress",
                "call_id": call_id, "name": name, "arguments": ""}
        self.output.append(item)
        self.open, self.calls[index] = item, item
        item["_at"] = self._index()
        return frames + [self.frame("response.output_item.added", output_index=item["_at"],
                                    item={k: v for k, v in item.items() if k != "_at"})]

    def feed(self, ev) -> list[str]:
        if ev.kind == KIND_CONTENT and ev.text:
            return self._text("message", ev.text, max(1, len(ev.ids)), ev.logprobs)
        if ev.kind == KIND_REASONING and ev.text:
            return self._text("reasoning", ev.text)
        if ev.kind == KIND_TOOL_START:
            return self._call_start(ev.index, ev.call_id, ev.name)
        if ev.kind == KIND_TOOL_ARGS and ev.index in self.calls:
            item = self.calls[ev.index]
            item["arguments"] += ev.text
            return [self.frame("response.function_call_arguments.delta", item_id=item["id"],
                               output_index=item["_at"], delta=ev.text)]
        if ev.kind == KIND_TOOL_CALL and ev.call is not None:
            return self._call_done(ev)
        return []

    def _call_done(self, ev) -> list[str]:
        frames = []
        if ev.index not in self.calls:
            frames += self._call_start(ev.index, ev.call.id, ev.call.name)
        item = self.calls[ev.index]
        args = arguments_text(ev.call.arguments)
        if not item["arguments"]:
            frames.append(self.frame("response.function_call_arguments.delta", item_id=item["id"],
                                     output_index=item["_at"], delta=args))
        item.update(arguments=args, status="completed")
        at = item.pop("_at")
        frames.append(self.frame("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                                 name=item["name"], arguments=args))
        frames.append(self.frame("response.output_item.done", output_index=at, item=item))
        if self.open is item:
            self.open = None
        return frames

    def finish(self, done: Done) -> list[str]:
        frames = self.close("incomplete" if done.finish == "length" else "completed")
        for item in self.output:  # a call the model left unfinished is not a call
            item.pop("_at", None)
        self.output = [it for it in self.output if it.get("status") != "in_progress"]  # unfinished calls
        status = "incomplete" if done.finish == "length" else "completed"
        final = self.response(status, done)
        if self.keep is not None:
            self.keep(final)
        return frames + [self.frame(f"response.{status}", response=final,
                                    timings=done.timings)]  # llama-server's place for them, beside the response

    def failed(self, message: str) -> str:
        return self.frame("response.failed", response=self.response(
            "failed", error={"code": "server_error", "message": message}))


def _meta(service, req: ChatRequest, body: dict, prev: str | None, store: bool) -> dict:
    return {"id": "resp_" + secrets.token_hex(12), "object": "response", "created_at": int(time.time()),
            "model": model_name(service, req), "instructions": body.get("instructions"),
            "max_output_tokens": req.max_new, "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": prev, "reasoning": {"effort": req.reasoning_effort, "summary": None},
            "store": store, "temperature": req.sampling.temperature, "top_p": req.sampling.top_p,
            "text": _echo_text(body), "tool_choice": body.get("tool_choice", "auto"),
            "tools": [{"type": "function", "name": t.name, "description": t.description,
                       "parameters": t.parameters, "strict": False} for t in req.tools],
            "truncation": "disabled", "metadata": body.get("metadata") or {}, "user": body.get("user")}


def _flag(body: dict, name: str) -> bool:
    """llama-server's stream extensions: true or false (default), else a 400 naming the field."""
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise BadRequest(f"{name}: true or false", param=name)
    return value


def _echo_text(body: dict) -> dict:
    text = body.get("text")
    return {"format": text["format"]} if isinstance(text, dict) and isinstance(text.get("format"), dict) else {
        "format": {"type": "text"}}


def responses(service, body: dict, ctx) -> JsonReply | StreamReply:
    whole, prev, own = continued(body, ctx)
    req = parse_responses(whole)
    prep = service.prepare(req)
    store = body.get("store") is not False and getattr(ctx, "responses", None) is not None
    builder = ResponseBuilder(_meta(service, req, body, prev, store))
    if store:   # kept once it has finished (completed or incomplete; a failed one is not)
        builder.keep = lambda response: ctx.responses.put(response, own, prev)
    builder.lps = [] if req.logprobs is not None else None
    if req.stream:
        if _flag(body, "timings_per_token"):
            builder.live = LiveTimings(prep.prompt_tokens)
        if _flag(body, "return_progress"):
            builder.progress = ProgressFeed()
        return StreamReply(_stream(service, prep, ctx, builder))
    events, done = collect(service, prep, ctx)
    for ev in events:
        builder.feed(ev)
    builder.finish(done)
    status = "incomplete" if done.finish == "length" else "completed"
    return JsonReply(200, builder.response(status, done))


def _stream(service, prep, ctx, builder: ResponseBuilder):
    yield from builder.start()
    run = EventRun(service, prep, ctx)
    try:
        for ev in run:
            if ev.kind == KIND_PING:
                yield from builder.ping(ev.progress) or [": keep-alive\n\n"]
            else:
                yield from builder.feed(ev)
    except Exception as e:  # after the headers: the response fails, with the reason
        yield cut(builder.failed(error_text(service, e)))
        return
    if ctx.shutting_down() and run.done is not None and run.done.finish == "cancel":
        yield cut(builder.failed("the server is shutting down; the answer was cut short"))
        return
    yield from builder.finish(run.done)


def input_tokens(service, body, ctx) -> JsonReply:
    """POST /v1/responses/input_tokens: the prompt length the request would have."""
    return JsonReply(200, {"object": "response.input_tokens",
                           "input_tokens": service.count_tokens(parse_responses(continued(body, ctx)[0]))})


def get_response(service, body, ctx) -> JsonReply:
    """GET / DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items; /cancel is a 400 (nothing runs in
    the background); an id not kept is OpenAI's 404."""
    rid, _, sub = ctx.path[len("/v1/responses/"):].partition("/")
    if sub == "cancel":
        return JsonReply(400, error_body(400, "invalid_request_error", "only a background response can be "
                                         "cancelled; this server runs none", "response_id"))
    store = getattr(ctx, "responses", None)
    found = store.get(rid) if store is not None and sub in ("", "input_items") else None
    if found is None:
        return JsonReply(404, error_body(404, "invalid_request_error", f"response {rid[:80]!r} not found (not "
                                         "stored, deleted, or past the server's stored-response bounds)",
                                         "response_id", "response_not_found"))
    if ctx.method == "DELETE" and not sub:
        store.delete(rid)
        return JsonReply(200, {"id": rid, "object": "response.deleted", "deleted": True})
    if sub == "input_items":
        items = [{"id": input_item_id(rid, i, it), **it} for i, it in enumerate(store.input_items(rid))]
        data = items[::-1]   # newest first, OpenAI's default order
        return JsonReply(200, {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                               "last_id": data[-1]["id"] if data else None, "has_more": False})
    return JsonReply(200, found)

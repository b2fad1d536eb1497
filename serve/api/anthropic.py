"""Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`): a translator over `serve/core/events.py`.

Calling convention: the one `serve/api/openai.py` documents: `handler(service, body, ctx) -> JsonReply |
StreamReply`; validation and `service.prepare(req)` happen before the reply is returned, so errors are plain
HTTP answers (`error_body` gives them the Anthropic shape `{"type":"error","error":{"type","message"}}`); after
a stream's first frame an error is an `event: error` frame (`stream_error`).

Request: `system` (string or text blocks), `messages` (content string or blocks: `text`, `thinking`,
`redacted_thinking`, `tool_use`, `tool_result`; `image`/`document` are refused: no vision encoder), `tools`
(`{name, description, input_schema}`; server tools without a schema are skipped), `tool_choice`
(`auto|any|none|tool`, `disable_parallel_tool_use`), `max_tokens`, `stop_sequences`, `stream`, `thinking`,
`output_config`, `temperature`/`top_p`/`top_k` (and the other sampling fields), `metadata` (ignored). A final
assistant message is a prefill: the reply continues it and holds only the new text (serve/prompt/prefill.py).

Answer: one `MessageBuilder` turns the event stream into the stream's SSE events *and* the assembled
message, so a streamed and a non-streamed answer carry the same blocks. Stream order: `message_start`,
`ping`, then per block `content_block_start`, `content_block_delta`s (`thinking_delta`, `text_delta`,
`input_json_delta`), `content_block_stop`; then `message_delta` (stop_reason, stop_sequence, usage) and
`message_stop`. Keep-alives are `ping` events.

Public surface: `messages`, `count_tokens`, `parse_messages`, `MessageBuilder`, `error_body`, `stream_error`.
"""
from __future__ import annotations

import contextlib
import json
import re
import secrets

from serve.core.events import (
    BadRequest, ChatRequest, Done, Message, ToolCall, ToolSpec, KIND_CONTENT, KIND_PING, KIND_REASONING,
    KIND_TOOL_ARGS, KIND_TOOL_CALL, KIND_TOOL_START)
from serve.api.wire import SHUTDOWN_TEXT, cut_by_shutdown, error_text, finish_note, model_name
from serve.core.effort import check_budget, normalize_effort
from serve.api.wire import reasoning_fields
from serve.api.fields import model_field
from serve.api.replies import JsonReply, StreamReply, cut
from serve.core.sampling import check_max_tokens, check_request_sampling

# OpenAI-style error types the server uses -> Anthropic's names.
_ERROR_TYPES = {"invalid_request_error": "invalid_request_error", "authentication_error": "authentication_error",
                "forbidden": "permission_error", "permission_error": "permission_error",
                "not_found_error": "not_found_error", "unavailable_error": "overloaded_error",
                "server_error": "api_error"}
_STATUS_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                 503: "overloaded_error"}
# Claude Code puts a billing line with a per-request stamp at the start of its system text; pinning the
# stamp keeps the prompt's start identical from turn to turn, so the conversation cache can reuse it.
_BILLING_STAMP = re.compile(r"^(x-anthropic-billing-header:[^\n]*?\bcch=)([0-9a-fA-F]+)")
NO_VISION = "this model reads text only (no vision encoder is loaded)"


def error_body(status: int, err_type: str, message: str, param=None, code=None) -> dict:
    kind = _ERROR_TYPES.get(err_type) or _STATUS_TYPES.get(status, "api_error")
    if status == 413:
        kind = "request_too_large"
    return {"type": "error", "error": {"type": kind, "message": message}}


def _event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def stream_error(message: str, err_type: str = "api_error") -> str:
    """A stream's final error event (the stream then ends incomplete: serve/api/replies.py `cut`)."""
    return cut(_event("error", {"type": "error", "error": {"type": err_type, "message": message}}))


# ---------------------------------------------------------------- request parsing

def _block_text(block: dict, where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise BadRequest(f"{where}.text: a string", param=where)
    return text


def _system_text(system) -> str | None:
    if system is None:
        return None
    if isinstance(system, str):
        text = system
    elif isinstance(system, list):
        parts = []
        for i, block in enumerate(system):
            if not isinstance(block, dict) or block.get("type") != "text":
                raise BadRequest(f"system[{i}]: a text block {{\"type\": \"text\", \"text\": ...}}", param="system")
            parts.append(_block_text(block, f"system[{i}]"))
        text = "\n\n".join(parts)
    else:
        raise BadRequest("system: a string or a list of text blocks", param="system")
    return _BILLING_STAMP.sub(lambda m: m.group(1) + "f" * len(m.group(2)), text)


def _tool_result_text(content, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content: a string or a list of blocks", param="messages")
    parts = []
    for k, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append(_block_text(block, f"{where}.content[{k}]"))
        elif kind in ("image", "document"):
            parts.append(f"[{kind} omitted: {NO_VISION}]")
        else:
            raise BadRequest(f"{where}.content[{k}].type: text or image, not {kind!r}", param="messages")
    return "\n".join(parts)


def _message(m, i: int) -> list[Message]:
    """One Anthropic message -> internal messages (a user turn's tool results become `tool` messages)."""
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise BadRequest(f"{where}: a message object", param="messages")
    role = m.get("role")
    if role not in ("user", "assistant"):
        raise BadRequest(f"{where}.role: user or assistant, not {role!r} (the system text goes in `system`)",
                         param="messages")
    content = m.get("content")
    if isinstance(content, str):
        return [Message(role, content)]
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content: a string or a list of content blocks", param="messages")
    out: list[Message] = []
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for k, block in enumerate(content):
        at = f"{where}.content[{k}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_block_text(block, at))
        elif kind in ("image", "document"):
            raise BadRequest(f"{at}: {NO_VISION}; send text", param="messages")
        elif kind == "thinking" and role == "assistant":
            if isinstance(block.get("thinking"), str):
                reasoning.append(block["thinking"])
        elif kind == "redacted_thinking" and role == "assistant":
            continue
        elif kind == "tool_use" and role == "assistant":
            name, args = block.get("name"), block.get("input", {})
            if not isinstance(name, str) or not name:
                raise BadRequest(f"{at}.name: a non-empty string", param="messages")
            if not isinstance(args, dict):
                raise BadRequest(f"{at}.input: an object", param="messages")
            calls.append(ToolCall(str(block.get("id") or ""), name, args))
        elif kind == "tool_result" and role == "user":
            text = _tool_result_text(block.get("content"), at)
            if block.get("is_error") and text:
                text = "Error: " + text
            out.append(Message("tool", text, tool_call_id=block.get("tool_use_id")))
        else:
            raise BadRequest(f"{at}.type: {kind!r} is not a {role} content block here", param="messages")
    if role == "assistant":
        out.append(Message("assistant", "".join(texts), reasoning="\n".join(reasoning) or None, tool_calls=calls))
    elif texts or not out:
        out.append(Message("user", "\n\n".join(texts)))
    return out


def _tools(raw) -> list[ToolSpec]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadRequest("tools: a list of tool objects", param="tools")
    out = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
            raise BadRequest(f"tools[{i}].name: a non-empty string", param="tools")
        schema = t.get("input_schema")
        if schema is None and t.get("type") not in (None, "custom"):
            continue   # an Anthropic server tool (web search, ...): nothing here can run it
        if not isinstance(schema, dict):
            raise BadRequest(f"tools[{i}].input_schema: a JSON schema object", param="tools")
        out.append(ToolSpec(t["name"], str(t.get("description") or ""), schema))
    return out


def _tool_choice(raw, req: ChatRequest) -> None:
    """`{"type": "auto" | "any" | "none" | "tool", "name"?, "disable_parallel_tool_use"?}`; a type naming
    nothing known acts as auto (UPSTREAM §5.3; said in the request's notes); not an object is a 400."""
    if raw is None:
        return
    if not isinstance(raw, dict):
        raise BadRequest('tool_choice: {"type": "auto" | "any" | "none" | "tool", ...}', param="tool_choice")
    kind = raw.get("type")
    if kind == "tool":
        if not isinstance(raw.get("name"), str):
            raise BadRequest("tool_choice.name: the tool's name", param="tool_choice")
        req.tool_choice = {"name": raw["name"]}
    elif kind in ("auto", "any", "none"):
        req.tool_choice = {"auto": "auto", "any": "required", "none": "none"}[kind]
    else:
        req.notes.append(f"tool_choice type {str(kind)[:80]!r} names nothing known: acting as auto")
        req.tool_choice = "auto"
    if raw.get("disable_parallel_tool_use") is True:
        req.parallel_tool_calls = False


def _stop_sequences(raw) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise BadRequest("stop_sequences: a list of strings", param="stop_sequences")
    return [s for s in raw if s]


def _prefill(last: Message) -> bool:
    """A final assistant message is a prefill, continued (Anthropic's documented prefill); as Anthropic, its
    text may not end in white space (the reply would start mid-token)."""
    if last.role != "assistant":
        return False
    if last.content and last.content != last.content.rstrip():
        raise BadRequest("messages: final assistant content cannot end with trailing whitespace", param="messages")
    return True


def parse_messages(body: dict, anthropic_thinking: str = "model") -> ChatRequest:
    """An Anthropic Messages body -> the internal `ChatRequest` (api "anthropic")."""
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages: a non-empty list of messages", param="messages")
    messages: list[Message] = []
    system = _system_text(body.get("system"))
    if system is not None:
        messages.append(Message("system", system))
    for i, m in enumerate(raw):
        messages += _message(m, i)
    req = ChatRequest(messages=messages, tools=_tools(body.get("tools")), api="anthropic")
    req.continue_final = _prefill(messages[-1])
    _tool_choice(body.get("tool_choice"), req)
    req.max_new = check_max_tokens(body.get("max_tokens"))
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("stream: true or false", param="stream")
    req.stream = bool(stream)
    req.stop = _stop_sequences(body.get("stop_sequences"))
    req.sampling = check_request_sampling(body)
    req.reasoning_effort = effort_from_anthropic(body, anthropic_thinking)
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        # Anthropic's budget is the thinking budget (checked here too: output_config.effort skips the mapping)
        req.reasoning_budget_tokens = check_budget(thinking.get("budget_tokens"), "thinking.budget_tokens")
    reasoning_fields(body, req)
    req.model = model_field(body)
    req.extra = {k: v for k, v in body.items() if k.startswith("strata_")}
    return req


# ---------------------------------------------------------------- answers

class MessageBuilder:
    """Events -> Anthropic SSE frames, while assembling the same message the non-streamed answer returns.

    stream_args: send a call's arguments as `input_json_delta` pieces while they arrive (default); off, a
    call's block is sent whole when the call is complete. Either way the assembled `content` is the same.
    """

    def __init__(self, message_id: str, model: str, prompt_tokens: int, stream_args: bool = True):
        self.id, self.model, self.prompt_tokens = message_id, model, prompt_tokens
        self.stream_args = stream_args
        self.content: list[dict] = []
        self._open: str | None = None      # kind of the block open in the stream: thinking / text / tool_use
        self._tool_index: int | None = None  # the open tool_use block's call index
        self._tool_blocks: dict[int, int] = {}   # call index -> block index (announced calls)
        self._announced: set[int] = set()        # call indexes whose name was known
        self._finished: set[int] = set()

    def start(self) -> list[str]:
        message = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0}}
        return [_event("message_start", {"type": "message_start", "message": message}),
                _event("ping", {"type": "ping"})]

    def _close(self) -> list[str]:
        if self._open is None:
            return []
        self._open, self._tool_index = None, None
        return [_event("content_block_stop", {"type": "content_block_stop", "index": len(self.content) - 1})]

    def _start_block(self, block: dict) -> list[str]:
        frames = self._close()
        self.content.append(block)
        self._open = block["type"]
        frames.append(_event("content_block_start", {"type": "content_block_start", "index": len(self.content) - 1,
                                                     "content_block": block}))   # serialized now: still empty
        return frames

    def _delta(self, delta: dict) -> str:
        return _event("content_block_delta", {"type": "content_block_delta", "index": len(self.content) - 1,
                                              "delta": delta})

    def feed(self, ev) -> list[str]:
        kind = ev.kind
        if kind == KIND_PING:
            return [_event("ping", {"type": "ping"})]
        if kind in (KIND_REASONING, KIND_CONTENT):
            block_type, field, delta_type = (("thinking", "thinking", "thinking_delta") if kind == KIND_REASONING
                                             else ("text", "text", "text_delta"))
            frames = []
            if self._open != block_type:
                frames += self._start_block({"type": block_type, field: "", **(
                    {"signature": ""} if block_type == "thinking" else {})})
            self.content[-1][field] += ev.text
            frames.append(self._delta({"type": delta_type, field: ev.text}))
            return frames
        if kind == KIND_TOOL_START:
            self._announced.add(ev.index)
            if not self.stream_args:
                return []
            frames = self._start_block({"type": "tool_use", "id": ev.call_id, "name": ev.name, "input": {}})
            self._tool_blocks[ev.index], self._tool_index = len(self.content) - 1, ev.index
            return frames
        if kind == KIND_TOOL_ARGS:
            if not self.stream_args or self._tool_index != ev.index:
                return []
            return [self._delta({"type": "input_json_delta", "partial_json": ev.text})]
        if kind == KIND_TOOL_CALL and ev.call is not None:
            return self._tool_done(ev)
        return []

    def _tool_done(self, ev) -> list[str]:
        call = ev.call
        args = call.arguments if isinstance(call.arguments, dict) else {"arguments": call.arguments}
        self._finished.add(ev.index)
        frames = []
        if ev.index not in self._tool_blocks:     # not streamed (stream_args off, or seen only whole)
            frames += self._start_block({"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
            self._tool_blocks[ev.index] = len(self.content) - 1
            frames.append(self._delta({"type": "input_json_delta",
                                       "partial_json": json.dumps(args, ensure_ascii=False)}))
        self.content[self._tool_blocks[ev.index]]["input"] = args
        if self._tool_index == ev.index:
            frames += self._close()
        return frames

    def finish(self, done: Done) -> list[str]:
        """Close the open block, then `message_delta` and `message_stop`."""
        frames = self._close()
        message = self.message(done)
        frames.append(_event("message_delta", {"type": "message_delta", "delta": {
            "stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
            "usage": message["usage"], **finish_note(done)}))
        frames.append(_event("message_stop", {"type": "message_stop"}))
        return frames

    def stop_reason(self, done: Done) -> str:
        if done.stop_sequence:
            return "stop_sequence"
        all_done = self._announced <= self._finished
        if self._finished and all_done and done.finish in ("stop", "tool_calls"):
            return "tool_use"
        return "max_tokens" if done.finish == "length" else "end_turn"

    def message(self, done: Done) -> dict:
        """The assembled message (the non-streamed answer). Unfinished calls are left out."""
        content = [b for i, b in enumerate(self.content)
                   if b["type"] != "tool_use" or i in {self._tool_blocks[k] for k in self._finished}]
        reused = min(done.cached_tokens or 0, max(done.prompt_tokens - 1, 0))
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": self.stop_reason(done),
                "stop_sequence": done.stop_sequence if done.stop_sequence else None,
                "usage": {"input_tokens": done.prompt_tokens - reused, "cache_read_input_tokens": reused,
                          "cache_creation_input_tokens": 0, "output_tokens": done.completion_tokens},
                **finish_note(done)}


def _builder(service, req: ChatRequest, prep) -> MessageBuilder:
    stream_args = req.extra.get("strata_stream_tool_args", True) is not False
    return MessageBuilder("msg_" + secrets.token_hex(12), model_name(service, req), prep.prompt_tokens,
                          stream_args=stream_args)


def messages(service, body: dict, ctx):
    req = parse_messages(body, service.config.get("anthropic_thinking", "model"))
    if not req.max_new:  # Anthropic requires a positive max_tokens (count_tokens takes none)
        raise BadRequest(f"max_tokens: required, a positive integer (not {body.get('max_tokens')!r})",
                         param="max_tokens")
    prep = service.prepare(req)
    builder = _builder(service, req, prep)
    if req.stream:
        return StreamReply(_stream(service, prep, ctx, builder))
    done = None
    with contextlib.closing(service.run(prep, ctx.cancelled, ctx.on_wait)) as events:
        for ev in events:
            if isinstance(ev, Done):
                done = ev
            else:
                builder.feed(ev)
    builder.finish(done)
    return JsonReply(200, builder.message(done))


def _stream(service, prep, ctx, builder: MessageBuilder):
    yield from builder.start()
    done = None
    try:
        with contextlib.closing(service.run(prep, ctx.cancelled, ctx.on_wait)) as events:
            for ev in events:
                if isinstance(ev, Done):
                    done = ev
                else:
                    yield from builder.feed(ev)
    except Exception as e:  # after the headers: a final error event ends the stream
        yield stream_error(error_text(service, e))
        return
    if cut_by_shutdown(ctx, done):
        yield stream_error(SHUTDOWN_TEXT, "overloaded_error")
        return
    yield from builder.finish(done)


def count_tokens(service, body: dict, ctx) -> JsonReply:
    """`{"input_tokens": N}`: the prompt length this request would have; the model does not run."""
    req = parse_messages(body, service.config.get("anthropic_thinking", "model"))
    return JsonReply(200, {"input_tokens": service.count_tokens(req)})


def effort_from_anthropic(body: dict, mode: str = "model") -> str | None:
    """The effort an Anthropic body asks for, or None (template default).

    `thinking.type: disabled` -> none; `output_config.effort`; else `thinking.budget_tokens` < 2048 low,
    < 8192 medium, else high. No `thinking` field: the template default, or "none" when the config's
    `anthropic_thinking` is "on_request".
    """
    thinking = body.get("thinking")
    if thinking is not None and not isinstance(thinking, dict):
        raise BadRequest("`thinking` must be an object like {\"type\": \"enabled\", \"budget_tokens\": 4096}",
                         param="thinking")
    output_config = body.get("output_config")
    if output_config is not None and not isinstance(output_config, dict):
        raise BadRequest("`output_config` must be an object", param="output_config")
    if thinking is not None:
        kind = thinking.get("type")
        if kind not in ("enabled", "disabled", "adaptive", None):
            raise BadRequest(f"`thinking.type` must be \"enabled\" or \"disabled\", not {kind!r}",
                             param="thinking.type")
        if kind == "disabled":
            return "none"
    level = normalize_effort((output_config or {}).get("effort"), "output_config.effort")
    if level is not None:
        return level
    if thinking is not None:
        budget = check_budget(thinking.get("budget_tokens"), "thinking.budget_tokens")
        if budget is None:
            return None
        return "low" if budget < 2048 else "medium" if budget < 8192 else "high"
    return "none" if mode == "on_request" else None

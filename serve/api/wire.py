"""The neutral wire: what every dialect's translator reads from a body and writes to a stream alike.

Role: the shared parsing helpers of the translators in serve/api/ (a content part list to text, a tool list,
a tool choice, a boolean field, `stop`, the effort fields of an OpenAI-style body) and the shared stream
pieces (one SSE event, the keep-alive comment, the shutdown text and its test). No translator imports another
translator's privates: what two of them need lives here, under a public name. Knows no HTTP server and no
engine: it reads dicts and writes text.

Public surface: `text_of(content, where)`, `bool_field(body, name, default)`, `parse_tools(raw)`,
`parse_tool_choice(choice, notes)`, `check_stop(value)`, `STOP_STRINGS_MAX`, `effort_from_openai(body)`,
`reasoning_fields(body, req)`, `model_name(service, req)`, `error_text(service, e)`, `cut_by_shutdown(ctx,
done)`, `continue_final(body, messages)`, `finish_note(done)`, `sse(obj)`, `KEEP_ALIVE`, `SHUTDOWN_TEXT`.
"""
from __future__ import annotations

import json

from serve.core.effort import check_budget, normalize_effort
from serve.core.errors import bug_text, client_error, log_bug, public_text
from serve.core.events import FINISH_LOOP, BadRequest, ToolSpec


def effort_from_openai(body: dict) -> str | None:
    """The effort an OpenAI-style body asks for, or None when it names none.

    Sources: `reasoning_effort`, `reasoning.effort`, `chat_template_kwargs.reasoning_effort` and
    `chat_template_kwargs.enable_thinking` (false wins over every other source).
    """
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise BadRequest("`chat_template_kwargs` must be an object", param="chat_template_kwargs")
    kwargs = kwargs or {}
    enable = kwargs.get("enable_thinking")
    if enable is not None and not isinstance(enable, bool):
        raise BadRequest("`chat_template_kwargs.enable_thinking` must be true or false",
                         param="chat_template_kwargs.enable_thinking")
    found = None
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise BadRequest("`reasoning` must be an object like {\"effort\": \"low\"}", param="reasoning")
    for field, value in (("reasoning_effort", body.get("reasoning_effort")),
                         ("reasoning.effort", (reasoning or {}).get("effort")),
                         ("chat_template_kwargs.reasoning_effort", kwargs.get("reasoning_effort"))):
        level = normalize_effort(value, field)
        if level is not None and found is None:
            found = level
    return "none" if enable is False else found


def reasoning_fields(body: dict, req) -> None:
    """Strata's reasoning extensions, on either API, onto a ChatRequest: `reasoning_budget_tokens`
    (integer >= 0; 0 = none), `answer_room` and `reasoning_close_retry` (booleans)."""
    budget = check_budget(body.get("reasoning_budget_tokens"))
    if budget is not None:
        req.reasoning_budget_tokens = budget
    for name in ("answer_room", "reasoning_close_retry"):
        value = body.get(name)
        if value is not None:
            if not isinstance(value, bool):
                raise BadRequest(f"`{name}`: true or false", param=name)
            setattr(req, name, value)


KEEP_ALIVE = ": keep-alive\n\n"


SHUTDOWN_TEXT = "the server is shutting down; the answer was cut short"


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


# ---------------------------------------------------------------- request parsing
def text_of(content, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                out.append(part)
                continue
            if not isinstance(part, dict):
                raise BadRequest(f"{where}[{i}]: a content part object", param=where)
            kind = part.get("type")
            if kind in ("text", "input_text", "output_text"):
                if not isinstance(part.get("text"), str):
                    raise BadRequest(f"{where}[{i}].text: a string", param=where)
                out.append(part["text"])
            elif kind in ("image_url", "input_image", "image"):
                raise BadRequest(f"{where}[{i}]: this model reads text only (no images)", param=where)
            else:
                raise BadRequest(f"{where}[{i}].type: unknown content part type {kind!r}", param=where)
        return "".join(out)
    raise BadRequest(f"{where}: a string or a list of content parts", param=where)


def bool_field(body: dict, name: str, default=False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"{name}: true or false", param=name)
    return value


def parse_tools(raw) -> list[ToolSpec]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadRequest("tools: a list of tool objects", param="tools")
    out = []
    for i, t in enumerate(raw):
        fn = t.get("function", t) if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRequest(f"tools[{i}].function.name: a non-empty string", param="tools")
        params = fn.get("parameters") or {}
        if not isinstance(params, dict):
            raise BadRequest(f"tools[{i}].function.parameters: a JSON schema object", param="tools")
        out.append(ToolSpec(fn["name"], str(fn.get("description") or ""), params))
    return out


def parse_tool_choice(choice, notes: list) -> str | dict:
    """auto | none | required | {"type": "function", "function": {"name": ...}} (or {"name": ...}).

    A string or object naming nothing known acts as auto (UPSTREAM §5.3; said in the request's notes); any
    other type is a 400."""
    if choice is None:
        return "auto"
    if isinstance(choice, dict):
        fn = choice.get("function") if isinstance(choice.get("function"), dict) else choice
        if isinstance(fn.get("name"), str):
            return {"name": fn["name"]}
        if choice.get("type") in ("auto", "none", "required"):
            return choice["type"]
    elif isinstance(choice, str):
        if choice in ("auto", "none", "required"):
            return choice
    else:
        raise BadRequest(f"tool_choice: \"auto\", \"none\", \"required\" or {{\"type\": \"function\", "
                         f"\"function\": {{\"name\": ...}}}}, not {choice!r}", param="tool_choice")
    notes.append(f"tool_choice {str(choice)[:80]!r} names nothing known: acting as auto")
    return "auto"


def model_name(service, req) -> str:
    aliases = service.config.get("aliases") or []
    return req.model if req.model and req.model in aliases else service.model_name


def cut_by_shutdown(ctx, done) -> bool:
    """The reply ended because the server is shutting down (or never got its end): the stream ends with the
    shutdown error event, never a normal finish."""
    return done is None or (ctx.shutting_down() and done.finish == "cancel")


def error_text(service, e) -> str:
    """The text of a failure after the headers, as a client may see it: a StrataError's message (Service.run
    raised a service error, death note included: the engine log's tail and local paths go to the server log);
    anything else is a bug: "internal error (TypeName)", its traceback in the server log (serve/core/errors.py)."""
    err = client_error(e)
    if err is None:
        log_bug(e, "a reply after its headers")
        return bug_text(e)
    return public_text(err.message or type(e).__name__)


def continue_final(body: dict, messages: list) -> bool:
    """Whether the final assistant message is continued (prefill, serve/prompt/prefill.py): vLLM's
    `continue_final_message: true` or `add_generation_prompt: false` ask for it (and need that message);
    `continue_final_message: false` or `add_generation_prompt: true` ask for a new turn; neither given, a
    trailing assistant message is continued, as llama-server does. Read by the chat and Responses routes."""
    cont = body.get("continue_final_message")
    gen = body.get("add_generation_prompt")
    cont = None if cont is None else bool_field(body, "continue_final_message")
    gen = None if gen is None else bool_field(body, "add_generation_prompt")
    last_assistant = messages[-1].role == "assistant"
    if cont and gen:
        raise BadRequest("continue_final_message and add_generation_prompt: not both true (continuing the final "
                         "message adds no new turn)", param="continue_final_message")
    if cont or gen is False:
        if not last_assistant:
            name = "continue_final_message" if cont else "add_generation_prompt"
            raise BadRequest(f"{name}: continuing needs an assistant message at the end of messages",
                             param=name)
        return True
    return last_assistant and cont is None and gen is None


def finish_note(done) -> dict:
    """Strata's field beside a dialect's finish reason: `strata_finish: "loop_guard"` when the loop guard
    ended the reply (the dialect's reason then says stop: the reply is whole, a constrained one parses), else
    nothing."""
    return {"strata_finish": "loop_guard"} if done is not None and done.finish == FINISH_LOOP else {}


STOP_STRINGS_MAX = 4       # OpenAI allows at most 4 stop strings


def check_stop(value) -> list[str]:
    """OpenAI `stop`: a string or a list of at most 4 strings; empty strings are dropped."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise BadRequest("stop: a string or a list of strings", param="stop")
    if len(value) > STOP_STRINGS_MAX:
        raise BadRequest(f"stop: at most {STOP_STRINGS_MAX} strings", param="stop")
    return [s for s in value if s]

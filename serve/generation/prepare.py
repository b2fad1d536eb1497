"""Preparing a request: from one internal request to the token ids and engine keys a run needs, before anything
is sent (a part of `Service`, serve/generation/service.py).

Role: render the chat template (effort, thinking, a forced call's opening and grammar), encode with the
Service's `PromptEncoder`, apply the context rule (requests are never truncated: a prompt or a limit over the
context is a 400 with llama-server's figures beside it; `fit_max_tokens` in the run config fits the limit
instead), and merge sampling (model card -> config -> shared settings -> request) into the engine keys, a
grammar's `grammar=` key and the log-probability keys included. Errors are `BadRequest` / `ServiceUnavailable`
(serve/core/errors.py), raised before the reply starts.

`Preparation` holds no state of its own: it reads the Service's `engine`, `tok`, `template`, `encoder`,
`config`, `arch`, `shutting_down`, `_breaker_cache`, `_settings()`, `effort(req)`, `service_error(e)` and
`ensure_engine()`, set or defined in serve/generation/service.py.

Public surface: `Prepared`, `Preparation` (a base of `Service`: `prepare(req)`, `render_chat(req, effort)`,
`encode_chat(req, store)`, `forced_opening(req)`, `count_tokens(req)`, `default_max_tokens()`).
"""
from __future__ import annotations

from dataclasses import dataclass

from serve.core import sampling as sampling_mod
from serve.core.errors import ServiceUnavailable
from serve.core.events import BadRequest, ChatRequest, CompletionRequest
from serve.engine_client.protocol import CTX_SLACK
from serve.generation.constrain import GRAMMAR_INFO_KEY, auto_tools_grammar, forced_call, grammar_key
from serve.generation.logprobs import engine_keys
from serve.generation.passes import encode_written
from serve.prompt.prefill import render_continued
from serve.prompt.tool_text import forced_opening


@dataclass
class Prepared:
    req: ChatRequest | CompletionRequest
    ids: list[int]
    max_new: int
    keys: str
    thinking: bool = False
    chat: bool = True
    forced_opening: str | None = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.ids)


def _over(n_prompt: int, n_ctx: int) -> dict:
    """The error figures llama-server puts beside a context refusal (its clients read them)."""
    return {"type": "exceed_context_size_error", "n_prompt_tokens": n_prompt, "n_ctx": n_ctx}


def _empty(message) -> bool:
    return not (message.content or message.reasoning or message.tool_calls)


class Preparation:
    """The preparing half of a Service (see the module docstring for the fields it uses)."""

    def _context(self) -> int:
        ctx = self.engine.max_context or self.engine.known_ctx
        if not ctx:
            raise ServiceUnavailable("the engine is starting (a minute or two); try again shortly")
        return ctx

    def render_chat(self, req: ChatRequest, effort: str | None = None):
        """The chat's prompt text (`Rendered`) for the request's effort (else the settings' and config's)."""
        effort = effort or self.effort(req)
        thinking = None if effort is None else effort != "none"
        if req.tools and req.tool_choice != "none" and getattr(self.template, "tool_format", "xml") is None:
            raise BadRequest(f"tools: Strata does not read tool calls in the format of this model's "
                             f"{getattr(self.template, 'family', '')} chat template yet; send the request "
                             "without tools", param="tools")
        if req.tools and getattr(self.template, "call_syntax", None) and (
                req.tool_choice not in ("auto", "none") or req.strict_tools):
            raise BadRequest(f"tool_choice: with this model's {self.template.family} tool-call format Strata offers "
                             "tool_choice auto (or none), without strict tools; a forced or strict call is not "
                             "available yet", param="tool_choice")
        if req.continue_final and _empty(req.messages[-1]):  # nothing to continue: a new turn
            req.messages, req.continue_final = req.messages[:-1], False
        if req.continue_final:
            return self._render_continued(req, effort)
        if req.strict_tools and req.tools and req.tool_choice == "auto" and req.grammar is None:
            req.grammar = auto_tools_grammar(req.tools, getattr(self.template, "tool_format", "xml"),
                                             req.parallel_tool_calls)
        if req.grammar is not None:
            thinking = False  # the grammar starts at the reply's first token
        return self.template.render(req.messages, req.tools if req.tool_choice != "none" else [],
                                    thinking=thinking, effort=effort)

    def _render_continued(self, req: ChatRequest, effort: str | None):
        """A prefill: the final assistant message continued (serve/prompt/prefill.py). A grammar or a forced call
        starts at the reply's first token, which a continued message is past: both are a 400."""
        fmt = getattr(self.template, "tool_format", "xml")
        tools = req.tools if req.tool_choice != "none" else []
        if req.grammar is not None or (req.strict_tools and tools) or forced_opening(req.tool_choice, tools, fmt):
            raise BadRequest("messages: a final assistant message is continued here (prefill), and a continued "
                             "message cannot also follow a response format, strict tools or a forced tool call; "
                             "send one or the other", param="messages")
        return render_continued(self.template, req.messages, tools, effort)

    def encode_chat(self, req: ChatRequest, store: bool = True) -> tuple[list[int], bool]:
        rendered = self.render_chat(req)
        ids = self.encoder.encode(rendered.text, plain=rendered.plain, store=store)
        # a forced call with thinking off follows its tool's schema (serve/generation/constrain.py)
        req.constrained_call = None if rendered.thinking or req.tool_choice == "none" else forced_call(
            req.tool_choice, req.tools, getattr(self.template, "tool_format", "xml"))
        opening = None if rendered.thinking else self.forced_opening(req)
        if opening:  # a forced call with thinking off: the opening ends the prompt (UPSTREAM §5.3)
            ids = ids + encode_written(self.tok, opening)
        return ids, rendered.thinking

    def forced_opening(self, req: ChatRequest) -> str | None:
        """The forced call opening for `tool_choice` required/named, else None. With thinking on the run
        writes it once the model has left its thinking (serve/generation/passes.py)."""
        if getattr(req, "constrained_call", None):
            return req.constrained_call[0]
        return forced_opening(req.tool_choice, req.tools, getattr(self.template, "tool_format", "xml"))

    def count_tokens(self, req: ChatRequest) -> int:
        return len(self.encode_chat(req, store=False)[0])

    def prepare(self, req) -> Prepared:
        try:
            return self._prepare(req)
        except Exception as e:
            raise self.service_error(e) from None

    def _prepare(self, req) -> Prepared:
        if self.shutting_down.is_set():
            raise ServiceUnavailable("the server is shutting down")
        if isinstance(req, CompletionRequest):
            if req.ids is None and (not isinstance(req.prompt, str) or not req.prompt):
                raise BadRequest("prompt: a non-empty string", param="prompt")
            if req.ids is not None:
                ids = list(req.ids)
            else:
                ids = self.tok.encode(req.prompt, parse_special=True)
                bos = self.tok.special_ids.get("bos")
                if self.tok.add_bos and bos is not None and ids[:1] != [bos]:  # a model that wants <bos> (Gemma)
                    ids = [bos] + ids
            thinking, chat = False, False
        else:
            (ids, thinking), chat = self.encode_chat(req), True
        if not ids:
            raise BadRequest("the prompt is empty", param="messages" if chat else "prompt")
        ctx = self._context()
        room = ctx - CTX_SLACK - len(ids)
        max_new = req.max_new
        if not max_new:  # no limit of its own (absent, 0 or -1): the shared settings' cap, else the run's
            cap = self.default_max_tokens()
            if room < 1:
                raise BadRequest(f"request exceeds the available context size: prompt ({len(ids)} tokens) "
                                 f"leaves no room to answer in the context ({ctx}); requests are never truncated",
                                 param="messages", code="context_length_exceeded", extra=_over(len(ids), ctx))
            max_new = min(cap, room)
        elif max_new > room:
            if self.config.get("fit_max_tokens") and room >= 1:
                max_new = room
            else:
                raise BadRequest(
                    f"request exceeds the available context size: prompt ({len(ids)} tokens) + max tokens "
                    f"({max_new}) exceeds the context ({ctx}); requests are never truncated. Send a smaller "
                    f"max_tokens (at most {max(room, 0)} here)", param="max_tokens", code="context_length_exceeded",
                    extra=_over(len(ids), ctx))
        keys = self._engine_keys(req, thinking)
        self.ensure_engine()
        return Prepared(req, ids, max_new, keys, thinking=thinking, chat=chat,
                        forced_opening=self.forced_opening(req) if chat else None)

    def default_max_tokens(self) -> int:
        """The cap of a reply that names no limit: the shared settings' `max_tokens`, else the run config's
        `default_max_tokens` (sampling.DEFAULT_MAX_TOKENS). Never the end of the context."""
        cap = self._settings().get("max_tokens")
        return int(cap or self.config.get("default_max_tokens") or sampling_mod.DEFAULT_MAX_TOKENS)

    def _engine_keys(self, req, thinking) -> str:
        """Sampling merged model card -> config `sampling` -> shared settings -> request (0 stays greedy)."""
        card = sampling_mod.card_sampling(self.arch, thinking)
        merged = sampling_mod.merge_sampling(card, self.config.get("sampling"), self._settings(), req.sampling)
        if merged.get("dry_multiplier"):
            merged["dry_breaker_ids"] = self._breaker_ids(
                tuple(merged.get("dry_sequence_breakers") or sampling_mod.DRY_BREAKERS_DEFAULT))
        keys = sampling_mod.engine_keys(merged)
        call = getattr(req, "constrained_call", None)
        grammar = req.grammar if req.grammar is not None else (call[1] if call else None)
        if grammar is not None:
            info = getattr(self.engine, "info", None) or {}
            if info and str(info.get(GRAMMAR_INFO_KEY)) != "1":
                raise BadRequest("structured output: this engine cannot apply grammars (INFO grammar=1 missing)",
                                 param="response_format")
            keys.append(grammar_key(grammar))
        return " ".join(keys + engine_keys(req))

    def _breaker_ids(self, breakers: tuple[str, ...]) -> tuple[int, ...]:
        """DRY's breaker strings as token ids (sampling.dry_breaker_ids), once per set."""
        if breakers not in self._breaker_cache:
            self._breaker_cache[breakers] = sampling_mod.dry_breaker_ids(self.tok, breakers)
        return self._breaker_cache[breakers]

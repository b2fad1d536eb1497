"""The one internal request and the one event stream that every HTTP API translates to and from.

Role: `serve/api/openai.py` and `serve/api/anthropic.py` are translators. Each turns its wire request into one
`ChatRequest` (or `CompletionRequest` for raw text), hands it to `Service.run(...)`, and turns the
`Event`s that come back into its own wire format (JSON body or SSE chunks). Nothing in this module knows
HTTP, pipes or token ids.

Public surface: `Message`, `ToolSpec`, `ChatRequest`, `CompletionRequest`, `Event`, `Done`,
`ProgressFeed` (prompt-progress reports from pings), `BadRequest` (bad client input: a `StrataError`,
serve/core/errors.py, that the HTTP boundary turns into a 400 with a message that says what to change, in the
caller's API's error shape), and the event `KIND_*` names.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from serve.core.errors import StrataError


class BadRequest(StrataError, ValueError):
    """Client input that cannot be served as sent. `param` names the field when there is one; `status` is 400,
    or 413 for bodies/prompts over a limit; `extra`: more keys for the error object (llama-server's figures),
    "type" included."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None, extra: dict | None = None):
        super().__init__(message, param=param, code=code, status=status, extra=extra)


@dataclass
class ToolCall:
    """A tool call in the history (assistant turn) or produced by the model."""
    id: str
    name: str
    arguments: dict | str  # parsed JSON object; a string only when the model wrote unparsable arguments


@dataclass
class Message:
    """One chat turn, already normalised by the translator.

    role: "system" | "user" | "assistant" | "tool".
    content: plain text (multi-part text content is joined by the translator; images are refused there).
    reasoning: an assistant turn's earlier thinking text, when the client sent it back.
    tool_calls: an assistant turn's calls. tool_call_id / name: a tool result's call id and tool name.
    """
    role: str
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None


@dataclass
class ToolSpec:
    name: str
    description: str = ""
    parameters: dict = field(default_factory=dict)  # JSON schema of the arguments object


@dataclass
class Sampling:
    """Request sampling fields; None = not set by the request (the merge order fills it)."""
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    penalty_last_n: int | None = None
    seed: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    # the engine's further samplers (engine/sampler.h; llama-server's and Ollama's names)
    typical_p: float | None = None
    top_n_sigma: float | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: tuple[str, ...] | None = None


@dataclass
class ChatRequest:
    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=list)
    tool_choice: str | dict = "auto"   # "auto" | "none" | "required" | {"name": NAME}
    parallel_tool_calls: bool = True
    max_new: int | None = None         # None or <= 0: the rest of the context
    sampling: Sampling = field(default_factory=Sampling)
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    reasoning_effort: str | None = None          # normalised: "none" | "low" | "medium" | "high" | None
    reasoning_budget_tokens: int | None = None
    answer_room: bool = True
    reasoning_close_retry: bool = False
    model: str | None = None
    api: str = "openai"                # "openai" | "anthropic" | "responses" | "ollama": logs, history, call ids
    extra: dict[str, Any] = field(default_factory=dict)  # strata_* extensions, passed through
    notes: list[str] = field(default_factory=list)       # what the translator let pass (kept in the history)
    grammar: str | None = None         # GBNF the reply must follow (serve/generation/constrain.py): response_format, ...
    strict_tools: bool = False         # OpenAI tools with strict: true (their calls follow their schemas)
    constrained_call: tuple[str, str] | None = None  # a forced call's (opening, grammar of the rest), set by
                                                     # Service.encode_chat when the call can be constrained
    logprobs: int | None = None        # top alternatives per token when log-probabilities are asked (serve/generation/logprobs.py)
    n: int = 1                         # choices of this prompt (serve/generation/choices.py)
    continue_final: bool = False       # the last message is an assistant's to go on writing (prefill,
                                       # serve/prompt/prefill.py); the reply holds only the new text


@dataclass
class CompletionRequest:
    """/v1/completions: raw prompt text, no template."""
    prompt: str
    max_new: int | None = None
    sampling: Sampling = field(default_factory=Sampling)
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    echo: bool = False
    model: str | None = None
    grammar: str | None = None         # GBNF the completion must follow (serve/generation/constrain.py)
    ids: list[int] | None = None       # the prompt as token ids (llama.cpp's routes); then `prompt` is their text
    logprobs: int | None = None        # top alternatives per token when log-probabilities are asked (serve/generation/logprobs.py)
    logprobs_post: bool = False        # llama.cpp post_sampling_probs: the draw's own distribution (lp_post=1)
    n: int = 1                         # choices of this prompt (serve/generation/choices.py)


KIND_PING = "ping"            # nothing to say yet (a long prompt is being read): send a keep-alive;
                              # `progress` then says how far the prompt read is, when the engine told
KIND_CONTENT = "content"      # text: answer text
KIND_REASONING = "reasoning"  # text: thinking text
KIND_TOOL_START = "tool_start"  # index, call_id, name: a call's name is known
KIND_TOOL_ARGS = "tool_args"  # index, text: a piece of the arguments' JSON text (pieces concatenate)
KIND_TOOL_CALL = "tool_call"  # index, call: the finished call (ToolCall)


@dataclass
class Event:
    kind: str
    text: str = ""
    index: int = 0
    call_id: str = ""
    name: str = ""
    call: ToolCall | None = None
    # a ping's prompt read: {total, cache, processed, time_ms} (llama-server's prompt_progress names), or None
    progress: dict | None = None
    ids: list[int] = field(default_factory=list)  # content: the engine's token ids that made this text
    # content: the log-probabilities of the tokens whose text this event carries, when the request asked
    # (serve/generation/logprobs.py Trail entries), else None
    logprobs: list | None = None


FINISH_LOOP = "loop"           # Done.finish when the loop guard ended the reply (serve/generation/guards.py)


@dataclass
class Done:
    """The last thing a run yields.

    finish: "stop" | "length" | "cancel" | "tool_calls" | "loop" (the translator maps it to its API's names;
    "loop": the loop guard ended a reply that repeated itself, a constrained one closed so it still parses:
    the wire's own reason says stop, and `strata_finish: "loop_guard"` beside it, serve/api/wire.py).
    Figures the engine never reported are None, never 0. completion_tokens: the reply's tokens over every
    engine pass, the ones the server wrote between passes included (a thinking wrap-up, a forced call's
    opening); reasoning_tokens: those of them written while the reply was in its thinking.
    """
    finish: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None
    reasoning_tokens: int = 0
    stop_sequence: str | None = None
    timings: dict = field(default_factory=dict)  # llama.cpp names: prompt_n, prompt_ms, predicted_n, ...
    ids: list[int] = field(default_factory=list)  # the engine's token ids of the reply (llama.cpp's `tokens`)


class ProgressFeed:
    """Pings' `progress` -> the prompt_progress reports a stream shows (llama-server's rules): the first report
    has `processed == cache` (the read starts where the reused prefix ends), then one per step forward; a
    ping that says nothing new gives none."""

    def __init__(self):
        self.last: dict | None = None

    def feed(self, progress: dict | None) -> list[dict]:
        if not progress:
            return []
        out = []
        if self.last is None:
            out.append({**progress, "processed": progress["cache"], "time_ms": 0})
        if progress["processed"] > (out or [self.last])[-1]["processed"]:
            out.append(dict(progress))
        if out:
            self.last = out[-1]
        return out


class LiveTimings:
    """llama-server's `timings_per_token`: a streaming reply's running figures, taken where its tokens reach the
    server (prompt_ms: the request's start to its first token; predicted_ms: the first token to now). The
    reply's last event carries the engine's own figures (`Done.timings`)."""

    def __init__(self, prompt_n: int, clock=time.monotonic):
        self.clock, self.t0, self.first = clock, clock(), None
        self.prompt_n, self.n = prompt_n, 0

    def token(self, n: int = 1) -> dict:
        now = self.clock()
        self.first = now if self.first is None else self.first
        self.n += n
        pm, dm = (self.first - self.t0) * 1e3, (now - self.first) * 1e3
        return {"prompt_n": self.prompt_n, "prompt_ms": pm,
                "prompt_per_second": 1e3 * self.prompt_n / pm if pm > 0 else 0.0,
                "predicted_n": self.n, "predicted_ms": dm,
                "predicted_per_second": 1e3 * (self.n - 1) / dm if dm > 0 else 0.0}  # steps after the first

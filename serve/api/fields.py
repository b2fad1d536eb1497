"""The request fields the dialects share, read once at the edge: wire values -> the internal request's values.

Role: each translator in serve/api/ reads its body here into its `ChatRequest` / `CompletionRequest`
(serve/core/events.py); the generation modules (choices, logprobs, constrain, json_schema) then take that
request and its typed values, never the body. Every reader raises a `BadRequest` naming the field and what
to send instead. Knows no HTTP server and no engine.

- `n` (choices of one prompt, at most CHOICES_MAX) and vLLM's `best_of` (refused unless it equals n).
- Log-probabilities: OpenAI chat's `logprobs` / `top_logprobs`, legacy completions' `logprobs` k,
  llama.cpp's `n_probs` / `post_sampling_probs`, Responses' `include` / `top_logprobs` -> the K to ask the
  engine for (serve/generation/logprobs.py), or None.
- Structured output on OpenAI routes: `response_format`, llama.cpp's `json_schema` and `grammar`, vLLM's
  `guided_json` / `guided_choice` / `guided_regex` / `guided_grammar` / `structured_outputs` -> one GBNF text (schemas compile
  through serve/generation/constrain.py `schema_ask`, regexes through serve/generation/regex_grammar.py);
  tools' `strict`.
- Fields Strata does not implement (`suffix`, llama-server's dynamic temperature and tail-free sampling,
  vLLM's beam search, min_tokens, token-id lists, ...): a 400 naming them when set to anything but their
  default, never accepted and ignored.
- `model`: a string or absent.

Public surface: `check_n(body, name)`, `check_best_of(body, n)`, `chat_logprobs(body)`,
`completions_logprobs(body)`, `llama_n_probs(body, post_ok)`, `responses_logprobs(body)`,
`openai_grammar(body)`, `strict_requested(raw_tools)`, `refuse_unsupported(body, fields)`,
`model_field(body, required)`, `ban_eos(body, sampling, stop_ids)`, `SAMPLER_FIELDS_REFUSED`, `VLLM_FIELDS_REFUSED`, `RESPONSES_INCLUDE`,
`GRAMMAR_TEXT_MAX_BYTES`.
"""
from __future__ import annotations

import json

from serve.core.events import BadRequest
from serve.generation.choices import CHOICES_MAX
from serve.generation.constrain import schema_ask
from serve.generation.json_schema import ANY_OBJECT_GRAMMAR, gbnf_literal
from serve.generation.logprobs import LOGPROBS_TOP_MAX
from serve.generation.regex_grammar import RegexError, regex_grammar

GRAMMAR_TEXT_MAX_BYTES = 1 << 20   # a GBNF text a client may send (the engine parses it once per request)
RESPONSES_INCLUDE = "message.output_text.logprobs"

# Output fields Strata does not implement; each is a 400 naming it unless it asks for the default.
# name -> (the values that ask for nothing, what to say)
_UNSUPPORTED = {
    "suffix": ((None, ""), "suffix (insertion) is not supported"),
    # llama-server's samplers the engine does not have (engine/sampler.h has the others)
    "dynatemp_range": ((None, 0, 0.0), "dynamic temperature is not implemented (0 = off)"),
    "dynatemp_exponent": ((None, 1, 1.0), "dynamic temperature is not implemented (1 = off)"),
    "tfs_z": ((None, 1, 1.0), "tail-free sampling is not implemented (1 = off; llama.cpp removed it too)"),
    # vLLM's sampling parameters beyond OpenAI's
    "min_tokens": ((None, 0), "min_tokens is not implemented (0 = off)"),
    "use_beam_search": ((None, False), "beam search is not implemented"),
    "length_penalty": ((None, 1, 1.0), "length_penalty (beam search) is not implemented"),
    "allowed_token_ids": ((None,), "allowed_token_ids is not implemented; logit_bias can ban tokens"),
    "bad_words": ((None, []), "bad_words is not implemented; logit_bias can ban tokens"),
    "stop_token_ids": ((None, []), "stop_token_ids is not implemented; use stop strings"),
    "prompt_logprobs": ((None,), "prompt_logprobs is not implemented"),
}
SAMPLER_FIELDS_REFUSED = ("dynatemp_range", "dynatemp_exponent", "tfs_z")   # every sampling route refuses these
VLLM_FIELDS_REFUSED = ("min_tokens", "use_beam_search", "length_penalty", "allowed_token_ids", "bad_words",
                       "stop_token_ids", "prompt_logprobs")   # and the OpenAI routes these


# ---------------------------------------------------------------- choices
def check_n(body: dict, name: str = "n") -> int:
    value = body.get(name)
    if value is None:
        return 1
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= CHOICES_MAX:
        raise BadRequest(f"{name}: an integer from 1 to {CHOICES_MAX} (choices of one prompt; at most the "
                         f"engine's most lanes)", param=name)
    return value


def check_best_of(body: dict, n: int) -> None:
    """best_of (server-side candidates ranked by log-probability, only the best returned) is not offered;
    best_of equal to n asks for nothing more than n."""
    value = body.get("best_of")
    if value is not None and value != n or isinstance(value, bool):
        raise BadRequest("best_of: not supported (every choice generated is returned); use n", param="best_of")


# ---------------------------------------------------------------- log-probabilities
def _count(body: dict, name: str, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise BadRequest(f"{name}: an integer from {lo} to {hi}", param=name)
    return value


def chat_logprobs(body: dict) -> int | None:
    """OpenAI chat (and Ollama): `logprobs` true|false, `top_logprobs` 0..20 (only with logprobs true)."""
    on = body.get("logprobs")
    if on is not None and not isinstance(on, bool):
        raise BadRequest("logprobs: true or false", param="logprobs")
    top = _count(body, "top_logprobs", 0, LOGPROBS_TOP_MAX)
    if top is not None and not on:
        raise BadRequest("top_logprobs: needs logprobs: true", param="top_logprobs")
    return (top or 0) if on else None


def completions_logprobs(body: dict) -> int | None:
    """OpenAI completions (legacy): `logprobs` k, 0..20 alternatives per token (OpenAI allows 5)."""
    return _count(body, "logprobs", 0, LOGPROBS_TOP_MAX)


def llama_n_probs(body: dict, post_ok: bool = False) -> int | None:
    """llama.cpp: `n_probs` k > 0 (0 = none); `post_sampling_probs` (the probabilities of the distribution the
    draw used, the engine's `lp_post=1`) only where `post_ok` (/completion), else a 400."""
    post = body.get("post_sampling_probs")
    if post not in (None, False, True):
        raise BadRequest("post_sampling_probs: true or false", param="post_sampling_probs")
    if post and not post_ok:
        raise BadRequest("post_sampling_probs: not supported on this route (only /completion); n_probs here gives "
                         "the model's distribution before sampling (log-probabilities)", param="post_sampling_probs")
    k = _count(body, "n_probs", 0, LOGPROBS_TOP_MAX)
    return k or None


def responses_logprobs(body: dict) -> int | None:
    """OpenAI Responses: `include` holding "message.output_text.logprobs", `top_logprobs` 0..20 (top_logprobs
    > 0 alone asks too: a count of alternatives is never ignored)."""
    include = body.get("include")
    if include is not None and not (isinstance(include, list) and all(isinstance(x, str) for x in include)):
        raise BadRequest("include: a list of strings", param="include")
    top = _count(body, "top_logprobs", 0, LOGPROBS_TOP_MAX)
    return (top or 0) if RESPONSES_INCLUDE in (include or ()) or top else None


# ---------------------------------------------------------------- structured output
def openai_grammar(body: dict) -> str | None:
    """The grammar asked by response_format / json_schema / grammar, or None; a 400 for a bad or double ask."""
    asks = []
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
            raise BadRequest('response_format: {"type": "text" | "json_object" | "json_schema", ...}',
                             param="response_format")
        if rf["type"] == "json_object" and rf.get("schema") is not None:  # llama.cpp's extension: a schema
            asks.append(schema_ask(rf["schema"], "response_format.schema"))
        elif rf["type"] == "json_object":
            asks.append(ANY_OBJECT_GRAMMAR)
        elif rf["type"] == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict) or "schema" not in js:
                raise BadRequest('response_format.json_schema: {"name": ..., "schema": {...}, "strict": ...}',
                                 param="response_format")
            asks.append(schema_ask(js["schema"], "response_format.json_schema.schema"))
    if body.get("json_schema") is not None:
        asks.append(schema_ask(body["json_schema"], "json_schema"))
    if body.get("grammar") is not None:
        g = body["grammar"]
        if not isinstance(g, str) or not g.strip():
            raise BadRequest("grammar: GBNF text with a root rule", param="grammar")
        if len(g.encode()) > GRAMMAR_TEXT_MAX_BYTES:
            raise BadRequest(f"grammar: over {GRAMMAR_TEXT_MAX_BYTES >> 20} MiB", param="grammar")
        asks.append(g)
    asks += _vllm_asks(body)
    if len(asks) > 1:
        raise BadRequest("response_format, json_schema, grammar and the guided_* / structured_outputs fields: "
                         "give one of them", param="response_format")
    return asks[0] if asks else None


def _choice_grammar(value, field: str) -> str:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
        raise BadRequest(f"{field}: a non-empty list of non-empty strings", param=field)
    return "root ::= " + " | ".join(gbnf_literal(c) for c in dict.fromkeys(value)) + "\n"


def _gbnf_text(value, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadRequest(f"{field}: GBNF text with a root rule", param=field)
    if len(value.encode()) > GRAMMAR_TEXT_MAX_BYTES:
        raise BadRequest(f"{field}: over {GRAMMAR_TEXT_MAX_BYTES >> 20} MiB", param=field)
    return value


def _regex(value, field: str) -> str:
    """A regex the whole reply must match (serve/generation/regex_grammar.py); a 400 naming what is outside
    the subset."""
    try:
        return f"root ::= {regex_grammar(value)}\n"
    except RegexError as e:
        raise BadRequest(f"{field}: {e}", param=field) from None


def _schema_value(value, field: str) -> str:
    """A schema sent as an object or as its JSON text (vLLM takes both) -> its grammar."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise BadRequest(f"{field}: a JSON Schema (an object, or its JSON text)", param=field) from None
    return schema_ask(value, field)


def _vllm_asks(body: dict) -> list[str]:
    """vLLM's guided decoding fields: `guided_json` (a schema), `guided_choice` (the reply is one of the
    strings), `guided_regex` (the reply matches it whole), `guided_grammar` (GBNF), and the newer
    `structured_outputs` {json, regex, choice, grammar, json_object}; `guided_whitespace_pattern` and
    `disable_any_whitespace` are refused by name. `guided_decoding_backend` names vLLM's engine: accepted, the
    grammar is ours."""
    asks = []
    if body.get("guided_whitespace_pattern") is not None:
        raise BadRequest("guided_whitespace_pattern: not supported (the JSON grammar's whitespace is fixed: "
                         "at most 20 spaces or newlines between tokens)", param="guided_whitespace_pattern")
    if body.get("guided_regex") is not None:
        asks.append(_regex(body["guided_regex"], "guided_regex"))
    if body.get("guided_json") is not None:
        asks.append(_schema_value(body["guided_json"], "guided_json"))
    if body.get("guided_choice") is not None:
        asks.append(_choice_grammar(body["guided_choice"], "guided_choice"))
    if body.get("guided_grammar") is not None:
        asks.append(_gbnf_text(body["guided_grammar"], "guided_grammar"))
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise BadRequest('structured_outputs: an object like {"json": {...}} or {"choice": [...]}',
                             param="structured_outputs")
        known = {"json", "choice", "grammar", "json_object", "regex", "disable_any_whitespace"}  # vLLM's
        for key, value in so.items():
            field = f"structured_outputs.{key}"
            if key not in known:
                raise BadRequest(f"{field}: not supported (json, regex, choice, grammar, json_object)", param=field)
            if value is None or (key == "disable_any_whitespace" and value is False):
                continue
            if key == "disable_any_whitespace":
                raise BadRequest(f"{field}: not supported here (the JSON grammar's whitespace is fixed)", param=field)
            if key == "regex":
                asks.append(_regex(value, field))
            elif key == "json":
                asks.append(_schema_value(value, field))
            elif key == "choice":
                asks.append(_choice_grammar(value, field))
            elif key == "grammar":
                asks.append(_gbnf_text(value, field))
            elif value is True:
                asks.append(ANY_OBJECT_GRAMMAR)
    return asks


def strict_requested(raw_tools) -> bool:
    """OpenAI tools with `"strict": true` (on the function or the tool object)."""
    return isinstance(raw_tools, list) and any(
        isinstance(t, dict) and (t.get("strict") is True or (isinstance(t.get("function"), dict)
                                                             and t["function"].get("strict") is True))
        for t in raw_tools)


def refuse_unsupported(body: dict, fields: tuple[str, ...]) -> None:
    """A 400 for the first of `fields` the body sets to something other than its default."""
    for name in fields:
        if name not in body:
            continue
        quiet, why = _UNSUPPORTED[name]
        value = body[name]
        if not any(value == q and type(value) is type(q) or (value is None and q is None) for q in quiet):
            raise BadRequest(f"{name}: {why} (got {json.dumps(value)[:60]})", param=name)


# ---------------------------------------------------------------- the rest
def ban_eos(body: dict, sampling, stop_ids) -> None:
    """llama-server's and vLLM's `ignore_eos: true`: every end-of-generation token (`stop_ids()`, asked only
    then) banned with the engine's -100 bias, so the reply runs to its limit, as llama.cpp's /completion does."""
    value = body.get("ignore_eos")
    if value is not None and not isinstance(value, bool):
        raise BadRequest("ignore_eos: true or false", param="ignore_eos")
    if value:
        sampling.logit_bias.update({int(t): -100.0 for t in stop_ids()})


def model_field(body: dict, required: bool = False) -> str | None:
    """`model`: a string (a non-empty one where `required`, as Ollama's routes need), else absent."""
    model = body.get("model")
    if required and (not isinstance(model, str) or not model):
        raise BadRequest("model: the model's name", param="model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("model: a string", param="model")
    return model

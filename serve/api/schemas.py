"""The wire formats as JSON Schema: each route handler's request body and answer, for GET /openapi.json.

Role: one table, `BODIES`, maps a handler (the function serve/http/routes.py routes to) to the JSON Schema of
the body it reads; `ANSWERS` maps a handler to the schema of its 200 JSON answer where the shape is fixed;
`STREAMS` names the handlers that answer `stream: true` with SSE (or NDJSON on Ollama's routes);
`ERROR_BODIES` is each dialect's error shape. Keyed by the handler, not the path, so an alias path
(`/chat/completions` beside `/v1/chat/completions`) gets the same schema and a new path for an existing
handler needs nothing here. The schemas say what a client may send: the translators (serve/api/*.py) still
check every field themselves and answer a 400 naming it; a field not listed is refused by name there.
Knows no HTTP server and no engine.

Public surface: `BODIES`, `ANSWERS`, `STREAMS`, `NDJSON_STREAMS`, `RAW_BODIES`, `ERROR_BODIES`, `obj(required, **props)` (a
closed object schema) and the named schemas (`SETTINGS`, `OBJ`, `STR`...).
"""
from __future__ import annotations

from serve.api import (anthropic, embeddings, lifecycle_routes as lc, llama_routes, ollama, ollama_models as om,
                       openai, responses, slot_routes)
from serve.core.effort import EFFORT_LEVELS
from serve.core.sampling import SHARED_SETTINGS_KEYS

STR = {"type": "string"}
INT = {"type": "integer"}
BOOL = {"type": "boolean"}
OBJ = {"type": "object"}
COUNT = {"type": "integer", "minimum": 1}
STOP = {"anyOf": [STR, {"type": "array", "items": STR, "maxItems": 4}]}
PARTS = {"type": "array", "items": {"type": "object", "properties": {"type": {"enum": ["text"]}, "text": STR},
                                    "required": ["type", "text"], "additionalProperties": False}}
CONTENT = {"anyOf": [STR, PARTS]}
SAMPLING = {"temperature": {"type": "number", "minimum": 0, "maximum": 2},
            "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "top_k": {"type": "integer", "minimum": 0}, "seed": INT}
TOOL = {"type": "object", "required": ["type", "function"], "additionalProperties": False,
        "properties": {"type": {"const": "function"},
                       "function": {"type": "object", "required": ["name"],
                                    "properties": {"name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                                                   "description": STR, "parameters": OBJ}}}}


def obj(required=(), **props) -> dict:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


OPENAI_MESSAGE = obj(("role", "content"), role={"enum": ["system", "developer", "user", "assistant"]},
                      content=CONTENT, name=STR)
OPENAI_CHAT = obj(("messages",), model=STR, messages={"type": "array", "items": OPENAI_MESSAGE, "minItems": 1},
                   max_tokens=COUNT, max_completion_tokens=COUNT, stop=STOP, stream=BOOL,
                   stream_options=obj(include_usage=BOOL), n={"type": "integer", "minimum": 1, "maximum": 4},
                   logprobs=BOOL, top_logprobs={"type": "integer", "minimum": 0, "maximum": 20},
                   tools={"type": "array", "items": TOOL}, tool_choice={"enum": ["auto", "none", "required"]},
                   reasoning_effort={"enum": list(EFFORT_LEVELS)},
                   response_format=obj(("type",), type={"enum": ["text", "json_object"]}),
                   presence_penalty={"type": "number", "minimum": -2, "maximum": 2},
                   frequency_penalty={"type": "number", "minimum": -2, "maximum": 2}, **SAMPLING)
OPENAI_COMPLETION = obj(("prompt",), model=STR, prompt={"anyOf": [STR, {"type": "array", "items": STR,
                                                                          "minItems": 1, "maxItems": 4}]},
                         max_tokens=COUNT, stop=STOP, stream=BOOL, echo=BOOL, **SAMPLING)
ANTHROPIC_MESSAGE = obj(("role", "content"), role={"enum": ["user", "assistant"]}, content=CONTENT)
ANTHROPIC_MESSAGES = obj(("model", "max_tokens", "messages"), model=STR, max_tokens=COUNT,
                          messages={"type": "array", "items": ANTHROPIC_MESSAGE, "minItems": 1},
                          system={"anyOf": [STR, PARTS]}, stop_sequences={"type": "array", "items": STR},
                          stream=BOOL, **SAMPLING)
ANTHROPIC_COUNT = obj(("model", "messages"), model=STR,
                       messages={"type": "array", "items": ANTHROPIC_MESSAGE, "minItems": 1},
                       system={"anyOf": [STR, PARTS]})
RESPONSES = obj(("input",), model=STR, input={"anyOf": [STR, {"type": "array", "minItems": 1, "items": obj(
    ("role", "content"), role={"enum": ["system", "developer", "user", "assistant"]}, content=STR)}]},
                 instructions=STR, max_output_tokens=COUNT, stream=BOOL, store={"const": False},
                 temperature=SAMPLING["temperature"], top_p=SAMPLING["top_p"])
RESPONSES_COUNT = obj(("input",), model=STR, input=RESPONSES["properties"]["input"], instructions=STR)
OLLAMA_OPTIONS = obj(num_predict=COUNT, stop={"type": "array", "items": STR, "maxItems": 4}, **SAMPLING)
OLLAMA_CHAT = obj(("model", "messages"), model=STR, stream=BOOL, options=OLLAMA_OPTIONS,
                   messages={"type": "array", "minItems": 1, "items": obj(
                       ("role", "content"), role={"enum": ["system", "user", "assistant"]}, content=STR)})
OLLAMA_GENERATE = obj(("model", "prompt"), model=STR, prompt=STR, system=STR, stream=BOOL, raw=BOOL,
                       options=OLLAMA_OPTIONS)
OLLAMA_MODEL = obj(("model",), model=STR)
OLLAMA_HUB = obj(model=STR, name=STR)
LLAMA_COMPLETION = obj(("prompt",), prompt=STR, n_predict=COUNT, stop={"type": "array", "items": STR},
                        stream=BOOL, cache_prompt=BOOL, **SAMPLING)
LLAMA_INFILL = obj(("input_prefix", "input_suffix"), input_prefix=STR, input_suffix=STR, prompt=STR,
                    n_predict=COUNT, stream=BOOL)
TOKENIZE = obj(("content",), content=STR, add_special=BOOL, with_pieces=BOOL)
DETOKENIZE = obj(("tokens",), tokens={"type": "array", "items": {"type": "integer", "minimum": 0}})
APPLY_TEMPLATE = obj(("messages",), messages=OPENAI_CHAT["properties"]["messages"])
INPUT_TOKENS = obj(("messages",), model=STR, messages=OPENAI_CHAT["properties"]["messages"])
EMBED_INPUT = {"anyOf": [STR, {"type": "array", "items": STR, "minItems": 1, "maxItems": 8}]}
OPENAI_EMBEDDINGS = obj(("input",), model=STR, input=EMBED_INPUT,
                         encoding_format={"enum": ["float", "base64"]})
LLAMA_EMBEDDING = obj(("content",), content=EMBED_INPUT)
OLLAMA_EMBED = obj(("model", "input"), model=STR, input=EMBED_INPUT)
OLLAMA_EMBEDDINGS = obj(("model", "prompt"), model=STR, prompt=STR)
OLLAMA_CREATE = obj(("model",), **{
    "model": STR, "from": STR, "files": {"type": "object", "additionalProperties": STR}, "modelfile": STR,
    "parameters": OBJ, "system": STR, "license": {"anyOf": [STR, {"type": "array", "items": STR}]}, "stream": BOOL,
    "messages": {"type": "array", "items": obj(("role", "content"), role={"enum": ["system", "user", "assistant"]},
                                               content=STR)}})
SETTINGS = obj(("defaults",), defaults={"anyOf": [{"type": "null"}, obj(
    temperature=SAMPLING["temperature"], top_p=SAMPLING["top_p"], top_k=SAMPLING["top_k"], seed=INT,
    max_tokens=COUNT, reasoning_effort={"enum": list(EFFORT_LEVELS)},
    reasoning_budget_tokens={"type": "integer", "minimum": 0})]})
MODEL_ONLY = obj(model=STR)
CONFIG_EDIT = obj(("changes",), model=STR, changes=OBJ)

BODIES = {
    openai.chat_completions: OPENAI_CHAT, openai.completions: OPENAI_COMPLETION,
    anthropic.messages: ANTHROPIC_MESSAGES, anthropic.count_tokens: ANTHROPIC_COUNT,
    responses.responses: RESPONSES, responses.input_tokens: RESPONSES_COUNT,
    ollama.chat: OLLAMA_CHAT, ollama.generate: OLLAMA_GENERATE, ollama.show: OLLAMA_MODEL,
    ollama.no_hub: OLLAMA_HUB,
    llama_routes.completion: LLAMA_COMPLETION, llama_routes.infill: LLAMA_INFILL,
    llama_routes.apply_template: APPLY_TEMPLATE, llama_routes.input_tokens: INPUT_TOKENS,
    llama_routes.tokenize: TOKENIZE, llama_routes.detokenize: DETOKENIZE,
    embeddings.openai_embeddings: OPENAI_EMBEDDINGS, embeddings.llama_embedding: LLAMA_EMBEDDING,
    embeddings.ollama_embed: OLLAMA_EMBED, embeddings.ollama_embeddings: OLLAMA_EMBEDDINGS,
    lc.load: MODEL_ONLY, lc.unload: MODEL_ONLY, lc.lease: MODEL_ONLY, lc.lease_release: OBJ,
    lc.config_post: CONFIG_EDIT, slot_routes.slot_action: obj(filename=STR),
    om.create: OLLAMA_CREATE, om.copy: obj(("source", "destination"), source=STR, destination=STR),
    om.delete: OLLAMA_MODEL,
}
assert set(SHARED_SETTINGS_KEYS) >= set(SETTINGS["properties"]["defaults"]["anyOf"][1]["properties"])

USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
         "properties": {"prompt_tokens": INT, "completion_tokens": INT, "total_tokens": INT}}
CHAT_COMPLETION = {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
                   "properties": {"id": STR, "object": {"const": "chat.completion"}, "created": INT, "model": STR,
                                  "usage": USAGE, "choices": {"type": "array", "minItems": 1, "items": {
                                      "type": "object", "required": ["index", "message", "finish_reason"],
                                      "properties": {"index": INT, "finish_reason": {"type": ["string", "null"]},
                                                     "message": {"type": "object", "required": ["role"],
                                                                 "properties": {"role": {"const": "assistant"},
                                                                                "content": {"type": ["string",
                                                                                                     "null"]}}}}}}}}
TEXT_COMPLETION = {"type": "object", "required": ["id", "object", "choices", "usage"],
                   "properties": {"object": {"const": "text_completion"}, "usage": USAGE,
                                  "choices": {"type": "array", "items": {"type": "object",
                                                                         "required": ["index", "text"]}}}}
ANTHROPIC_REPLY = {"type": "object", "required": ["id", "type", "role", "content", "stop_reason", "usage"],
                   "properties": {"type": {"const": "message"}, "role": {"const": "assistant"},
                                  "content": {"type": "array", "items": {"type": "object", "required": ["type"]}},
                                  "usage": {"type": "object", "required": ["input_tokens", "output_tokens"]}}}
ANSWERS = {openai.chat_completions: CHAT_COMPLETION, openai.completions: TEXT_COMPLETION,
           anthropic.messages: ANTHROPIC_REPLY,
           anthropic.count_tokens: obj(("input_tokens",), input_tokens=INT),
           llama_routes.tokenize: {"type": "object", "required": ["tokens"], "properties": {
               "tokens": {"type": "array"}}},
           llama_routes.detokenize: {"type": "object", "required": ["content"], "properties": {"content": STR}}}
STREAMS = frozenset({openai.chat_completions, openai.completions, anthropic.messages, responses.responses,
                     llama_routes.completion, llama_routes.infill})
NDJSON_STREAMS = frozenset({ollama.chat, ollama.generate, om.create})
RAW_BODIES = frozenset({om.blob_post})   # the body is a file (Ollama's blob upload), not JSON

OPENAI_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"], "properties": {"message": STR, "type": STR}}}}
ERROR_BODIES = {
    "openai": OPENAI_ERROR,
    "anthropic": {"type": "object", "required": ["type", "error"], "properties": {
        "type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"],
                                              "properties": {"type": STR, "message": STR}}}},
    "ollama": {"type": "object", "required": ["error"], "properties": {"error": STR}},
    "llama": {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["code", "message", "type"], "properties": {"code": INT, "message": STR,
                                                                                 "type": STR}}}},
}

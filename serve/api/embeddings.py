"""Embeddings in four dialects: OpenAI `POST /v1/embeddings`, llama.cpp `POST /embedding` and `/embeddings`,
Ollama `POST /api/embed` and its older `POST /api/embeddings`.

What a vector is (docs/PROTOCOL.md "Embeddings"): the mean, over every token of the input, of the model's
final-normed hidden state (the rows its output head reads), L2-normalised, float32: llama.cpp's
`--pooling mean` with its default `--embd-normalize 2` (llama-server's own default for a decoder model is
pooling `none`, which its `/v1/embeddings` refuses; mean is the usual choice for a decoder model and the one
its OpenAI route accepts). Texts are tokenized as llama-server does for embeddings: special tokens parsed, the
model's BOS added when it asks for one. Token-id inputs are taken as they are.

Rules: every input is checked before any runs. No input, an empty string or an empty id list, more than
EMBED_MAX_INPUTS inputs, an id outside the vocabulary, or an input longer than the context allows: 400 naming
the field. Inputs are never truncated (Ollama's `truncate`, default true, is accepted and refuses all the same:
the vector of a cut text is not the text's). `dimensions` is refused (a 400): cutting a mean-pooled decoder
state short is not a smaller embedding of the same text. One input is one engine read (Service.embed), run one
after another, so a request holds at most one decode slot and generation beside it goes on.

Calling convention: the one serve/api/openai.py documents (`handler(service, body, ctx) -> JsonReply`); errors
are BadRequest, shaped per dialect by the server (`ERROR_DIALECTS`). It knows nothing of the engine but
Service.embed / Service.embed_room.

Public surface: `openai_embeddings`, `llama_embedding`, `ollama_embed`, `ollama_embeddings`, `EMBED_MAX_INPUTS`,
`decode_vector`.
"""
from __future__ import annotations

import base64
import struct
import time

from serve.core.events import BadRequest
from serve.api.replies import JsonReply

EMBED_MAX_INPUTS = 256  # one request's inputs: each is a read in turn, so 256 short texts stay within minutes
_NS_PER_S = 1_000_000_000


# ---------------------------------------------------------------- inputs
def _is_ids(value) -> bool:
    return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)


def _text_ids(service, text: str, field: str) -> list[int]:
    if not text:
        raise BadRequest(f"{field}: an empty input has no embedding", param=field)
    ids = service.tok.encode(text, parse_special=True)
    bos = service.tok.special_ids.get("bos")
    if getattr(service.tok, "add_bos", False) and bos is not None:
        ids = [bos] + ids
    return ids


def _given_ids(service, ids: list, field: str) -> list[int]:
    if not ids:
        raise BadRequest(f"{field}: an empty input has no embedding", param=field)
    n_vocab = service.tok.n_vocab
    bad = [i for i in ids if not 0 <= i < n_vocab]
    if bad:
        raise BadRequest(f"{field}: token ids are 0..{n_vocab - 1}, not {bad[0]}", param=field)
    return list(ids)


def _one(service, item, field: str, mixed: bool) -> list[int]:
    """One input: a string, a list of ids, or (llama.cpp, `mixed`) a list of strings and ids."""
    if isinstance(item, str):
        return _text_ids(service, item, field)
    if _is_ids(item):
        return _given_ids(service, item, field)
    if mixed and isinstance(item, list) and all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in item):
        ids: list[int] = []
        for p in item:
            ids += service.tok.encode(p, parse_special=True) if isinstance(p, str) else [p]
        return _given_ids(service, ids, field)
    kinds = "a string, a list of token ids" + (", or a list of strings and ids" if mixed else "")
    raise BadRequest(f"{field}: each input is {kinds}", param=field)


def inputs(service, value, field: str, mixed: bool = False) -> list[list[int]]:
    """`input` (OpenAI: a string, a list of strings, a list of ids, a list of id lists; llama.cpp's `content`
    also a mixed list) -> one id list per input, each checked against the context."""
    if value is None:
        raise BadRequest(f"{field}: required (a string or a list of them)", param=field)
    if isinstance(value, str) or _is_ids(value) and value:
        items, names = [value], [field]
    elif isinstance(value, list):
        items, names = value, [f"{field}[{i}]" for i in range(len(value))]
    else:
        raise BadRequest(f"{field}: a string, a list of strings, a list of token ids or a list of them", param=field)
    if not items:
        raise BadRequest(f"{field}: at least one input", param=field)
    if len(items) > EMBED_MAX_INPUTS:
        raise BadRequest(f"{field}: at most {EMBED_MAX_INPUTS} inputs a request, not {len(items)}", param=field)
    out = [_one(service, item, name, mixed) for item, name in zip(items, names)]
    room = service.embed_room()
    for ids, name in zip(out, names):
        if len(ids) > room:
            raise BadRequest(f"{name}: {len(ids)} tokens, over the {room} this context allows for one input "
                             "(inputs are never truncated)", param=field, code="context_length_exceeded")
    return out


def decode_vector(payload: str) -> list[float]:
    """The engine's `<n_embd> <base64>` -> the floats."""
    n, _, b64 = payload.partition(" ")
    return list(struct.unpack(f"<{int(n)}f", base64.b64decode(b64)))


def _run(service, id_lists, ctx) -> list[str]:
    return [service.embed(ids, ctx.cancelled) for ids in id_lists]


def _check_dimensions(body) -> None:
    if body.get("dimensions") is not None:
        raise BadRequest("dimensions: not supported (a mean-pooled decoder state cut short is not a smaller "
                         "embedding of the text); leave it out for the model's full width", param="dimensions")


def _model_name(service, body) -> str:
    name = body.get("model")
    if name is not None and not isinstance(name, str):
        raise BadRequest("model: a string", param="model")
    aliases = [service.model_name, *(service.config.get("aliases") or [])]
    return name if name and name in aliases else service.model_name


# ---------------------------------------------------------------- OpenAI
def openai_embeddings(service, body, ctx) -> JsonReply:
    if "input" not in body and "content" in body:
        return llama_embedding(service, body, ctx)  # llama-server: `content` is its own shape, not OpenAI's
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise BadRequest("encoding_format: 'float' or 'base64'", param="encoding_format")
    _check_dimensions(body)
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise BadRequest("user: a string", param="user")
    model = _model_name(service, body)
    id_lists = inputs(service, body.get("input"), "input")
    data = []
    for i, payload in enumerate(_run(service, id_lists, ctx)):
        vec = payload.partition(" ")[2] if fmt == "base64" else decode_vector(payload)
        data.append({"object": "embedding", "index": i, "embedding": vec})
    n = sum(len(ids) for ids in id_lists)
    return JsonReply(200, {"object": "list", "data": data, "model": model,
                           "usage": {"prompt_tokens": n, "total_tokens": n}})


# ---------------------------------------------------------------- llama.cpp
def llama_embedding(service, body, ctx) -> JsonReply:
    """llama-server's `/embedding(s)`: `content` (or `input`) -> `[{index, embedding: [vector]}]` (its
    pooled shape: one vector in the list)."""
    norm = body.get("embd_normalize", 2)
    if norm != 2 or isinstance(norm, bool):
        raise BadRequest("embd_normalize: only 2 (Euclidean, the default) is served", param="embd_normalize")
    field = "content" if "content" in body else "input"
    id_lists = inputs(service, body.get(field), field, mixed=True)
    return JsonReply(200, [{"index": i, "embedding": [decode_vector(p)]}
                           for i, p in enumerate(_run(service, id_lists, ctx))])


# ---------------------------------------------------------------- Ollama
def _ollama_model(body) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model: the model's name", param="model")
    truncate = body.get("truncate", True)
    if not isinstance(truncate, bool):
        raise BadRequest("truncate: true or false", param="truncate")
    if body.get("options") is not None and not isinstance(body.get("options"), dict):
        raise BadRequest("options: an object", param="options")
    return model


def ollama_embed(service, body, ctx) -> JsonReply:
    """`/api/embed`: `input` (a string or a list of strings) -> `{model, embeddings, total_duration,
    load_duration, prompt_eval_count}` (durations in ns)."""
    t0 = time.monotonic()
    model = _ollama_model(body)
    _check_dimensions(body)
    value = body.get("input")
    if not (isinstance(value, str) or isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise BadRequest("input: a string or a list of strings", param="input")
    id_lists = inputs(service, value, "input")
    vectors = [decode_vector(p) for p in _run(service, id_lists, ctx)]
    return JsonReply(200, {"model": model, "embeddings": vectors,
                           "total_duration": int((time.monotonic() - t0) * _NS_PER_S), "load_duration": 0,
                           "prompt_eval_count": sum(len(ids) for ids in id_lists)})


def ollama_embeddings(service, body, ctx) -> JsonReply:
    """The older `/api/embeddings`: `prompt` (a string) -> `{embedding}`."""
    _ollama_model(body)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise BadRequest("prompt: a string", param="prompt")
    id_lists = inputs(service, prompt, "prompt")
    return JsonReply(200, {"embedding": decode_vector(_run(service, id_lists, ctx)[0])})

"""llama.cpp's native routes: a translator over `serve/core/events.py` for llama-server's own clients (its web UI and
test suite, SillyTavern, editor plugins).

Calling convention: the one `serve/api/openai.py` documents; errors are llama-server's
`{"error": {"code", "message", "type"}}` (`error_body`); after a stream's first chunk a last `data:` error.

Routes:
- POST `/completion` (and `/completions`): `prompt` (a string, token ids, or a list holding one of them),
  `n_predict` (alias `max_tokens`; -1 = no cap), `stream` (SSE `data:` chunks `{index, content, tokens (the ids
  of that text), stop: false, id_slot, tokens_predicted, tokens_evaluated}`, then the final object; no `[DONE]`,
  as llama-server), `return_tokens` (the final object's `tokens`: the reply's ids; else empty),
  `temperature`, `top_k`, `top_p`, `min_p`, `seed`, `repeat_penalty`, `repeat_last_n`, `presence_penalty`,
  `frequency_penalty`, `typical_p`, `top_n_sigma`, `xtc_probability`, `xtc_threshold`, `mirostat`,
  `mirostat_tau`, `mirostat_eta`, `dry_multiplier`, `dry_base`, `dry_allowed_length`, `dry_penalty_last_n`,
  `dry_sequence_breakers` (the engine's samplers, docs/PROTOCOL.md), `logit_bias` (pairs or object), `ignore_eos` (bans the end-of-generation tokens; shown
  in `generation_settings.logit_bias` with bias null, as llama-server), `stop`, `return_progress` (stream:
  `prompt_progress {total, cache, processed, time_ms}` chunks while the prompt is read), `timings_per_token`
  (stream: running `timings` on each chunk, the prompt read's on the progress chunks), `response_fields` ("a/b"
  paths),
  `n_probs` (1..20: `completion_probabilities` [{id, token, bytes, logprob, top_logprobs}] on the final
  object, or per chunk when streamed; serve/generation/logprobs.py; `post_sampling_probs`: `prob` / `top_probs` of the
  distribution the draw used), `n_cmpl` (alias
  `n`, 1..8 choices of the prompt: a list of final objects with their `index`, chunks carry theirs;
  serve/generation/choices.py). Accepted without effect, as llama-server accepts options its build does not use:
  `cache_prompt` (the prefix is always reused), `samplers` (the order is the engine's own, engine/sampler.h),
  `id_slot`, `n_keep`. Wrong types are a 400 naming the field. The final object:
  `content`, `tokens` (with `return_tokens`), `id_slot`, `stop`, `model`, `tokens_predicted`, `tokens_evaluated`,
  `generation_settings`, `prompt`, `has_new_line`, `truncated` (always false: nothing is truncated),
  `stop_type` (eos | limit | word | none), `stopping_word`, `tokens_cached`, `timings`.
- POST `/infill`: `input_prefix`, `input_suffix`, `input_extra [{filename, text}]`, `prompt`, and the
  /completion fields, for models with fill-in-the-middle tokens (llama.cpp's repo-level layout); otherwise a
  501 naming the missing tokens, as llama-server answers.
- POST `/apply-template`: a chat body -> `{"prompt": the rendered text}`; POST
  `/v1/chat/completions/input_tokens`: a chat body -> `{"input_tokens": its prompt length}`.
- POST `/tokenize` `{content, add_special, parse_special (default true), with_pieces}` -> `{"tokens": [id]}`
  or `[{"id", "piece"}]` (a piece that is not whole UTF-8 is its list of byte values); `/detokenize`.
- GET `/props`: `serve/ops/llama_views.py`'s view plus the fields llama-server's clients read (`aliases`,
  `chat_template_caps.supports_tools`, `endpoint_*`, `bos_token`, `eos_token`, `model_path`). `model_path` is the
  file's name without its folders on purpose: a client has no use for the server's file system layout.

Public surface: `completion`, `infill`, `apply_template`, `input_tokens`, `tokenize`, `detokenize`, `props`, `fim_ids`,
`infill_ids`, `error_body`.
"""
from __future__ import annotations

import contextlib
import os

from serve.ops import llama_views
from serve.core import sampling as sampling_mod
from serve.core.events import BadRequest, CompletionRequest, Done, KIND_CONTENT, KIND_PING, LiveTimings, ProgressFeed
from serve.api.fields import SAMPLER_FIELDS_REFUSED, check_n, llama_n_probs, refuse_unsupported
from serve.generation.choices import collect_text, prepare_choices, run_choices
from serve.generation.logprobs import llama_probs
from serve.api.wire import error_text, finish_note, model_name, sse
from serve.api.openai import parse_chat
from serve.api.replies import JsonReply, StreamReply, cut
from serve.core.sampling import check_request_sampling
from serve.api.wire import check_stop

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 501: "not_supported_error", 503: "unavailable_error"}
_FIM_NAMES = {"pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>"),
              "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>"),
              "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>"),
              "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
              "sep": ("<|file_sep|>", "<file_sep>")}
_NUMBER_FIELDS = ("n_predict", "max_tokens")


def error_body(status: int, err_type: str, message: str, param=None, code=None) -> dict:
    return {"error": {"code": status, "message": message,
                      "type": _ERROR_TYPES.get(status, err_type if status < 500 else "server_error")}}


# ---------------------------------------------------------------- tokens
def _is_id_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)


def _check_ids(tok, ids: list, field: str) -> list[int]:
    bad = [i for i in ids if not 0 <= i < tok.n_vocab]
    if bad:
        raise BadRequest(f"{field}: token ids are 0..{tok.n_vocab - 1}, not {bad[0]}", param=field)
    return list(ids)


def _piece(tok, tid: int):
    raw = tok.token_bytes(tid)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def tokenize(service, body, ctx) -> JsonReply:
    content = body.get("content")
    if content is None:
        return JsonReply(200, {"tokens": []})
    flags = {}
    for name, default in (("add_special", False), ("parse_special", True), ("with_pieces", False)):
        value = body.get(name, default)
        if not isinstance(value, bool):
            raise BadRequest(f"{name}: true or false", param=name)
        flags[name] = value
    ids = _mixed_ids(service.tok, content, "content", flags["parse_special"])
    bos = service.tok.special_ids.get("bos")
    if flags["add_special"] and bos is not None and getattr(service.tok, "add_bos", False):
        ids = [bos] + ids
    if flags["with_pieces"]:
        return JsonReply(200, {"tokens": [{"id": i, "piece": _piece(service.tok, i)} for i in ids]})
    return JsonReply(200, {"tokens": ids})


def _mixed_ids(tok, content, field: str, parse_special: bool) -> list[int]:
    """A string, or a list of strings and token ids (llama.cpp's "mixed" prompt), -> ids."""
    if isinstance(content, str):
        return tok.encode(content, parse_special=parse_special)
    if isinstance(content, list) and all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in content):
        ids: list[int] = []
        for p in content:
            ids += tok.encode(p, parse_special=parse_special) if isinstance(p, str) else _check_ids(tok, [p], field)
        return ids
    raise BadRequest(f"{field}: a string, or a list of strings and token ids", param=field)


def detokenize(service, body, ctx) -> JsonReply:
    ids = body.get("tokens", [])
    if not _is_id_list(ids):
        raise BadRequest("tokens: a list of token ids", param="tokens")
    return JsonReply(200, {"content": service.tok.decode(_check_ids(service.tok, ids, "tokens"))})


# ---------------------------------------------------------------- views
def props(service, body, ctx) -> JsonReply:
    status, out = llama_views.props(service, ctx.query, unloaded=ctx.model_unloaded)
    if status == 200:
        tok = service.tok
        sid = tok.special_ids
        name = lambda key: tok.id_to_token(sid[key]) if key in sid and hasattr(tok, "id_to_token") else ""
        out.setdefault("chat_template_caps", {})["supports_tools"] = True  # Strata's own tool format, any template
        path = llama_views.model_file(service.engine)
        if path:  # the file's name only: a client has no use for the server's folders
            out["model_path"] = os.path.basename(path)
        out.update(aliases=list(service.config.get("aliases") or []), endpoint_slots=True, endpoint_props=True,
                   endpoint_metrics=True, bos_token=name("bos"), eos_token=name("eos"))
    return JsonReply(status, out)


def input_tokens(service, body, ctx) -> JsonReply:
    """POST /v1/chat/completions/input_tokens (llama-server): the prompt length a chat body would have."""
    return JsonReply(200, {"object": "response.input_tokens", "input_tokens": service.count_tokens(parse_chat(body))})


def apply_template(service, body, ctx) -> JsonReply:
    req = parse_chat(body)
    return JsonReply(200, {"prompt": service.render_chat(req).text})


# ---------------------------------------------------------------- /completion
def _one_prompt(tok, prompt):
    """One prompt -> (ids or None, text): a string, token ids, a mix of both, or {"prompt_string": text}."""
    if isinstance(prompt, dict) and not prompt.get("multimodal_data"):
        prompt = prompt.get("prompt_string")
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest("prompt: a non-empty string or a list of token ids", param="prompt")
        return None, prompt
    if _is_id_list(prompt) and prompt:
        ids = _check_ids(tok, prompt, "prompt")
        return ids, tok.decode(ids)
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, int)) and not isinstance(p, bool)
                                                   for p in prompt):
        ids = _mixed_ids(tok, prompt, "prompt", True)
        return ids, tok.decode(ids)
    raise BadRequest("prompt: a string, token ids, or a list of those (no images: this model reads text only)",
                     param="prompt")


def _prompts(tok, prompt) -> list:
    """`prompt` -> [(ids or None, text)]: a list whose items are strings, id lists or prompt objects is that
    many prompts (llama-server answers a list); a list with bare ids in it is one prompt."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, dict)) or _is_id_list(p) for p in prompt):
        return [_one_prompt(tok, p) for p in prompt]
    return [_one_prompt(tok, prompt)]


def _llama_request(service, body: dict, ids, text: str) -> CompletionRequest:
    refuse_unsupported(body, SAMPLER_FIELDS_REFUSED)
    n_predict = None
    for name in _NUMBER_FIELDS:
        value = body.get(name)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool):
                raise BadRequest(f"{name}: an integer (-1 = no cap)", param=name)
            n_predict = value if n_predict is None else n_predict
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream: true or false", param="stream")
    for name in ("return_progress", "cache_prompt", "return_tokens", "ignore_eos", "timings_per_token"):
        if name in body and not isinstance(body[name], bool):
            raise BadRequest(f"{name}: true or false", param=name)
    fields = body.get("response_fields")
    if fields is not None and not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
        raise BadRequest("response_fields: a list of field paths", param="response_fields")
    fields = {k: v for k, v in body.items() if k != "seed" or v != -1}
    fields["logit_bias"] = _logit_bias(service.tok, body.get("logit_bias"))
    if body.get("ignore_eos") and isinstance(fields["logit_bias"], (list, type(None))):
        # llama-server's ignore_eos: every end-of-generation token banned, so the reply runs to its limit
        fields["logit_bias"] = (fields["logit_bias"] or []) + [[t, -100] for t in sorted(service.stop_ids)]
    sampling = check_request_sampling(fields)
    return CompletionRequest(prompt=text, ids=ids, max_new=None if n_predict is None or n_predict < 0 else n_predict,
                             sampling=sampling, stop=check_stop(body.get("stop")), stream=stream,
                             model=body.get("model") if isinstance(body.get("model"), str) else None,
                             logprobs=llama_n_probs(body, post_ok=True),
                             logprobs_post=body.get("post_sampling_probs") is True, n=_n_cmpl(body))


def _logit_bias(tok, value):
    """llama-server's `logit_bias` forms -> id pairs: [[id or text, bias]] or {id or text: bias}; a text key
    biases each of its tokens, `false` bans (-100, the strongest bias the engine takes)."""
    if value is None:
        return None
    pairs = list(value.items()) if isinstance(value, dict) else value
    if not isinstance(pairs, list) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
        return value  # the sampling check names the field
    out = []
    for key, bias in pairs:
        bias = -100 if bias is False else bias
        if isinstance(key, str) and not key.strip().lstrip("-").isdigit():
            out += [[tid, bias] for tid in tok.encode(key, parse_special=False)]
        else:
            out.append([key, bias])
    return out


def _n_cmpl(body: dict) -> int:
    """llama-server's `n_cmpl`, with `n` as its alias."""
    return check_n(body, "n_cmpl") if body.get("n_cmpl") is not None else check_n(body, "n")


def completion(service, body: dict, ctx):
    prompts = _prompts(service.tok, body.get("prompt"))
    if len(prompts) == 1:
        return _complete(service, body, ctx, _llama_request(service, body, *prompts[0]))
    if body.get("stream"):
        raise BadRequest("stream: one prompt per streamed request here", param="stream")
    answers = []  # several prompts: one after another, answered as a list in prompt order (x n_cmpl)
    for k, (ids, text) in enumerate(prompts):
        reply = _complete(service, body, ctx, _llama_request(service, body, ids, text))
        for res in reply.body if isinstance(reply.body, list) else [reply.body]:
            answers.append({**res, "index": len(answers)})
    return JsonReply(200, answers)


def _complete(service, body, ctx, req: CompletionRequest):
    n = req.n
    preps = prepare_choices(service, req, n)
    meta = {"model": model_name(service, req), "prompt": req.prompt, "n_prompt": preps[0].prompt_tokens,
            "settings": _settings(service, req), "fields": body.get("response_fields") or [],
            "return_tokens": body.get("return_tokens") is True}
    if req.stream:
        live = ([LiveTimings(p.prompt_tokens) for p in preps] if body.get("timings_per_token") is True
                else None)  # one per choice
        return StreamReply(_stream(service, preps, ctx, meta, bool(body.get("return_progress")), live))
    content, probs, dones = collect_text(service, preps, ctx.cancelled)
    results = []
    for i in range(n):
        res = _final(meta, content[i], dones[i], stream=False, index=i)
        if req.logprobs is not None and not meta["fields"]:
            res["completion_probabilities"] = llama_probs(probs[i], req.logprobs_post)
        results.append(res)
    return JsonReply(200, results[0] if n == 1 else results)


def _settings(service, req: CompletionRequest) -> dict:
    """`generation_settings`: the sampling the run used (model card -> config -> shared settings -> request)."""
    defaults = service.settings_view()["defaults"]
    m = sampling_mod.merge_sampling(sampling_mod.card_sampling(service.arch, False), service.config.get("sampling"),
                                    {k: v for k, v in defaults.items() if k in sampling_mod.FIELDS}, req.sampling)
    return {"n_predict": req.max_new if req.max_new is not None else -1, "seed": m.get("seed", -1),
            "temperature": m.get("temperature", 0.0), "top_k": m.get("top_k", 0), "top_p": m.get("top_p", 1.0),
            "min_p": m.get("min_p", 0.0), "repeat_penalty": m.get("repetition_penalty", 1.0),
            "repeat_last_n": m.get("penalty_last_n", sampling_mod.PENALTY_LAST_N_DEFAULT),
            "presence_penalty": m.get("presence_penalty", 0.0), "frequency_penalty": m.get("frequency_penalty", 0.0),
            "stop": req.stop, "stream": req.stream, "n_probs": req.logprobs or 0,
            # llama-server's list form; null is a ban (its -inf, the engine's -100)
            "logit_bias": [{"token": t, "bias": None if b <= -100 else b}
                           for t, b in sorted((req.sampling.logit_bias or {}).items())]}


def _stop_type(done: Done) -> str:
    if done.stop_sequence is not None:
        return "word"
    return {"stop": "eos", "length": "limit"}.get(done.finish, "none")


def _nested(obj: dict, paths: list[str]) -> dict:
    """llama-server's `response_fields`: "a/b" picks obj["a"]["b"] under the key "a/b"; missing ones are left out."""
    out = {}
    for path in paths:
        value, found = obj, True
        for key in path.split("/"):
            if isinstance(value, dict) and key in value:
                value = value[key]
            else:
                found = False
                break
        if found:
            out[path] = value
    return out


def _final(meta: dict, content: str, done: Done, stream: bool, index: int = 0) -> dict:
    tokens = done.ids if meta["return_tokens"] and not stream else []  # a stream's chunks carried them
    res = {"index": index, "content": content, "tokens": tokens, "id_slot": 0, "stop": True, "model": meta["model"],
           "tokens_predicted": done.completion_tokens, "tokens_evaluated": done.prompt_tokens,
           "generation_settings": meta["settings"], "prompt": meta["prompt"], "has_new_line": "\n" in content,
           "truncated": False, "stop_type": _stop_type(done), "stopping_word": done.stop_sequence or "",
           "tokens_cached": done.prompt_tokens + done.completion_tokens, "timings": done.timings, **finish_note(done)}
    return _nested(res, meta["fields"]) if meta["fields"] and not stream else res


def _read_timings(p: dict) -> dict:
    """timings_per_token on a prompt_progress chunk: the read so far (the first report: all zero)."""
    n, ms = p["processed"] - p["cache"], float(p["time_ms"])
    return {"cache_n": p["cache"], "prompt_n": n, "prompt_ms": ms, "prompt_per_second": 1e3 * n / ms if ms else 0.0,
            "predicted_n": 0, "predicted_ms": 0.0, "predicted_per_second": 0.0}


def _stream(service, preps, ctx, meta, return_progress: bool, live=None):
    n_out, feed, dones = [0] * len(preps), ProgressFeed(), [None] * len(preps)
    probs = preps[0].req.logprobs is not None

    def head(i):
        return {"index": i, "tokens": [], "stop": False, "id_slot": 0, "tokens_evaluated": meta["n_prompt"]}

    try:
        with contextlib.closing(run_choices(service, preps, ctx.cancelled, ctx.on_wait)) as items:
            for i, ev in items:
                if isinstance(ev, Done):
                    dones[i] = ev
                    yield sse(_final(meta, "", ev, stream=True, index=i))
                elif ev.kind == KIND_PING:
                    reports = feed.feed(ev.progress) if return_progress and i == 0 else []
                    for p in reports:
                        extra = {"timings": _read_timings(p)} if live is not None else {}
                        yield sse({**head(i), "content": "", "tokens_predicted": 0, "prompt_progress": p, **extra})
                    if not reports:
                        yield ": keep-alive\n\n"
                elif ev.kind == KIND_CONTENT and ev.text:
                    n = max(1, len(ev.ids))
                    n_out[i] += n
                    extra = {"timings": live[i].token(n)} if live is not None else {}
                    chunk = {**head(i), "content": ev.text, "tokens": ev.ids, "tokens_predicted": n_out[i], **extra}
                    if probs:
                        chunk["completion_probabilities"] = llama_probs(ev.logprobs or [], preps[0].req.logprobs_post)
                    yield sse(chunk)
    except Exception as e:
        yield cut(sse(error_body(500, "server_error", error_text(service, e))))


# ---------------------------------------------------------------- /infill
def fim_ids(tok) -> dict | None:
    """The model's fill-in-the-middle token ids {pre, suf, mid[, rep, sep]}, or None when pre/suf/mid lack."""
    found = {}
    for role, names in _FIM_NAMES.items():
        for n in names:
            tid = tok.token_to_id(n) if hasattr(tok, "token_to_id") else None
            if tid is not None:
                found[role] = tid
                break
    return found if all(k in found for k in ("pre", "suf", "mid")) else None


def infill_ids(tok, fim: dict, prefix, suffix, extra: list, prompt: str) -> list[int]:
    """llama.cpp's repo-level FIM layout: [rep "myproject\\n"] ([sep] filename\\n text)* [sep "filename\\n"]
    pre prefix prompt suf suffix mid. Nothing is cut: a prompt over the context is the usual 400."""
    enc = lambda text: tok.encode(text, parse_special=False)
    ids: list[int] = []
    if "rep" in fim:
        ids += [fim["rep"]] + enc("myproject\n")
    for chunk in extra:
        if "sep" in fim:
            ids += [fim["sep"]] + enc(chunk.get("filename", "tmp") + "\n")
        else:
            ids += enc("\n\n--- snippet ---\n\n")
        ids += enc(chunk["text"])
    if "sep" in fim:
        ids += [fim["sep"]] + enc("filename\n")
    return (ids + [fim["pre"]] + _mixed_ids(tok, prefix, "input_prefix", False) + enc(prompt) + [fim["suf"]] +
            _mixed_ids(tok, suffix, "input_suffix", False) + [fim["mid"]])


def _check_extra(extra) -> list:
    if extra is None:
        return []
    if not isinstance(extra, list):
        raise BadRequest('input_extra: an array of {"filename": string, "text": string}', param="input_extra")
    for i, chunk in enumerate(extra):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise BadRequest(f"input_extra[{i}].text: a string", param="input_extra")
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise BadRequest(f"input_extra[{i}].filename: a string", param="input_extra")
    return extra


def infill(service, body: dict, ctx):
    fim = fim_ids(service.tok)
    if fim is None:
        raise BadRequest("Infill is not supported by this model: it has no fill-in-the-middle tokens (prefix, "
                         "suffix, middle)", param="model", status=501)
    for name in ("input_prefix", "input_suffix"):
        if name not in body:
            raise BadRequest(f'"{name}" is required', param=name)
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise BadRequest('"prompt" must be a string', param="prompt")
    ids = infill_ids(service.tok, fim, body["input_prefix"], body["input_suffix"],
                     _check_extra(body.get("input_extra")), prompt)
    return _complete(service, body, ctx, _llama_request(service, body, ids, service.tok.decode(ids)))

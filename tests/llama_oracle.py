"""llama.cpp as an oracle: run by the peer's interpreter (llama-cpp-python), never imported by the tests.

Contract: `python llama_oracle.py REQUEST.json` reads one request and prints one JSON answer on stdout. It
uses only llama-cpp-python's low-level ctypes API (`llama_cpp.llama_cpp`) and ggml's own type traits, so
nothing here computes anything itself: every number is llama.cpp's. The tests run it through
`tests/oracle.py` (which finds the interpreter and skips with a reason when there is none).

Requests ({"op": ...}):
  logits    {model, ids, n_gen, out, n_ctx, last_only}: the logits of every prompt position (last_only: of the
            last) and of every fed greedy token as float32 rows of n_vocab written to `out` -> {"tokens": [...],
            "n_vocab": n}. One thread-count-independent CPU context, f16 KV, flash attention off.
  dequant   {type, data, out, n}: ggml's to_float for n elements of raw blocks of ggml type number `type`
            read from file `data`, written as float32 to `out` -> {}.
  tokenize  {model, texts, add_special, parse_special} -> {"ids": [[...], ...]}
  embed     {model, prompts: [[ids], ...]} -> {"embeddings": [[n_embd floats], ...]}: pooling mean, unnormalised
  template  {model, name, chats: [[{role, content}], ...], add_ass} -> {"texts": [...]} (llama.cpp's built-in
            rendering of the named template family, or of the model's own template when name is null)
  jinja     {template, bos, eos, cases: [{messages, tools, flags, add_generation_prompt}]} -> {"texts": [...]}:
            llama-cpp-python's rendering of a chat template text (llama_chat_format.Jinja2ChatFormatter, what it
            renders a GGUF's own template with); a case the template refuses is {"error": message}
"""

import ctypes
import json
import os
import sys

os.environ.setdefault("LLAMA_LOG_LEVEL", "error")
import llama_cpp.llama_cpp as ll  # noqa: E402  (after the environment is set)


@ll.llama_log_callback
def _quiet(level, text, user_data):  # llama.cpp's log lines would mix with the answer on stdout
    pass


def _load(path, n_ctx=512):
    ll.llama_log_set(_quiet, None)
    ll.llama_backend_init()
    mp = ll.llama_model_default_params()
    mp.use_mmap = True
    model = ll.llama_model_load_from_file(path.encode(), mp)
    if not model:
        raise SystemExit(f"llama.cpp could not load {path}")
    return model


def _context(model, n_ctx):
    cp = ll.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = max(n_ctx, 512)
    cp.n_ubatch = 512
    cp.n_threads = cp.n_threads_batch = 2
    cp.flash_attn_type = 0  # disabled: the plain softmax(q k^T) v the engine computes
    ctx = ll.llama_init_from_model(model, cp)
    if not ctx:
        raise SystemExit("llama.cpp could not create a context")
    return ctx


def op_logits(req):
    model = _load(req["model"])
    ids = req["ids"]
    n_gen = req["n_gen"]
    ctx = _context(model, req.get("n_ctx") or len(ids) + n_gen + 8)
    n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
    rows = []

    def decode(tokens, pos0, all_rows):
        for c0 in range(0, len(tokens), 512):
            chunk = tokens[c0:c0 + 512]
            batch = ll.llama_batch_init(len(chunk), 0, 1)
            batch.n_tokens = len(chunk)
            want = [all_rows or c0 + i == len(tokens) - 1 for i in range(len(chunk))]
            for i, t in enumerate(chunk):
                batch.token[i] = t
                batch.pos[i] = pos0 + c0 + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = int(want[i])
            rc = ll.llama_decode(ctx, batch)
            if rc != 0:
                raise SystemExit(f"llama_decode returned {rc}")
            for i in range(len(chunk)):
                if want[i]:
                    p = ll.llama_get_logits_ith(ctx, i)
                    rows.append(bytes(ctypes.string_at(p, 4 * n_vocab)))
            ll.llama_batch_free(batch)

    decode(ids, 0, not req.get("last_only"))
    tokens = []
    for step in range(n_gen):
        last = memoryview(rows[-1]).cast("f")
        t = max(range(n_vocab), key=last.__getitem__)
        tokens.append(t)
        if step + 1 < n_gen:
            decode([t], len(ids) + step, True)
    with open(req["out"], "wb") as f:
        f.write(b"".join(rows))
    return {"tokens": tokens, "n_vocab": n_vocab}


def op_embed(req):
    """llama.cpp's pooled embedding (`--pooling mean`, before any normalisation) of each id list in one
    ubatch (its pooled output is per ubatch, so the whole prompt goes in one)."""
    model = _load(req["model"])
    n_embd = ll.llama_model_n_embd(model)
    out = []
    for ids in req["prompts"]:
        ll.llama_log_set(_quiet, None)
        cp = ll.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = max(len(ids) + 8, 64)
        cp.n_threads = cp.n_threads_batch = 2
        cp.flash_attn_type = 0
        cp.embeddings = True
        cp.pooling_type = ll.LLAMA_POOLING_TYPE_MEAN
        ctx = ll.llama_init_from_model(model, cp)
        batch = ll.llama_batch_init(len(ids), 0, 1)
        batch.n_tokens = len(ids)
        for i, t in enumerate(ids):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, i, 1, 1
            batch.seq_id[i][0] = 0
        if ll.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        p = ll.llama_get_embeddings_seq(ctx, 0)
        out.append([p[j] for j in range(n_embd)])
        ll.llama_batch_free(batch)
        ll.llama_free(ctx)
    return {"embeddings": out}


class _TypeTraits(ctypes.Structure):  # struct ggml_type_traits (ggml.h)
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


def _ggml_base():
    lib_dir = os.path.dirname(ll._lib._name)
    return ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"))


def op_dequant(req):
    base = _ggml_base()
    base.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
    traits = base.ggml_get_type_traits(ctypes.c_int(req["type"])).contents
    to_float = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int64)(traits.to_float)
    with open(req["data"], "rb") as f:
        raw = f.read()
    n = req["n"]
    src = ctypes.create_string_buffer(raw, len(raw))
    out = (ctypes.c_float * n)()
    to_float(ctypes.cast(src, ctypes.c_void_p), out, n)
    with open(req["out"], "wb") as f:
        f.write(bytes(out))
    return {"type_name": traits.type_name.decode()}


def op_tokenize(req):
    mp = ll.llama_model_default_params()
    mp.vocab_only = True
    ll.llama_log_set(_quiet, None)
    model = ll.llama_model_load_from_file(req["model"].encode(), mp)
    vocab = ll.llama_model_get_vocab(model)
    out = []
    for text in req["texts"]:
        raw = text.encode("utf-8", "surrogatepass")
        cap = len(raw) * 2 + 16
        buf = (ll.llama_token * cap)()
        n = ll.llama_tokenize(vocab, raw, len(raw), buf, cap, req.get("add_special", False),
                              req.get("parse_special", False))
        if n < 0:
            raise SystemExit(f"llama_tokenize needs {-n} tokens")
        out.append(list(buf[:n]))
    return {"ids": out}


def op_template(req):
    texts = []
    name = req.get("name")
    tmpl = name.encode() if name else None
    if tmpl is None:
        mp = ll.llama_model_default_params()
        mp.vocab_only = True
        ll.llama_log_set(_quiet, None)
        model = ll.llama_model_load_from_file(req["model"].encode(), mp)
        tmpl = ll.llama_model_chat_template(model, None)
    for chat in req["chats"]:
        msgs = (ll.llama_chat_message * len(chat))()
        keep = []
        for i, m in enumerate(chat):
            role, content = m["role"].encode(), m["content"].encode()
            keep += [role, content]
            msgs[i].role = role
            msgs[i].content = content
        cap = 4096 + sum(len(m["content"]) for m in chat) * 2
        buf = ctypes.create_string_buffer(cap)
        n = ll.llama_chat_apply_template(tmpl, msgs, len(chat), req.get("add_ass", True), buf, cap)
        if n < 0:
            texts.append(None)  # llama.cpp does not know this template
            continue
        texts.append(buf.raw[:n].decode("utf-8"))
    return {"texts": texts}


def op_jinja(req):
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    texts = []
    for case in req["cases"]:
        fmt = Jinja2ChatFormatter(req["template"], eos_token=req["eos"], bos_token=req["bos"],
                                  add_generation_prompt=case.get("add_generation_prompt", True))
        try:
            texts.append(fmt(messages=case["messages"], tools=case.get("tools"), **case.get("flags", {})).prompt)
        except Exception as e:  # noqa: BLE001  the template's own refusal is an answer too
            texts.append({"error": f"{type(e).__name__}: {e}"})
    return {"texts": texts}


def main():
    with open(sys.argv[1]) as f:
        req = json.load(f)
    answer = {"logits": op_logits, "dequant": op_dequant, "tokenize": op_tokenize, "template": op_template,
              "embed": op_embed, "jinja": op_jinja}[req["op"]](req)
    sys.stdout.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()

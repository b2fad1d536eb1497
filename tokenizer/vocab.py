"""The tokenizer's vocabulary as files: read from a GGUF's metadata, written to and read from a directory.

Role: tokenizer/bpe.py builds a Tokenizer from a Vocab; this module is where a Vocab comes from.
It reads the tokenizer keys of a GGUF (through tokenizer/gguf_meta.py, so tensor data is never touched),
writes them out as plain files once, and reads those files back, which is faster than walking the GGUF
again. It knows nothing of BPE, pre-tokenizers or special-token matching; it imports nothing of
strata_tokenizer (write_dir reads a built tokenizer's attributes only).

Public surface:
    TOKEN_TYPE_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED   GGUF tokenizer.ggml.token_type values
    Vocab(tokens, token_types, merges, pre, special_ids, chat_template, add_bos)
                                            the Tokenizer constructor's arguments, in its order
    read_metadata(gguf_path) -> dict        the GGUF's tokenizer keys only (TOKENIZER_KEYS)
    vocab_from_metadata(meta) -> Vocab      ValueError unless tokenizer.ggml.model is "gpt2"
    vocab_from_dir(tokenizer_dir) -> Vocab  the files write_dir wrote
    is_fresh(tokenizer_dir, gguf_path)      whether the directory was written from this very GGUF file
    write_dir(out_dir, gguf_path, meta, tok) -> Path
                                            write out_dir/tokenizer/{vocab.json, merges.txt,
                                            token_type.json, tokenizer.json, chat_template.jinja}

Files: vocab.json maps token text -> id (a text repeated in the vocabulary keeps its first id there; the
later ids are in tokenizer.json's "duplicate_tokens"); merges.txt is one merge per line in rank order;
token_type.json is the list of GGUF token types; tokenizer.json holds pre, special ids, add_bos and the
source GGUF's path, size and mtime, and is written last, so its presence marks a whole directory. Token
texts that were not valid UTF-8 in the GGUF round-trip through surrogateescape. Each file is replaced
atomically, so a concurrent reader sees an old file or a new one, never a part.
"""

import collections
import json
import os
import pathlib

from tokenizer import gguf_meta

TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

TOKENIZER_KEYS = tuple("tokenizer.ggml." + k for k in (
    "model", "pre", "tokens", "token_type", "merges", "bos_token_id", "eos_token_id", "eot_token_id",
    "eom_token_id", "padding_token_id", "add_bos_token")) + ("tokenizer.chat_template",)

# pre-tokenizers whose models want <s> first when the GGUF does not say (llama.cpp's default for them)
ADD_BOS_BY_DEFAULT = ("tekken",)
Vocab = collections.namedtuple("Vocab", "tokens token_types merges pre special_ids chat_template add_bos")


def read_metadata(gguf_path):
    """The GGUF's tokenizer metadata: {key: value} for the TOKENIZER_KEYS present."""
    return gguf_meta.read_metadata(gguf_path, keys=TOKENIZER_KEYS)


def vocab_from_metadata(meta):
    """A Vocab from a GGUF metadata dict (see gguf_meta.read_metadata)."""
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"tokenizer model {model!r} is not supported (only byte-level BPE, 'gpt2')")
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type") or [TOKEN_TYPE_NORMAL] * len(tokens)
    pre = meta.get("tokenizer.ggml.pre") or "default"  # llama.cpp's name for a missing pre: unsupported
    return Vocab(tokens, types, meta.get("tokenizer.ggml.merges", []), pre,
                 _special_ids_from_meta(meta, len(tokens)), meta.get("tokenizer.chat_template"),
                 meta.get("tokenizer.ggml.add_bos_token", pre in ADD_BOS_BY_DEFAULT))


def vocab_from_dir(tokenizer_dir):
    """A Vocab from the files written by write_dir()."""
    d = pathlib.Path(tokenizer_dir)

    def read(name):  # surrogateescape: token texts that were not UTF-8 in the GGUF round-trip
        return (d / name).read_text(encoding="utf-8", errors="surrogateescape")

    info = json.loads(read("tokenizer.json"))
    vocab = json.loads(read("vocab.json"))
    types = json.loads(read("token_type.json"))
    merges = read("merges.txt").split("\n")
    if merges and merges[-1] == "":
        merges.pop()
    tokens = [""] * len(types)
    for text, tid in vocab.items():
        tokens[tid] = text
    for tid, text in info.get("duplicate_tokens", {}).items():
        tokens[int(tid)] = text
    template = None
    if (d / "chat_template.jinja").exists():
        template = read("chat_template.jinja")
    return Vocab(tokens, types, merges, info["pre"], info.get("special_ids"), template,
                 info.get("add_bos_token", False))


def is_fresh(tokenizer_dir, gguf_path):
    """Whether tokenizer_dir holds a whole write_dir() output of the GGUF file as it is now."""
    try:
        with open(pathlib.Path(tokenizer_dir) / "tokenizer.json", encoding="utf-8") as f:
            return json.load(f).get("source") == _source_stamp(gguf_path)
    except (OSError, ValueError):
        return False


def write_dir(out_dir, gguf_path, meta, tok):
    """Write out_dir/tokenizer/ from `meta` (read_metadata of gguf_path) and `tok`, the tokenizer built
    from it (its pre, pre_family, pre_pattern, n_vocab, special_ids, add_bos, token_types and
    chat_template are recorded); returns that directory."""
    d = pathlib.Path(out_dir) / "tokenizer"
    for folder in reversed([d, *d.parents]):  # a cache: folders 0700 where they are made here, files 0600
        if not folder.is_dir():
            folder.mkdir(mode=0o700, exist_ok=True)
    tokens = meta["tokenizer.ggml.tokens"]
    vocab, duplicates = {}, {}
    for tid, text in enumerate(tokens):
        if text in vocab:
            duplicates[str(tid)] = text
        else:
            vocab[text] = tid
    merges = meta.get("tokenizer.ggml.merges", [])
    info = {"model": "gpt2", "pre": tok.pre, "vocab_size": tok.n_vocab, "n_merges": len(merges),
            "special_ids": tok.special_ids, "add_bos_token": tok.add_bos,
            "pre_pattern": tok.pre_pattern,
            "pre_pattern_source": f"llama.cpp llama-vocab.cpp regex list of pre family {tok.pre_family!r}"
                                  ", as one pattern",
            "source": _source_stamp(gguf_path)}
    if duplicates:
        info["duplicate_tokens"] = duplicates
    files = {"vocab.json": json.dumps(vocab, ensure_ascii=False),
             "merges.txt": "".join(m + "\n" for m in merges),
             "token_type.json": json.dumps(tok.token_types),
             "chat_template.jinja": tok.chat_template}
    for name, content in files.items():
        if content is not None:
            _write_atomic(d / name, content)
    _write_atomic(d / "tokenizer.json", json.dumps(info, ensure_ascii=False, indent=1))  # last: marks done
    return d


def _special_ids_from_meta(meta, n_vocab):
    out = {}
    for name in ("bos", "eos", "eot", "eom"):
        tid = meta.get(f"tokenizer.ggml.{name}_token_id")
        if isinstance(tid, int) and 0 <= tid < n_vocab:
            out[name] = tid
    return out


def _source_stamp(path):
    st = os.stat(path)
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _write_atomic(path, text):
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w", encoding="utf-8", errors="surrogateescape", newline="\n") as f:
        f.write(text)
    os.replace(tmp, path)

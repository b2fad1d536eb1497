"""Byte-level BPE tokenizer that gives exactly the model's token ids, read from the model's GGUF.

Role: the server renders chat prompts and tokenises them itself (the engine knows only token ids). This
module turns text into ids and ids into text; it knows nothing of HTTP, chat templates or the engine.
Reading and writing the vocabulary files is tokenizer/vocab.py's; encoding a growing chat
incrementally is tokenizer/prompt_encoder.py's; the special-token splitting, decoding and `ByteTokenizer`
are tokenizer/base.py's (their names are importable from here too).

Public surface:
    extract(gguf_path, out_dir) -> Path       write out_dir/tokenizer/{vocab.json, merges.txt,
                                              token_type.json, tokenizer.json, chat_template.jinja}
                                              (the files: see tokenizer/vocab.py)
    Tokenizer.from_gguf(path, cache_dir=None) / Tokenizer.from_dir(dir)
    ByteTokenizer()                           bytes 0-255 plus specials from 256, same interface (tests, mock)
    tok.encode(text, parse_special=False, plain=None) -> ids
    tok.encode_marked(text, parse_special=True, plain=None) -> (ids, marks)
    tok.decode(ids, errors="replace"), tok.token_bytes(id), tok.stream_decoder() -> StreamDecoder
    tok.token_to_id(text), tok.id_to_token(id); attributes n_vocab, pre, chat_template, special_ids
    (keys among bos, eos, eot, eom, im_start, im_end, endoftext), token_types, add_bos, missing_bytes,
    special_overlaps
    (PromptEncoder lives in tokenizer/prompt_encoder.py, which imports this module)
    TOKEN_TYPE_*                              re-exported from tokenizer/vocab.py
    PRE_NAMES: the supported tokenizer.ggml.pre names (smollm, gpt-2, llama-bpe, qwen2, qwen35, tekken, gpt-4o and the
    names llama.cpp treats alike); any other name is a ValueError naming it.

Algorithm (matches llama.cpp's BPE tokenizer for the supported `tokenizer.ggml.pre` names):
  1. Special tokens are split out first, scanning left to right and taking the longest literal at each
     position. Control tokens (GGUF type 3, and unknown, type 2) match only with parse_special=True;
     user-defined tokens (type 4) always. Characters inside a `plain` span (start, end) never belong to
     a special match. This equals llama.cpp's longest-literal-first partition unless two specials
     partially overlap (`special_overlaps` lists such pairs; none in the supported models).
  2. Each text fragment between specials is cut by the pre-tokenizer regex of its `pre` name.
  3. Each piece's UTF-8 bytes start as one symbol per byte (GPT-2 byte->unicode map); the adjacent pair of
     lowest merge rank is merged, leftmost on ties, until no pair has a rank. Symbols are token ids.
No BOS is added. A byte whose GPT-2 character is no token (`missing_bytes`) is dropped, as llama.cpp
does. Decoding concatenates token bytes (control and user-defined tokens give their text).

Marks: for each special token matched, (char offset just after it, number of ids up to and including it).
Text after a mark is tokenised independently of the text before it, which PromptEncoder uses to re-encode
only the tail of a growing chat.

Thread safety: tokenizers are immutable after construction except for their piece cache, a dict whose
single get/set operations are atomic under the GIL (a lost entry only costs a recompute). Any number of
threads may encode concurrently.
"""

import heapq
import pathlib
from itertools import chain, compress, repeat
from operator import add, mul, not_

import regex

from tokenizer import vocab as strata_vocab
from tokenizer.base import (  # noqa: F401 (the base's names stay importable from here)
    BYTE_CHARS, BYTES_TO_CHARS, CHAR_BYTES, SPECIAL_NAMES, BaseTokenizer, ByteTokenizer, StreamDecoder, check_text,
    normalize_spans)
from tokenizer.vocab import TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_USER_DEFINED

PIECE_CACHE_MAX_ENTRIES = 1 << 18  # ~260K pieces: covers any real vocabulary of words, bounded memory
PIECE_CACHE_MAX_CHARS = 256        # longer pieces (whitespace runs, unbroken CJK) are rare; not cached
SMALL_PIECE_SYMBOLS = 128          # up to this many bytes, the list merge loop beats the heap loop

# Pre-tokenizer patterns, one `regex` pattern per llama.cpp `pre` family. `regex`'s \s is Unicode
# White_Space, the same set as llama.cpp's whitespace table. Where llama.cpp leaves text unmatched by its
# regex, it keeps that text as a piece of its own; the trailing `|\s+` does the same here (the only text the
# GPT-2 alternatives leave unmatched is one whitespace character before a non-space).
_GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# smollm = split off every digit (\p{N}), then GPT-2 on each remaining stretch. One pass: digits first, and
# the GPT-2 look-ahead "(?!\S)" becomes "not followed by a non-space non-digit", since a digit ends a stretch.
_SMOLLM_PATTERN = r"\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+"
_LLAMA3_PATTERN = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
                   r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_PATTERN = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
                  r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35_PATTERN = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
                   r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                   r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# tekken (Mistral Nemo, Mistral Small 3.x, Ministral, Pixtral): llama.cpp's form of the tokenizer.json regex, in
# which "upper" is a letter other than a-z and "lower" a letter other than A-Z (so a non-ASCII letter is both),
# and a run of symbols may take trailing slashes as well as newlines.
_TEKKEN_PATTERN = (r"[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])*(?:(?=\p{L})[^A-Z])+"
                   r"|[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])+(?:(?=\p{L})[^A-Z])*"
                   r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# gpt-4o (o200k: gpt-oss): tekken's cased letter runs, each with an optional English contraction after it, and
# numbers in runs of up to three digits; llama.cpp's form of the tokenizer.json regex.
_GPT4O_PATTERN = (r"[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])*(?:(?=\p{L})[^A-Z])+"
                  r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
                  r"|[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])+(?:(?=\p{L})[^A-Z])*"
                  r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
                  r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# pre-tokenizer family -> (pattern, ignore_merges: a piece that is itself a token is emitted whole, as
# llama.cpp does for its llama3 family)
PRE_TOKENIZERS = {
    "smollm": (_SMOLLM_PATTERN, False),
    "gpt2": (_GPT2_PATTERN, False),
    "llama-bpe": (_LLAMA3_PATTERN, True),
    "qwen2": (_QWEN2_PATTERN, False),
    "qwen35": (_QWEN35_PATTERN, False),
    "tekken": (_TEKKEN_PATTERN, True),
    "gpt-4o": (_GPT4O_PATTERN, False),
}
# tokenizer.ggml.pre names -> family, as llama.cpp groups them (only names whose encoding is the family's)
PRE_NAMES = {
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
                    "smollm"),
    **dict.fromkeys(("gpt-2", "gpt2", "phi-2", "mpt", "olmo"), "gpt2"),
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral"), "llama-bpe"),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"), "qwen2"),
    "qwen35": "qwen35",
    "tekken": "tekken",
    "gpt-4o": "gpt-4o",
}


_PAIR_SHIFT = 22                       # symbol ids < 4M: vocab plus internal (non-token) merge results
_PAIR_BASE = 1 << _PAIR_SHIFT
_SYM_MASK = _PAIR_BASE - 1
_NO_MERGE = 1 << 62                    # larger than any rank << _PAIR_SHIFT


class Tokenizer(BaseTokenizer):
    """Byte-level BPE over a GGUF vocabulary (tokenizer.ggml.model == "gpt2")."""

    def __init__(self, tokens, token_types, merges, pre, special_ids=None, chat_template=None,
                 add_bos=False):
        if pre not in PRE_NAMES:
            raise ValueError(f"unknown tokenizer pre-tokenizer {pre!r} (tokenizer.ggml.pre); supported: "
                             + ", ".join(sorted(PRE_NAMES)))
        if len(token_types) != len(tokens):
            raise ValueError(f"{len(tokens)} tokens but {len(token_types)} token types")
        if len(tokens) >= 1 << (_PAIR_SHIFT - 1):
            raise ValueError(f"vocabulary of {len(tokens)} tokens is too large")
        self.n_vocab = len(tokens)
        self.pre = pre
        self.chat_template = chat_template
        self.add_bos = bool(add_bos)
        self.token_types = list(token_types)
        self.pre_family = PRE_NAMES[pre]
        pattern, self._ignore_merges = PRE_TOKENIZERS[self.pre_family]
        self.pre_pattern = pattern
        self._findall = regex.compile(pattern).findall
        self._id_text = list(tokens)
        self._text_to_id = {}
        for tid, text in enumerate(tokens):
            self._text_to_id[text] = tid  # llama.cpp refuses duplicated texts; here the last id wins
        self._id_bytes = [self._bytes_of(t, ty) for t, ty in zip(tokens, token_types)]
        self._init_specials(tokens, token_types)
        self._build_merges(merges)
        self._cache = {}
        self.special_ids = dict(special_ids or {})
        for text, name in SPECIAL_NAMES.items():
            if text in self._text_to_id and name not in self.special_ids:
                self.special_ids[name] = self._text_to_id[text]
        if "eot" not in self.special_ids and "im_end" in self.special_ids:
            self.special_ids["eot"] = self.special_ids["im_end"]
        self._harmony_ends()

    def _harmony_ends(self):
        """harmony's vocabulary (gpt-oss: both <|return|> and <|call|>): they end a reply (special ids "return",
        "call"), and <|end|>, which only ends one of its messages, is no end of turn even where the file names
        it so (llama.cpp's reading)."""
        ret, call = self._text_to_id.get("<|return|>"), self._text_to_id.get("<|call|>")
        if ret is None or call is None:
            return
        self.special_ids.update({"return": ret, "call": call})
        if self.special_ids.get("eot") is not None and self.special_ids["eot"] == self._text_to_id.get("<|end|>"):
            del self.special_ids["eot"]

    @staticmethod
    def _bytes_of(text, ttype):
        """What a token decodes to, as llama.cpp's token_to_piece with special=True: a normal token's
        byte-mapped text back to bytes; control, unknown and user-defined tokens their text as is; the
        other types (unused, byte) nothing."""
        if ttype in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED, TOKEN_TYPE_UNKNOWN):
            return text.encode("utf-8", "surrogateescape")
        if ttype != TOKEN_TYPE_NORMAL:
            return b""
        try:
            return bytes(CHAR_BYTES[c] for c in text)
        except KeyError:  # not a byte-mapped text: take it literally
            return text.encode("utf-8", "surrogateescape")

    def _symbol(self, text):
        """Symbol id of a BPE symbol text: its token id, or an internal id past the vocabulary."""
        sid = self._text_to_id.get(text)
        if sid is None:
            sid = self._internal.get(text)
            if sid is None:
                sid = self.n_vocab + len(self._internal_text)
                self._internal[text] = sid
                self._internal_text.append(text)
        return sid

    def _build_merges(self, merges):
        self._internal = {}
        self._internal_text = []
        self._byte_symbol = [self._symbol(c) for c in BYTE_CHARS]
        # bytes whose GPT-2 character is no token: llama.cpp drops them (see _spell_out), so does this
        self.missing_bytes = bytes(b for b, c in enumerate(BYTE_CHARS) if c not in self._text_to_id)
        table = {}
        for rank, line in enumerate(merges):
            cut = line.find(" ", 1)  # a left part may itself start with a space
            if cut < 0:
                raise ValueError(f"malformed merge #{rank}: {line!r}")
            left, right = line[:cut], line[cut + 1:]
            key = (self._symbol(left) << _PAIR_SHIFT) | self._symbol(right)
            if key not in table:  # the first rank of a repeated merge wins, as in llama.cpp
                table[key] = (rank << _PAIR_SHIFT) | self._symbol(left + right)
        if self.n_vocab + len(self._internal_text) > _SYM_MASK:
            raise ValueError("too many BPE symbols")
        self._merge_get = table.get
        self.n_merges = len(merges)

    def _encode_text(self, text, out):
        pieces = self._findall(text)
        cache = self._cache
        got = list(map(cache.get, pieces))
        if None in got:
            # the pieces not cached (and the rare ones whose ids are empty), each computed once; all the
            # per-piece loops here run in C
            fresh = {piece: self._bpe(piece) for piece in set(compress(pieces, map(not_, got)))}
            got = list(map(fresh.get, pieces, got))
            if len(cache) > PIECE_CACHE_MAX_ENTRIES:
                cache.clear()
            cache.update((p, ids) for p, ids in fresh.items() if len(p) <= PIECE_CACHE_MAX_CHARS)
        out.extend(chain.from_iterable(got))

    def _bpe(self, piece):
        """Token ids of one pre-token piece (a tuple)."""
        data = piece.encode("utf-8")
        if self._ignore_merges:
            tid = self._text_to_id.get(data.decode("latin-1").translate(BYTES_TO_CHARS))
            if tid is not None:
                return (tid,)
        syms = list(map(self._byte_symbol.__getitem__, data))
        if len(syms) <= SMALL_PIECE_SYMBOLS:
            self._merge_small(syms)
        else:
            syms = self._merge_heap(syms)
        if max(syms) >= self.n_vocab:
            return tuple(self._spell_out(syms))
        return tuple(syms)

    def _merge_small(self, syms):
        """In place: repeatedly merge the lowest-rank adjacent pair, leftmost on ties (O(n^2) in C loops)."""
        get = self._merge_get
        # pair key a << _PAIR_SHIFT | b, built with C-level maps (a * 2**shift + b is the same number)
        pairs = list(map(get, map(add, map(mul, syms[:-1], repeat(_PAIR_BASE)), syms[1:]), repeat(_NO_MERGE)))
        while pairs:
            best = min(pairs)
            if best == _NO_MERGE:
                break
            i = pairs.index(best)  # leftmost among equal ranks
            merged = best & _SYM_MASK
            syms[i] = merged
            del syms[i + 1]
            del pairs[i]
            if i < len(pairs):
                pairs[i] = get((merged << _PAIR_SHIFT) | syms[i + 1], _NO_MERGE)
            if i > 0:
                pairs[i - 1] = get((syms[i - 1] << _PAIR_SHIFT) | merged, _NO_MERGE)

    def _merge_heap(self, syms):
        """Same merges as _merge_small in O(n log n): a heap of (rank, position) over a linked list."""
        get = self._merge_get
        n = len(syms)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap = []
        for i in range(n - 1):
            value = get((syms[i] << _PAIR_SHIFT) | syms[i + 1])
            if value is not None:
                heap.append((value, i))
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            value, i = pop(heap)
            j = nxt[i]
            if syms[i] < 0 or j < 0 or get((syms[i] << _PAIR_SHIFT) | syms[j]) != value:
                continue  # stale: one side was merged since this pair was queued
            merged = value & _SYM_MASK
            syms[i] = merged
            syms[j] = -1
            k = nxt[j]
            nxt[i] = k
            if k >= 0:
                prv[k] = i
                value = get((merged << _PAIR_SHIFT) | syms[k])
                if value is not None:
                    push(heap, (value, i))
            h = prv[i]
            if h >= 0:
                value = get((syms[h] << _PAIR_SHIFT) | merged)
                if value is not None:
                    push(heap, (value, h))
        return [s for s in syms if s >= 0]

    def _spell_out(self, syms):
        """A final symbol that is not a token: llama.cpp looks up each single byte of its UTF-8 text as a
        one-byte token text and drops the bytes that are none. A byte >= 0x80 alone is not UTF-8, so it
        matches only a token text that was itself invalid UTF-8 (read here with surrogateescape)."""
        out = []
        for s in syms:
            if s < self.n_vocab:
                out.append(s)
                continue
            for b in self._internal_text[s - self.n_vocab].encode("utf-8"):
                tid = self._text_to_id.get(bytes([b]).decode("utf-8", "surrogateescape"))
                if tid is not None:
                    out.append(tid)
        return out

    # -- construction from files -------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, meta):
        """Build from a GGUF metadata dict (see gguf_meta.read_metadata)."""
        return cls(*strata_vocab.vocab_from_metadata(meta))

    @classmethod
    def from_gguf(cls, path, cache_dir=None):
        """Read the tokenizer from a GGUF; with cache_dir, extract there once and reuse the files."""
        if cache_dir is None:
            return cls.from_metadata(strata_vocab.read_metadata(path))
        tok_dir = pathlib.Path(cache_dir) / "tokenizer"
        if not strata_vocab.is_fresh(tok_dir, path):
            extract(path, cache_dir)
        return cls.from_dir(tok_dir)

    @classmethod
    def from_dir(cls, tokenizer_dir):
        """Read the files written by extract()."""
        return cls(*strata_vocab.vocab_from_dir(tokenizer_dir))


def extract(gguf_path, out_dir):
    """Write out_dir/tokenizer/ from the GGUF's tokenizer metadata; returns that directory."""
    meta = strata_vocab.read_metadata(gguf_path)
    tok = Tokenizer.from_metadata(meta)  # validates (pre name, model) before anything is written
    return strata_vocab.write_dir(out_dir, gguf_path, meta, tok)

"""SentencePiece-style tokenizer from a GGUF (`tokenizer.ggml.model` = "llama"), exact against llama.cpp.

Role: the same job and interface as tokenizer/bpe.py's byte-level BPE Tokenizer (encode,
encode_marked, decode, token_bytes, stream_decoder, special_pattern, marks for PromptEncoder), for
vocabularies of scored pieces: Gemma 3, Llama 2 and Mistral-style models. It knows nothing of HTTP, chat
templates or the engine. `load_tokenizer(path, cache_dir)` picks this or the BPE tokenizer from the file.

Public surface:
    SpmTokenizer(tokens, token_types, scores, special_ids=None, chat_template=None, add_bos=False,
                 add_space_prefix=True)
    SpmTokenizer.from_metadata(meta) / SpmTokenizer.from_gguf(path)
    load_tokenizer(path, cache_dir=None)  SpmTokenizer for "llama", strata_tokenizer.Tokenizer for "gpt2",
                                          ValueError naming any other tokenizer model
    SPM_KEYS: the GGUF keys it reads

Algorithm (llama.cpp's SPM tokenizer):
  1. Special tokens are split out first, exactly as in the BPE tokenizer (control and unknown tokens only
     with parse_special; user-defined ones always: Gemma's newline and space runs are user-defined).
  2. Each text fragment (there is always a special token or the start of the text before one) gets a
     leading space when add_space_prefix is set; every space becomes U+2581 "▁".
  3. The fragment starts as one symbol per character. Every adjacent pair whose concatenation is a token is
     queued by that token's score (highest first; on equal scores the leftmost pair). The best pair is
     merged, unless one side has since been merged away; the new symbol's neighbours are queued. Repeat
     until the queue is empty.
  4. Each final symbol is its token (a merge only happens into a token); a single character that is no
     token becomes its UTF-8 bytes as <0xXX> byte tokens (or the one-byte token, or unk when neither exists).
No BOS is added (the caller puts `<bos>` where the model expects it). Decoding: a normal token's text with
"▁" as a space, a byte token its byte, control / unknown / user-defined tokens their text, unused none.

Caches: a fragment's ids are kept in a bounded dict keyed by the fragment text (fragments are short: Gemma's
newlines are tokens of their own, so a fragment is at most a line), so PromptEncoder's re-encoding of a
growing chat's tail costs dictionary look-ups. Thread safety: as the BPE tokenizer (immutable but for that
cache, whose single get/set operations are atomic under the GIL).
"""

import heapq

from tokenizer import gguf_meta, bpe as strata_tokenizer, vocab as strata_vocab
from tokenizer.bpe import BaseTokenizer
from tokenizer.vocab import TOKEN_TYPE_NORMAL

TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6
SPACE_MARK = "\u2581"
FRAGMENT_CACHE_MAX_ENTRIES = 1 << 16  # fragments are lines or shorter: bounded memory, warm for a chat
FRAGMENT_CACHE_MAX_CHARS = 4096       # longer fragments are not cached

SPM_KEYS = strata_vocab.TOKENIZER_KEYS + tuple("tokenizer.ggml." + k for k in (
    "scores", "unknown_token_id", "add_space_prefix"))


class SpmTokenizer(BaseTokenizer):
    """Scored-piece (SentencePiece BPE) vocabulary with byte fallback."""

    pre = "spm"

    def __init__(self, tokens, token_types, scores, special_ids=None, chat_template=None, add_bos=False,
                 add_space_prefix=True, unk_id=None):
        if len(token_types) != len(tokens) or len(scores) != len(tokens):
            raise ValueError("tokenizer.ggml.tokens, token_type and scores differ in length")
        self.n_vocab = len(tokens)
        self.chat_template = chat_template
        self.add_bos = bool(add_bos)
        self.add_space_prefix = bool(add_space_prefix)
        self.token_types = list(token_types)
        self._id_text = list(tokens)
        self._scores = list(scores)
        self._text_to_id = {}
        for tid, text in enumerate(tokens):  # a repeated text keeps its last id, as llama.cpp's map does
            self._text_to_id[text] = tid
        self._id_bytes = [self._bytes_of(t, ty) for t, ty in zip(tokens, token_types)]
        self._byte_ids = self._byte_table(unk_id)
        self.missing_bytes = bytes(b for b in range(256) if self._byte_ids[b] is None)
        self._init_specials(tokens, token_types)
        self.special_ids = dict(special_ids or {})
        if "eot" not in self.special_ids and "<end_of_turn>" in self._text_to_id:  # Gemma's end of turn
            self.special_ids["eot"] = self._text_to_id["<end_of_turn>"]
        self._cache = {}

    @staticmethod
    def _bytes_of(text, ttype):
        if ttype == TOKEN_TYPE_BYTE:
            return bytes([int(text[3:5], 16)])
        if ttype == TOKEN_TYPE_NORMAL:
            return text.replace(SPACE_MARK, " ").encode("utf-8", "surrogateescape")
        if ttype == TOKEN_TYPE_UNUSED:
            return b""
        return text.encode("utf-8", "surrogateescape")

    def _byte_table(self, unk_id):
        table = []
        for b in range(256):
            tid = self._text_to_id.get(f"<0x{b:02X}>")
            if tid is None and b < 0x80:
                tid = self._text_to_id.get(chr(b))
            table.append(tid if tid is not None else unk_id)
        return table

    def _encode_text(self, text, out):
        ids = self._cache.get(text)
        if ids is None:
            ids = self._spm(text)
            if len(text) <= FRAGMENT_CACHE_MAX_CHARS:
                if len(self._cache) >= FRAGMENT_CACHE_MAX_ENTRIES:
                    self._cache.clear()
                self._cache[text] = ids
        out.extend(ids)

    def _spm(self, fragment):
        text = (" " + fragment if self.add_space_prefix else fragment).replace(" ", SPACE_MARK)
        n = len(text)
        if n == 0:
            return []
        start = list(range(n))     # symbol i covers text[start[i]:start[i] + size[i]]
        size = [1] * n             # 0: merged into its left neighbour
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        to_id, scores = self._text_to_id, self._scores
        queue = []

        def push(left, right):
            if left < 0 or right < 0:
                return
            piece = text[start[left]:start[right] + size[right]]
            tid = to_id.get(piece)
            if tid is not None:
                heapq.heappush(queue, (-scores[tid], left, right, len(piece)))

        for i in range(1, n):
            push(i - 1, i)
        while queue:
            _, left, right, length = heapq.heappop(queue)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != length:
                continue
            size[left] = length
            size[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            push(prev[left], left)
            push(left, nxt[left])
        ids = []
        i = 0 if n else -1
        while i >= 0:
            piece = text[start[i]:start[i] + size[i]]
            tid = to_id.get(piece)
            if tid is not None:
                ids.append(tid)
            else:
                for b in piece.encode("utf-8", "surrogatepass"):
                    if self._byte_ids[b] is not None:
                        ids.append(self._byte_ids[b])
            i = nxt[i]
        return ids

    # -- construction from files -------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, meta):
        model = meta.get("tokenizer.ggml.model")
        if model != "llama":
            raise ValueError(f"tokenizer model {model!r} is not SentencePiece ('llama')")
        tokens = meta["tokenizer.ggml.tokens"]
        types = meta.get("tokenizer.ggml.token_type") or [TOKEN_TYPE_NORMAL] * len(tokens)
        scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
        special = strata_vocab._special_ids_from_meta(meta, len(tokens))
        unk = meta.get("tokenizer.ggml.unknown_token_id")
        return cls(tokens, types, scores, special, meta.get("tokenizer.chat_template"),
                   meta.get("tokenizer.ggml.add_bos_token", True),
                   meta.get("tokenizer.ggml.add_space_prefix", True),
                   unk if isinstance(unk, int) and 0 <= unk < len(tokens) else None)

    @classmethod
    def from_gguf(cls, path, cache_dir=None):
        return cls.from_metadata(gguf_meta.read_metadata(path, keys=SPM_KEYS))


def load_tokenizer(path, cache_dir=None):
    """The tokenizer the GGUF's tokenizer.ggml.model names: BPE ("gpt2") or SentencePiece ("llama")."""
    model = gguf_meta.read_metadata(path, keys=("tokenizer.ggml.model",)).get("tokenizer.ggml.model")
    if model == "llama":
        return SpmTokenizer.from_gguf(path)
    if model == "gpt2":
        return strata_tokenizer.Tokenizer.from_gguf(path, cache_dir=cache_dir)
    raise ValueError(f"{path}: tokenizer model {model!r} is not supported (byte-level BPE 'gpt2' or "
                     "SentencePiece 'llama')")

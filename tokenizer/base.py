"""The tokenizer's common side: special-token splitting, marks, decoding, and the byte tokenizer.

Role: `BaseTokenizer` splits text at special tokens (longest literal first, `plain` spans never special),
records marks, and decodes ids to text; a subclass supplies `_encode_text` and the token tables
(tokenizer/bpe.py `Tokenizer`: byte-level BPE over a GGUF vocabulary; `ByteTokenizer` here: one id per byte,
for tests and the mock engine). Also the GPT-2 byte <-> character tables, `check_text` (text that cannot be
UTF-8 encoded is refused) and `StreamDecoder` (ids to text without splitting a character). Imports nothing of
ours but tokenizer/vocab.py; knows nothing of HTTP, templates or the engine. The algorithm and the thread-safety
note: tokenizer/bpe.py's docstring.

Text or ids the tokenizer cannot take (a lone surrogate, a token id outside the vocabulary) raise `TextError`, a
ValueError: input, not a failure of the tokenizer (the server answers it with a 400).

Public surface: `BaseTokenizer`, `ByteTokenizer`, `StreamDecoder`, `TextError`, `check_text(text)`,
`normalize_spans(spans, length)`, `BYTE_CHARS`, `CHAR_BYTES`, `BYTES_TO_CHARS`, `SPECIAL_NAMES`.
"""

import codecs

import regex

from tokenizer.vocab import TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_USER_DEFINED

_LONE_SURROGATE = regex.compile(r"[\ud800-\udfff]")
SPECIAL_NAMES = {"<|endoftext|>": "endoftext", "<|im_start|>": "im_start", "<|im_end|>": "im_end"}


def _gpt2_byte_chars():
    """The GPT-2 byte -> printable character table: 256 one-char strings."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {}
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


BYTE_CHARS = _gpt2_byte_chars()
CHAR_BYTES = {c: b for b, c in enumerate(BYTE_CHARS)}
BYTES_TO_CHARS = {b: c for b, c in enumerate(BYTE_CHARS)}  # str.translate table over latin-1 text


class TextError(ValueError):
    """Text or token ids this tokenizer cannot take; the message says which and where."""


def check_text(text):
    """Raise TextError if `text` cannot be UTF-8 encoded (lone surrogates)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be str, not {type(text).__name__}")
    m = _LONE_SURROGATE.search(text)
    if m:
        raise TextError(f"text has a lone surrogate U+{ord(m.group()):04X} at offset {m.start()}; "
                         "it cannot be encoded as UTF-8")


def normalize_spans(spans, length):
    """Sorted, disjoint, non-empty (start, end) spans clipped to [0, length]; touching spans are joined."""
    if not spans:
        return []
    out = []
    for start, end in sorted((max(0, int(s)), min(length, int(e))) for s, e in spans):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def _partial_overlaps(literals, limit=8):
    """Pairs (a, b) of literals where a proper suffix of a is a proper prefix of b: the only case where
    this left-to-right scan and llama.cpp's longest-literal-first partition can disagree."""
    prefixes = {}
    for b in literals:
        for k in range(1, len(b)):
            prefixes.setdefault(b[:k], b)
    out = []
    for a in literals:
        for k in range(1, len(a)):
            b = prefixes.get(a[k:])
            if b is not None and len(out) < limit:
                out.append((a, b))
    return out


def _open_segments(length, plain):
    """Complement of the normalized plain spans within [0, length]: where specials may match."""
    pos = 0
    for start, end in plain:
        if start > pos:
            yield pos, start
        pos = end
    if pos < length:
        yield pos, length


class StreamDecoder:
    """Turns a stream of ids into text without splitting a UTF-8 character across outputs.

    feed(id) returns the complete characters now available; flush() returns what is held (an incomplete
    sequence becomes U+FFFD). Concatenated outputs equal tokenizer.decode(all ids). Not thread-safe: one
    decoder per stream.
    """

    def __init__(self, tokenizer, errors="replace"):
        self._token_bytes = tokenizer.token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors=errors)

    def feed(self, token_id):
        return self._decoder.decode(self._token_bytes(token_id))

    def flush(self):
        out = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return out


class BaseTokenizer:
    """Special-token splitting, marks, decoding; subclasses supply _encode_text and the token tables."""

    n_vocab = 0
    pre = ""
    chat_template = None
    add_bos = False         # no supported model wants a BOS prepended (tokenizer.ggml.add_bos_token)
    missing_bytes = b""     # bytes with no token of their own, dropped by encode (as llama.cpp does)

    def _init_specials(self, token_texts, token_types):
        """Build the special-token matchers from parallel lists of token text and GGUF type."""
        control, user = {}, {}
        for tid, (text, ttype) in enumerate(zip(token_texts, token_types)):
            if not text:
                continue
            if ttype in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN):  # llama.cpp treats both alike here
                control[text] = tid
            elif ttype == TOKEN_TYPE_USER_DEFINED:
                user[text] = tid
        self._special_to_id = {**control, **user}
        self._special_pattern_all = self._literal_pattern(self._special_to_id)
        self._special_pattern_user = self._literal_pattern(user)
        self.max_special_chars = max((len(t) for t in self._special_to_id), default=0)
        self.special_overlaps = _partial_overlaps(self._special_to_id)


    @staticmethod
    def _literal_pattern(literals):
        """A regex matching the longest of `literals` at a position, built as a trie: each node's
        branches start with distinct characters and a literal that ends there is an optional suffix
        tried last, so the match is the longest literal. (A flat alternation of hundreds of literals is
        ~50x slower to search.)"""
        if not literals:
            return None
        trie = {}
        for literal in literals:
            node = trie
            for ch in literal:
                node = node.setdefault(ch, {})
            node[""] = {}  # a literal ends here

        def build(node):
            branches = [regex.escape(ch) + build(child) for ch, child in sorted(node.items()) if ch]
            if not branches:
                return ""
            body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
            return f"(?:{body})?" if "" in node else body

        return regex.compile(build(trie))

    def special_pattern(self, parse_special=True):
        """The compiled literal pattern of the specials that match under `parse_special` (or None)."""
        return self._special_pattern_all if parse_special else self._special_pattern_user

    def encode(self, text, parse_special=False, plain=None):
        """Token ids of `text`. `plain`: (start, end) char spans never matched as special tokens."""
        return self._encode(text, parse_special, plain, None)

    def encode_marked(self, text, parse_special=True, plain=None):
        """(ids, marks); marks: per special matched, (char offset after it, ids up to and including it)."""
        marks = []
        ids = self._encode(text, parse_special, plain, marks)
        return ids, marks

    def _encode(self, text, parse_special, plain, marks):
        check_text(text)
        length = len(text)
        spans = normalize_spans(plain, length)
        ids = []
        pattern = self.special_pattern(parse_special)
        pos = 0  # start of the text not yet encoded
        if pattern is not None:
            special_to_id = self._special_to_id
            for seg_start, seg_end in _open_segments(length, spans):
                search = pattern.search
                q = seg_start
                while True:
                    m = search(text, q, seg_end)
                    if m is None:
                        break
                    start, end = m.span()
                    if start > pos:
                        self._encode_text(text[pos:start], ids)
                    ids.append(special_to_id[m.group()])
                    if marks is not None:
                        marks.append((end, len(ids)))
                    pos = q = end
        if pos < length:
            self._encode_text(text[pos:], ids)
        return ids

    def token_to_id(self, text):
        return self._text_to_id.get(text)

    def id_to_token(self, token_id):
        if not 0 <= token_id < self.n_vocab:
            raise TextError(f"token id {token_id} out of range [0, {self.n_vocab})")
        return self._id_text[token_id]

    def token_bytes(self, token_id):
        if not 0 <= token_id < self.n_vocab:
            raise TextError(f"token id {token_id} out of range [0, {self.n_vocab})")
        return self._id_bytes[token_id]

    def decode(self, ids, errors="replace"):
        ids = list(ids)
        if ids and (min(ids) < 0 or max(ids) >= self.n_vocab):
            bad = next(i for i in ids if not 0 <= i < self.n_vocab)
            raise TextError(f"token id {bad} out of range [0, {self.n_vocab})")
        return b"".join(map(self._id_bytes.__getitem__, ids)).decode("utf-8", errors)

    def stream_decoder(self):
        return StreamDecoder(self)


class ByteTokenizer(BaseTokenizer):
    """Ids 0-255 are bytes; specials from 256 (first three control, the rest user-defined). For tests and
    the mock engine. id_to_token of a byte id is its GPT-2 character, as in a byte-level BPE vocabulary."""

    DEFAULT_SPECIALS = (("<|endoftext|>", TOKEN_TYPE_CONTROL), ("<|im_start|>", TOKEN_TYPE_CONTROL),
                        ("<|im_end|>", TOKEN_TYPE_CONTROL), ("<think>", TOKEN_TYPE_USER_DEFINED),
                        ("</think>", TOKEN_TYPE_USER_DEFINED), ("<tool_call>", TOKEN_TYPE_USER_DEFINED),
                        ("</tool_call>", TOKEN_TYPE_USER_DEFINED))

    def __init__(self, specials=DEFAULT_SPECIALS):
        texts = list(BYTE_CHARS) + [t for t, _ in specials]
        types = [TOKEN_TYPE_NORMAL] * 256 + [ty for _, ty in specials]
        self.n_vocab = len(texts)
        self.pre = "bytes"
        self.chat_template = None
        self.token_types = types
        self._id_text = texts
        self._text_to_id = {t: i for i, t in enumerate(texts)}
        self._id_bytes = [bytes([b]) for b in range(256)] + [t.encode("utf-8") for t, _ in specials]
        self._init_specials(texts, types)
        self.special_ids = {name: self._text_to_id[t] for t, name in SPECIAL_NAMES.items()
                            if t in self._text_to_id}
        if "im_end" in self.special_ids:
            self.special_ids["eos"] = self.special_ids["eot"] = self.special_ids["im_end"]

    def _encode_text(self, text, out):
        out.extend(text.encode("utf-8"))

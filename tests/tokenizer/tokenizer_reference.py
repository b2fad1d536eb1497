"""Independent, deliberately naive reference tokenizer and test corpus for tests/tools.

Written separately from tokenizer/bpe.py so that agreement means something:
  - the pre-tokenizer applies llama.cpp's regex *list* for each `pre` name literally, one regex after the
    other over the pieces of the previous one, keeping unmatched text as pieces (llama.cpp's semantics;
    the module under test uses its own single-pass patterns);
  - BPE works on strings: it rescans the whole piece for the lowest-rank adjacent pair, merges the leftmost
    such pair, and repeats (obviously correct, quadratic);
  - special tokens are found by a character loop trying every literal, longest first, at each position.
"""

import struct
import random

import regex

# llama.cpp llama-vocab.cpp regex lists (facts: the patterns themselves), by pre name.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_QWEN_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
LLAMA_CPP_REGEXES = {
    "gpt2": [_GPT2],
    "smollm": [r"\p{N}", _GPT2],
    "llama-bpe": [_QWEN_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "qwen2": [_QWEN_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "qwen35": [_QWEN_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "tekken": [r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])"
               r"([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "gpt-4o": [r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _QWEN_CONTRACTIONS + r"?"
               r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _QWEN_CONTRACTIONS + r"?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
}
IGNORE_MERGES = {"llama-bpe", "tekken"}


def bytes_to_unicode():
    """GPT-2's table: printable Latin-1 bytes stand for themselves, the other 68 bytes take 256, 257, ..."""
    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    table = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


def pretokenize(text, pre):
    chunks = [text]
    for pattern in LLAMA_CPP_REGEXES[pre]:
        out = []
        for chunk in chunks:
            pos = 0
            for m in regex.finditer(pattern, chunk):
                if m.start() > pos:
                    out.append(chunk[pos:m.start()])
                if m.end() > m.start():
                    out.append(m.group())
                pos = m.end()
            if pos < len(chunk):
                out.append(chunk[pos:])
        chunks = out
    return chunks


class NaiveBPE:
    """Reference encoder over (tokens, token_types, merges, pre)."""

    def __init__(self, tokens, token_types, merges, pre):
        self.vocab = {}
        for i, t in enumerate(tokens):
            self.vocab[t] = i
        self.ranks = {}
        for rank, line in enumerate(merges):
            left, right = line.split(" ", 1) if not line.startswith(" ") else (" ", line[2:])
            self.ranks.setdefault((left, right), rank)
        self.pre = pre
        self.byte_char = bytes_to_unicode()
        self.specials = sorted([t for t, ty in zip(tokens, token_types) if ty in (2, 3, 4) and t],
                               key=len, reverse=True)
        self.user_defined = {t for t, ty in zip(tokens, token_types) if ty == 4}

    def bpe(self, piece):
        mapped = "".join(self.byte_char[b] for b in piece.encode("utf-8"))
        if self.pre in IGNORE_MERGES and mapped in self.vocab:
            return [self.vocab[mapped]]
        symbols = list(mapped)
        while True:
            best_rank, best_i = None, None
            for i in range(len(symbols) - 1):
                rank = self.ranks.get((symbols[i], symbols[i + 1]))
                if rank is not None and (best_rank is None or rank < best_rank):
                    best_rank, best_i = rank, i
            if best_rank is None:
                break
            symbols[best_i:best_i + 2] = [symbols[best_i] + symbols[best_i + 1]]
        ids = []
        for s in symbols:
            if s in self.vocab:
                ids.append(self.vocab[s])
            else:  # llama.cpp: a symbol that is not a token falls back to its single bytes as one-byte
                # strings (never valid UTF-8 above 0x7f, hence never a token there); the rest is dropped
                for b in s.encode("utf-8"):
                    if b < 0x80 and chr(b) in self.vocab:
                        ids.append(self.vocab[chr(b)])
        return ids

    def encode_text(self, text):
        ids = []
        for piece in pretokenize(text, self.pre):
            ids.extend(self.bpe(piece))
        return ids

    def encode(self, text, parse_special=False, plain=()):
        plain_chars = set()
        for s, e in plain or ():
            plain_chars.update(range(s, e))
        ids, pending, i = [], [], 0
        while i < len(text):
            hit = None
            for lit in self.specials:
                if not parse_special and lit not in self.user_defined:
                    continue
                if text.startswith(lit, i) and not plain_chars.intersection(range(i, i + len(lit))):
                    hit = lit
                    break
            if hit is None:
                pending.append(text[i])
                i += 1
                continue
            ids.extend(self.encode_text("".join(pending)))
            pending = []
            ids.append(self.vocab[hit])
            i += len(hit)
        ids.extend(self.encode_text("".join(pending)))
        return ids


# -- corpus -----------------------------------------------------------------------------------------

PROSE = ("The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see. I'M SURE YOU'RE RIGHT, "
         "they'VE said it'S fine and She'D agree. Don't, won't, can't... \"Quoted\" (parenthesised) [x] {y}!")
CODE = ("def f(x, y=2):\n\tif x >= 10:\n\t\treturn {'a': [1, 2]}\n" + " " * 17 + "pass\n\n\n"
        "int main(void) {\n    printf(\"%d\\n\", 42);\t\t// tab\n}\n" + " " * 300 + "\n" + "\t" * 9 + "x\r\n")
CJK = "自然言語処理は人工知能の一分野です。我们今天讨论分词器。한국어 문장도 있습니다。カタカナとひらがな"
EMOJI = ("👩‍👩‍👧‍👦 👍🏽👍🏿 🏳️‍🌈 🇯🇵🇫🇷 🧑🏾‍🚀 ❤️ ✊🏻 🤷‍♀️ 1️⃣")
MARKS = "e\u0301 a\u0308\u0323 n\u0303o नमस्ते दुनिया العَرَبِيَّة ก่า Ǆ ǅ x\u20dd"
DIGITS = "0 12 345 6789 1234567890123 ١٢٣٤ ۱۲۳ １２３ ²³ Ⅻ ½ 3.14159 1,000,000 v2.0.1"
CONTROL = "\x00\x01\x02\x07\x08\x0b\x0c\x1b[0m\x1c\x1d\x1e\x1f\x7f\x85 \xa0nbsp\u2028\u2029\u3000\ufeff\u200b"
SPECIAL_TEXT = ("<|im_start|>user\nhi<|im_end|>\n<|endoftext|><|im_start|> <|im_ <|im_end|x "
                "<|im_end|><|im_end|>")
CORPUS_PARTS = [PROSE, CODE, CJK, EMOJI, MARKS, DIGITS, CONTROL, SPECIAL_TEXT]


def random_mix(n_strings, seed=0, max_len=60):
    """Strings drawn from every corpus part's characters and words, in random order."""
    rnd = random.Random(seed)
    pool_chars = sorted(set("".join(CORPUS_PARTS)))
    pool_words = "".join(CORPUS_PARTS).split(" ")
    out = []
    for _ in range(n_strings):
        bits = []
        for _ in range(rnd.randint(1, max_len // 4)):
            r = rnd.random()
            if r < 0.4:
                bits.append(rnd.choice(pool_chars))
            elif r < 0.8:
                bits.append(rnd.choice(pool_words))
            else:
                bits.append(rnd.choice([" ", "  ", "\n", "\t", "'", "'S", "'ll", "\r\n", " " * 7]))
        out.append("".join(bits))
    return out


# -- metadata-only GGUF copies (for llama.cpp comparisons under other pre names) ------------------

def _kv_spans(data):
    """[(key, start, end)] byte spans of the metadata pairs of a GGUF v3 file (walked independently)."""
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(type_code, pos):
        if type_code in sizes:
            return pos + sizes[type_code]
        if type_code == 8:
            return pos + 8 + struct.unpack_from("<Q", data, pos)[0]
        item_type, count = struct.unpack_from("<IQ", data, pos)
        pos += 12
        if item_type in sizes:
            return pos + count * sizes[item_type]
        for _ in range(count):
            pos = skip(item_type, pos)
        return pos

    pos, out = 24, []
    for _ in range(struct.unpack_from("<Q", data, 16)[0]):
        start = pos
        n = struct.unpack_from("<Q", data, pos)[0]
        key = data[pos + 8:pos + 8 + n].decode()
        type_code = struct.unpack_from("<I", data, pos + 8 + n)[0]
        pos = skip(type_code, pos + 12 + n)
        out.append((key, start, pos))
    return out


def derive_gguf(src, dst, pre):
    """Write `dst`: the metadata of `src` with tokenizer.ggml.pre set to `pre`, and no tensors."""
    data = open(src, "rb").read()
    spans = _kv_spans(data)
    body = b""
    for key, start, end in spans:
        if key == "tokenizer.ggml.pre":
            raw = pre.encode()
            body += data[start:start + 8 + len(key)] + struct.pack("<IQ", 8, len(raw)) + raw
        else:
            body += data[start:end]
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(spans)) + body
    with open(dst, "wb") as f:
        f.write(out + b"\0" * (-len(out) % 32))


def write_gguf(path, kvs):
    """A metadata-only GGUF v3 file from [(key, type_code, value)]; a string value may be raw bytes
    (to write token texts that are not UTF-8); arrays are (item_type, [values])."""
    formats = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(type_code, v):
        if type_code in formats:
            return struct.pack("<" + formats[type_code], v)
        if type_code == 8:
            raw = v if isinstance(v, bytes) else v.encode("utf-8")
            return struct.pack("<Q", len(raw)) + raw
        item_type, items = v
        return struct.pack("<IQ", item_type, len(items)) + b"".join(value(item_type, x) for x in items)

    body = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    for key, type_code, v in kvs:
        body += value(8, key) + struct.pack("<I", type_code) + value(type_code, v)
    with open(path, "wb") as f:
        f.write(body)


def toy_tokenizer_kvs(pre="gpt-2"):
    """A small byte-level BPE vocabulary: 256 byte tokens, a few merges, a control, a user-defined and a
    not-UTF-8 token."""
    table = bytes_to_unicode()
    tokens = [table[b] for b in range(256)]
    merges = ["Ġ t", "h e", "Ġt he", "l l", "he ll", "ll o", "Ġ w"]
    for m in merges:
        tokens.append(m.replace(" ", ""))
    tokens += ["<|im_end|>", "<think>"]
    types = [1] * (len(tokens) - 2) + [3, 4]
    raw_tokens = [t.encode("utf-8") for t in tokens] + [b"\xff\xfe"]
    types.append(1)
    return [("general.architecture", 8, "llama"), ("tokenizer.ggml.model", 8, "gpt2"),
            ("tokenizer.ggml.pre", 8, pre), ("tokenizer.ggml.tokens", 9, (8, raw_tokens)),
            ("tokenizer.ggml.token_type", 9, (5, types)), ("tokenizer.ggml.merges", 9, (8, merges)),
            ("tokenizer.ggml.eos_token_id", 4, len(tokens) - 2),
            ("tokenizer.chat_template", 8, "{{ messages }}")]

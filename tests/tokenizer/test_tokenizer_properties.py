"""Property tests (hypothesis) for tokenizer/bpe.py.

- decode(encode(s)) == s for every string without lone surrogates (for the real vocabulary: every string
  whose UTF-8 bytes all have tokens; llama.cpp drops the others, and so do we);
- each single-pass pre-tokenizer pattern cuts text exactly as llama.cpp's regex list for its pre name;
- PromptEncoder equals a full encode for random chat transcripts, cut points and plain spans;
- the streaming decoder equals decode for every split of the ids.
"""

import pathlib
import sys
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import tokenizer_reference as ref  # noqa: E402
from tests.conftest import model_path  # noqa: E402
from tokenizer.prompt_encoder import PromptEncoder  # noqa: E402
from tokenizer.bpe import PRE_TOKENIZERS, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED, ByteTokenizer, Tokenizer

MODEL = model_path()
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CHAT_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_REAL = {}


def real_tokenizer():
    if MODEL is None:
        pytest.skip("default model GGUF not installed")
    if "tok" not in _REAL:
        _REAL["tok"] = Tokenizer.from_gguf(MODEL)
    return _REAL["tok"]


# Characters that exercise every regex branch, plus anything hypothesis likes.
_INTERESTING = list("aZé中한ア \t\n\r\x0b\x0c\x85\xa0\u2028\u3000'sStTlLdDmMrReEvV09١²Ⅻ.,!?<|>_-/#$\x00\x1f\x7f"
                    "\u0301\u0308\u200d\U0001F44D\U0001F3FD\ufe0f")
_SPECIAL_BITS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
                 "</tool_call>", "<|im_", "|>", "'s", "  ", "\n\n", "1234"]
text_st = st.lists(st.one_of(st.sampled_from(_INTERESTING), st.sampled_from(_SPECIAL_BITS),
                             st.characters(blacklist_categories=("Cs",))), max_size=40).map("".join)


@SETTINGS
@given(text_st, st.booleans())
def test_roundtrip_bytes(text, special):
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text, special)) == text


@SETTINGS
@given(text_st, st.booleans())
def test_roundtrip_real(text, special):
    tok = real_tokenizer()
    data = text.encode("utf-8")
    # bytes with no token are dropped (as llama.cpp does); everything else comes back exactly
    kept = bytes(b for b in data if b not in tok.missing_bytes)
    assert tok.decode(tok.encode(text, special)) == kept.decode("utf-8", "replace")
    if kept == data:
        assert tok.decode(tok.encode(text, special)) == text


@SETTINGS
@given(text_st)
def test_single_pass_patterns_cut_like_llama_cpp(text):
    import regex
    for pre in ref.LLAMA_CPP_REGEXES:
        pieces = regex.findall(PRE_TOKENIZERS[pre][0], text)
        assert pieces == ref.pretokenize(text, pre), pre


def _tricky_bytes():
    # Specials that contain or overlap one another, so a match can straddle a mark.
    return ByteTokenizer(specials=(("<|x|>", TOKEN_TYPE_CONTROL), ("<|x|>y", TOKEN_TYPE_CONTROL),
                                   ("|>y", TOKEN_TYPE_USER_DEFINED), ("x|", TOKEN_TYPE_CONTROL),
                                   ("<|im_end|>", TOKEN_TYPE_CONTROL)))


message_st = st.lists(st.one_of(st.sampled_from(_INTERESTING), st.sampled_from(_SPECIAL_BITS),
                                st.sampled_from(["<|x|>", "y", "x|", "|>"])), max_size=8).map("".join)
chat_st = st.lists(st.tuples(st.integers(0, 2), message_st), min_size=1, max_size=5)


def _render(messages):
    return "".join(f"<|im_start|>{('system', 'user', 'assistant')[r]}\n{m}<|im_end|>\n"
                   for r, m in messages)


def _check_prompt_encoder(tok, data, chats, keep):
    enc = PromptEncoder(tok, keep=keep)
    for _ in range(data.draw(st.integers(1, 6))):
        chat = data.draw(st.sampled_from(chats))
        k = data.draw(st.integers(1, len(chat)))
        opening = data.draw(st.sampled_from(["<|im_start|>assistant\n", "", "<|x|>", "<|x|>y"]))
        text = _render(chat[:k]) + opening
        if data.draw(st.booleans()):  # a random cut point
            text = text[:data.draw(st.integers(0, len(text)))]
        plain = data.draw(st.lists(st.tuples(st.integers(0, len(text)), st.integers(0, len(text))),
                                   max_size=3))
        store = data.draw(st.booleans())
        got = enc.encode(text, plain=plain, store=store)
        assert got == tok.encode(text, True, plain), (text, plain)
        if data.draw(st.integers(0, 5)) == 0:
            enc.forget(got)


@CHAT_SETTINGS
@given(st.data(), st.lists(chat_st, min_size=1, max_size=2), st.integers(0, 3))
def test_prompt_encoder_equals_full_encode_bytes(data, chats, keep):
    _check_prompt_encoder(ByteTokenizer(), data, chats, keep)


@CHAT_SETTINGS
@given(st.data(), st.lists(chat_st, min_size=1, max_size=2), st.integers(1, 3))
def test_prompt_encoder_equals_full_encode_tricky_specials(data, chats, keep):
    _check_prompt_encoder(_tricky_bytes(), data, chats, keep)


@settings(max_examples=40, deadline=None)
@given(st.data(), st.lists(chat_st, min_size=1, max_size=2), st.integers(1, 3))
def test_prompt_encoder_equals_full_encode_real(data, chats, keep):
    _check_prompt_encoder(real_tokenizer(), data, chats, keep)


def _check_stream(tok, ids):
    want = tok.decode(ids)
    dec = tok.stream_decoder()
    got = ""
    for i in ids:
        piece = dec.feed(i)
        got += piece
        assert want.startswith(got)
    assert got + dec.flush() == want


@SETTINGS
@given(st.lists(st.integers(0, 262), max_size=30))
def test_stream_decoder_equals_decode_bytes(ids):
    _check_stream(ByteTokenizer(), ids)


@SETTINGS
@given(st.lists(st.integers(0, 49151), max_size=30))
def test_stream_decoder_equals_decode_real(ids):
    _check_stream(real_tokenizer(), ids)


def test_concurrent_encodes_are_exact():
    tok = real_tokenizer() if MODEL else ByteTokenizer()
    enc = PromptEncoder(tok, keep=2)
    texts = [_render([(1, m), (2, m[::-1])] * 3) for m in ref.random_mix(40, seed=11)]
    want = [tok.encode(t, True) for t in texts]
    errors = []

    def worker(offset):
        for j in range(len(texts)):
            i = (j + offset) % len(texts)
            if enc.encode(texts[i]) != want[i] or tok.encode(texts[i], True) != want[i]:
                errors.append(i)

    threads = [threading.Thread(target=worker, args=(k * 7,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors


literal_st = st.text(alphabet="ab<|>", min_size=2, max_size=5)  # 1 char would be a byte token


@CHAT_SETTINGS
@given(st.lists(st.tuples(literal_st, st.sampled_from([2, 3, 4])), min_size=1, max_size=8,
                unique_by=lambda x: x[0]),
       st.text(alphabet="ab<|> x", max_size=40), st.booleans(),
       st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=2))
def test_special_split_equals_naive_scan(specials, text, special, plain):
    # The trie pattern takes the longest literal at the leftmost position, as the naive scan does.
    tok = ByteTokenizer(specials=tuple(specials))
    naive = ref.NaiveBPE(tok._id_text, tok.token_types, [], "gpt2")
    assert tok.encode(text, special, plain) == naive.encode(text, special, plain)

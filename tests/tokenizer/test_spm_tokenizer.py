"""tokenizer/spm.py: the SentencePiece-style tokenizer.

A hand-made scored vocabulary pins the algorithm (score order, leftmost on ties, byte fallback, the ▁ mark,
add_space_prefix, control vs user-defined specials, decoding); hypothesis round trips run on it and on the
Gemma 3 vocabulary; the Gemma vocabulary is compared with llama.cpp's own tokenizer on a generated mixed
corpus (code, CJK, emoji, whitespace runs, characters that need byte fallback, specials) — skipped with the
reason when llama.cpp (the peer interpreter) or the Gemma package is not there.
"""

import pathlib
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests import gemma_model, oracle  # noqa: E402
from tokenizer.prompt_encoder import PromptEncoder  # noqa: E402
from tokenizer.spm import SpmTokenizer, load_tokenizer  # noqa: E402
from tests.conftest import corpus  # noqa: E402

N, U, C, UD, B = 1, 2, 3, 4, 6  # GGUF token types: normal, unknown, control, user-defined, byte


def tiny(add_space_prefix=True):
    """A vocabulary of a few scored pieces plus the 256 byte tokens."""
    pieces = [("<unk>", U, 0.0), ("<s>", C, 0.0), ("</s>", C, 0.0), ("<tool>", UD, 0.0)]
    pieces += [(f"<0x{b:02X}>", B, 0.0) for b in range(256)]
    pieces += [("▁", N, -1.0), ("a", N, -2.0), ("b", N, -2.0), ("c", N, -2.0), ("ab", N, -5.0),
               ("bc", N, -3.0), ("abc", N, -4.0), ("▁a", N, -6.0), ("▁abc", N, -1.5), ("cc", N, -3.0)]
    tokens, types, scores = zip(*pieces)
    return SpmTokenizer(list(tokens), list(types), list(scores), {"bos": 1, "eos": 2},
                        add_space_prefix=add_space_prefix, unk_id=0)


def ids_of(tok, *texts):
    return [tok.token_to_id(t) for t in texts]


def test_best_score_first_then_leftmost():
    tok = tiny(add_space_prefix=False)
    # pairs: ab (-5), bc (-3): bc wins; then a+bc = abc (-4) is a token: merged
    assert tok.encode("abc") == ids_of(tok, "abc")
    # "ccc": cc at 0 and at 1 tie (-3): the leftmost merges, the last c stays
    assert tok.encode("ccc") == ids_of(tok, "cc", "c")


def test_space_prefix_and_mark():
    tok = tiny(add_space_prefix=True)
    # "▁abc" : ▁a (-6), ab (-5), bc (-3) -> bc; then ▁+a? no; a+bc=abc (-4) -> then ▁+abc = ▁abc (-1.5)
    assert tok.encode("abc") == ids_of(tok, "▁abc")
    assert tok.encode("a b") == ids_of(tok, "▁a", "▁", "b")
    assert tok.decode(tok.encode("a b")) == " a b"  # the prefix space is the model's, decode keeps it


def test_byte_fallback_and_decode():
    tok = tiny(add_space_prefix=False)
    ids = tok.encode("aé🙂")
    assert ids == ids_of(tok, "a", "<0xC3>", "<0xA9>", "<0xF0>", "<0x9F>", "<0x99>", "<0x82>")
    assert tok.decode(ids) == "aé🙂"
    stream = tok.stream_decoder()
    assert "".join(stream.feed(i) for i in ids) + stream.flush() == "aé🙂"


def test_specials_control_only_when_parsed_user_defined_always():
    tok = tiny(add_space_prefix=True)
    assert tok.encode("<s>a", parse_special=True) == [1] + ids_of(tok, "▁a")
    assert tok.encode("<s>", parse_special=False)[0] != 1
    # a user-defined token splits the text even without parse_special; the text after it is a new
    # fragment and gets its own prefix space, as in llama.cpp
    assert tok.encode("a<tool>a") == ids_of(tok, "▁a", "<tool>", "▁a")
    ids, marks = tok.encode_marked("a<tool>a")
    assert marks == [(len("a<tool>"), 2)]


def test_prompt_encoder_equals_encode():
    tok = tiny(add_space_prefix=False)
    enc = PromptEncoder(tok, keep=2)
    text = "ab<s>cc"
    for i in range(1, 6):
        text += f"<s>abc{'c' * i}</s>"
        assert enc.encode(text) == tok.encode(text, parse_special=True)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_round_trip_tiny(text):
    tok = tiny(add_space_prefix=False)
    assert tok.decode(tok.encode(text)) == text


@pytest.fixture(scope="module")
def gemma():
    path = gemma_model.gemma_path()
    return path, load_tokenizer(path)


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_round_trip_gemma(gemma, text):
    _, tok = gemma
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("parse_special", [False, True])
def test_gemma_matches_llama_cpp(gemma, parse_special):
    path, tok = gemma
    oracle.require_oracle()
    texts = corpus()
    theirs = oracle.ask({"op": "tokenize", "model": path, "texts": texts, "add_special": False,
                         "parse_special": parse_special})["ids"]
    bad = [(t, tok.encode(t, parse_special=parse_special), ids) for t, ids in zip(texts, theirs)
           if tok.encode(t, parse_special=parse_special) != ids]
    assert not bad, f"{len(bad)} of {len(texts)} differ, first: {bad[0]!r}"

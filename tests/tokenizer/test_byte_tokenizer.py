"""ByteTokenizer: the test/mock tokenizer shares the special-token rules of the real one."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from tokenizer.prompt_encoder import PromptEncoder  # noqa: E402
from tokenizer.bpe import ByteTokenizer  # noqa: E402


def test_bytes_and_specials():
    tok = ByteTokenizer()
    assert tok.n_vocab == 263
    assert tok.encode("hi") == [104, 105]
    # control tokens only with parse_special; user-defined always
    assert tok.encode("<|im_start|>x<think>", parse_special=True) == [257, 120, 259]
    assert tok.encode("<|im_start|>x<think>")[-1] == 259
    assert tok.encode("<|im_start|>")[0] == ord("<")
    assert tok.special_ids["im_end"] == 258 and tok.special_ids["eos"] == 258
    assert tok.token_to_id("</tool_call>") == 262 and tok.id_to_token(262) == "</tool_call>"


def test_plain_spans_and_marks():
    tok = ByteTokenizer()
    text = "<|im_start|>u <|im_end|><|im_end|>"
    ids, marks = tok.encode_marked(text, plain=[(14, 24)])
    assert ids[0] == 257 and ids[-1] == 258 and ids.count(258) == 1
    assert marks == [(12, 1), (34, len(ids))]
    assert tok.decode(ids) == text


def test_lone_surrogate_refused():
    with pytest.raises(ValueError, match="surrogate"):
        ByteTokenizer().encode("a\ud800b")


def test_stream_decoder_holds_partial_character():
    tok = ByteTokenizer()
    ids = tok.encode("é€")
    dec = tok.stream_decoder()
    outs = [dec.feed(i) for i in ids]
    assert outs == ["", "é", "", "", "€"]
    assert dec.flush() == ""


def test_prompt_encoder_reuses_prefix():
    tok = ByteTokenizer()
    enc = PromptEncoder(tok, keep=2)
    first = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert enc.encode(first) == tok.encode(first, True)
    second = first + "hello<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n"
    assert enc.encode(second) == tok.encode(second, True)
    assert enc.reused_ids == len(tok.encode(first, True)) - len(tok.encode("assistant\n"))


def test_prompt_encoder_never_reuses_a_mark_that_a_longer_special_straddles():
    tok = ByteTokenizer(specials=(("<|x|>", 3), ("<|x|>y", 3)))
    enc = PromptEncoder(tok, keep=1)
    assert enc.encode("a<|x|>") == [97, 256]
    assert enc.encode("a<|x|>yz") == [97, 257, 122]  # not [97, 256, 121, 122]
    assert enc.reused_ids == 0


def test_prompt_encoder_needs_the_same_plain_spans_before_the_mark():
    tok = ByteTokenizer()
    enc = PromptEncoder(tok, keep=1)
    text = "<|im_start|>a<|im_end|>b"
    assert enc.encode(text) == tok.encode(text, True)
    assert enc.encode(text + "c", plain=[(13, 23)]) == tok.encode(text + "c", True, [(13, 23)])
    assert enc.reused_ids == 1  # only up to <|im_start|>, where the spans still agree


def test_forget_and_store_false():
    tok = ByteTokenizer()
    enc = PromptEncoder(tok, keep=2)
    text = "<|im_start|>a<|im_end|>"
    ids = enc.encode(text, store=False)
    enc.encode(text + "x")
    assert enc.reused_ids == 0
    enc.forget(enc.encode(text + "y"))
    assert enc.reused_ids == len(ids)
    enc.encode(text + "z")
    assert enc.reused_ids == len(ids)  # the prompt of "x" is still kept
    enc.forget(tok.encode(text + "z", True))
    enc.forget(tok.encode(text + "x", True))
    enc.encode(text + "w")
    assert enc.reused_ids == 0


def test_unknown_type_behaves_as_control_and_overlaps_are_reported():
    tok = ByteTokenizer(specials=(("<unk>", 2), ("<|x|>", 3), ("|>y", 4)))
    assert tok.encode("<unk>", parse_special=True) == [256]
    assert tok.encode("<unk>")[0] == ord("<")
    assert tok.special_overlaps == [("<|x|>", "|>y")]
    assert ByteTokenizer().special_overlaps == []

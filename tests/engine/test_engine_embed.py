"""Embeddings on the real engine (BEMB, docs/PROTOCOL.md "Embeddings"): a BEMB read shares the slot
steps with a decoding slot, whose greedy tokens stay those of a run alone; the vector does not depend on the
step budget (chunking); BSTOP during a BEMB read ends it `cancel` with no vector."""
import base64
import struct

from conftest import chat
from test_engine_slots import NO_EOS, accept, until


def vector(words):
    n = int(words[-2])
    return struct.unpack(f"<{n}f", base64.b64decode(words[-1]))


def bemb(e, slot, ids) -> list[str]:
    """BEMB, then its BACC; the other slots' lines read before it."""
    e.send(f"BEMB {slot} {','.join(map(str, ids))}")
    before = []
    while True:
        line = e.line()
        assert line is not None and not line.startswith("ERR"), line
        if line.startswith("BACC "):
            assert line.split() == ["BACC", str(slot), "0"]
            return before
        before.append(line)


def test_bemb_beside_a_decoding_slot(start_engine, tok):
    e = start_engine("--max-context", "2048", "--batch", "2", "--step-tokens", "16")
    story = chat(tok, "Tell a long story.")
    alone = e.gen(story, max_new=24, keys=NO_EOS).tokens
    text = chat(tok, " ".join(["An input embedded while another slot decodes."] * 6))
    accept(e, 0, 24, story)
    pending = bemb(e, 1, text)  # slot 0's read is two steps, the input's many: slot 0 decodes during it
    tokens, order, vec = {}, [], None
    while True:
        w = (pending.pop(0) if pending else e.line()).split()
        assert w[0] != "ERR", w
        order.append((w[0], int(w[1])) if w[0] in ("BPP", "BT", "BVEC", "BDONE") else (w[0], -1))
        if w[0] == "BT":
            tokens.setdefault(int(w[1]), []).append(int(w[2]))
        if w[0] == "BVEC":
            vec = vector(w)
        if ("BDONE", 0) in order and ("BDONE", 1) in order:
            break
    reads = [i for i, k in enumerate(order) if k == ("BPP", 1)]
    assert len(reads) > 2 and ("BT", 0) in order[reads[0]:reads[-1]], order  # decoding went on meanwhile
    assert order.index(("BVEC", 1)) == order.index(("BDONE", 1)) - 1 and 1 not in tokens
    assert tokens[0] == alone  # its greedy tokens, as alone
    # the same input alone on a one-slot engine, in one chunk: the same vector up to float rounding of the
    # chunked sums
    one = start_engine("--max-context", "2048", "--batch", "1", "--chunk", "2048")
    bemb(one, 0, text)
    alone_vec = vector(until(one, "BVEC 0 ").split())
    until(one, "BDONE 0 ")
    assert max(abs(a - b) for a, b in zip(vec, alone_vec)) < 1e-5


def test_bstop_during_a_bemb_read(start_engine, tok):
    e = start_engine("--max-context", "2048", "--batch", "2", "--step-tokens", "16")
    ids = chat(tok, " ".join(["A long input that is read in many steps."] * 12))
    bemb(e, 0, ids)
    e.expect("BPP 0 16 ")
    e.send("BSTOP 0")
    lines = []
    while not (lines and lines[-1].startswith("BDONE 0 ")):
        lines.append(e.line())
    assert not any(ln.startswith("BVEC") for ln in lines), lines
    end = lines[-1].split()
    assert end[3] == "cancel" and end[2] == "0" and 16 <= int(end[8]) < len(ids)

"""Sliding-window layers kept as rings (engine/kv_cache.h) against the same engine without rings.

A random-weight gemma3 file (tests/gguf_writer.py, SmolLM2's vocabulary: five 16-position window layers, then
one global layer). RING_FLAGS make n_batch 9 + 8 = 17, so each window layer keeps a ring of 16 + 17 - 1 = 32
cells plus 15 mirror cells instead of the 512 of the context; REF_FLAGS (default chunk: n_batch 520) would
need a ring longer than the context, so that engine keeps every position. Both run the same requests; the
greedy tokens must be equal, and the ring engine must reuse exactly what its rule allows (docs: model.h,
kv_cache_can_resume): a continuation inside the rings' hold resumes, a prompt that diverges before the
window of its divergence point is read again from 0, parked conversations, batch slots and SAVE/RESTORE
carry the rings' state. llama.cpp parity of the ring path is in test_gemma3.py.
"""

import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests import gguf_writer  # noqa: E402
from tests.engine.conftest import Engine  # noqa: E402
from tokenizer import gguf_meta  # noqa: E402

N_SWA = 16
RING = N_SWA + 17 - 1  # n_swa + n_batch - 1 under RING_FLAGS
CONTEXT = "512"
RING_FLAGS = ("--max-context", CONTEXT, "--chunk", "8", "--step-tokens", "9", "--threads", "2", "--batch", "2")
REF_FLAGS = ("--max-context", CONTEXT, "--threads", "2", "--batch", "2")
TEXT = ("The quick brown fox jumps over the lazy dog while the cat sleeps by the warm fire. "
        "def fib(n):\n    return n if n < 2 else fib(n-1) + fib(n-2)\n")


@pytest.fixture(scope="module")
def gemma_file(model_path, tmp_path_factory):
    vocab = {k: v for k, v in gguf_meta.read_metadata(str(model_path)).items()
             if k.startswith("tokenizer.") and k != "tokenizer.chat_template"}
    return gguf_writer.random_model(tmp_path_factory.mktemp("ring") / "gemma3.gguf", "gemma3", vocab, wtype="F16",
                                    seed=5, shapes=dict(n_layer=6, head_dim=128, n_swa=N_SWA, n_ctx=4096))


@pytest.fixture
def engines(engine_path, gemma_file):
    started = []
    try:
        for flags in (RING_FLAGS, REF_FLAGS):
            started.append(Engine(engine_path, gemma_file, *flags))
        yield started
    finally:
        for e in started:
            e.close()


def _keys(e):
    return "logit_bias=" + ",".join(f"{i}:-inf" for i in e.info["eos"].split(","))


def _gen(e, ids, n):
    g = e.gen(ids, max_new=n, keys=_keys(e))
    assert g.err is None and len(g.tokens) == n, g.lines[-3:]
    return g


def _bgen(e, slot, ids, n):
    e.send(f"BGEN {slot} {n} {_keys(e)} {','.join(map(str, ids))}")
    reused, toks = None, []
    while True:
        w = e.line().split()
        assert w[0] != "ERR", w
        if w[0] == "BACC":
            reused = int(w[2])
        elif w[0] == "BT":
            toks.append(int(w[2]))
        elif w[0] == "BDONE":
            return reused, toks


def _session(e, action, path):
    """BSAVE / BRESTORE of slot 0 (where _gen's requests run)."""
    e.send(f"B{action} 0 {path}")
    line = e.line()
    while line.startswith("SESSION "):
        line = e.line()
    assert line.startswith("SAVED " if action == "SAVE" else "RESTORED "), line


def test_ring_kv_is_smaller(engines):
    ring, ref = engines
    assert int(ring.info["kv_mib_per_seq"]) < int(ref.info["kv_mib_per_seq"]), (ring.info, ref.info)


def test_ring_reuse_rule_and_tokens(engines, tok):
    prompt = tok.encode(TEXT * 3)[:100]
    other = tok.encode("Completely unrelated words about mountains, rivers and the weather in spring.")
    results = []
    for e in engines:
        a = _gen(e, prompt, 8)
        cont = _gen(e, prompt + a.tokens[:4], 4)  # inside the rings' hold: resumes
        far = _gen(e, prompt[:40] + other, 8)     # diverges 60 positions back: older than any window held
        near_ids = prompt[:40] + other[:-3] + prompt[:5]  # diverges 3 + 8 positions back: still held
        near = _gen(e, near_ids, 8)
        results.append((a, cont, far, near))
    (a, cont, far, near), (ra, rcont, rfar, rnear) = results
    assert [g.tokens for g in (a, cont, far, near)] == [g.tokens for g in (ra, rcont, rfar, rnear)]
    assert cont.tokens == a.tokens[4:]
    assert cont.resume >= len(prompt) and rcont.resume == cont.resume
    assert rfar.resume == 40 and far.resume == 0  # the rule: read again from position 0
    n_near = 40 + len(other) - 3
    assert near.resume == rnear.resume == n_near


def test_ring_slots_conversation_cache_and_session_file(engines, tok, tmp_path):
    im_start = int(engines[0].info["im_start"])
    chat_a = [im_start] + tok.encode(TEXT * 2)[:70] + [im_start] + tok.encode("Answer:")
    chat_b = [im_start] + tok.encode("A different conversation about cooking rice and beans.") + [im_start]
    results = []
    for i, e in enumerate(engines):
        r = {}
        r["a"] = _gen(e, chat_a, 6)
        r["b"] = _gen(e, chat_b, 4)                        # parks chat a (diverges before its checkpoint)
        r["a2"] = _gen(e, chat_a + r["a"].tokens, 4)       # chat a's next turn, from the conversation cache
        r["slot"] = _bgen(e, 1, chat_a + r["a"].tokens, 4)  # slot 1 copies it from slot 0
        path = tmp_path / f"s{i}.session"
        _session(e, "SAVE", path)
        _gen(e, chat_b, 2)
        _session(e, "RESTORE", path)
        r["restored"] = _gen(e, chat_a + r["a"].tokens + r["a2"].tokens, 4)
        results.append(r)
    ring, ref = results
    for k in ("a", "b", "a2", "restored"):
        assert ring[k].tokens == ref[k].tokens, k
    assert ring["slot"][1] == ref["slot"][1] == ring["a2"].tokens
    assert ring["a2"].resume >= len(chat_a) and ring["slot"][0] >= len(chat_a)
    assert ring["restored"].resume >= len(chat_a) + 6
    assert any("conversation cache: restored" in l for l in engines[0].stderr_lines)

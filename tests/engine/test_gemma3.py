"""The gemma3 architecture against llama.cpp: a random-weight file, then the real Gemma 3 270M.

Random file (tests/gguf_writer.py, SmolLM2's vocabulary): 6 layers (five 16-position sliding-window layers,
then one global layer, Gemma 3's pattern), head_dim 128 != n_embd / n_head, a 38-token prompt plus 16 greedy
steps so that most queries see only their window; then the window layers as rings (engine/kv_cache.h) over
a 120-token prompt. Tolerance as tests/engine/test_arch_parity.py. Reuse with rings: test_gemma3_ring.py.

Real model (the optional package, installed and assembled in the set-up, else skipped with the reason):
greedy tokens of prompts that start with <bos>, over GREEDY_STEPS steps, equal to llama.cpp's, one prompt
longer than the 512-position window (run with the window layers as rings, KV bytes printed); a step whose
llama.cpp top-two margin is under GREEDY_MARGIN may differ (the margin is printed), and the runs are
compared no further.
"""

import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests import gemma_model, gguf_writer, oracle  # noqa: E402
from tests.engine.conftest import LOGIT_TOL_FLOAT, PROMPT, check_logits  # noqa: E402
from tokenizer import gguf_meta  # noqa: E402

GREEDY_STEPS = 64
GREEDY_MARGIN = 0.1
RING_STEPS = 24
# the real model's long prompt runs with its window layers as rings: a context the rings are shorter than,
# and chunks of 128 (ring 512 + 128 - 1 = 639 cells, so the 1,100-token prompt laps it)
LONG_CTX = 4096
LONG_CHUNK = 128


def test_random_gemma3_matches_llama_cpp(model_path, tok, tmp_path):
    vocab = {k: v for k, v in gguf_meta.read_metadata(str(model_path)).items()
             if k.startswith("tokenizer.") and k != "tokenizer.chat_template"}
    path = gguf_writer.random_model(tmp_path / "gemma3.gguf", "gemma3", vocab, wtype="F16", seed=3,
                                    shapes=dict(n_layer=6, head_dim=128))
    check_logits(path, tok.encode(PROMPT), LOGIT_TOL_FLOAT)


def test_random_gemma3_same_bits_at_any_thread_count(model_path, tok, tmp_path):
    """One kv head, as Gemma 3 270M: a decode step's attention is one (tile, kv head) item, which the forward
    pass splits over the query heads when the pool has more threads and the layer attends to 512 positions
    or more (model.cpp, att_split: 1, 2, 4 parts at 1, 2, 3 threads; here the global layer, past a 530-token
    prompt); Q5_0 layers (kept 5-bit where the CPU has the kernel). The same logits, bit for bit."""
    vocab = {k: v for k, v in gguf_meta.read_metadata(str(model_path)).items()
             if k.startswith("tokenizer.") and k != "tokenizer.chat_template"}
    path = gguf_writer.random_model(tmp_path / "gemma3.gguf", "gemma3", vocab, wtype="Q5_0", seed=5,
                                    shapes=dict(n_layer=6, head_dim=128, n_head_kv=1, n_ctx=1024))
    ids = (tok.encode(PROMPT) * 40)[:530]
    n_vocab = len(vocab["tokenizer.ggml.tokens"])
    runs = [oracle.engine_logits(path, ids, 12, n_vocab, last_only=True, threads=t) for t in (1, 2, 3)]
    for rows, tokens in runs[1:]:
        assert tokens == runs[0][1] and all(a == b for a, b in zip(rows, runs[0][0], strict=True))


def test_random_gemma3_ring_matches_llama_cpp(model_path, tok, tmp_path):
    """The window layers as rings (chunk 8: n_batch 8, ring 16 + 8 - 1 = 23 cells + 15 mirror cells, laps
    over a 120-token prompt and its greedy run): llama.cpp's logits, and the same bits with less KV than the
    same run whose chunk is too large for a ring (so every position is kept)."""
    vocab = {k: v for k, v in gguf_meta.read_metadata(str(model_path)).items()
             if k.startswith("tokenizer.") and k != "tokenizer.chat_template"}
    path = gguf_writer.random_model(tmp_path / "gemma3.gguf", "gemma3", vocab, wtype="F16", seed=3,
                                    shapes=dict(n_layer=6, head_dim=128))
    ids = (tok.encode(PROMPT) * 4)[:120]
    oracle.require_oracle()
    theirs, their_tokens = oracle.oracle_logits(path, ids, RING_STEPS)
    ring_kv, full_kv = {}, {}
    ours, our_tokens = oracle.engine_logits(path, ids, RING_STEPS, len(theirs[0]), chunk=8, figures=ring_kv)
    full, full_tokens = oracle.engine_logits(path, ids, RING_STEPS, len(theirs[0]), figures=full_kv)
    # the same positions in the same order: the rings change where K/V live, not one bit of the result
    assert full_tokens == our_tokens and all(a == b for a, b in zip(full, ours, strict=True))
    same = next((i for i, (a, b) in enumerate(zip(our_tokens, their_tokens)) if a != b), RING_STEPS)
    worst, spread = oracle.compare_logits(ours[:len(ids) + same], theirs[:len(ids) + same])
    print(f"ring: max |diff| {worst:.4g}, spread {spread:.4g}; kv bytes {ring_kv} vs every position {full_kv}")
    assert worst <= LOGIT_TOL_FLOAT * spread
    assert oracle.greedy_agree(our_tokens, their_tokens, theirs, len(ids), GREEDY_MARGIN), (our_tokens, their_tokens)
    assert int(ring_kv["kv_bytes"]) < int(full_kv["kv_bytes"])


def _prompts(tok):
    story = ("Once upon a time, in a small village by the sea, there lived an old fisherman who told the "
             "children stories about the stars. Every evening they gathered around his boat and listened. ")
    code = "def merge_sort(xs):\n    if len(xs) <= 1:\n        return xs\n    mid = len(xs) // 2\n"
    facts = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"
    long_text = " ".join(f"Item {i}: the {i}th line of a long list that keeps going." for i in range(60))
    return [("story", story * 2), ("code", code * 3), ("facts", facts), ("long", long_text + " Item 60:")]


@pytest.mark.parametrize("which", ["story", "code", "facts", "long"])
def test_gemma_270m_greedy_matches_llama_cpp(which):
    from tokenizer.spm import load_tokenizer
    path = gemma_model.gemma_path()
    oracle.require_oracle()
    tok = load_tokenizer(path)
    text = dict(_prompts(tok))[which]
    ids = [tok.special_ids["bos"]] + tok.encode(text)
    if which == "long":
        assert len(ids) > 512, len(ids)  # past the sliding window
    theirs, their_tokens = oracle.oracle_logits(path, ids, GREEDY_STEPS, last_only=True)
    ring = dict(n_ctx=LONG_CTX, chunk=LONG_CHUNK) if which == "long" else {}
    figures = {}
    ours, our_tokens = oracle.engine_logits(path, ids, GREEDY_STEPS, len(theirs[0]), last_only=True,
                                            figures=figures, **ring)
    if which == "long":  # 15 of 18 layers keep 639 + 511 cells, 3 keep every position
        full = 2 * 18 * (len(ids) + GREEDY_STEPS - 1) * 256 * 2
        print(f"  KV {int(figures['kv_bytes']) / 2**20:.1f} MiB with rings, {full / 2**20:.1f} MiB without")
        assert int(figures["kv_bytes"]) < full
    first_diff = next((i for i, (a, b) in enumerate(zip(our_tokens, their_tokens)) if a != b), None)
    margins = [oracle.top2_margin(r) for r in theirs]
    print(f"{which}: {len(ids)} prompt tokens; first difference at step {first_diff}; smallest llama.cpp "
          f"top-two margin {min(margins):.3f}" + (f", at the difference {margins[first_diff]:.3f}"
                                                  if first_diff is not None else ""))
    print("  ours:", repr(tok.decode(our_tokens)))
    if first_diff is not None:
        print("  llama.cpp:", repr(tok.decode(their_tokens)))
        assert margins[first_diff] < GREEDY_MARGIN, (
            f"step {first_diff}: {our_tokens[first_diff]} vs {their_tokens[first_diff]} with margin "
            f"{margins[first_diff]:.3f}")
    same = first_diff if first_diff is not None else GREEDY_STEPS
    worst, spread = oracle.compare_logits(ours[:same + 1], theirs[:same + 1])
    print(f"  logits over the common steps: max |diff| {worst:.4g}, spread {spread:.4g}")


def test_gemma_270m_prefix_reuse_and_slots(engine_path):
    """Past the window, a continued prompt resumes from the cache and a batch slot decodes alike: the same
    greedy tokens as one run in slot 0 (context 2048 with the default chunk: the window layers are rings of
    512 + 520 - 1 cells, which this run does not lap; test_gemma3_ring.py laps them)."""
    from tests.engine.conftest import Engine  # by package path: a bare `conftest` may be another folder's
    from tokenizer.spm import load_tokenizer
    path = gemma_model.gemma_path()
    tok = load_tokenizer(path)
    ids = [tok.special_ids["bos"]] + tok.encode(dict(_prompts(tok))["long"])[:600]
    no_end = "logit_bias=1:-inf,106:-inf"
    e = Engine(engine_path, path, "--max-context", "2048", "--batch", "2", "--threads", "2")
    try:
        first = e.gen(ids, max_new=12, keys=no_end)
        assert len(first.tokens) == 12, first.lines
        cont = e.gen(ids + first.tokens[:6], max_new=6, keys=no_end)
        assert cont.resume >= len(ids) and cont.tokens == first.tokens[6:]
        e.gen([tok.special_ids["bos"]] + tok.encode("Something else entirely."), max_new=2, keys=no_end)
        e.send(f"BGEN 1 12 {no_end} {','.join(map(str, ids))}")
        toks = []
        while True:  # BACC, BPP..., BT per token, BDONE
            w = e.line().split()
            assert w[0] != "ERR", w
            if w[0] == "BT":
                toks.append(int(w[2]))
            elif w[0] == "BDONE":
                break
        assert toks == first.tokens
    finally:
        e.close()

"""phi3 (fused QKV and gate/up, partial rotary, LongRoPE; engine/models/phi3.cpp) against llama.cpp on random-weight
files.

The file (tests/gguf_writer.py, SmolLM2's real vocabulary) rotates only N_ROT of each head's 64 dims, carries
LongRoPE's short and long factors, an original context of N_ORIG and an attention factor. Both sides choose
the factors by the context they are given: a context under N_ORIG takes the short ones, a longer one the long
ones (llama.cpp pads its context to 256, so the two contexts used here are far on either side). Compared at
every prompt position and along the greedy continuation (tests/llama_oracle.py in the peer's interpreter;
skipped with the reason when absent), with test_arch_parity.py's tolerance: |ours - llama.cpp| <=
LOGIT_TOL_FLOAT (f16 weights) or LOGIT_TOL_QUANT (Q8_0) of the largest per-row logit spread, greedy tokens equal
up to the first near-tie. The long case first checks that llama.cpp's logits move with the factors (short vs
long differ by more than the tolerance), so that a match cannot come from factors that change nothing.
"""

import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests import gguf_writer, oracle  # noqa: E402

LOGIT_TOL_FLOAT = 0.01
LOGIT_TOL_QUANT = 0.03
GREEDY_MARGIN = 0.1
N_GEN = 16
N_ROT = 32
N_ORIG = 1024
LONG_CTX = 2048
PROMPT = ("The quick brown fox jumps over the lazy dog. def fib(n):\n    return n if n < 2 else fib(n-1) + "
          "fib(n-2)\n")
KV = {"rope.scaling.original_context_length": N_ORIG, "rope.scaling.attn_factor": 1.19}


@pytest.mark.parametrize("wtype,n_ctx", [("F16", None), ("F16", LONG_CTX), ("Q8_0", LONG_CTX)])
def test_phi3_matches_llama_cpp(wtype, n_ctx, vocab_meta, prompt_ids, tmp_path):
    oracle.require_oracle()
    path = gguf_writer.random_model(tmp_path / f"phi3-{wtype}.gguf", "phi3", vocab_meta, wtype=wtype, seed=19,
                                    tied=False, shapes={"n_rot": N_ROT, "n_ctx": 4 * N_ORIG}, arch_kv=KV)
    theirs, their_tokens = oracle.oracle_logits(path, prompt_ids, N_GEN, n_ctx=n_ctx)
    if n_ctx:
        short, _ = oracle.oracle_logits(path, prompt_ids, 0)
        effect, spread0 = oracle.compare_logits(theirs[:len(prompt_ids)], short)
        assert effect > 3 * LOGIT_TOL_FLOAT * spread0, f"the long factors barely move llama.cpp's logits ({effect:.4g})"
    ours, our_tokens = oracle.engine_logits(path, prompt_ids, N_GEN, len(theirs[0]), n_ctx=n_ctx)
    same = next((i for i, (a, b) in enumerate(zip(our_tokens, their_tokens)) if a != b), N_GEN)
    worst, spread = oracle.compare_logits(ours[:len(prompt_ids) + same], theirs[:len(prompt_ids) + same])
    tol = LOGIT_TOL_FLOAT if wtype == "F16" else LOGIT_TOL_QUANT
    print(f"phi3 {wtype} n_ctx {n_ctx}: max |diff| {worst:.4g}, spread {spread:.4g} ({worst / spread:.2%}); "
          f"greedy ours {our_tokens} llama.cpp {their_tokens}")
    assert worst <= tol * spread, f"logits differ by {worst:.4g} (spread {spread:.4g})"
    assert oracle.greedy_agree(our_tokens, their_tokens, theirs, len(prompt_ids), GREEDY_MARGIN), \
        (our_tokens, their_tokens)

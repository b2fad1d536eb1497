"""The llama, qwen2 and qwen3 builders and every weight type, against llama.cpp on random-weight files.

Each case writes a small random-weight GGUF (tests/gguf_writer.py: 2 layers, 256 wide, 4 query / 2 KV heads
of 64, FFN 512) carrying SmolLM2's real vocabulary (49152 tokens, so the prompt is real text), then compares
the engine's logits at every prompt position and along the greedy continuation (build/strata-test-probe)
with llama.cpp's (tests/llama_oracle.py in the peer's interpreter; skipped with the reason when absent).

Tolerance, stated: |ours - llama.cpp| <= LOGIT_TOL_FLOAT of the largest per-row logit spread for float
weights, LOGIT_TOL_QUANT for quantised ones (llama.cpp quantises activations to 8 bits for its integer dots,
the engine to 16 bits for Q4/Q8/K types and not at all for the generic float path: the residue is theirs),
and the greedy tokens equal up to the first step whose top-two margin is under GREEDY_MARGIN.
"""

import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests import gguf_writer, oracle  # noqa: E402
from tests.engine.conftest import LOGIT_TOL_FLOAT, check_logits  # noqa: E402

LOGIT_TOL_QUANT = 0.03   # of the logit spread: llama.cpp's 8-bit activations on quantised weights
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_architecture_matches_llama_cpp(arch, vocab_meta, prompt_ids, tmp_path):
    path = gguf_writer.random_model(tmp_path / f"{arch}.gguf", arch, vocab_meta, wtype="F16", seed=7,
                                    tied=arch == "qwen3")
    check_logits(path, prompt_ids, LOGIT_TOL_FLOAT)


NEW_TYPES = ["Q5_0", "Q5_1", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "MXFP4"]
OLD_TYPES = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]


@pytest.mark.parametrize("wtype", NEW_TYPES + OLD_TYPES)
def test_weight_type_matches_llama_cpp(wtype, vocab_meta, prompt_ids, tmp_path):
    path = gguf_writer.random_model(tmp_path / f"llama-{wtype}.gguf", "llama", vocab_meta, wtype=wtype, seed=11)
    check_logits(path, prompt_ids, LOGIT_TOL_QUANT)


@pytest.mark.parametrize("wtype", NEW_TYPES)
def test_dequant_matches_ggml(wtype, tmp_path):
    """Our scalar reference dequant, element for element, against ggml's own to_float on the same random
    blocks (random bytes; only the half scales made finite)."""
    import random
    oracle.require_oracle()
    type_num, block, _ = gguf_writer.GGML_TYPES[wtype]
    n = 64 * 256
    raw = gguf_writer.random_blocks(random.Random(wtype), wtype, n)
    ours = oracle.engine_dequant(type_num, raw, n)
    theirs = oracle.oracle_dequant(type_num, raw, n)
    bad = [i for i in range(n) if ours[i] != theirs[i]]
    assert not bad, f"{wtype}: {len(bad)} elements differ, first {bad[0]}: {ours[bad[0]]} vs {theirs[bad[0]]}"

"""RoPE scaling (rope.scaling.type linear and yarn, engine/rope_scaling.h) against llama.cpp on random-weight files.

Each case writes a small random-weight GGUF (tests/gguf_writer.py, SmolLM2's real vocabulary) whose metadata
scales RoPE with an original context (rope.scaling.original_context_length) far below the prompt, so most
positions compared lie past it, where the scaling decides the attention pattern; then compares the engine's
logits at every prompt position and along the greedy continuation with llama.cpp's (tests/llama_oracle.py in
the peer's interpreter; skipped with the reason when absent).

Tolerance, stated: |ours - llama.cpp| <= LOGIT_TOL_FLOAT of the largest per-row logit spread (f16 weights, f16
KV, as tests/engine/test_arch_parity.py), greedy tokens equal up to the first step whose top-two margin is
under GREEDY_MARGIN. So that a match cannot come from scaling that changes nothing, each case first checks
that llama.cpp's logits for the scaled file differ from those of the same weights unscaled by more than the
tolerance.
"""

import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests import gguf_writer, oracle  # noqa: E402

LOGIT_TOL_FLOAT = 0.01   # of the logit spread: f16 weights, f16 KV on both sides (test_arch_parity's)
GREEDY_MARGIN = 0.1      # top-two logit gap under which a greedy step may go either way
N_GEN = 16
N_ORIG = 32              # the files' original context: the prompt runs ~3x past it
PROMPT = ("The quick brown fox jumps over the lazy dog. def fib(n):\n    return n if n < 2 else fib(n-1) + "
          "fib(n-2)\n") * 3

CASES = {
    "llama-linear": ("llama", {"rope.scaling.type": "linear", "rope.scaling.factor": 4.0}),
    "llama-yarn": ("llama", {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                             "rope.scaling.original_context_length": N_ORIG}),
    "qwen3-yarn-attn": ("qwen3", {"rope.scaling.type": "yarn", "rope.scaling.factor": 8.0,
                                  "rope.scaling.original_context_length": N_ORIG,
                                  "rope.scaling.attn_factor": 0.9}),
    "qwen2-factor-only": ("qwen2", {"rope.scaling.factor": 2.0}),  # no type: llama.cpp reads it as linear
    "qwen3moe-yarn": ("qwen3moe", {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                                   "rope.scaling.original_context_length": N_ORIG}),  # Qwen3-30B-A3B's long form
    # six layers: five window layers (never scaled, only the attention factor applies) and one global
    "gemma3-yarn": ("gemma3", {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                               "rope.scaling.original_context_length": N_ORIG, "rope.scaling.attn_factor": 1.1}),
}
LAYERS = {"gemma3": 6}


@pytest.fixture(scope="module")
def prompt_ids(tok):  # conftest's, with the check that the prompt runs past the original context
    ids = tok.encode(PROMPT)
    assert len(ids) > 2 * N_ORIG
    return ids


@pytest.mark.parametrize("case", sorted(CASES))
def test_rope_scaling_matches_llama_cpp(case, vocab_meta, prompt_ids, tmp_path):
    oracle.require_oracle()
    arch, kv = CASES[case]
    shapes = {"n_ctx": 4096, "n_layer": LAYERS.get(arch, 2)}
    plain = gguf_writer.random_model(tmp_path / f"{case}-plain.gguf", arch, vocab_meta, wtype="F16", seed=5,
                                     tied=arch != "llama", shapes=shapes)
    path = gguf_writer.random_model(tmp_path / f"{case}.gguf", arch, vocab_meta, wtype="F16", seed=5,
                                    tied=arch != "llama", shapes=shapes, arch_kv=kv)
    theirs, their_tokens = oracle.oracle_logits(path, prompt_ids, N_GEN)
    unscaled, _ = oracle.oracle_logits(plain, prompt_ids, 0)
    effect, spread0 = oracle.compare_logits(theirs[:len(prompt_ids)], unscaled[:len(prompt_ids)])
    assert effect > 3 * LOGIT_TOL_FLOAT * spread0, f"{case}: the scaling barely moves llama.cpp's logits ({effect:.4g})"

    ours, our_tokens = oracle.engine_logits(path, prompt_ids, N_GEN, len(theirs[0]))
    same = next((i for i, (a, b) in enumerate(zip(our_tokens, their_tokens)) if a != b), N_GEN)
    worst, spread = oracle.compare_logits(ours[:len(prompt_ids) + same], theirs[:len(prompt_ids) + same])
    print(f"{case}: max |diff| {worst:.4g}, spread {spread:.4g} ({worst / spread:.2%}); scaling moves llama.cpp's "
          f"logits by {effect:.4g}; greedy ours {our_tokens} llama.cpp {their_tokens}")
    assert worst <= LOGIT_TOL_FLOAT * spread, f"logits differ by {worst:.4g} (spread {spread:.4g})"
    assert oracle.greedy_agree(our_tokens, their_tokens, theirs, len(prompt_ids), GREEDY_MARGIN), \
        (our_tokens, their_tokens)


def test_unknown_rope_scaling_is_refused_by_name(vocab_meta, tmp_path):
    """A scaling type Strata does not compute is refused at load, naming it (never run unscaled)."""
    exe = oracle.dump_exe()
    path = gguf_writer.random_model(tmp_path / "dynamic.gguf", "llama", vocab_meta, tied=False,
                                    arch_kv={"rope.scaling.type": "dynamic", "rope.scaling.factor": 2.0})
    r = subprocess.run([str(exe), "logits", str(path), "1,2,3", "1", str(tmp_path / "out.bin"), "16"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "unsupported rope scaling 'dynamic'" in r.stderr, r.stderr[-2000:]

"""`--act-bits 8` on the real model: the engine flag (INFO act_bits=, a bad value exits 2, the default is 16)
and the mode's accuracy against llama.cpp next to the default's.

Accuracy, stated: over PROMPTS, the logits at every prompt position and along the greedy continuation (up to
the first token where either side's greedy run leaves llama.cpp's) stay within ACT8_TOL of llama.cpp's logit
spread (the default mode within DEFAULT_TOL), and the greedy tokens agree up to the first near tie (top-two
margin under GREEDY_MARGIN). llama.cpp itself quantises activations to 8 bits (Q8_1 blocks) for these
weights, so the 8-bit mode is not further from it than from the float64 reference
(tests/engine/reference_forward_test.cpp states that side). The figures are printed (-s).
"""

import subprocess

import pytest

from tests import oracle

ACT8_TOL = 0.06       # of the logit spread (measured 2.5..4.0 %; README Benchmarks)
DEFAULT_TOL = 0.04    # the 16-bit default (measured 2.1..3.2 %: llama.cpp's own 8-bit activations)
# top-two logit gap under which a greedy step may go either way: on this model llama.cpp's own 8-bit
# activations move single logits by up to ~0.7 against the engine's default (e.g. the France prompt's second
# token: llama.cpp 22.96 vs 22.84, the engine 23.05 vs 23.50), so a gap under 1 is a tie for both modes
GREEDY_MARGIN = 1.0
N_GEN = 16
PROMPTS = (
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village by the sea,",
    "<|im_start|>user\nWrite a Python function that reverses a string.<|im_end|>\n<|im_start|>assistant\n",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n# the first ten numbers\n",
)


def test_the_flag_is_reported_and_checked(start_engine, engine_path, model_path, tok):
    e8 = start_engine("--act-bits", "8", "--max-context", "512", "--threads", "2")
    assert e8.info["act_bits"] == "8"
    g = e8.gen(tok.encode(PROMPTS[0]), max_new=4)
    assert g.err is None and len(g.tokens) == 4
    assert start_engine("--max-context", "512").info["act_bits"] == "16"
    r = subprocess.run([str(engine_path), "--serve", "--model", str(model_path), "--act-bits", "4"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "bad value for --act-bits: 4" in r.stderr


def _worst(ours, our_tokens, theirs, their_tokens, n_prompt):
    same = next((i for i, (a, b) in enumerate(zip(our_tokens, their_tokens)) if a != b), N_GEN)
    return oracle.compare_logits(ours[:n_prompt + same], theirs[:n_prompt + same])


def test_act_bits_8_against_llama_cpp(model_path, tok, monkeypatch):
    oracle.require_oracle()
    figures = {8: [], 16: []}
    agree = {8: 0, 16: 0}
    for text in PROMPTS:
        ids = tok.encode(text)
        theirs, their_tokens = oracle.oracle_logits(model_path, ids, N_GEN)
        for bits in (16, 8):
            monkeypatch.setenv("STRATA_PROBE_ACT_BITS", str(bits))
            ours, our_tokens = oracle.engine_logits(model_path, ids, N_GEN, len(theirs[0]))
            worst, spread = _worst(ours, our_tokens, theirs, their_tokens, len(ids))
            figures[bits].append(worst / spread)
            agree[bits] += our_tokens == their_tokens
            assert oracle.greedy_agree(our_tokens, their_tokens, theirs, len(ids), GREEDY_MARGIN), \
                (bits, text, our_tokens, their_tokens)
    for bits, tol in ((8, ACT8_TOL), (16, DEFAULT_TOL)):
        print(f"act_bits {bits}: max |logit diff| vs llama.cpp {max(figures[bits]):.2%} of the spread "
              f"(per prompt {', '.join(f'{f:.2%}' for f in figures[bits])}); greedy {N_GEN} tokens identical "
              f"on {agree[bits]} of {len(PROMPTS)} prompts")
        assert max(figures[bits]) <= tol, (bits, figures[bits])

"""Activation bits on the real model: the engine flag (INFO act_bits=, a bad value exits 2), the default per
kernel set (8 on AVX2, 16 elsewhere: act_bits_default in engine/cpu/kernels_act8.h), and each mode's accuracy
against llama.cpp and, for the defaults, against the float64 forward.

Accuracy against llama.cpp: over PROMPTS, the logits at every prompt position and along the greedy continuation
(up to the first token where either side's greedy run leaves llama.cpp's) stay within ACT8_TOL of llama.cpp's
logit spread (16 bits within DEFAULT_TOL), and the greedy tokens agree up to the first near tie (top-two margin
under GREEDY_MARGIN). llama.cpp itself quantises activations to 8 bits (Q8_1 blocks) for these weights.
Against the float64 forward (tests/engine/reference_forward_test.cpp, its STRATA_REF_LOGITS_OUT dump): the
default mode of the native set and of the AVX2 set is no further from it than llama.cpp is (PEER_SLACK): the
rule that made 8 bits AVX2's default. The figures are printed (-s).
"""

import array
import os
import pathlib
import struct
import subprocess
import tempfile

import pytest

from tests import oracle

ACT8_TOL = 0.06       # of the logit spread (measured 2.5..4.0 %; docs/BENCHMARKS.md)
DEFAULT_TOL = 0.04    # 16 bits (measured 2.1..3.2 %: llama.cpp's own 8-bit activations)
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
    assert start_engine("--act-bits", "16", "--max-context", "512",
                        env={"STRATA_KERNELS": "avx2"}).info["act_bits"] == "16"
    r = subprocess.run([str(engine_path), "--serve", "--model", str(model_path), "--act-bits", "4"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "bad value for --act-bits: 4" in r.stderr


@pytest.mark.parametrize("kernels", [None, "avx2", "scalar"])
def test_the_default_is_8_on_avx2_and_16_elsewhere(start_engine, kernels):
    e = start_engine("--max-context", "512", env={"STRATA_KERNELS": kernels} if kernels else None)
    # the set the CPU gave (STRATA_KERNELS never steps up past it): only AVX2's default is 8 for Q4_1 weights
    assert e.info["act_bits"] == ("8" if e.info["kernels"] == "avx2" else "16"), e.info


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


PEER_SLACK = 1.25  # our default's worst top-10 error may be this much of llama.cpp's (measured 0.97..1.09x)
TOP_LOGITS = 10    # as reference_forward_test's top_rel_err


def _reference_dump(model_path):
    """[(ids, float64 logits at the prompt's end)] of reference_forward_test's float64 forward on `model_path`."""
    exe = oracle.REPO / "build" / "reference_forward_test"
    if not exe.is_file():
        pytest.skip("build/reference_forward_test is not built (cmake --build build)")
    with tempfile.TemporaryDirectory() as d:
        out = pathlib.Path(d) / "ref.bin"
        r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=oracle.DUMP_TIMEOUT_S,
                           env={**os.environ, "STRATA_REF_LOGITS_OUT": str(out), "STRATA_TEST_MODEL": str(model_path)})
        if r.returncode == 77:  # CTest's "skipped": the test found no model or CPU set to run
            pytest.skip(f"reference_forward_test skipped: {(r.stdout + r.stderr).strip()[-300:]}")
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        data = out.read_bytes()
    n_prompts, n_vocab = struct.unpack_from("<ii", data)
    at, rows = 8, []
    for _ in range(n_prompts):
        (n,) = struct.unpack_from("<i", data, at)
        ids = list(struct.unpack_from("<%di" % n, data, at + 4))
        at += 4 + 4 * n
        rows.append((ids, array.array("d", data[at:at + 8 * n_vocab])))
        at += 8 * n_vocab
    return rows


def _top_rel_err(ref, row):
    """Worst |row - ref| over the reference's top TOP_LOGITS logits, relative to the top logit's magnitude."""
    top = sorted(range(len(ref)), key=ref.__getitem__, reverse=True)[:TOP_LOGITS]
    return max(abs(row[i] - ref[i]) for i in top) / max(abs(ref[top[0]]), 1.0)


def test_the_defaults_are_as_close_to_the_float64_forward_as_llama_cpp(model_path, monkeypatch):
    oracle.require_oracle()
    ref = _reference_dump(model_path)
    monkeypatch.delenv("STRATA_PROBE_ACT_BITS", raising=False)
    peer = [_top_rel_err(r, oracle.oracle_logits(model_path, ids, 1, last_only=True)[0][0]) for ids, r in ref]
    for kernels in ("", "avx2"):  # the native set's default, and AVX2's (8 bits where the CPU has AVX2)
        if kernels:
            monkeypatch.setenv("STRATA_KERNELS", kernels)
        else:
            monkeypatch.delenv("STRATA_KERNELS", raising=False)
        ours = [_top_rel_err(r, oracle.engine_logits(model_path, ids, 1, len(r), last_only=True)[0][0])
                for ids, r in ref]
        print(f"default mode, STRATA_KERNELS={kernels or '-'}: top-{TOP_LOGITS} error against the float64 forward "
              f"{' / '.join(f'{e:.1e}' for e in ours)}; llama.cpp {' / '.join(f'{e:.1e}' for e in peer)}")
        assert max(ours) <= PEER_SLACK * max(peer), (kernels, ours, peer)

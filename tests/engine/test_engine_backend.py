"""The engine's --backend cpu|cuda|auto (prefill/cuda_forward.h) over the real protocol.

Everywhere: `auto` on a machine without a usable GPU (or a build without CUDA) starts on the CPU, says so in INFO
(backend=cpu) and says why on stderr; `cuda` there exits 1 with the reason; `cuda` with `--kv q8_0` is refused
by name. On a machine with a GPU (tools/device_check.sh runs this file there): INFO says backend=cuda with the
device, and greedy generations of the real model on the GPU equal the CPU engine's, except after a near-tie.
"""

import subprocess

import pytest

from tests.engine.conftest import Engine, chat

START_TIMEOUT_S = 120.0  # load + upload of a 100 MB model, or the failure line
N_GEN = 24
GREEDY_MARGIN = 0.1      # the CPU's top-two logit gap under which a greedy step may go either way (n_probs shows it)


def _margins(gen):
    """Per generated token, the gap of the top two log-probabilities (logprobs=2: `T id lp=.. top=a:x,b:y`)."""
    out = []
    for line in gen.lines:
        if line.startswith("T "):
            top = next(w for w in line.split() if w.startswith("top="))[4:].split(",")
            vals = sorted((float(t.split(":")[1]) for t in top), reverse=True)
            out.append(vals[0] - vals[1])
    return out


def _has_gpu(engine_path, model_path):
    e = Engine(engine_path, model_path, "--backend", "auto", "--threads", "2", "--max-context", "512")
    try:
        return e.info.get("backend") == "cuda", e
    except Exception:
        e.close()
        raise


def test_auto_without_gpu_runs_on_the_cpu_and_says_why(engine_path, model_path):
    gpu, e = _has_gpu(engine_path, model_path)
    try:
        if gpu:
            assert e.info["device"], e.info
            pytest.skip("a GPU is here: auto chose it")
        assert e.info["backend"] == "cpu"
        assert any("--backend auto: on the CPU (" in line for line in e.stderr_lines), e.stderr_text()
        g = e.gen([1, 2, 3], max_new=4)
        assert g.err is None and len(g.tokens) == 4
    finally:
        e.close()


def test_cuda_without_gpu_exits_with_the_reason(engine_path, model_path):
    gpu, e = _has_gpu(engine_path, model_path)
    e.close()
    if gpu:
        pytest.skip("a GPU is here")
    r = subprocess.run([str(engine_path), "--serve", "--model", str(model_path), "--backend", "cuda"],
                       input="", capture_output=True, text=True, timeout=START_TIMEOUT_S)
    assert r.returncode == 1
    assert "--backend cuda: " in r.stderr and ("CUDA" in r.stderr or "device" in r.stderr), r.stderr


def test_cuda_with_q8_kv_is_refused_by_name(engine_path, model_path):
    r = subprocess.run([str(engine_path), "--serve", "--model", str(model_path), "--backend", "cuda", "--kv", "q8_0"],
                       input="", capture_output=True, text=True, timeout=START_TIMEOUT_S)
    assert r.returncode == 1
    assert "--kv q8_0 is CPU-only" in r.stderr, r.stderr


def test_gpu_greedy_tokens_equal_the_cpu_engine(engine_path, model_path, tok):
    gpu, g_engine = _has_gpu(engine_path, model_path)
    if not gpu:
        g_engine.close()
        pytest.skip("no GPU here (or a build without CUDA)")
    c_engine = Engine(engine_path, model_path, "--backend", "cpu", "--threads", "2", "--max-context", "512")
    try:
        for prompt in ("What is the capital of France?", "Write a haiku about the sea.",
                       "List three prime numbers and explain why they are prime."):
            ids = chat(tok, prompt)
            on_gpu = g_engine.gen(ids, max_new=N_GEN)
            on_cpu = c_engine.gen(ids, max_new=N_GEN, keys="logprobs=2")
            assert on_gpu.err is None and on_cpu.err is None
            n = next((i for i, (a, b) in enumerate(zip(on_gpu.tokens, on_cpu.tokens)) if a != b), None)
            if n is None:
                assert len(on_gpu.tokens) == len(on_cpu.tokens)
                continue
            # the first difference must follow a near-tie on the CPU
            assert _margins(on_cpu)[n] < GREEDY_MARGIN, (prompt, n, on_gpu.tokens, on_cpu.tokens)
    finally:
        g_engine.close()
        c_engine.close()

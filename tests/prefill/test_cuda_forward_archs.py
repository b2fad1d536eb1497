"""The CUDA backend's forward on every architecture it takes, on the CPU: tiny random-weight llama, qwen2 (QKV
biases), qwen3 (QK-norm, NeoX RoPE) and gemma3 (embedding scale, QK-norm, post-norms, GELU, 16-position windows
whose rings wrap, a global layer) files from tests/gguf_writer.py, each in a different weight type, run through
build/cuda_forward_test (the forward with the kernels' math emulated on the host, against the CPU engine:
greedy tokens, mixed batches, prefix copies, SAVE/RESTORE rows). Skips when that binary is not built.
"""

import pathlib
import subprocess

import pytest

from tests import gguf_writer

REPO = pathlib.Path(__file__).resolve().parents[2]
TEST_BIN = REPO / "build" / "cuda_forward_test"
RUN_TIMEOUT_S = 300
N_VOCAB = 512

CASES = {  # arch: (layer weight type, shapes)
    "llama": ("Q4_K", dict(n_layer=2)),
    "qwen2": ("Q5_0", dict(n_layer=2)),
    "qwen3": ("Q6_K", dict(n_layer=2)),
    "gemma3": ("Q8_0", dict(n_layer=6, n_swa=16)),  # layers 0-4 windowed, layer 5 global (pattern 6)
}


def _vocab():
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": [f"<t{i}>" for i in range(N_VOCAB)],
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}


@pytest.mark.parametrize("arch", sorted(CASES))
def test_cuda_forward_matches_the_cpu_engine(arch, tmp_path):
    if not TEST_BIN.is_file():
        pytest.skip(f"{TEST_BIN} is not built")
    wtype, shapes = CASES[arch]
    path = gguf_writer.random_model(tmp_path / f"{arch}.gguf", arch, _vocab(), wtype=wtype, embd_type="Q8_0",
                                    seed=3, shapes=dict(shapes, n_ctx=1024))
    r = subprocess.run([str(TEST_BIN)], env={"STRATA_TEST_MODEL": str(path)}, capture_output=True, text=True,
                       timeout=RUN_TIMEOUT_S)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cuda_forward_test: ok" in r.stdout

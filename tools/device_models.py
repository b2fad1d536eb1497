"""Random-weight GGUF models of realistic shapes, written on the GPU machine (nothing can be fetched there and
the default model's 98 MB do not travel with the tree): tools/device_check.sh reads them to compare the GPU's
greedy tokens with the CPU engine's and to measure speed. Random weights are fine for both: the kernels do the
same work whatever the values, and the greedy check compares two engines on the same file.

    python3 tools/device_models.py OUT_DIR [small|gemma|llama8b ...]

small:   the default model's shape (SmolLM2-135M: llama, 30 layers, 576 wide, 9/3 heads of 64, Q4_1 layers,
         Q8_0 embedding, 49152 tokens)
gemma:   Gemma 3 270M's shape (gemma3, 18 layers, 640 wide, 4/1 heads of 256, window 512, Q5_0 layers,
         Q8_0 embedding, 262144 tokens)
llama8b: Llama-3-8B's shape as a Q4_K_M file (32 layers, 4096 wide, 32/8 heads of 128, 14336 FFN, Q4_K layers,
         Q6_K embedding and head, 128256 tokens, 32768 context)
Prints each file's path. The vocabulary is synthetic ("<t123>"): the engine reads token ids only.
"""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import gguf_writer  # noqa: E402  (the tests' writer: one GGUF writer in the repository)

MODELS = {
    "small": dict(arch="llama", n_vocab=49152, wtype="Q4_1", embd_type="Q8_0", tied=True,
                  shapes=dict(n_embd=576, n_head=9, n_head_kv=3, head_dim=64, n_ff=1536, n_layer=30, n_ctx=8192)),
    "gemma": dict(arch="gemma3", n_vocab=262144, wtype="Q5_0", embd_type="Q8_0", tied=True,
                  shapes=dict(n_embd=640, n_head=4, n_head_kv=1, head_dim=256, n_ff=2048, n_layer=18, n_ctx=32768,
                              n_swa=512)),
    "llama8b": dict(arch="llama", n_vocab=128256, wtype="Q4_K", embd_type="Q6_K", tied=False,
                    shapes=dict(n_embd=4096, n_head=32, n_head_kv=8, head_dim=128, n_ff=14336, n_layer=32,
                                n_ctx=32768)),
}


def vocab(n_vocab):
    tokens = [f"<t{i}>" for i in range(n_vocab)]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}


def write(out_dir, name):
    spec = MODELS[name]
    path = pathlib.Path(out_dir) / f"{name}.gguf"
    if not path.exists():
        gguf_writer.random_model(path, spec["arch"], vocab(spec["n_vocab"]), wtype=spec["wtype"],
                                 embd_type=spec["embd_type"], seed=5, tied=spec["tied"], shapes=spec["shapes"])
    return path


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = pathlib.Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name in argv[2:] or ["small", "gemma", "llama8b"]:
        print(write(out, name), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""`strata models` lists a mixture-of-experts file as one Strata runs, with its experts (total and used per token).

Writes small random-weight qwen3moe / qwen2moe files and a dense qwen3 one (tests/gguf_writer.py, SmolLM2's
vocabulary) and reads them back through strata_control.models.describe, the function `strata models` lists
with: the MoE files are usable and carry {"total": expert_count, "active": expert_used_count}, the dense one
none.
"""

import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from strata_control import models  # noqa: E402
from tests import gguf_writer  # noqa: E402
from tokenizer import gguf_meta  # noqa: E402


@pytest.fixture(scope="module")
def vocab_meta(model_path):
    meta = gguf_meta.read_metadata(str(model_path))
    return {k: v for k, v in meta.items() if k.startswith("tokenizer.") and k != "tokenizer.chat_template"}


@pytest.mark.parametrize("arch,experts", [("qwen3moe", (16, 4)), ("qwen2moe", (8, 2)), ("qwen3", None)])
def test_models_lists_experts(arch, experts, vocab_meta, tmp_path):
    shapes = {"n_expert": experts[0], "n_expert_used": experts[1]} if experts else None
    path = gguf_writer.random_model(tmp_path / f"{arch}.gguf", arch, vocab_meta, tied=arch != "qwen2moe",
                                    shapes=shapes)
    row = models.describe(str(path)).row()
    assert row["status"] == "ok", row["problem"]
    assert row["architecture"] == arch
    assert row["experts"] == ({"total": experts[0], "active": experts[1]} if experts else None)

"""/props and /metrics show a MoE engine's expert tiers (engine/expert_tiers.h): the split and the hit rate.

Over the real engine: a random-weight qwen3moe (tests/gguf_writer.py, 2 layers of 16 experts, Q8_0) with
SmolLM2's vocabulary, started with `--experts-ram-mib 1` (its experts take 3 MiB packed), answers a
completion; then GET /props and the JSON /metrics carry `expert_tiers` {total, resident, hits, misses,
hit_rate} from the engine's INFO and the reads its DONE / BDONE lines reported. A dense model shows none.
"""
import os

import pytest

from tests import gguf_writer
from tests.conftest import ENGINE_EXE, model_path
from tests.serve.conftest import real_server

MODEL = model_path()
real = pytest.mark.skipif(not (os.path.exists(ENGINE_EXE) and MODEL), reason="needs the engine and the model")


@real
def test_props_and_metrics_show_the_split_and_the_hit_rate(tmp_path):
    from tokenizer.gguf_meta import read_metadata
    vocab = {k: v for k, v in read_metadata(MODEL).items()
             if k.startswith("tokenizer.") and k != "tokenizer.chat_template"}
    path = gguf_writer.random_model(tmp_path / "moe.gguf", "qwen3moe", vocab, wtype="Q8_0", seed=31)
    with real_server(ENGINE_EXE, str(path), tmp_path, 512, ["--experts-ram-mib", "1", "--batch", "2"]) as run:
        status, body, _ = run.post("/v1/completions", {"prompt": "The quick brown fox jumps over the lazy dog",
                                                        "max_tokens": 40, "temperature": 0})
        assert status == 200, body
        _, props, _ = run.request("GET", "/props")
        tiers = props["expert_tiers"]
        assert tiers["total"] == 32 and 0 < tiers["resident"] < 32
        assert tiers["hits"] > 0 and tiers["misses"] > 0 and 0 < tiers["hit_rate"] < 1
        _, metrics, _ = run.request("GET", "/metrics", headers={"Accept": "application/json"})
        assert metrics["expert_tiers"] == tiers


@real
def test_a_dense_model_shows_no_tiers(tmp_path):
    with real_server(ENGINE_EXE, MODEL, tmp_path, 512) as run:
        _, props, _ = run.request("GET", "/props")
        assert props["expert_tiers"] is None

"""strata_control.plan: every decision over machine descriptions written here (no real machine involved)."""
import pytest

from strata_control import runconfig
from strata_control.models import describe
from strata_control.plan import MIB, Machine, PlanRefused, kv_bytes_per_token, make_plan
from tests.strata_control.ggufs import write_model

GIB = 1 << 30


def _machine(**kw):
    base = dict(cores=8, physical_cores=4, ram_bytes=16 * GIB, free_ram_bytes=12 * GIB,
                cpu_features=frozenset({"avx2", "avx512f", "avx512_vnni"}))
    return Machine(**{**base, **kw})


@pytest.fixture
def small(tmp_path):
    """SmolLM2-135M's shape: 30 layers, 3 KV heads of 64: 23,040 bytes of f16 KV per token."""
    return describe(str(write_model(tmp_path / "small.gguf", pad_bytes=90 * MIB)))


def test_defaults_on_a_roomy_machine(small):
    p = make_plan(small, _machine(), {"parallel": 1})
    assert (p.threads, p.n_ctx, p.kv, p.lanes, p.replicas, p.kernels, p.device) == \
        (4, 8192, "f16", 1, 1, "avx512_vnni", "cpu")
    assert kv_bytes_per_token(small, "f16") == 2 * 30 * 3 * 64 * 2
    assert p.memory["kv"] == 8192 * 23040 and p.engine_args() == ["--max-context", "8192", "--threads", "4",
                                                                   "--kv", "f16", "--batch", "1"]
    assert len(p.reasons) >= 5 and all("\n" not in r for r in p.reasons) and p.notices == []
    assert "plan for small" in p.render()


def test_odd_lane_counts_are_clamped_with_one_notice(small):
    for asked, lanes in ((0, 1), (-3, 1), (9, 8), (64, 8)):
        p = make_plan(small, _machine(), {"parallel": asked})
        assert p.lanes == lanes and len(p.notices) == 1 and f"--parallel {asked}" in p.notices[0]
    p = make_plan(small, _machine(), {"parallel": 3})
    assert p.lanes == 3 and p.notices == [] and p.engine_args()[-2:] == ["--batch", "3"]
    assert p.memory["kv"] == 3 * 8192 * 23040  # three lanes: three slots (a lane is a slot, there is no solo one)


def test_small_ram_picks_q8_0_then_cuts_the_context(small):
    # f16 at 8192 x 8 sequences = 1440 MiB of KV; q8_0 = 765 MiB
    need_f16 = 90 * MIB + 64 * MIB + 8 * 8192 * 23040
    p = make_plan(small, _machine(free_ram_bytes=int(need_f16 / 0.9) - MIB), {"parallel": 8})
    assert (p.kv, p.n_ctx) == ("q8_0", 8192) and "f16 does not fit" in p.reasons[-1]
    p = make_plan(small, _machine(free_ram_bytes=600 * MIB), {"parallel": 8})
    assert p.kv == "q8_0" and 512 <= p.n_ctx < 8192 and p.n_ctx % 256 == 0
    assert p.memory["total"] <= p.memory["budget"] and "cut from 8192" in p.reasons[4]


def test_a_model_that_does_not_fit_is_refused_with_the_numbers(small):
    with pytest.raises(PlanRefused) as e:
        make_plan(small, _machine(free_ram_bytes=120 * MIB))
    assert "needs" in str(e.value) and "108 MiB are usable" in str(e.value) and "weights 90" in str(e.value)
    with pytest.raises(PlanRefused, match="needs .* MiB"):   # an asked context is never cut
        make_plan(small, _machine(free_ram_bytes=400 * MIB), {"max_context": 8192, "kv": "f16", "parallel": 8})


def test_threads_and_context_out_of_range_are_refused(small):
    with pytest.raises(PlanRefused, match="this machine has 8 CPUs"):
        make_plan(small, _machine(), {"threads": 9})
    with pytest.raises(PlanRefused, match="--threads 0"):
        make_plan(small, _machine(), {"threads": 0})
    with pytest.raises(PlanRefused, match="256..8192"):
        make_plan(small, _machine(), {"max_context": 100000})
    assert make_plan(small, _machine(), {"threads": 8, "max_context": 2048}).n_ctx == 2048
    # as small as llama.cpp's suite runs a slot (ctx 512 over 2 slots), and no smaller
    assert make_plan(small, _machine(), {"max_context": 256}).n_ctx == 256
    with pytest.raises(PlanRefused, match="256..8192"):
        make_plan(small, _machine(), {"max_context": 255})


def test_many_cores_and_replicas_share_the_physical_cores(small):
    p = make_plan(small, _machine(cores=128, physical_cores=64), {"replicas": 4})
    assert p.threads == 16 and p.replicas == 4 and p.memory["weights"] == 4 * small.size_bytes
    assert any("64 physical cores shared by 4 replicas" in r for r in p.reasons)


def test_a_gpu_described_but_absent_or_without_kernels_means_the_cpu(small):
    p = make_plan(small, _machine(gpus=[{"name": "H100", "memory_bytes": 80 * GIB, "present": False}]))
    assert p.device == "cpu" and "described (H100) but not present" in p.reasons[0]
    p = make_plan(small, _machine(gpus=[{"name": "H100", "present": True}]))
    assert p.device == "cpu" and "no GPU kernels" in p.reasons[0]
    p = make_plan(small, _machine(cpu_features=frozenset({"avx2"})))
    assert p.kernels == "avx2"
    assert make_plan(small, _machine(cpu_features=frozenset())).kernels == "scalar"


def test_an_unsupported_model_is_refused_with_its_reason(tmp_path):
    m = describe(str(write_model(tmp_path / "g.gguf", arch="gemma2")))
    with pytest.raises(PlanRefused, match="architecture 'gemma2'"):
        make_plan(m, _machine())


def _reason(p, word):
    return next(r for r in p.reasons if r.startswith(word + " "))


@pytest.mark.parametrize("cores,physical,lanes", [(1, 1, 1), (2, 1, 4), (8, 4, 4), (128, 64, 4)])
def test_reasons_of_a_plan_nobody_asked_anything_say_default(small, cores, physical, lanes):
    """Nothing asked (no flag, no run config): every reason says default, none says asked (the old plan said
    "lanes 4: as asked" for the server's default)."""
    p = make_plan(small, _machine(cores=cores, physical_cores=physical), runconfig.plan_want({}, {}))
    assert p.lanes == lanes and p.threads == physical
    assert _reason(p, "lanes").startswith(f"lanes {lanes}: the default on ")
    assert _reason(p, "threads") == f"threads {physical}: the default, one per physical core"
    assert _reason(p, "context").startswith("context 8192: the default")
    assert _reason(p, "kv").startswith("kv f16: the default")
    assert not any("asked" in r or "calibrate" in r or "clamped" in r for r in p.reasons)
    assert p.memory["kv"] == lanes * 8192 * 23040   # what the engine will hold: one slot per lane


def test_reasons_name_who_asked_flag_run_config_calibrated_clamped(small):
    cfg = {"threads": 2, "parallel": 3, "max_context": 4096, "kv": "q8_0",
           "calibrated": {"threads": 2, "chunk": 256, "date": "2026-12-03"}}
    p = make_plan(small, _machine(), runconfig.plan_want(cfg, {}))
    assert _reason(p, "threads") == "threads 2: measured fastest here by serve --calibrate (run config)"
    assert _reason(p, "lanes") == "lanes 3: as asked (the run config)"
    assert _reason(p, "context").startswith("context 4096: as asked (the run config)")
    assert _reason(p, "kv") == "kv q8_0: as asked (the run config)"
    p = make_plan(small, _machine(), runconfig.plan_want({**cfg, "threads": 3}, {"parallel": 12, "max_context": 2048}))
    assert _reason(p, "threads") == "threads 3: as asked (the run config)"    # no longer the measured value
    assert _reason(p, "lanes") == "lanes 8: 12 asked (--parallel), clamped to the engine's 1..8"
    assert _reason(p, "context").startswith("context 2048: as asked (--ctx)")
    p = make_plan(small, _machine(), runconfig.plan_want({}, {"threads": 4, "replicas": 2}))
    assert _reason(p, "threads") == "threads 4: as asked (--threads)"
    assert _reason(p, "replicas").startswith("replicas 2: as asked (--replicas)")
    p = make_plan(small, _machine(free_ram_bytes=600 * MIB), runconfig.plan_want({}, {"parallel": 8}))
    assert _reason(p, "context").startswith("context ") and "cut from 8192" in _reason(p, "context")


def test_a_moe_that_does_not_fit_keeps_what_fits_of_its_experts_in_ram(tmp_path):
    # a random qwen3moe (tests/gguf_writer.py: 2 layers of 16 experts) over a small vocabulary
    from tests import gguf_writer
    vocab = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.merges": [],
             "tokenizer.ggml.tokens": [f"t{i}" for i in range(512)], "tokenizer.ggml.token_type": [1] * 512}
    path = gguf_writer.random_model(tmp_path / "moe.gguf", "qwen3moe", vocab, wtype="Q8_0", seed=3,
                                    shapes={"n_expert": 64})
    moe = describe(str(path))
    assert moe.n_expert == 64 and 0.8 * moe.size_bytes < moe.expert_bytes < moe.size_bytes
    kv = kv_bytes_per_token(moe, "f16") * 512
    whole = moe.size_bytes + 64 * MIB + kv            # weights + engine overhead + KV at context 512
    dense = whole - moe.expert_bytes
    room = int((dense + moe.expert_bytes / 2) / 0.9) + 1   # free RAM: about half the experts fit beside the rest
    p = make_plan(moe, _machine(free_ram_bytes=room), {"parallel": 1, "max_context": 512})
    assert p.experts_ram is not None and 0 < p.experts_ram < moe.expert_bytes
    assert abs(p.experts_ram - moe.expert_bytes / 2) < 2 * MIB
    assert "--experts-ram-mib" in p.engine_args() and p.view()["experts_ram_mib"] == p.experts_ram // MIB
    assert any(r.startswith("experts: ") and "mapped file" in r for r in p.reasons)
    assert p.memory["total"] <= p.memory["budget"]
    roomy = make_plan(moe, _machine(), {"parallel": 1})
    assert roomy.experts_ram is None   # it fits whole: every expert
    # speed counts the active weights (4 of 64 experts per layer), memory all of them
    active = moe.size_bytes - moe.expert_bytes + moe.expert_bytes * 4 // 64
    assert any(r.startswith(f"speed: a decoded token reads about {active // MIB} MiB") for r in roomy.reasons)
    assert roomy.memory["weights"] == moe.size_bytes
    asked = make_plan(moe, _machine(), {"parallel": 1, "experts_ram_mib": 2})   # asked: kept though it fits
    assert asked.experts_ram == 2 * MIB and asked.engine_args()[-4:-2] == ["--experts-ram-mib", "2"]
    assert any("2 MiB of their" in r and "--experts-ram-mib" in r for r in asked.reasons)
    assert asked.memory["weights"] == moe.size_bytes - moe.expert_bytes + 2 * MIB
    with pytest.raises(PlanRefused, match="does not fit"):   # not even the rest fits
        make_plan(moe, _machine(free_ram_bytes=int(dense / 2)), {"parallel": 1, "max_context": 512})

"""strata_control.drafting: every drafting decision over written machines, models and draft models."""
import pytest

from strata_control.drafting import DraftModel, drafting_plan
from strata_control.models import describe
from strata_control.plan import MIB, Machine, PlanRefused
from tests.strata_control.ggufs import write_model

GIB = 1 << 30
VOCAB = "a" * 64


def _machine(**kw):
    base = dict(cores=2, physical_cores=2, ram_bytes=8 * GIB, free_ram_bytes=6 * GIB)
    return Machine(**{**base, **kw})


@pytest.fixture
def model(tmp_path):
    return describe(str(write_model(tmp_path / "big.gguf", pad_bytes=400 * MIB)))


def _one_line_each(p):
    assert p.reasons and all("\n" not in r for r in p.reasons)


def test_default_is_lookup_without_a_draft_model(model):
    p = drafting_plan(model, _machine(), None)
    assert (p.mode, p.draft_model) == ("lookup", None) and p.engine_args() == ["--drafting", "lookup"]
    _one_line_each(p)
    assert "the CPU (2 cores)" in p.reasons[0] and "400 MiB" in p.reasons[0]
    assert "no draft model named" in p.reasons[1] and "same token for token" in p.reasons[2]
    assert p.render().startswith("drafting lookup\n  - ")


def test_off_and_lookup_as_asked(model):
    p = drafting_plan(model, _machine(), "off")
    assert p.mode == "off" and p.engine_args() == ["--drafting", "off"] and "as asked" in p.reasons[0]
    small = DraftModel("/m/draft.gguf", 50 * MIB, VOCAB)
    p = drafting_plan(model, _machine(), "lookup", small, VOCAB)
    assert (p.mode, p.draft_model) == ("lookup", None) and "not used (--drafting lookup)" in p.reasons[1]


def test_auto_takes_a_small_draft_model_and_leaves_a_large_one_out(model):
    small = DraftModel("/m/draft.gguf", 50 * MIB, VOCAB)
    p = drafting_plan(model, _machine(), "auto", small, VOCAB)
    assert p.engine_args() == ["--drafting", "auto", "--draft-model", "/m/draft.gguf"]
    assert "draft.gguf is 50 MiB, 12% of the model's weights" in p.reasons[1]
    big = DraftModel("/m/same.gguf", 400 * MIB, VOCAB)
    p = drafting_plan(model, _machine(), None, big, VOCAB)
    assert (p.mode, p.draft_model) == ("lookup", None) and "left out: same.gguf is 400 MiB, 100%" in p.reasons[1]
    p = drafting_plan(model, _machine(), "model", big, VOCAB)  # asked: the model as its own draft (a check)
    assert p.engine_args() == ["--drafting", "model", "--draft-model", "/m/same.gguf"] and "as asked" in p.reasons[1]
    _one_line_each(p)


def test_refusals(model):
    with pytest.raises(PlanRefused, match="needs a draft model"):
        drafting_plan(model, _machine(), "model")
    with pytest.raises(PlanRefused, match="not the vocabulary of big"):
        drafting_plan(model, _machine(), "auto", DraftModel("/m/other.gguf", MIB, "b" * 64), VOCAB)
    with pytest.raises(PlanRefused, match="not the vocabulary"):
        drafting_plan(model, _machine(), "model", DraftModel("/m/novocab.gguf", MIB, None), VOCAB)
    with pytest.raises(PlanRefused, match="one of auto, lookup, model, off"):
        drafting_plan(model, _machine(), "sometimes")


def test_gpu_machine_line(model):
    m = _machine(gpus=[{"name": "gpu0", "present": True}], gpu_kernels=True)
    assert "on a GPU" in drafting_plan(model, m).reasons[0]

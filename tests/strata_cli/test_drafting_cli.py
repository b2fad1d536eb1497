"""`strata drafting plan` on the default model (the decision and its reasons, refusals with exit 1), and the
engine flags `strata serve` derives from --drafting / --draft-model / the run config's keys."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.engine.conftest import model_path  # noqa: F401  the default model's fixture (skips without it)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "strata_cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_drafting_plan_default_and_asked(model_path):
    model = str(model_path)
    r = _cli("drafting", "plan", "--json")
    assert r.returncode == 0, r.stderr
    view = json.loads(r.stdout)
    assert view["mode"] == "lookup" and view["draft_model"] is None and len(view["reasons"]) == 3
    r = _cli("drafting", "plan", model, "--drafting", "model", "--draft-model", model)
    assert r.returncode == 0 and r.stdout.startswith("smollm2-135m-instruct: drafting model with ")
    assert "100% of the model's weights" in r.stdout
    r = _cli("drafting", "plan", "--drafting", "model")
    assert r.returncode == 1 and "needs a draft model" in r.stderr
    r = _cli("drafting", "plan", "--draft-model", "/nonexistent.gguf")
    assert r.returncode == 1 and "does not exist" in r.stderr


def test_serve_engine_args_carry_the_plan(model_path):
    model = str(model_path)
    from serve import bootstrap
    pick_from = lambda d: (lambda name, key=None, default=None: d.get(key or name, default))  # noqa: E731
    args, _, _ = bootstrap._engine_args(model, False, None, {}, pick_from({"parallel": 1}))
    assert args[args.index("--drafting") + 1] == "lookup" and "--draft-model" not in args
    args, _, _ = bootstrap._engine_args(model, False, None, {}, pick_from({"parallel": 1, "drafting": "off"}))
    assert args[args.index("--drafting") + 1] == "off"
    args, _, _ = bootstrap._engine_args(model, False, None, {}, pick_from({"parallel": 1, "drafting": "model",
                                                                  "draft_model": model}))
    assert args[args.index("--drafting"):args.index("--drafting") + 4] == ["--drafting", "model", "--draft-model",
                                                                            model]
    with pytest.raises(bootstrap.SetupError, match="needs a draft model"):
        bootstrap._engine_args(model, False, None, {}, pick_from({"parallel": 1, "drafting": "model"}))
    assert os.path.isfile(model)

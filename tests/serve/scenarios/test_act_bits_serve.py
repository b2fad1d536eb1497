"""`strata serve --act-bits 8|16` and the run config's `act_bits` reach the engine as that flag; neither given
adds no flag (the engine's default for its kernel set); any other value is refused before a start."""
import json
import sys

import pytest

from serve.bootstrap import SetupError, build
from strata_cli import parser


def _engine_args(tmp_path, flags=(), config=None):
    argv = ["serve", "--tokenizer", "bytes", "--engine", sys.executable, "--log", str(tmp_path / "e.log"), *flags]
    if config is not None:
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps(config))
        argv += ["--config", str(cfg)]
    svc, _ = build(parser().parse_args(argv))
    return svc.engine.args


def test_the_flag_and_the_config_key_reach_the_engine(tmp_path):
    args = _engine_args(tmp_path, ["--act-bits", "8"])
    assert args[args.index("--act-bits") + 1] == "8"
    args = _engine_args(tmp_path, config={"act_bits": 8})
    assert args[args.index("--act-bits") + 1] == "8"
    args = _engine_args(tmp_path, ["--act-bits", "16"], config={"act_bits": 8})  # the flag wins
    assert args[args.index("--act-bits") + 1] == "16"
    args = _engine_args(tmp_path, config={"act_bits": 16})  # 16 asked for is passed: 8 is AVX2's default
    assert args[args.index("--act-bits") + 1] == "16"


def test_the_default_adds_no_flag(tmp_path):
    assert "--act-bits" not in _engine_args(tmp_path)


def test_other_values_are_refused(tmp_path):
    with pytest.raises(SetupError, match="act_bits 12: 16 or 8"):
        _engine_args(tmp_path, config={"act_bits": 12})
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--act-bits", "4"])

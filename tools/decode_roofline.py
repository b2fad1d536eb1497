"""Decode against the memory wall: the engine's read bandwidth, the decode bound it gives, and where the time
of one decode step goes. Used by tools/bench_engine.py (its --phases flag and its roofline rows).

Role: measurement helpers, no policy. probe_bandwidth runs `strata-engine --probe-bandwidth` (a C++ reader on
the engine's own thread pool, 64-byte vector loads in contiguous per-thread ranges, as the matmul kernels read
weights; engine/cpu/bandwidth.h) and returns its PROBE line as a dict. decode_bound turns it into tok/s: one
decode token reads decode_bytes of weights plus kv_bytes_per_pos per cached position. measure_phases runs a
greedy decode with STRATA_STEP_TIMING=1 and parses the engine's `step timing:` line (engine/cpu/step_timer.h).

Knows the engine's command line and its stderr line formats only. Public surface: probe_bandwidth,
decode_bound, measure_phases, parse_step_timing, format_roofline, format_ceilings, format_phases.
"""

import os
import subprocess
import tempfile

PROBE_TIMEOUT_S = 300.0           # model load + 11 passes over 256 MiB, on a busy machine
STEP_TIMING_PREFIX = "step timing:"
PREFILL_TIMING_PREFIX = "prefill timing:"  # the same fields for a prompt read (steps = tokens read)


def probe_bandwidth(engine, model, threads, buffer_mib=256):
    """{'read_gb_s': float, 'decode_bytes': int, 'kv_bytes_per_pos': int, ...} from the engine's PROBE line."""
    out = subprocess.run([engine, "--probe-bandwidth", "--threads", str(threads), "--model", model,
                          "--probe-mib", str(buffer_mib)], capture_output=True, text=True,
                         timeout=PROBE_TIMEOUT_S, check=True).stdout
    for line in out.splitlines():
        if line.startswith("PROBE "):
            fields = dict(w.split("=", 1) for w in line.split()[1:])
            return {k: (v if k == "reader" else float(v) if "." in v else int(v)) for k, v in fields.items()}
    raise RuntimeError("no PROBE line from %s" % engine)


def decode_bound(probe, mean_pos):
    """tok/s a decode step at mean_pos cached positions would reach if it only read memory at the probe's
    rate: bandwidth / (weight bytes + KV bytes)."""
    per_token = probe["decode_bytes"] + probe["kv_bytes_per_pos"] * mean_pos
    return probe["read_gb_s"] * 1e9 / per_token


def parse_step_timing(text, prefix=STEP_TIMING_PREFIX):
    """The last `step timing:` line (or prefix's) of an engine's stderr -> {'steps': n, 'total_ms': t,
    'jobs': j, phase: ms, ...}, or None; its clock (`wall` or `cpu`, absent from older engines' lines) is
    left out."""
    found = None
    for line in text.splitlines():
        if line.startswith(prefix):
            found = line[len(prefix):]
    if found is None:
        return None
    out = {}
    for word in found.split():
        k, v = word.split("=", 1)
        if k != "clock":
            out[k] = float(v)
    return out


def measure_phases(engine_cls, binary, model, threads, gen_args, runs=3, clock="cpu", prefix=STEP_TIMING_PREFIX):
    """Runs runs greedy decodes (gen_args: (max_new, ids, keys) for engine_cls.gen) on an engine started with
    STRATA_STEP_TIMING=cpu (clock "cpu": the model thread's CPU time, what a shared machine disturbs least)
    or =1 (clock "wall"); returns the step timing (prefix: PREFILL_TIMING_PREFIX for the prompt read's) of
    the run with the fastest total. gen_args' ids may be a function of the run number (fresh prompts)."""
    env = dict(os.environ, STRATA_STEP_TIMING="cpu" if clock == "cpu" else "1")
    best = None
    with tempfile.TemporaryFile(mode="w+") as err:
        eng = engine_cls(binary, model, threads, env=env, stderr=err)
        try:
            max_new, ids, keys = gen_args
            ids_of = ids if callable(ids) else (lambda _: ids)
            eng.gen(max_new, ids_of(-1), keys)  # warm-up
            for r in range(runs):
                err.seek(0)
                err.truncate()
                eng.gen(max_new, ids_of(r), keys)
                err.flush()
                err.seek(0)
                got = parse_step_timing(err.read(), prefix)
                if got and (best is None or got["total_ms"] < best["total_ms"]):
                    best = got
        finally:
            eng.close()
    return best


def format_roofline(probe, decode_tok_s, mean_pos, peer_tok_s=None):
    """Lines: bandwidth, bytes per token, the bound, and decode as a fraction of it."""
    bound = decode_bound(probe, mean_pos)
    per_token = probe["decode_bytes"] + probe["kv_bytes_per_pos"] * mean_pos
    lines = [
        "read bandwidth: %.1f GB/s (best of %d passes over %d MiB, %d threads, %s loads; mean %.1f GB/s)" % (
            probe["read_gb_s"], probe["passes"], probe["buffer_mib"], probe["threads"], probe["reader"],
            probe["mean_gb_s"]),
        "bytes per decode token: %.1f MB (weights %.1f MB + KV at %d positions %.1f MB) -> bound %.0f tok/s" % (
            per_token / 1e6, probe["decode_bytes"] / 1e6, mean_pos, probe["kv_bytes_per_pos"] * mean_pos / 1e6,
            bound),
        "decode %.1f tok/s = %.0f %% of the bandwidth bound" % (decode_tok_s, 100.0 * decode_tok_s / bound),
    ]
    if peer_tok_s:
        lines.append("llama.cpp decode %.1f tok/s = %.0f %% of the same bound" % (peer_tok_s, 100.0 * peer_tok_s / bound))
    if "kernel_q4_1_gb_s" in probe:
        lines.append(format_ceilings(probe))
    return "\n".join(lines)


def format_ceilings(probe):
    """One line: the single-token kernels' compute ceilings from the PROBE line (engine/cpu/bandwidth.h: one thread,
    a weight in L2, CPU time) against the read bandwidth each thread gets."""
    per_thread = probe["read_gb_s"] / max(probe["threads"], 1)
    return ("kernel ceilings, 1 thread in cache: Q4_1 %.1f GB/s, Q8_0 %.1f GB/s (8-bit activations %.1f / %.1f); "
            "memory gives each thread %.1f GB/s" % (probe["kernel_q4_1_gb_s"], probe["kernel_q8_0_gb_s"],
                                                   probe["kernel8_q4_1_gb_s"], probe["kernel8_q8_0_gb_s"], per_thread))


def format_phases(timing, clock="cpu", what="decode step"):
    """The step timing as a table: phase, us per step (per token for a prompt read), share of the step."""
    steps = max(timing["steps"], 1.0)
    total = timing["total_ms"]
    how = "CPU time of the model thread" if clock == "cpu" else "wall time"
    if "read_us" in timing:
        how += " (less %.2f us per clock read)" % timing["read_us"]
    lines = ["%s: %.3f ms %s (%.1f steps/s at that), %.1f pool jobs (fork/join barriers) per step" % (
        what, total / steps, how, 1000.0 * steps / total if total else 0.0, timing["jobs"] / steps),
        "%-10s %12s %8s" % ("phase", "us/step", "share")]
    phases = [(k, v) for k, v in timing.items() if k not in ("steps", "total_ms", "jobs", "read_us")]
    for name, ms in sorted(phases, key=lambda kv: -kv[1]):
        if ms > 0:
            lines.append("%-10s %12.1f %7.1f%%" % (name, 1000.0 * ms / steps, 100.0 * ms / total if total else 0))
    return "\n".join(lines)

"""Reaching llama.cpp (the oracle) from the tests, and the engine's own logits for the same question.

Contract: llama.cpp runs in its own interpreter (llama-cpp-python in the peer's venv, built outside the repo
as docs/BENCHMARKS.md says; env `STRATA_LLAMA_PYTHON` names another), never in the repo's .venv: `ask(request)` writes
the request as JSON, runs tests/llama_oracle.py there and returns its JSON answer. `oracle_python()` is None
when there is no such interpreter, and `require_oracle()` then skips the calling test with the reason.
`engine_logits(model, ids, n_gen)` runs build/strata-test-probe for the engine's side of the same question.
Both sides' logits come back as lists of rows (array('f') of n_vocab) plus the greedy tokens.
"""

import array
import functools
import json
import os
import pathlib
import subprocess
import tempfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PEER_PYTHON = pathlib.Path("/root/.cache/strata-peer/venv/bin/python")
ORACLE_SCRIPT = REPO / "tests" / "llama_oracle.py"
ORACLE_TIMEOUT_S = 600.0  # a 262K-vocabulary model's logits for a few hundred positions on two busy cores
DUMP_TIMEOUT_S = 600.0


@functools.lru_cache(maxsize=None)
def oracle_python():
    """The interpreter that imports llama_cpp, or None."""
    candidates = [os.environ.get("STRATA_LLAMA_PYTHON"), str(PEER_PYTHON)]
    for py in candidates:
        if not py or not pathlib.Path(py).is_file():
            continue
        try:
            r = subprocess.run([py, "-c", "import llama_cpp.llama_cpp"], capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            continue
        if r.returncode == 0:
            return py
    return None


def require_oracle():
    py = oracle_python()
    if py is None:
        pytest.skip("llama.cpp oracle absent: no interpreter with llama_cpp (llama-cpp-python) at "
                    f"{PEER_PYTHON} or STRATA_LLAMA_PYTHON")
    return py


def ask(request):
    py = require_oracle()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(request, f)
    try:
        r = subprocess.run([py, str(ORACLE_SCRIPT), f.name], capture_output=True, text=True,
                           timeout=ORACLE_TIMEOUT_S)
    finally:
        os.unlink(f.name)
    assert r.returncode == 0, f"llama.cpp oracle failed ({request['op']}): {r.stderr[-2000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def _rows(path, n_vocab):
    data = array.array("f")
    data.frombytes(pathlib.Path(path).read_bytes())
    return [data[i:i + n_vocab] for i in range(0, len(data), n_vocab)]


def oracle_logits(model, ids, n_gen, n_ctx=None, last_only=False):
    """llama.cpp's rows (see engine_logits) and greedy tokens."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.bin")
        a = ask({"op": "logits", "model": str(model), "ids": list(ids), "n_gen": n_gen, "out": out,
                 "n_ctx": n_ctx, "last_only": last_only})
        return _rows(out, a["n_vocab"]), a["tokens"]


def dump_exe():
    exe = REPO / "build" / "strata-test-probe"
    if not exe.is_file():
        pytest.skip("build/strata-test-probe is not built (cmake --build build)")
    return exe


def engine_logits(model, ids, n_gen, n_vocab, n_ctx=None, last_only=False, chunk=None, figures=None, threads=None,
                  experts_kib=None):
    """The engine's logits rows: every prompt position (last_only: the last one), then every fed greedy
    token; and its greedy tokens. chunk: prompt entries per evaluation (also what sizes the rings of window
    layers); figures: a dict that gets the probe's kv_bytes and expert tiers' figures; threads: the pool's size
    (the probe's default 2); experts_kib: the expert RAM budget in KiB (engine/expert_tiers.h)."""
    exe = dump_exe()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.bin")
        args = [str(exe), "logits", str(model), ",".join(map(str, ids)), str(n_gen), out,
                str(n_ctx or len(ids) + n_gen + 8)]
        args.append("last" if last_only else "all")
        if chunk:
            args.append(str(chunk))
        env = dict(os.environ)
        if threads:
            env["STRATA_PROBE_THREADS"] = str(threads)
        if experts_kib is not None:
            env["STRATA_PROBE_EXPERTS_KIB"] = str(experts_kib)
        r = subprocess.run(args, capture_output=True, text=True, timeout=DUMP_TIMEOUT_S, env=env)
        assert r.returncode == 0, f"strata-test-probe logits failed: {r.stderr[-2000:]}"
        if figures is not None:
            figures.update(line.split("=", 1) for line in r.stderr.splitlines()
                           if line.startswith(("kv_bytes=", "experts_")))
        return _rows(out, n_vocab), [int(t) for t in r.stdout.strip().split(",")]


def assert_logits_independent_of_batch_and_threads(model, ids, n_gen, n_vocab):
    """The engine's logits rows and greedy tokens are bit-equal whether the prompt is read in one chunk or in
    chunks of 1 or 7, on 1 or 2 threads."""
    whole, tokens = engine_logits(model, ids, n_gen, n_vocab)
    for chunk, threads in ((1, 2), (7, 1), (None, 1)):
        rows, toks = engine_logits(model, ids, n_gen, n_vocab, chunk=chunk, threads=threads)
        assert toks == tokens
        bad = [i for i, (a, b) in enumerate(zip(rows, whole, strict=True)) if a != b]
        assert not bad, f"chunk {chunk}, {threads} threads: rows {bad[:5]} differ from the one-chunk read"

def engine_dequant(type_num, raw, n):
    exe = dump_exe()
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "in.bin"), os.path.join(d, "out.bin")
        pathlib.Path(src).write_bytes(raw)
        r = subprocess.run([str(exe), "dequant", str(type_num), src, str(n), out], capture_output=True, text=True,
                           timeout=DUMP_TIMEOUT_S)
        assert r.returncode == 0, f"strata-test-probe dequant failed: {r.stderr[-2000:]}"
        return _rows(out, n)[0]


def oracle_dequant(type_num, raw, n):
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "in.bin"), os.path.join(d, "out.bin")
        pathlib.Path(src).write_bytes(raw)
        ask({"op": "dequant", "type": type_num, "data": src, "n": n, "out": out})
        return _rows(out, n)[0]


def top2_margin(row):
    a = b = float("-inf")
    for v in row:
        if v > a:
            a, b = v, a
        elif v > b:
            b = v
    return a - b


def compare_logits(ours, theirs):
    """(max |diff|, spread) over all rows, spread = the largest per-row max - min of llama.cpp's logits."""
    worst = spread = 0.0
    for r1, r2 in zip(ours, theirs, strict=True):
        worst = max(worst, max(abs(x - y) for x, y in zip(r1, r2, strict=True)))
        spread = max(spread, max(r2) - min(r2))
    return worst, spread


def greedy_agree(ours_tokens, theirs_tokens, theirs_rows, n_prompt, margin):
    """True when the greedy runs agree up to the first step whose llama.cpp top-two margin is below `margin`
    (after such a near tie either side may take either token; the runs are compared no further)."""
    for i, (a, b) in enumerate(zip(ours_tokens, theirs_tokens, strict=True)):
        if top2_margin(theirs_rows[n_prompt - 1 + i]) < margin:
            return True
        if a != b:
            return False
    return True

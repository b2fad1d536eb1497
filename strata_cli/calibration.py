"""`strata serve --calibrate`: measure engine thread counts and prompt chunk sizes on this machine and write
the best into the model's run config, saying what was measured.

Role: start the engine once per setting (`--threads T`, then `--chunk C` at the best T), time a prompt read of
`PROMPT_TOKENS` tokens and `DECODE_TOKENS` decoded tokens from the engine's own figures (BDONE's prompt_ms
and decode_ms, on one slot: it reads its prompt in --chunk pieces), pick the threads with the fastest decode
(prompt reads are short in a chat; ties go to fewer threads) and the chunk with the fastest prompt read, and write `threads` and `chunk` into the run config
(strata_control.runconfig.save_edit: the old file is kept as `.bak`). It knows no HTTP.

Public surface: `candidates(physical_cores)`, `measure(argv, model, threads, chunk, log)`, `calibrate(argv,
model, config_path, cores, say)`, `CHUNKS`.
"""
from __future__ import annotations

import os
import random
import time

from serve.engine_client.engine import StrataEngine

PROMPT_TOKENS = 1024      # long enough that chunking matters, short enough for a slow machine (seconds)
DECODE_TOKENS = 64        # decode figures settle within this many tokens
CHUNKS = (128, 256, 512)  # the engine's --chunk choices tried (512 is its default)
MEASURE_CTX = 2048        # the engine's context while measuring: the prompt and the decode fit


def candidates(physical_cores: int) -> list[int]:
    """Thread counts worth trying: 1, powers of two below the physical cores, and the physical cores."""
    out, t = {1, max(1, physical_cores)}, 2
    while t < physical_cores:
        out.add(t)
        t *= 2
    return sorted(out)


def measure(argv: list[str], model: str, threads: int, chunk: int, log: str | None = None) -> dict:
    """One engine start at these settings -> {"prefill_tok_s", "decode_tok_s"} (EOS banned while decoding)."""
    engine = StrataEngine(argv, ["--model", model, "--max-context", str(MEASURE_CTX), "--threads", str(threads),
                                 "--chunk", str(chunk), "--batch", "1"], log_path=log)  # one slot reads in chunks
    engine.start()
    try:
        n_vocab = int(engine.info.get("n_vocab") or 256)
        rnd = random.Random(threads * 1000 + chunk)
        ids = [rnd.randrange(n_vocab) for _ in range(PROMPT_TOKENS)]
        eos = [t for t in str(engine.info.get("eos") or "").split(",") if t.strip().lstrip("-").isdigit()]
        keys = "logit_bias=" + ",".join(f"{t}:-100" for t in eos) if eos else ""
        result: dict = {}
        n_out = sum(1 for t in engine.generate(ids, DECODE_TOKENS, keys, result=result) if t is not None)
    finally:
        engine.close()
    pm, dm = result.get("prompt_ms") or 0.0, result.get("decode_ms") or 0.0
    return {"threads": threads, "chunk": chunk, "prefill_tok_s": round(1e3 * PROMPT_TOKENS / pm, 1) if pm else 0.0,
            "decode_tok_s": round(1e3 * n_out / dm, 1) if dm else 0.0}


def calibrate(argv: list[str], model: str, config_path: str, physical_cores: int, say=print,
              log: str | None = None) -> dict:
    """Measure, pick, write -> {"threads", "chunk", "runs"}; `say` gets one line per run and the verdict."""
    from strata_control import runconfig
    runs = []
    for t in candidates(physical_cores):
        runs.append(measure(argv, model, t, 512, log))
        say(f"threads {t:>3}, chunk 512: prefill {runs[-1]['prefill_tok_s']} tok/s, "
            f"decode {runs[-1]['decode_tok_s']} tok/s")
    best_t = max(runs, key=lambda r: (r["decode_tok_s"], -r["threads"]))["threads"]
    by_chunk = {512: next(r for r in runs if r["threads"] == best_t)}
    for c in CHUNKS:
        if c not in by_chunk:
            by_chunk[c] = measure(argv, model, best_t, c, log)
            runs.append(by_chunk[c])
            say(f"threads {best_t:>3}, chunk {c}: prefill {by_chunk[c]['prefill_tok_s']} tok/s, "
                f"decode {by_chunk[c]['decode_tok_s']} tok/s")
    best_c = max(by_chunk.values(), key=lambda r: (r["prefill_tok_s"], r["chunk"]))["chunk"]
    current = runconfig.read_config(config_path) if os.path.exists(config_path) else {}
    os.makedirs(os.path.dirname(os.path.abspath(config_path)), exist_ok=True)
    runconfig.save_edit(config_path, {**current, "threads": best_t, "chunk": best_c, "calibrated": {
        "threads": best_t, "chunk": best_c, "date": time.strftime("%Y-%m-%d")}})
    say(f"best: threads {best_t} (fastest decode), chunk {best_c} (fastest prompt read); written to "
        f"{config_path}" + (" (the old file kept as .bak)" if current else ""))
    return {"threads": best_t, "chunk": best_c, "runs": runs}

"""Expert tiers: prefill and decode of a MoE GGUF with every expert in RAM and under smaller expert budgets.

Role: a benchmark, run by hand (`python3 tools/bench_expert_tiers.py MODEL.gguf [--budgets 100,50,0]
[--threads T] [--runs N]`). For each budget (`--experts-ram-mib`, engine/expert_tiers.h; "all" = no budget)
it starts `build/strata-engine`, reads one prompt of --prompt tokens (a sentence repeated: the routing of a
real prompt repeats too), decodes 64 tokens, and prints prefill and decode tok/s (the `DONE` line's
prompt_ms / decode_ms), the experts resident of the total, and the hit rate (the `VRAM` answer's
experts_hits / (hits + misses): expert reads served from RAM). The best of --runs is kept (the machine may
be shared). A file whose experts fit the budget reports every expert resident.

Knows nothing of the server: only the engine's protocol (docs/PROTOCOL.md).
Public surface: main(argv), run_once(model, budget_mib, ids, threads).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE = os.path.join(ROOT, "build", "strata-engine")
RUN_TIMEOUT_S = 900   # one engine run: load, one prompt, 64 tokens, on a slow shared machine
N_GEN = 64


def _kv(line: str) -> dict:
    return dict(w.split("=", 1) for w in line.split()[1:] if "=" in w)


def run_once(model: str, budget_mib: int | None, ids: list[int], threads: int) -> dict:
    """One engine run: {prefill_tok_s, decode_tok_s, resident, total, hit_rate}."""
    args = [ENGINE, "--serve", "--model", model, "--threads", str(threads), "--max-context", str(len(ids) + 128)]
    if budget_mib is not None:
        args += ["--experts-ram-mib", str(budget_mib)]
    script = f"GEN {N_GEN} {','.join(map(str, ids))}\nVRAM\nQUIT\n"
    r = subprocess.run(args, input=script, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if r.returncode != 0:
        raise SystemExit(f"the engine failed: {r.stderr[-2000:]}")
    lines = r.stdout.splitlines()
    info: dict = {}
    for ln in lines:
        if ln.startswith("INFO "):
            info.update(_kv(ln))
    done = next(ln.split() for ln in lines if ln.startswith("DONE "))
    vram = _kv(next(ln for ln in lines if ln.startswith("VRAM ")))
    gen, prompt, prompt_ms, decode_ms = int(done[1]), int(done[2]), float(done[3]), float(done[4])
    hits, misses = int(vram.get("experts_hits", 0)), int(vram.get("experts_misses", 0))
    return {"prefill_tok_s": prompt / prompt_ms * 1000.0, "decode_tok_s": gen / decode_ms * 1000.0,
            "resident": info.get("experts_resident"), "total": info.get("experts_total"),
            "hit_rate": hits / (hits + misses) if hits + misses else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--budgets", default="all,100,50,0", help="expert budgets in MiB, comma separated; all = none")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=400, help="prompt tokens")
    args = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    from tokenizer.bpe import Tokenizer
    tok = Tokenizer.from_gguf(args.model)
    ids = tok.encode("The quick brown fox jumps over the lazy dog. " * (args.prompt // 8 + 1))[:args.prompt]
    print(f"{'budget MiB':>10} {'resident':>12} {'prefill tok/s':>14} {'decode tok/s':>13} {'hit rate':>9}")
    for b in args.budgets.split(","):
        budget = None if b == "all" else int(b)
        best = max((run_once(args.model, budget, ids, args.threads) for _ in range(args.runs)),
                   key=lambda x: x["decode_tok_s"])
        rate = "-" if best["hit_rate"] is None else f"{best['hit_rate']:.0%}"
        print(f"{b:>10} {str(best['resident']) + ' / ' + str(best['total']):>12} {best['prefill_tok_s']:>14.1f} "
              f"{best['decode_tok_s']:>13.2f} {rate:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

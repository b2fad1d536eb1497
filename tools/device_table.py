"""The table of a device check: reads tools/device_check.sh's result file and prints the markdown table that
docs/GPU.md and the issue's closing note take, with the bars issue 26 sets.

    python3 tools/device_table.py device_check_out/device_check.txt

Rows per model (MODEL line, then its BENCH lines) and figure: Strata on the GPU, PyTorch bf16 on the same shape
(TORCH lines), the CPU engine where it ran, and the share of the physical limit: prefill against the bf16
tensor-core roofline (the H200's dense spec; matmul and causal-attention FLOPs of the shape), decode against
the HBM bound (decode bytes of the file plus the KV read, over the spec bandwidth). Bars: prefill of the 8B shape
at 4096 tokens >= 50 % of the roofline and >= PyTorch; decode at 1 slot >= 70 % of the bound. GREEDY lines and
every step's status follow the table.
"""

import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tools.bench_torch import (H200_BF16_DENSE_TFLOPS, H200_HBM_TBS, SHAPES, attention_flops,  # noqa: E402
                               matmul_flops_per_token)

PREFILL_BAR = 0.50   # of the roofline, the 8B shape at 4096 tokens
DECODE_BAR = 0.70    # of the HBM bound, 1 slot


def fields(line):
    return dict(w.split("=", 1) for w in line.split() if "=" in w)


def shape_of(model):
    """The SHAPES key of a MODEL line (by layers and width), or None."""
    for name, (n_layer, n_embd, *_rest) in SHAPES.items():
        if int(model["layers"]) == n_layer and int(model["embd"]) == n_embd:
            return name
    return None


def parse(text):
    rows, torch, greedy, steps = [], {}, [], []
    model = None
    for line in text.splitlines():
        if line.startswith("MODEL "):
            model = fields(line)
        elif line.startswith("BENCH ") and model:
            f = fields(line)
            kind = "prefill" if " prefill " in line else "decode"
            key = f["n"] if kind == "prefill" else f["slots"]
            rows.append((shape_of(model), model, f["backend"], kind, key, float(f["tok_s"])))
        elif line.startswith("TORCH "):
            f = fields(line)
            kind = "prefill" if " prefill " in line else "decode"
            torch[(f["shape"], kind, f["n"] if kind == "prefill" else f["slots"])] = float(f["tok_s"])
        elif line.startswith("GREEDY "):
            greedy.append(line)
        elif re.match(r"--- .*: rc=", line):
            steps.append(line[4:])
    return rows, torch, greedy, steps


def limit_share(shape, model, kind, key, tok_s):
    """(share of the physical limit, limit tok/s) for one figure, or (None, None) without the shape."""
    if shape is None:
        return None, None
    if kind == "prefill":
        n = int(key)
        flops = n * matmul_flops_per_token(SHAPES[shape]) + attention_flops(SHAPES[shape], n)
        limit = n / (flops / (H200_BF16_DENSE_TFLOPS * 1e12))
    else:  # one step reads the weights once and each slot's 128 cached positions
        k = int(key)
        limit = k * H200_HBM_TBS * 1e12 / (int(model["decode_bytes"]) + k * int(model["kv_bytes_per_pos"]) * 128)
    return tok_s / limit, limit


def table(text):
    rows, torch, greedy, steps = parse(text)
    cpu = {(s, k, key): t for s, _, b, k, key, t in rows if b == "cpu"}
    out = ["| shape | figure | Strata GPU tok/s | PyTorch bf16 tok/s | CPU tok/s | limit tok/s | share of limit | bar |",
           "|---|---|---|---|---|---|---|---|"]
    for shape, model, backend, kind, key, tok_s in rows:
        if backend != "cuda":
            continue
        share, limit = limit_share(shape, model, kind, key, tok_s)
        pt = torch.get((shape, kind, key))
        bar = ""
        if shape == "llama8b" and kind == "prefill" and key == "4096":
            ok = share is not None and share >= PREFILL_BAR and (pt is None or tok_s >= pt)
            bar = f"{'PASS' if ok else 'FAIL'} (>= {PREFILL_BAR:.0%} and >= PyTorch)"
        elif kind == "decode" and key == "1":
            ok = share is not None and share >= DECODE_BAR
            bar = f"{'PASS' if ok else 'FAIL'} (>= {DECODE_BAR:.0%})"
        figure = f"prefill {key}" if kind == "prefill" else f"decode {key} slot{'s' if key != '1' else ''}"
        c = cpu.get((shape, kind, key))
        cells = [shape or model["arch"], figure, f"{tok_s:.1f}", f"{pt:.1f}" if pt is not None else "-",
                 f"{c:.1f}" if c is not None else "-", f"{limit:.0f}" if limit else "-",
                 f"{share:.1%}" if share is not None else "-", bar]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "Greedy tokens, GPU vs CPU:"] + [f"- {g}" for g in greedy]
    out += ["", "Steps:"] + [f"- {s}" for s in steps]
    return "\n".join(out)


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(table(pathlib.Path(argv[1]).read_text(errors="replace")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

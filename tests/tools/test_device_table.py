"""tools/device_table.py: a device check's result lines become the table with the issue's bars, computed from the
shapes' FLOPs and bytes (the 8B shape's roofline at 4096 tokens, its HBM bound at 1 slot)."""

from tools import device_table
from tools.bench_torch import SHAPES, attention_flops, matmul_flops_per_token

REPORT = """\
MODEL arch=llama layers=32 embd=4096 vocab=128256 backend=cuda device=NVIDIA_H200 decode_bytes=4600000000 kv_bytes_per_pos=131072
BENCH backend=cuda prefill n=4096 chunk=2048 s=0.2 tok_s=40000.0
BENCH backend=cuda decode slots=1 ctx=128 steps=64 s=0.1 tok_s=600.0
--- speed: llama-3-8B Q4_K_M shape on the GPU: rc=0 seconds=40
TORCH shape=llama8b prefill n=4096 s=0.1 tok_s=38000.0 roofline_tok_s=65817 pct_of_roofline=58
GREEDY prompt=64 n=32 equal=30 first_diff=30 cpu_margin=0.0400
"""


def test_the_8b_rows_carry_the_roofline_the_bound_and_the_bars():
    flops = 4096 * matmul_flops_per_token(SHAPES["llama8b"]) + attention_flops(SHAPES["llama8b"], 4096)
    roofline = 4096 / (flops / 989.4e12)
    assert 60000 < roofline < 70000  # ~15 GFLOP a token: 14 of matmuls, ~1 of attention at 4096
    out = device_table.table(REPORT)
    rows = [line for line in out.splitlines() if line.startswith("| llama8b")]
    prefill, decode = rows
    assert f"| {roofline:.0f} | {40000 / roofline:.1%} | PASS" in prefill and "38000.0" in prefill
    bound = 4.8e12 / (4600000000 + 131072 * 128)
    assert f"| {bound:.0f} | {600 / bound:.1%} | FAIL" in decode
    assert "- GREEDY prompt=64 n=32 equal=30 first_diff=30 cpu_margin=0.0400" in out
    assert "- speed: llama-3-8B Q4_K_M shape on the GPU: rc=0 seconds=40" in out


def test_slower_than_pytorch_fails_the_prefill_bar():
    out = device_table.table(REPORT.replace("tok_s=38000.0", "tok_s=45000.0"))
    assert "FAIL (>= 50% and >= PyTorch)" in out

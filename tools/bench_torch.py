"""The strong baseline and the physical limits for the GPU figures of tools/device_check.sh, on the same machine.

    python3 tools/bench_torch.py [--shape llama8b|small] [--prefill 512,4096,16384] [--slots 1,8]

Baseline: the same decoder shape in PyTorch with bf16 weights (what the quantised weights dequantise to; random
values: the work is the same) — cuBLAS GEMMs, SDPA attention (causal, grouped heads), RMS norm, RoPE, SwiGLU —
timed with CUDA events after a warm-up: prefill tok/s at each length (the head for the last token only, as the
engine) and decode tok/s at 1 and 8 sequences over a 128-position cache.
Limits: the bf16 tensor-core rate a large cuBLAS GEMM reaches here (and the H200's spec, 989 TFLOP/s dense), the
HBM bandwidth a large device copy reaches (spec 4.8 TB/s), and from them the prefill roofline of the shape
(FLOPs per token of the matmuls and the causal attention) and the decode bound (bytes per token / bandwidth).
Prints `TORCH ...` and `LIMIT ...` lines. Needs torch with CUDA (prints SKIP and exits 0 without).
"""

import argparse
import sys

SHAPES = {  # n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab
    "llama8b": (32, 4096, 32, 8, 128, 14336, 128256),
    "small": (30, 576, 9, 3, 64, 1536, 49152),
    "gemma": (18, 640, 4, 1, 256, 2048, 262144),  # its windows are not modelled: full causal attention
}
H200_BF16_DENSE_TFLOPS = 989.4   # NVIDIA's figure for the SXM part, without sparsity
H200_HBM_TBS = 4.8


def matmul_flops_per_token(shape):
    n_layer, E, nh, nkv, hd, F, _ = shape
    per_layer = E * (nh * hd + 2 * nkv * hd) + nh * hd * E + 3 * E * F
    return 2 * n_layer * per_layer


def attention_flops(shape, n):
    """Causal attention of a prompt of n tokens: q k^T and p v over the positions each token sees."""
    n_layer, _, nh, _, hd, _, _ = shape
    return 4 * n_layer * nh * hd * (n * (n + 1) / 2)


def timed(torch, fn, reps=3):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000.0 / reps


class Model:
    def __init__(self, torch, shape):
        self.t = torch
        n_layer, E, nh, nkv, hd, F, V = shape
        self.shape = shape
        dev, bf = "cuda", torch.bfloat16
        g = torch.Generator(device=dev).manual_seed(1)
        def w(*s):
            return (torch.randn(*s, device=dev, generator=g, dtype=torch.float32) * 0.02).to(bf)
        self.layers = [dict(qkv=w(nh * hd + 2 * nkv * hd, E), o=w(E, nh * hd), gu=w(2 * F, E), d=w(E, F),
                            n1=torch.ones(E, device=dev, dtype=bf), n2=torch.ones(E, device=dev, dtype=bf))
                       for _ in range(n_layer)]
        self.head = w(V, E)
        inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd))
        self.inv = inv

    def rope(self, x, pos):  # x (b, h, n, hd), NeoX halves
        ang = pos[:, None].float() * self.inv[None, :]
        c, s = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        a, b = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return self.t.cat([a * c - b * s, a * s + b * c], dim=-1)

    def forward(self, x, pos, cache=None):
        """x (b, n, E); pos (n); cache: per layer [k, v] (b, nkv, L, hd) to attend over before x's own."""
        t, F = self.t, self.t.nn.functional
        _, E, nh, nkv, hd, Fd, _ = self.shape
        b, n, _ = x.shape
        for i, L in enumerate(self.layers):
            h = F.rms_norm(x, (E,), L["n1"])
            qkv = h @ L["qkv"].T
            q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
            q = self.rope(q.view(b, n, nh, hd).transpose(1, 2), pos)
            k = self.rope(k.view(b, n, nkv, hd).transpose(1, 2), pos)
            v = v.view(b, n, nkv, hd).transpose(1, 2)
            if cache is not None:
                k = t.cat([cache[i][0], k], dim=2)
                v = t.cat([cache[i][1], v], dim=2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None, enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(b, n, nh * hd) @ L["o"].T
            h = F.rms_norm(x, (E,), L["n2"])
            g, u = (h @ L["gu"].T).split([Fd, Fd], dim=-1)
            x = x + (F.silu(g) * u) @ L["d"].T
        return x[:, -1] @ self.head.T


def limits(torch):
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    s = timed(torch, lambda: a @ a, reps=10)
    tflops = 2 * 8192 ** 3 / s / 1e12
    src = torch.empty(2 << 30, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    s = timed(torch, lambda: dst.copy_(src), reps=10)
    tbs = 2 * src.numel() / s / 1e12
    print(f"LIMIT bf16_gemm_tflops={tflops:.1f} spec_bf16_tflops={H200_BF16_DENSE_TFLOPS} "
          f"hbm_copy_tbs={tbs:.2f} spec_hbm_tbs={H200_HBM_TBS}", flush=True)
    return tflops, tbs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama8b", choices=sorted(SHAPES))
    ap.add_argument("--prefill", default="512,4096,16384")
    ap.add_argument("--slots", default="1,8")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("SKIP: no torch")
        return 0
    if not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA device")
        return 0
    shape = SHAPES[args.shape]
    tflops, tbs = limits(torch)
    m = Model(torch, shape)
    E = shape[1]
    with torch.inference_mode():
        for n in (int(v) for v in args.prefill.split(",")):
            x = torch.randn(1, n, E, device="cuda", dtype=torch.bfloat16)
            pos = torch.arange(n, device="cuda")
            s = timed(torch, lambda: m.forward(x, pos), reps=2)
            flops = n * matmul_flops_per_token(shape) + attention_flops(shape, n)
            roof = n / (flops / (H200_BF16_DENSE_TFLOPS * 1e12))
            print(f"TORCH shape={args.shape} prefill n={n} s={s:.4f} tok_s={n / s:.1f} "
                  f"roofline_tok_s={roof:.1f} pct_of_roofline={100 * n / s / roof:.1f}", flush=True)
        n_layer, _, _, nkv, hd, _, _ = shape
        for b in (int(v) for v in args.slots.split(",")):
            cache = [[torch.randn(b, nkv, 128, hd, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
                     for _ in range(n_layer)]
            x = torch.randn(b, 1, E, device="cuda", dtype=torch.bfloat16)
            pos = torch.tensor([128], device="cuda")
            s = timed(torch, lambda: m.forward(x, pos, cache), reps=10)
            print(f"TORCH shape={args.shape} decode slots={b} ctx=128 s_per_step={s:.5f} tok_s={b / s:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

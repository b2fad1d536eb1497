"""The weight bytes one decoded token reads, by kind, as the engine holds the weights (bench_engine's --where).

Role: read a GGUF's tensor table (tokenizer/gguf_meta.py) and size the 2-D weights a decode step reads, the
output head apart from the layer matrices by kind, with the bytes per element the engine's kernel set holds
each type in; and the table of it, with the bandwidth a decode rate implies. A script's helper: it runs
nothing.

Public surface: `weight_traffic(model, kernels)`, `format_traffic(rows, decode_tok_s)`, `ENGINE_TYPE_BYTES`,
`KERNEL_SET_BYTES`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tokenizer import gguf_meta  # noqa: E402

# ggml type number -> (name, bytes per element) as the engine holds the weight: Q5_0 and IQ4_NL are widened
# to Q8_0 at load (34 bytes per 32), except Q5_0 with the AVX-512 kernels (KERNEL_SET_BYTES); Q4_K and Q6_K on the
# AVX2 / AVX-512 sets are read from their row-group copies (PACKED_KQ, engine/cpu/kernels_group_kq.h: 384 and 640
# bytes per 16 x 32; rows a multiple of 16); every other type is read as stored
ENGINE_TYPE_BYTES = {0: ("F32", 4.0), 1: ("F16", 2.0), 30: ("BF16", 2.0), 2: ("Q4_0", 18 / 32), 3: ("Q4_1", 20 / 32),
                     6: ("Q5_0->Q8_0", 34 / 32), 7: ("Q5_1", 24 / 32), 8: ("Q8_0", 34 / 32), 10: ("Q2_K", 84 / 256),
                     11: ("Q3_K", 110 / 256), 12: ("Q4_K", 144 / 256), 13: ("Q5_K", 176 / 256),
                     14: ("Q6_K", 210 / 256), 20: ("IQ4_NL->Q8_0", 34 / 32), 23: ("IQ4_XS", 136 / 256)}
PACKED_KQ = {12: ("Q4_K->group", 384 / 512), 14: ("Q6_K->group", 640 / 512)}
# kernel set (INFO kernels=) -> how it holds some types, over ENGINE_TYPE_BYTES
KERNEL_SET_BYTES = {"avx512_vnni": {6: ("Q5_0", 22 / 32), **PACKED_KQ}, "avx2": PACKED_KQ}


def weight_traffic(model, kernels="?"):
    """[(group, type names, MB read per decoded token, share)]: the 2-D weights one decode step reads, the
    output head (output.weight, or the tied token_embd.weight) apart from the layer matrices by kind;
    kernels: the engine's kernel set (INFO kernels=), which decides how Q5_0, Q4_K and Q6_K are held."""
    type_bytes = {**ENGINE_TYPE_BYTES, **KERNEL_SET_BYTES.get(kernels, {})}
    infos = gguf_meta.read_tensor_infos(model)
    names = {n for n, _, _ in infos}
    head = "output.weight" if "output.weight" in names else "token_embd.weight"
    groups = {}
    for name, type_num, ne in infos:
        if len(ne) != 2 or (name.startswith("token_embd") and head != name):
            continue
        kind = "output head" if name == head else name.split(".")[-2]
        tname, per = type_bytes.get(type_num, ("type %d" % type_num, 0.0))
        mb, types = groups.get(kind, (0.0, set()))
        groups[kind] = (mb + ne[0] * ne[1] * per / 1e6, types | {tname})
    total = sum(mb for mb, _ in groups.values()) or 1.0
    return [(k, "/".join(sorted(t)), mb, mb / total) for k, (mb, t) in sorted(groups.items(), key=lambda kv: -kv[1][0])]


def format_traffic(rows, decode_tok_s=None):
    total = sum(r[2] for r in rows)
    lines = ["weights read per decoded token (as the engine holds them): %.1f MB" % total]
    lines += ["  %-12s %-16s %8.1f MB %5.1f%%" % (k, t, mb, 100 * share) for k, t, mb, share in rows]
    if decode_tok_s:
        lines.append("  at %.1f tok/s decode: %.2f GB/s of weights" % (decode_tok_s, total * decode_tok_s / 1000))
    return "\n".join(lines)

"""A small GGUF v3 writer and random-weight model files, for tests that compare the engine with llama.cpp.

Contract: `GGUFWriter` collects metadata pairs and tensors and writes one GGUF v3 file (little-endian, data
aligned to 32 bytes). `random_model(path, arch, vocab_meta, wtype=...)` writes a small decoder of the given
architecture ("llama", "qwen2", "qwen3", "gemma3", and the mixtures of experts "qwen3moe", "qwen2moe": stacked
3-D expert tensors ffn_{gate,up,down}_exps, an F32 router, qwen2moe's shared expert; "phi3": fused attn_qkv and
gate/up ffn_up, LongRoPE factors rope_factors_short / rope_factors_long; "gpt-oss": biases on attention, router and
experts, attention sinks, alternating window layers, post_attention_norm as the FFN's norm, an untied head) with
random weights and the vocabulary
metadata it is given (a real tokenizer taken from a shipped model, so token ids mean something to both sides).
Everything is standard
library: random half floats and quant blocks are made from random bytes whose scale fields are rewritten
through byte tables, so a 50K-row embedding costs milliseconds, not a Python loop per element.

Layout written: magic "GGUF", u32 3, u64 n_tensors, u64 n_kv; the pairs (string key, u32 type, value); the
tensor infos (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset from the data start); zero
padding to the alignment; the tensor data, each tensor padded to the alignment.
"""

import random
import struct

ALIGNMENT = 32

# GGUF value types
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STRING, T_ARRAY, T_U64, T_I64, T_F64 = range(13)
_SCALAR = {T_U8: "<B", T_I8: "<b", T_U16: "<H", T_I16: "<h", T_U32: "<I", T_I32: "<i", T_F32: "<f",
           T_BOOL: "<?", T_U64: "<Q", T_I64: "<q", T_F64: "<d"}

# ggml tensor types: name -> (number, elements per block, bytes per block)
GGML_TYPES = {
    "F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22),
    "Q5_1": (7, 32, 24), "Q8_0": (8, 32, 34), "Q2_K": (10, 256, 84), "Q3_K": (11, 256, 110),
    "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176), "Q6_K": (14, 256, 210), "IQ4_NL": (20, 32, 18),
    "IQ4_XS": (23, 256, 136), "MXFP4": (39, 32, 17),
}

# Where a block's half-float scales sit and the binary16 exponent field they get, so that the dequantised
# weights land around 1e-2..1e-1 for every type (the largest |q * sub-scale| of the type sets the exponent).
# type -> [(byte offset of the half in the block, lowest exponent field)]; 15 is 2^0, -1 a subnormal below
# 2^-15.
_BLOCK_SCALES = {
    "Q4_0": [(0, 5)], "Q4_1": [(0, 4), (2, 6)], "Q5_0": [(0, 4)], "Q5_1": [(0, 3), (2, 6)],
    "Q8_0": [(0, 2)], "Q2_K": [(80, 3), (82, 3)], "Q3_K": [(108, 1)], "Q4_K": [(0, -1), (2, 0)],
    "Q5_K": [(0, -1), (2, 0)], "Q6_K": [(208, -1)], "IQ4_NL": [(0, 1)], "IQ4_XS": [(0, -1)],
}


def _string(s):
    b = s.encode("utf-8", "surrogateescape") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def _value(vtype, value, item_type=None):
    if vtype == T_STRING:
        return _string(value)
    if vtype == T_ARRAY:
        out = [struct.pack("<IQ", item_type, len(value))]
        if item_type == T_STRING:
            out.extend(_string(v) for v in value)
        else:
            fmt = _SCALAR[item_type]
            out.append(struct.pack("<" + fmt[1] * len(value), *value))
        return b"".join(out)
    return struct.pack(_SCALAR[vtype], value)


class GGUFWriter:
    """Metadata pairs and tensors in insertion order; write(path) emits the file."""

    def __init__(self):
        self.kv = []       # (key, type, value, item_type)
        self.tensors = []  # (name, ne, type name, data bytes)

    def add(self, key, value, vtype=None, item_type=None):
        """Adds one pair; the type is inferred (bool, int -> u32, float -> f32, str, list) unless given."""
        if vtype is None:
            if isinstance(value, bool):
                vtype = T_BOOL
            elif isinstance(value, int):
                vtype = T_U32
            elif isinstance(value, float):
                vtype = T_F32
            elif isinstance(value, str):
                vtype = T_STRING
            else:
                vtype = T_ARRAY
        if vtype == T_ARRAY and item_type is None:
            first = value[0] if value else ""
            item_type = (T_STRING if isinstance(first, str) else T_F32 if isinstance(first, float) else T_I32)
        self.kv.append((key, vtype, value, item_type))

    def add_tensor(self, name, ne, type_name, data):
        """ne as GGUF stores it: ne[0] is the row length (columns), ne[1] the rows."""
        _, block, block_bytes = GGML_TYPES[type_name]
        n = 1
        for d in ne:
            n *= d
        assert ne[0] % block == 0 and len(data) == n // block * block_bytes, (name, ne, type_name, len(data))
        self.tensors.append((name, list(ne), type_name, bytes(data)))

    def write(self, path):
        head = [b"GGUF", struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))]
        for key, vtype, value, item_type in self.kv:
            head += [_string(key), struct.pack("<I", vtype), _value(vtype, value, item_type)]
        offset = 0
        for name, ne, type_name, data in self.tensors:
            head += [_string(name), struct.pack("<I", len(ne)), struct.pack("<" + "Q" * len(ne), *ne),
                     struct.pack("<IQ", GGML_TYPES[type_name][0], offset)]
            offset += -(-len(data) // ALIGNMENT) * ALIGNMENT
        header = b"".join(head)
        with open(path, "wb") as f:
            f.write(header)
            f.write(b"\0" * (-len(header) % ALIGNMENT))
            for _, _, _, data in self.tensors:
                f.write(data)
                f.write(b"\0" * (-len(data) % ALIGNMENT))


def _exponent_table(exp_lo):
    """byte -> high byte of a half with a random sign, exponent field exp_lo..exp_lo+3 and random top mantissa
    bits (exp_lo -1: a subnormal below 2^-15)."""
    if exp_lo < 0:
        return bytes((b & 0x80) | (b & 1) for b in range(256))
    return bytes((b & 0x80) | ((exp_lo + ((b >> 2) & 3)) << 2) | (b & 3) for b in range(256))


def random_f16(rng, n, exp_lo=7):
    """n random halves, magnitudes 2^(exp_lo-15) .. 2^(exp_lo-11), random signs."""
    data = bytearray(rng.randbytes(2 * n))
    data[1::2] = data[1::2].translate(_exponent_table(exp_lo))
    return bytes(data)


def random_blocks(rng, type_name, n):
    """n elements of a quantised type: random bytes, each block's half scales made finite and moderate."""
    if type_name == "F16":
        return random_f16(rng, n)
    if type_name == "F32":
        return struct.pack(f"<{n}f", *(rng.gauss(0.0, 0.05) for _ in range(n)))
    if type_name == "MXFP4":   # an E8M0 exponent byte per block: 2^-9..2^-6, so |x| <= 12 * 2^-6 ~ 0.19
        data = bytearray(rng.randbytes(n // 32 * 17))
        data[0::17] = bytes(rng.randrange(119, 123) for _ in range(n // 32))
        return bytes(data)
    _, block, bb = GGML_TYPES[type_name]
    data = bytearray(rng.randbytes(n // block * bb))
    for off, exp_lo in _BLOCK_SCALES[type_name]:
        data[off + 1::bb] = data[off + 1::bb].translate(_exponent_table(exp_lo))
    return bytes(data)


def norm_weights(rng, n):
    """An RMS-norm weight vector near 1 (F32)."""
    return struct.pack(f"<{n}f", *(1.0 + rng.uniform(-0.2, 0.2) for _ in range(n)))


ARCH_SHAPES = dict(n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, n_layer=2, n_ctx=512, n_swa=16,
                   n_expert=16, n_expert_used=4, n_ff_exp=128, n_ff_shexp=256, n_rot=None)
MOE_ARCHS = ("qwen3moe", "qwen2moe", "gpt-oss")


def _gauss_f32(rng, n, sigma):
    return struct.pack(f"<{n}f", *(rng.gauss(0.0, sigma) for _ in range(n)))


def random_model(path, arch, vocab_meta, wtype="F16", embd_type="Q8_0", seed=1, tied=True, shapes=None,
                 arch_kv=None, exp_type=None):
    """Writes a random-weight decoder of `arch` with the tokenizer pairs of `vocab_meta` ({key: value} as
    tools/gguf_meta.read_metadata returns them); every layer matrix is of type wtype. arch_kv: more metadata
    under the architecture's prefix ({"rope.scaling.type": "yarn", ...}; int -> u32, float -> f32). exp_type:
    the experts' type where it is not wtype (gpt-oss's files: MXFP4 experts)."""
    sh = dict(ARCH_SHAPES, **(shapes or {}))
    rng = random.Random(seed)
    tokens = vocab_meta["tokenizer.ggml.tokens"]
    n_vocab, E, hd = len(tokens), sh["n_embd"], sh["head_dim"]
    nq, nkv, F = sh["n_head"] * hd, sh["n_head_kv"] * hd, sh["n_ff"]
    w = GGUFWriter()
    w.add("general.architecture", arch)
    # llama.cpp sets token attributes by model name: a name with "phi3" in it wants "</s>" in the vocabulary
    w.add("general.name", f"random-{arch.replace('phi3', 'phi-three')}-{wtype}")
    w.add("general.alignment", ALIGNMENT)
    a = arch + "."
    for key, val in (("context_length", sh["n_ctx"]), ("embedding_length", E), ("block_count", sh["n_layer"]),
                     ("feed_forward_length", F), ("attention.head_count", sh["n_head"]),
                     ("attention.head_count_kv", sh["n_head_kv"]), ("rope.dimension_count", sh["n_rot"] or hd)):
        w.add(a + key, val)
    if arch != "gemma3":
        w.add(a + "rope.freq_base", 10000.0)
    w.add(a + "attention.layer_norm_rms_epsilon", 1e-6)
    moe = arch in MOE_ARCHS
    if moe:
        w.add(a + "expert_count", sh["n_expert"])
        w.add(a + "expert_used_count", sh["n_expert_used"])
        w.add(a + "expert_feed_forward_length", sh["n_ff_exp"])
        if arch == "qwen2moe":
            w.add(a + "expert_shared_feed_forward_length", sh["n_ff_shexp"])
    for key, val in (arch_kv or {}).items():
        w.add(a + key, val)
    if arch in ("qwen3", "gemma3", "qwen3moe", "gpt-oss"):
        w.add(a + "attention.key_length", hd)
        w.add(a + "attention.value_length", hd)
    if arch in ("gemma3", "gpt-oss"):
        w.add(a + "attention.sliding_window", sh["n_swa"])
    if arch == "gemma3":
        w.add(a + "rope.freq_base_swa", 10000.0)
        w.add(a + "rope.freq_base", 1000000.0)
    for key, val in vocab_meta.items():
        if key.startswith("tokenizer."):
            item = T_F32 if key.endswith(".scores") else None
            w.add(key, val, item_type=item if isinstance(val, list) else None)
    if arch == "phi3":  # LongRoPE divisors per frequency: short near 1, long growing towards the slow end
        half = (sh["n_rot"] or hd) // 2
        w.add_tensor("rope_factors_short.weight", [half], "F32",
                     struct.pack(f"<{half}f", *(1.0 + 0.3 * rng.random() for _ in range(half))))
        w.add_tensor("rope_factors_long.weight", [half], "F32",
                     struct.pack(f"<{half}f", *(1.0 + 15.0 * i / half + rng.random() for i in range(half))))
    w.add_tensor("token_embd.weight", [E, n_vocab], embd_type, random_blocks(rng, embd_type, E * n_vocab))
    w.add_tensor("output_norm.weight", [E], "F32", norm_weights(rng, E))
    if not tied:
        w.add_tensor("output.weight", [E, n_vocab], embd_type, random_blocks(rng, embd_type, E * n_vocab))
    for il in range(sh["n_layer"]):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", [E], "F32", norm_weights(rng, E))
        attn = (("attn_qkv", E, nq + 2 * nkv),) if arch == "phi3" else (("attn_q", E, nq), ("attn_k", E, nkv),
                                                                        ("attn_v", E, nkv))
        for name, cols, rows in attn + (("attn_output", nq, E),):
            w.add_tensor(p + name + ".weight", [cols, rows], wtype, random_blocks(rng, wtype, cols * rows))
        if arch in ("qwen2", "qwen2moe", "gpt-oss"):
            biased = (("attn_q", nq), ("attn_k", nkv), ("attn_v", nkv)) + ((("attn_output", E),) if arch == "gpt-oss" else ())
            for name, n in biased:
                w.add_tensor(p + name + ".bias", [n], "F32", struct.pack(f"<{n}f", *(rng.gauss(0, 0.1) for _ in range(n))))
        if arch == "gpt-oss":  # sink logits of a few units: comparable with the scores, so they matter
            w.add_tensor(p + "attn_sinks.weight", [sh["n_head"]], "F32", _gauss_f32(rng, sh["n_head"], 1.5))
        if arch in ("qwen3", "gemma3", "qwen3moe"):
            w.add_tensor(p + "attn_q_norm.weight", [hd], "F32", norm_weights(rng, hd))
            w.add_tensor(p + "attn_k_norm.weight", [hd], "F32", norm_weights(rng, hd))
        if arch == "gemma3":
            w.add_tensor(p + "post_attention_norm.weight", [E], "F32", norm_weights(rng, E))
            w.add_tensor(p + "post_ffw_norm.weight", [E], "F32", norm_weights(rng, E))
        norm = "post_attention_norm" if arch == "gpt-oss" else "ffn_norm"
        w.add_tensor(p + norm + ".weight", [E], "F32", norm_weights(rng, E))
        if moe:
            _moe_layer(w, rng, p, arch, sh, exp_type or wtype)
            continue
        ffn = (("ffn_up", E, 2 * F), ("ffn_down", F, E)) if arch == "phi3" else (
            ("ffn_gate", E, F), ("ffn_up", E, F), ("ffn_down", F, E))
        for name, cols, rows in ffn:
            w.add_tensor(p + name + ".weight", [cols, rows], wtype, random_blocks(rng, wtype, cols * rows))
    w.write(path)
    return path


def _moe_layer(w, rng, p, arch, sh, wtype):
    """One layer's router (F32, logits of a few units so that the choice is clear), stacked experts (ne =
    (cols, rows, n_expert): expert e's rows follow expert e - 1's), qwen2moe's shared expert and gpt-oss's
    biases (F32: the router's (n_expert), the experts' (rows, n_expert))."""
    E, X, FX = sh["n_embd"], sh["n_expert"], sh["n_ff_exp"]
    w.add_tensor(p + "ffn_gate_inp.weight", [E, X], "F32", _gauss_f32(rng, E * X, 0.1))
    for name, cols, rows in (("ffn_gate_exps", E, FX), ("ffn_up_exps", E, FX), ("ffn_down_exps", FX, E)):
        w.add_tensor(p + name + ".weight", [cols, rows, X], wtype, random_blocks(rng, wtype, cols * rows * X))
    if arch == "gpt-oss":
        w.add_tensor(p + "ffn_gate_inp.bias", [X], "F32", _gauss_f32(rng, X, 0.1))
        # gate and up biases of a few units: some of them past the clamped SwiGLU's limit (7) on either side
        for name, rows, sigma in (("ffn_gate_exps", FX, 4.0), ("ffn_up_exps", FX, 4.0), ("ffn_down_exps", E, 0.1)):
            w.add_tensor(p + name + ".bias", [rows, X], "F32", _gauss_f32(rng, rows * X, sigma))
    if arch == "qwen2moe":
        FS = sh["n_ff_shexp"]
        w.add_tensor(p + "ffn_gate_inp_shexp.weight", [E], "F32", _gauss_f32(rng, E, 0.1))
        for name, cols, rows in (("ffn_gate_shexp", E, FS), ("ffn_up_shexp", E, FS), ("ffn_down_shexp", FS, E)):
            w.add_tensor(p + name + ".weight", [cols, rows], wtype, random_blocks(rng, wtype, cols * rows))

// prefill/cuda_math.h — the per-thread math of the CUDA kernels (prefill/cuda_kernels.cu), written once as
// __host__ __device__ functions so that the same code runs on the CPU in host-emulation tests
// (tests/prefill/cuda_math_test.cpp compares it with the CPU engine's dequantisation and a float64 reference).
//
// Contract:
//  - Plain C++ when not compiled by nvcc (CM_FN is `inline`): no CUDA header, no intrinsic.
//  - Block layouts are engine/cpu/quants.h's; every function reads bytes (a GGUF block is only 2-byte aligned, so a
//    wider load could fault on the device).
//  - A "sub-block" here is 32 consecutive elements of a row, [32 s, 32 s + 32): the unit of work of one lane in
//    the GEMV and of one thread in the bf16 dequantisation. Every type the CUDA path reads natively has one:
//    F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K (cm_native). Other types are converted to F16
//    at upload.
//  - The value of each element is computed with the CPU's expression (the same float operations in the same
//    order), so a device without FMA contraction gives the CPU's bits; nvcc's default contraction may move an
//    element by an ulp (the tests allow 2 ulps of the block's scale).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CM_FN __host__ __device__ inline
#define CM_UNROLL _Pragma("unroll")
#else
#define CM_FN inline
#define CM_UNROLL
#endif

namespace cm {

// GGUF type numbers (engine/cpu/quants.h ggml_type), repeated so that device code needs no host header
enum : uint32_t {
    CM_F32 = 0, CM_F16 = 1, CM_Q4_0 = 2, CM_Q4_1 = 3, CM_Q5_0 = 6, CM_Q8_0 = 8,
    CM_Q4_K = 12, CM_Q5_K = 13, CM_Q6_K = 14, CM_BF16 = 30,
};

CM_FN bool native(uint32_t type) {
    switch (type) {
    case CM_F32: case CM_F16: case CM_BF16: case CM_Q4_0: case CM_Q4_1: case CM_Q5_0: case CM_Q8_0:
    case CM_Q4_K: case CM_Q5_K: case CM_Q6_K:
        return true;
    default:
        return false;
    }
}

CM_FN uint16_t rd16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

CM_FN float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
CM_FN uint32_t float_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

// IEEE half -> float, exact (engine/cpu/quants.cpp fp16_to_fp32's rule, subnormals renormalised)
CM_FN float half_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1F;
    uint32_t mant = h & 0x3FF;
    if (exp == 0) {
        if (mant == 0) return bits_to_float(sign);
        int e = -1;
        do {
            ++e;
            mant <<= 1;
        } while ((mant & 0x400) == 0);
        return bits_to_float(sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3FF) << 13);
    }
    if (exp == 31) return bits_to_float(sign | 0x7F800000u | mant << 13);
    return bits_to_float(sign | (exp + 127 - 15) << 23 | mant << 13);
}

// float -> IEEE half, round to nearest even (engine/cpu/quants.cpp fp32_to_fp16's rule)
CM_FN uint16_t float_to_half(float f) {
    const uint32_t x = float_to_bits(f);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00 | (ax > 0x7F800000u ? 0x200 : 0));
    if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00);
    if (ax < 0x38800000u) {  // subnormal or zero: the ulp is 2^-24; round half to even by hand
        const float scaled = bits_to_float(ax) * 16777216.0f;
        uint32_t q = static_cast<uint32_t>(scaled);
        const float rest = scaled - static_cast<float>(q);
        if (rest > 0.5f || (rest == 0.5f && (q & 1u))) ++q;
        return static_cast<uint16_t>(sign | q);
    }
    const uint32_t rounded = ax + 0xFFFu + ((ax >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

CM_FN float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }
// float -> bfloat16, round to nearest even (NaN kept a quiet NaN)
CM_FN uint16_t float_to_bf16(float f) {
    const uint32_t u = float_to_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
    return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Bytes of a row of n elements (n a multiple of the type's block); 0 for a type not read natively.
CM_FN uint64_t row_bytes(uint32_t type, int64_t n) {
    switch (type) {
    case CM_F32: return uint64_t(n) * 4;
    case CM_F16: case CM_BF16: return uint64_t(n) * 2;
    case CM_Q4_0: return uint64_t(n / 32) * 18;
    case CM_Q4_1: return uint64_t(n / 32) * 20;
    case CM_Q5_0: return uint64_t(n / 32) * 22;
    case CM_Q8_0: return uint64_t(n / 32) * 34;
    case CM_Q4_K: return uint64_t(n / 256) * 144;
    case CM_Q5_K: return uint64_t(n / 256) * 176;
    case CM_Q6_K: return uint64_t(n / 256) * 210;
    default: return 0;
    }
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block (quants.h q4k_scale_min)
CM_FN void k_scale_min(int j, const uint8_t* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// y[0..32) = elements [32 s, 32 s + 32) of a row of `type` starting at row (a native type).
CM_FN void dequant32(uint32_t type, const uint8_t* row, int64_t s, float* y) {
    switch (type) {
    case CM_F32:
        for (int j = 0; j < 32; ++j) {
            const uint8_t* p = row + (s * 32 + j) * 4;
            y[j] = bits_to_float(uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
        }
        return;
    case CM_F16:
        for (int j = 0; j < 32; ++j) y[j] = half_to_float(rd16(row + (s * 32 + j) * 2));
        return;
    case CM_BF16:
        for (int j = 0; j < 32; ++j) y[j] = bf16_to_float(rd16(row + (s * 32 + j) * 2));
        return;
    case CM_Q4_0: {  // d, qs[16]: lo nibbles are elements 0..15, hi nibbles 16..31
        const uint8_t* b = row + s * 18;
        const float d = half_to_float(rd16(b));
        for (int j = 0; j < 16; ++j) {
            y[j] = static_cast<float>((b[2 + j] & 0xF) - 8) * d;
            y[j + 16] = static_cast<float>((b[2 + j] >> 4) - 8) * d;
        }
        return;
    }
    case CM_Q4_1: {  // d, m, qs[16]
        const uint8_t* b = row + s * 20;
        const float d = half_to_float(rd16(b)), m = half_to_float(rd16(b + 2));
        for (int j = 0; j < 16; ++j) {
            y[j] = static_cast<float>(b[4 + j] & 0xF) * d + m;
            y[j + 16] = static_cast<float>(b[4 + j] >> 4) * d + m;
        }
        return;
    }
    case CM_Q5_0: {  // d, qh[4] (bit j = fifth bit of element j), qs[16]
        const uint8_t* b = row + s * 22;
        const float d = half_to_float(rd16(b));
        const uint32_t qh = uint32_t(b[2]) | uint32_t(b[3]) << 8 | uint32_t(b[4]) << 16 | uint32_t(b[5]) << 24;
        for (int j = 0; j < 16; ++j) {
            const int lo = (b[6 + j] & 0xF) | int((qh >> j) & 1u) << 4;
            const int hi = (b[6 + j] >> 4) | int((qh >> (j + 16)) & 1u) << 4;
            y[j] = static_cast<float>(lo - 16) * d;
            y[j + 16] = static_cast<float>(hi - 16) * d;
        }
        return;
    }
    case CM_Q8_0: {  // d, qs[32]
        const uint8_t* b = row + s * 34;
        const float d = half_to_float(rd16(b));
        for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
        return;
    }
    case CM_Q4_K: case CM_Q5_K: {  // d, dmin, scales[12], (Q5_K: qh[32]), qs[128]; sub-block j of 8
        const bool five = type == CM_Q5_K;
        const uint8_t* b = row + (s / 8) * (five ? 176 : 144);
        const int j = static_cast<int>(s % 8);
        const float d = half_to_float(rd16(b)), dmin = half_to_float(rd16(b + 2));
        int sc, m;
        k_scale_min(j, b + 4, &sc, &m);
        const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
        const uint8_t* qh = b + 16;
        const uint8_t* q = b + (five ? 48 : 16) + 32 * (j / 2);  // sub-blocks 2p, 2p+1 share 32 bytes
        const int shift = (j % 2) * 4;
        for (int l = 0; l < 32; ++l) {
            int v = (q[l] >> shift) & 0xF;
            if (five && (qh[l] >> j & 1)) v += 16;
            y[l] = dl * static_cast<float>(v) - ml;
        }
        return;
    }
    case CM_Q6_K: {  // ql[128], qh[64], scales[16] (int8), d; sub-block j: half j/4, quarter j%4
        const uint8_t* b = row + (s / 8) * 210;
        const int j = static_cast<int>(s % 8), half = j / 4, quarter = j % 4;
        const float d = half_to_float(rd16(b + 208));
        const uint8_t* ql = b + half * 64 + (quarter & 1) * 32;
        const uint8_t* qh = b + 128 + half * 32;
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + half * 8 + 2 * quarter;
        const int lshift = quarter >= 2 ? 4 : 0, hshift = 2 * quarter;
        for (int l = 0; l < 32; ++l) {
            const int q = (((ql[l] >> lshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4)) - 32;
            y[l] = d * static_cast<float>(sc[l / 16]) * static_cast<float>(q);
        }
        return;
    }
    default:
        for (int j = 0; j < 32; ++j) y[j] = 0.0f;
        return;
    }
}

// GEMV lane work: lane `lane` of `n_lanes` takes sub-blocks lane, lane + n_lanes, ... of a row of n_cols
// elements and adds its partial dot with each of n_tok (<= 8) activation rows (x + t * x_stride) to acc[t].
// The sub-block is dequantised once for all tokens; inside a sub-block the 32 products are summed in order.
// (The token loop is unrolled to 8 with a guard so that acc stays in registers on the device.)
CM_FN void gemv_lane(uint32_t type, const uint8_t* row, int64_t n_cols, int lane, int n_lanes, const float* x,
                     int64_t x_stride, int n_tok, float* acc) {
    float w[32];
    for (int64_t s = lane; s < n_cols / 32; s += n_lanes) {
        dequant32(type, row, s, w);
        CM_UNROLL
        for (int t = 0; t < 8; ++t) {
            if (t >= n_tok) break;
            const float* xs = x + t * x_stride + s * 32;
            float sum = 0.0f;
            for (int j = 0; j < 32; ++j) sum += w[j] * xs[j];
            acc[t] += sum;
        }
    }
}

CM_FN float expf_(float x) {
#if defined(__CUDA_ARCH__)
    return expf(x);
#else
    return __builtin_expf(x);
#endif
}
CM_FN float tanhf_(float x) {
#if defined(__CUDA_ARCH__)
    return tanhf(x);
#else
    return __builtin_tanhf(x);
#endif
}

// ---- elementwise ------------------------------------------------------------------------------------------

// RoPE of one pair (x0, x1) by the angle pos * inv_freq, cos and sin scaled by mscale (rope_scaling.h)
CM_FN void rope_pair(float* x0, float* x1, float c, float s) {
    const float a = *x0, b = *x1;
    *x0 = a * c - b * s;
    *x1 = a * s + b * c;
}
// Indices of pair i of a head: (2i, 2i+1) "normal" (llama) or (i, i + n_rot/2) NeoX (qwen2/qwen3/gemma3)
CM_FN void rope_pair_index(int i, int n_rot, bool neox, int* a, int* b) {
    *a = neox ? i : 2 * i;
    *b = neox ? i + n_rot / 2 : 2 * i + 1;
}

// ---- attention (online softmax) -------------------------------------------------------------------------

// The cell of position pos in a kv head's cells: pos, or pos % n_ring on a ring layer (engine/kv_cache.h;
// the window of a query is then a contiguous run of cells from cell(first) on, thanks to the mirror cells).
CM_FN int64_t kv_cell(int64_t pos, int32_t n_ring) { return n_ring > 0 ? pos % n_ring : pos; }
// First position a query at pos reads: 0, or the start of its window on a sliding-window layer (n_swa > 0).
CM_FN int32_t attn_first(int32_t pos, int32_t n_swa) { return n_swa > 0 && pos + 1 > n_swa ? pos + 1 - n_swa : 0; }

// Running state of one query head's softmax(q k^T) v over a part of its positions: max score m, sum of
// exp(score - m) l, and the weighted sum of V rows acc (hd floats, kept by the caller).
struct attn_state {
    float m;
    float l;
};
CM_FN attn_state attn_init() { return attn_state{-3.0e38f, 0.0f}; }

CM_FN float silu(float x) { return x / (1.0f + expf_(-x)); }
// gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (engine/cpu/gelu.h's scalar form)
CM_FN float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanhf_(k * (x + 0.044715f * x * x * x)));
}

// Takes one chunk of scores s[0..n) (a masked one is below -1e37) whose V rows the caller adds next: the new
// max is taken, s[j] becomes exp(s[j] - m_new) (0 when masked), l is rescaled and grows by their sum. Returns
// the factor the caller multiplies its acc by (exp(m_old - m_new)) before adding sum_j s[j] v(j).
CM_FN float attn_chunk_scale(attn_state* st, float* s, int n) {
    float mx = st->m;
    for (int j = 0; j < n; ++j) mx = s[j] > mx ? s[j] : mx;
    const float scale = expf_(st->m - mx);
    float sum = 0.0f;
    for (int j = 0; j < n; ++j) {
        s[j] = s[j] < -1.0e37f ? 0.0f : expf_(s[j] - mx);
        sum += s[j];
    }
    st->l = st->l * scale + sum;
    st->m = mx;
    return scale;
}

// Combines n_part partial states of one query head (m_p, l_p, acc_p (hd floats at acc + p * acc_stride))
// into out (hd floats): out = sum_p exp(m_p - M) acc_p / sum_p exp(m_p - M) l_p, M = max m_p. A part that saw
// no position (l 0) adds nothing.
CM_FN void attn_combine(const float* m, const float* l, const float* acc, int64_t acc_stride, int n_part, int hd,
                        float* out) {
    float mx = -3.0e38f;
    for (int p = 0; p < n_part; ++p) mx = l[p] > 0.0f && m[p] > mx ? m[p] : mx;
    float den = 0.0f;
    for (int d = 0; d < hd; ++d) out[d] = 0.0f;
    for (int p = 0; p < n_part; ++p) {
        if (!(l[p] > 0.0f)) continue;
        const float w = expf_(m[p] - mx);
        den += w * l[p];
        for (int d = 0; d < hd; ++d) out[d] += w * acc[p * acc_stride + d];
    }
    const float inv = den > 0.0f ? 1.0f / den : 0.0f;
    for (int d = 0; d < hd; ++d) out[d] *= inv;
}

}  // namespace cm

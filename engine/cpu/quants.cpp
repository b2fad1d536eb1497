// engine/cpu/quants.cpp — type table and scalar dequantisation of the GGUF block formats (see quants.h).
#include "quants.h"

#include <cmath>

bool quant_supported(uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16: case GGML_TYPE_Q8_0:
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K:
    case GGML_TYPE_IQ4_NL: case GGML_TYPE_IQ4_XS: case GGML_TYPE_MXFP4:
        return true;
    default:
        return false;
    }
}

const char* quant_name(uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: return "F32";
    case GGML_TYPE_F16: return "F16";
    case GGML_TYPE_BF16: return "BF16";
    case GGML_TYPE_Q8_0: return "Q8_0";
    case GGML_TYPE_Q4_0: return "Q4_0";
    case GGML_TYPE_Q4_1: return "Q4_1";
    case GGML_TYPE_Q4_K: return "Q4_K";
    case GGML_TYPE_Q5_K: return "Q5_K";
    case GGML_TYPE_Q6_K: return "Q6_K";
    case GGML_TYPE_Q5_0: return "Q5_0";
    case GGML_TYPE_Q5_1: return "Q5_1";
    case GGML_TYPE_Q2_K: return "Q2_K";
    case GGML_TYPE_Q3_K: return "Q3_K";
    case GGML_TYPE_IQ4_NL: return "IQ4_NL";
    case GGML_TYPE_IQ4_XS: return "IQ4_XS";
    case GGML_TYPE_MXFP4: return "MXFP4";
    default: return "unsupported";
    }
}

int quant_block_size(ggml_type type) {
    switch (type) {
    case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1:
    case GGML_TYPE_IQ4_NL: case GGML_TYPE_MXFP4:
        return QK32;
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K: case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K:
    case GGML_TYPE_IQ4_XS:
        return QK_K;
    default: return 1;
    }
}

size_t quant_block_bytes(ggml_type type) {
    switch (type) {
    case GGML_TYPE_F32: return 4;
    case GGML_TYPE_F16: case GGML_TYPE_BF16: return 2;
    case GGML_TYPE_Q8_0: return sizeof(block_q8_0);
    case GGML_TYPE_Q4_0: return sizeof(block_q4_0);
    case GGML_TYPE_Q4_1: return sizeof(block_q4_1);
    case GGML_TYPE_Q4_K: return sizeof(block_q4_k);
    case GGML_TYPE_Q5_K: return sizeof(block_q5_k);
    case GGML_TYPE_Q6_K: return sizeof(block_q6_k);
    case GGML_TYPE_Q5_0: return sizeof(block_q5_0);
    case GGML_TYPE_Q5_1: return sizeof(block_q5_1);
    case GGML_TYPE_Q2_K: return sizeof(block_q2_k);
    case GGML_TYPE_Q3_K: return sizeof(block_q3_k);
    case GGML_TYPE_IQ4_NL: return sizeof(block_iq4_nl);
    case GGML_TYPE_IQ4_XS: return sizeof(block_iq4_xs);
    case GGML_TYPE_MXFP4: return sizeof(block_mxfp4);
    default: return 0;
    }
}

size_t quant_row_bytes(ggml_type type, int64_t n) {
    return static_cast<size_t>(n / quant_block_size(type)) * quant_block_bytes(type);
}

float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1F;
    uint32_t mant = h & 0x3FF;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {  // subnormal: renormalise
            int e = -1;
            do {
                ++e;
                mant <<= 1;
            } while ((mant & 0x400) == 0);
            bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3FF) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | mant << 13;
    } else {
        bits = sign | (exp + 127 - 15) << 23 | mant << 13;
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

uint16_t fp32_to_fp16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00 | (ax > 0x7F800000u ? 0x200 : 0));
    if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00);  // rounds to >= 65520: inf
    if (ax < 0x38800000u) {  // result is subnormal or zero: scale so the ulp is 2^-24 and round
        float a;
        std::memcpy(&a, &ax, 4);
        const float scaled = a * 16777216.0f;  // 2^24, exact
        const uint32_t q = static_cast<uint32_t>(std::nearbyint(scaled));
        return static_cast<uint16_t>(sign | q);
    }
    // normal: round the 13 dropped mantissa bits to nearest even
    const uint32_t rounded = ax + 0xFFFu + ((ax >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

static void dequant_q4_0(const block_q4_0* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK32) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < 16; ++j) {
            y[j] = static_cast<float>((b[i].qs[j] & 0xF) - 8) * d;
            y[j + 16] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequant_q4_1(const block_q4_1* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK32) {
        const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
        for (int j = 0; j < 16; ++j) {
            y[j] = static_cast<float>(b[i].qs[j] & 0xF) * d + m;
            y[j + 16] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
        }
    }
}

static void dequant_q8_0(const block_q8_0* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK32) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < QK32; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
    }
}

static void dequant_q4_k(const block_q4_k* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
        const uint8_t* q = b[i].qs;
        for (int pair = 0; pair < 4; ++pair, q += 32) {  // 64 elements share 32 bytes: lo then hi nibbles
            uint8_t sc0, m0, sc1, m1;
            q4k_scale_min(2 * pair, b[i].scales, &sc0, &m0);
            q4k_scale_min(2 * pair + 1, b[i].scales, &sc1, &m1);
            const float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
            for (int l = 0; l < 32; ++l) *y++ = d0 * static_cast<float>(q[l] & 0xF) - mm0;
            for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] >> 4) - mm1;
        }
    }
}

static void dequant_q5_k(const block_q5_k* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
        const uint8_t* q = b[i].qs;
        for (int pair = 0; pair < 4; ++pair, q += 32) {
            uint8_t sc0, m0, sc1, m1;
            q4k_scale_min(2 * pair, b[i].scales, &sc0, &m0);
            q4k_scale_min(2 * pair + 1, b[i].scales, &sc1, &m1);
            const float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
            const uint8_t bit0 = static_cast<uint8_t>(1u << (2 * pair)), bit1 = static_cast<uint8_t>(2u << (2 * pair));
            for (int l = 0; l < 32; ++l) {
                *y++ = d0 * static_cast<float>((q[l] & 0xF) + ((b[i].qh[l] & bit0) ? 16 : 0)) - mm0;
            }
            for (int l = 0; l < 32; ++l) {
                *y++ = d1 * static_cast<float>((q[l] >> 4) + ((b[i].qh[l] & bit1) ? 16 : 0)) - mm1;
            }
        }
    }
}

static void dequant_q6_k(const block_q6_k* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(b[i].d);
        const uint8_t* ql = b[i].ql;
        const uint8_t* qh = b[i].qh;
        const int8_t* sc = b[i].scales;
        for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; ++l) {
                const int s = l / 16;
                const int q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[s] * static_cast<float>(q1);
                y[l + 32] = d * sc[s + 2] * static_cast<float>(q2);
                y[l + 64] = d * sc[s + 4] * static_cast<float>(q3);
                y[l + 96] = d * sc[s + 6] * static_cast<float>(q4);
            }
        }
    }
}

// fifth bit of element j (0..31) of a Q5_0 / Q5_1 block, as 16 or 0
static inline int q5_high(const uint8_t* qh, int j) { return (qh[j / 8] >> (j % 8) & 1) << 4; }

static void dequant_q5_0(const block_q5_0* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK32) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < 16; ++j) {
            y[j] = static_cast<float>(((b[i].qs[j] & 0xF) | q5_high(b[i].qh, j)) - 16) * d;
            y[j + 16] = static_cast<float>(((b[i].qs[j] >> 4) | q5_high(b[i].qh, j + 16)) - 16) * d;
        }
    }
}

static void dequant_q5_1(const block_q5_1* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK32) {
        const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
        for (int j = 0; j < 16; ++j) {
            y[j] = static_cast<float>((b[i].qs[j] & 0xF) | q5_high(b[i].qh, j)) * d + m;
            y[j + 16] = static_cast<float>((b[i].qs[j] >> 4) | q5_high(b[i].qh, j + 16)) * d + m;
        }
    }
}

static void dequant_q2_k(const block_q2_k* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
        for (int s = 0; s < 16; ++s, y += 16) {  // sub-block s: half s / 8, shift 2 ((s % 8) / 2), bytes l0..l0+16
            const uint8_t sc = b[i].scales[s];
            const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
            const uint8_t* q = b[i].qs + (s / 8) * 32 + (s % 2) * 16;
            const int shift = 2 * ((s % 8) / 2);
            for (int l = 0; l < 16; ++l) y[l] = dl * static_cast<float>(q[l] >> shift & 3) - ml;
        }
    }
}

// The 6-bit scale of sub-block s (0..15) of a Q3_K block: low nibble from byte s % 8 (low for s < 8, high
// otherwise), high two bits from byte 8 + s % 4 at bit 2 (s / 4).
static inline int q3k_scale(const uint8_t* sc, int s) {
    const int lo = (s < 8 ? sc[s] : sc[s - 8] >> 4) & 0xF;
    const int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    return (lo | hi << 4) - 32;
}

static void dequant_q3_k(const block_q3_k* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(b[i].d);
        for (int s = 0; s < 16; ++s, y += 16) {
            const float dl = d * static_cast<float>(q3k_scale(b[i].scales, s));
            const int l0 = (s % 2) * 16, k = (s % 8) / 2, bit = (s / 8) * 4 + k;
            const uint8_t* q = b[i].qs + (s / 8) * 32 + l0;
            for (int l = 0; l < 16; ++l) {
                const int v = (q[l] >> (2 * k) & 3) - ((b[i].hmask[l0 + l] >> bit & 1) ? 0 : 4);
                y[l] = dl * static_cast<float>(v);
            }
        }
    }
}

const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void dequant_iq4_nl(const block_iq4_nl* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK32) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < 16; ++j) {
            y[j] = d * static_cast<float>(kvalues_iq4nl[b[i].qs[j] & 0xF]);
            y[j + 16] = d * static_cast<float>(kvalues_iq4nl[b[i].qs[j] >> 4]);
        }
    }
}

static void dequant_iq4_xs(const block_iq4_xs* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(b[i].d);
        for (int s = 0; s < 8; ++s, y += 32) {
            const int ls = ((b[i].scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | ((b[i].scales_h >> (2 * s)) & 3) << 4;
            const float dl = d * static_cast<float>(ls - 32);
            const uint8_t* q = b[i].qs + 16 * s;
            for (int j = 0; j < 16; ++j) {
                y[j] = dl * static_cast<float>(kvalues_iq4nl[q[j] & 0xF]);
                y[j + 16] = dl * static_cast<float>(kvalues_iq4nl[q[j] >> 4]);
            }
        }
    }
}

const int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

constexpr int MXFP4_E_HALF_LO = 104, MXFP4_E_HALF_HI = 143;  // 2^(e - 128) is a half (normal or subnormal)

static float mxfp4_scale(uint8_t e) { return std::ldexp(1.0f, int(e) - 128); }

static void dequant_mxfp4(const block_mxfp4* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK32) {
        const float d = mxfp4_scale(b[i].e);
        for (int j = 0; j < 16; ++j) {
            y[j] = d * static_cast<float>(kvalues_mxfp4[b[i].qs[j] & 0xF]);
            y[j + 16] = d * static_cast<float>(kvalues_mxfp4[b[i].qs[j] >> 4]);
        }
    }
}

bool quant_widens_to_q8_0(ggml_type type) {
    return type == GGML_TYPE_Q5_0 || type == GGML_TYPE_IQ4_NL || type == GGML_TYPE_MXFP4;
}

bool quant_rows_widen_exactly(ggml_type type, const void* x, int64_t n_elements) {
    if (type != GGML_TYPE_MXFP4) return quant_widens_to_q8_0(type);
    const block_mxfp4* b = static_cast<const block_mxfp4*>(x);
    for (int64_t i = 0; i < n_elements / QK32; ++i) {
        if (b[i].e < MXFP4_E_HALF_LO || b[i].e > MXFP4_E_HALF_HI) return false;
    }
    return true;
}

void quant_row_to_q8_0(ggml_type type, const void* x, block_q8_0* y, int64_t n) {
    const int64_t nb = n / QK32;
    for (int64_t i = 0; i < nb; ++i) {
        if (type == GGML_TYPE_Q5_0) {
            const block_q5_0& b = static_cast<const block_q5_0*>(x)[i];
            y[i].d = b.d;
            for (int j = 0; j < 16; ++j) {
                y[i].qs[j] = static_cast<int8_t>(((b.qs[j] & 0xF) | q5_high(b.qh, j)) - 16);
                y[i].qs[j + 16] = static_cast<int8_t>(((b.qs[j] >> 4) | q5_high(b.qh, j + 16)) - 16);
            }
        } else if (type == GGML_TYPE_MXFP4) {
            const block_mxfp4& b = static_cast<const block_mxfp4*>(x)[i];
            y[i].d = fp32_to_fp16(mxfp4_scale(b.e));
            for (int j = 0; j < 16; ++j) {
                y[i].qs[j] = kvalues_mxfp4[b.qs[j] & 0xF];
                y[i].qs[j + 16] = kvalues_mxfp4[b.qs[j] >> 4];
            }
        } else {  // IQ4_NL
            const block_iq4_nl& b = static_cast<const block_iq4_nl*>(x)[i];
            y[i].d = b.d;
            for (int j = 0; j < 16; ++j) {
                y[i].qs[j] = kvalues_iq4nl[b.qs[j] & 0xF];
                y[i].qs[j + 16] = kvalues_iq4nl[b.qs[j] >> 4];
            }
        }
    }
}

void dequantize_row(ggml_type type, const void* x, float* y, int64_t n) {
    const int64_t nb = n / quant_block_size(type);
    switch (type) {
    case GGML_TYPE_F32: std::memcpy(y, x, static_cast<size_t>(n) * 4); break;
    case GGML_TYPE_F16: {
        const uint16_t* h = static_cast<const uint16_t*>(x);
        for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(h[i]);
        break;
    }
    case GGML_TYPE_BF16: {
        const uint16_t* h = static_cast<const uint16_t*>(x);
        for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(h[i]);
        break;
    }
    case GGML_TYPE_Q4_0: dequant_q4_0(static_cast<const block_q4_0*>(x), y, nb); break;
    case GGML_TYPE_Q4_1: dequant_q4_1(static_cast<const block_q4_1*>(x), y, nb); break;
    case GGML_TYPE_Q8_0: dequant_q8_0(static_cast<const block_q8_0*>(x), y, nb); break;
    case GGML_TYPE_Q4_K: dequant_q4_k(static_cast<const block_q4_k*>(x), y, nb); break;
    case GGML_TYPE_Q5_K: dequant_q5_k(static_cast<const block_q5_k*>(x), y, nb); break;
    case GGML_TYPE_Q6_K: dequant_q6_k(static_cast<const block_q6_k*>(x), y, nb); break;
    case GGML_TYPE_Q5_0: dequant_q5_0(static_cast<const block_q5_0*>(x), y, nb); break;
    case GGML_TYPE_Q5_1: dequant_q5_1(static_cast<const block_q5_1*>(x), y, nb); break;
    case GGML_TYPE_Q2_K: dequant_q2_k(static_cast<const block_q2_k*>(x), y, nb); break;
    case GGML_TYPE_Q3_K: dequant_q3_k(static_cast<const block_q3_k*>(x), y, nb); break;
    case GGML_TYPE_IQ4_NL: dequant_iq4_nl(static_cast<const block_iq4_nl*>(x), y, nb); break;
    case GGML_TYPE_IQ4_XS: dequant_iq4_xs(static_cast<const block_iq4_xs*>(x), y, nb); break;
    case GGML_TYPE_MXFP4: dequant_mxfp4(static_cast<const block_mxfp4*>(x), y, nb); break;
    }
}

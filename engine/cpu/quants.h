// engine/cpu/quants.h — GGUF tensor element types, their block layouts and scalar dequantisation.
//
// Contract:
//  - ggml_type values are the numbers GGUF files store. Only the types listed in quant_supported() can be
//    loaded; every other value is refused by the reader.
//  - A row of ne0 elements of a block type is ne0 / block_size consecutive blocks (ne0 must divide).
//  - dequantize_row is the scalar reference: plain C++, written from the block layouts below, used to
//    embed tokens, by the generic (non integer-dot) matmul path and by the tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

enum ggml_type : uint32_t {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_IQ4_NL = 20,
    GGML_TYPE_IQ4_XS = 23,
    GGML_TYPE_BF16 = 30,
    GGML_TYPE_MXFP4 = 39,
};

constexpr int QK32 = 32;   // elements per block of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL
constexpr int QK_K = 256;  // elements per super-block of the K types

// Q4_0: x[j] = (lo nibble of qs[j] - 8) * d, x[j + 16] = (hi nibble of qs[j] - 8) * d.   18 bytes
struct block_q4_0 { uint16_t d; uint8_t qs[16]; };
// Q4_1: x[j] = lo(qs[j]) * d + m, x[j + 16] = hi(qs[j]) * d + m.                            20 bytes
struct block_q4_1 { uint16_t d; uint16_t m; uint8_t qs[16]; };
// Q8_0: x[j] = qs[j] * d.                                                                     34 bytes
struct block_q8_0 { uint16_t d; int8_t qs[32]; };
// Q4_K: 8 sub-blocks of 32 with 6-bit scale/min pairs packed in scales[12];
// x = d * sc * q - dmin * m, q a 4-bit value (sub-block pairs share qs bytes: lo, then hi).  144 bytes
struct block_q4_k { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qs[128]; };
// Q5_K: as Q4_K plus a fifth bit per element in qh[32].                                       176 bytes
struct block_q5_k { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
// Q6_K: 16 sub-blocks of 16 with int8 scales; q = 4 low bits (ql) | 2 high bits (qh) - 32.   210 bytes
struct block_q6_k { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };

// Q5_0: a 5-bit value per element: low nibble as in Q4_0, fifth bit j of the little-endian word qh for element
// j (0..31); x = (q - 16) * d.                                                                22 bytes
struct block_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };
// Q5_1: as Q5_0 without the centring, plus an offset: x = q * d + m.                          24 bytes
struct block_q5_1 { uint16_t d; uint16_t m; uint8_t qh[4]; uint8_t qs[16]; };
// Q2_K: 16 sub-blocks of 16; scales[s] = 4-bit scale (low) | 4-bit min (high); 2-bit q; per 128-element half,
// element 32 k + l (k = 0..3, l < 32) is bits 2k..2k+1 of qs[half * 32 + l]; x = d * sc * q - dmin * m.  84 bytes
struct block_q2_k { uint8_t scales[16]; uint8_t qs[64]; uint16_t d; uint16_t dmin; };
// Q3_K: 16 sub-blocks of 16 with 6-bit signed scales (minus 32) packed in scales[12] (low nibbles in bytes
// 0..7, high 2-bit pairs in bytes 8..11); q = the 2-bit value laid out as Q2_K, minus 4 when its bit in
// hmask is clear (bit k of hmask[l] for element 32 k + l of the block); x = d * (sc - 32) * q.   110 bytes
struct block_q3_k { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };
// IQ4_NL: Q4_0's nibble layout, each nibble an index into the non-linear table kvalues_iq4nl; x = d * table[q].
struct block_iq4_nl { uint16_t d; uint8_t qs[16]; };                                        // 18 bytes
// IQ4_XS: 8 sub-blocks of 32, each IQ4_NL-like (16 bytes of qs); 6-bit scale of sub-block s = nibble s%2 of
// scales_l[s/2] | bits 2s..2s+1 of scales_h << 4; x = d * (scale - 32) * table[q].            136 bytes
struct block_iq4_xs { uint16_t d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; };
// The 16 levels of IQ4_NL / IQ4_XS.
extern const int8_t kvalues_iq4nl[16];
// MXFP4 (OCP microscaling FP4; gpt-oss's experts): Q4_0's nibble layout, each nibble an E2M1 code whose value
// doubled is kvalues_mxfp4[q], and one E8M0 exponent byte e per block: x = kvalues_mxfp4[q] * 2^(e - 128).
struct block_mxfp4 { uint8_t e; uint8_t qs[16]; };                                           // 17 bytes
extern const int8_t kvalues_mxfp4[16];

static_assert(sizeof(block_q5_0) == 22 && sizeof(block_q5_1) == 24 && sizeof(block_iq4_nl) == 18);
static_assert(sizeof(block_mxfp4) == 17);
static_assert(sizeof(block_q2_k) == 84 && sizeof(block_q3_k) == 110 && sizeof(block_iq4_xs) == 136);
static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20 && sizeof(block_q8_0) == 34);
static_assert(sizeof(block_q4_k) == 144 && sizeof(block_q5_k) == 176 && sizeof(block_q6_k) == 210);

bool quant_supported(uint32_t type);
const char* quant_name(uint32_t type);
int quant_block_size(ggml_type type);    // elements per block (1 for F32/F16/BF16)
size_t quant_block_bytes(ggml_type type);
// Bytes of a row of n elements (n must be a multiple of the block size).
size_t quant_row_bytes(ggml_type type, int64_t n);

// y[0..n) = the n elements of row x (n a multiple of the block size).
void dequantize_row(ggml_type type, const void* x, float* y, int64_t n);

// Q5_0 and IQ4_NL blocks are exactly Q8_0 blocks with the same half scale (each value is d times an integer in
// int8 range), so the model rewrites such matrices as Q8_0 at load and they take Q8_0's integer kernels.
// True when type has that exact Q8_0 form; quant_row_to_q8_0 writes it (n / 32 blocks) for such a type.
// MXFP4 too, where every block's 2^(e - 128) is a half (e in 104..143: quant_rows_widen_exactly checks a
// matrix's blocks; beyond that range the matrix keeps the generic float path).
bool quant_widens_to_q8_0(ggml_type type);
bool quant_rows_widen_exactly(ggml_type type, const void* x, int64_t n_elements);
void quant_row_to_q8_0(ggml_type type, const void* x, block_q8_0* y, int64_t n);

// IEEE half / bfloat16 <-> float, exact (round to nearest even on the way down).
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
inline float bf16_to_fp32(uint16_t h) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block.
inline void q4k_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// engine/quants.h — GGUF tensor element types, their block layouts and scalar dequantisation.
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
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_BF16 = 30,
};

constexpr int QK32 = 32;   // elements per block of Q4_0, Q4_1, Q8_0
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

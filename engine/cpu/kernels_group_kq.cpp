// engine/cpu/kernels_group_kq.cpp — packing of Q4_K / Q6_K into the row-group layout, the scalar reference
// kernels and the dispatch by kernel set (contract and layout in kernels_group_kq.h).
#include "kernels_group_kq.h"

#include <cmath>
#include <cstring>

namespace {

constexpr size_t Q4K_GROUP_BLOCK = 128 + 256;  // ws, off; nibbles
constexpr size_t Q6K_GROUP_BLOCK = 128 + 512;  // d0, d1; int8 values

// Row r's block b (32 columns) of a Q4_K row: ws, off (as the layout stores them) and the 32 values 0..15.
void q4k_block(const uint8_t* row, int64_t b, float* ws, float* off, uint8_t* q) {
    const block_q4_k& blk = reinterpret_cast<const block_q4_k*>(row)[b / 8];
    const int s = int(b % 8);
    uint8_t sc, m;
    q4k_scale_min(s, blk.scales, &sc, &m);
    *ws = fp16_to_fp32(blk.d) * float(sc);                   // 11 x 6 bits: exact
    *off = -(fp16_to_fp32(blk.dmin) * float(m)) + 8.0f * *ws;  // two exact terms, one rounding
    const uint8_t* qs = blk.qs + (s / 2) * 32;
    for (int l = 0; l < 32; ++l) q[l] = s % 2 ? uint8_t(qs[l] >> 4) : uint8_t(qs[l] & 0xF);
}

// Row r's block b of a Q6_K row: the two sub-blocks' d * sc and the 32 values q - 32.
void q6k_block(const uint8_t* row, int64_t b, float* d0, float* d1, int8_t* q) {
    const block_q6_k& blk = reinterpret_cast<const block_q6_k*>(row)[b / 8];
    const int s = int(b % 8), h = s / 4, qd = s % 4;
    const uint8_t* ql = blk.ql + h * 64 + (qd % 2) * 32;
    const uint8_t* qh = blk.qh + h * 32;
    const int shift = qd < 2 ? 0 : 4;
    const float d = fp16_to_fp32(blk.d);
    *d0 = d * float(blk.scales[h * 8 + qd * 2]);  // 11 x 8 bits: exact
    *d1 = d * float(blk.scales[h * 8 + qd * 2 + 1]);
    for (int l = 0; l < 32; ++l) q[l] = int8_t((((ql[l] >> shift) & 0xF) | (((qh[l] >> (2 * qd)) & 3) << 4)) - 32);
}

// Scalar reference kernels: the header's steps, one row at a time, std::fma for the fused steps.
void group_q4k_scalar(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    for (int t = 0; t < n_tok; ++t) {
        const int64_t tok = t0 + t;
        for (int r = 0; r < MM_GROUP_ROWS; ++r) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t* gb = g + size_t(b) * Q4K_GROUP_BLOCK;
                const float* ws = reinterpret_cast<const float*>(gb);
                const float* off = ws + 16;
                const uint8_t* q = gb + 128;
                const int16_t* av = a.qs + tok * a.k + b * QK32;
                int32_t s = -8 * a.isum[tok * nb + b];
                for (int c = 0; c < 4; ++c) {
                    for (int e = 0; e < 2; ++e) {
                        uint16_t word;
                        std::memcpy(&word, q + 64 * c + 2 * (2 * r + e), 2);
                        for (int n = 0; n < 4; ++n) s += int32_t((word >> (4 * n)) & 0xF) * av[2 * (4 * c + n) + e];
                    }
                }
                acc = std::fma(float(s), ws[r] * a.d[tok * nb + b], acc);
                acc = std::fma(off[r], a.dsum[tok * nb + b], acc);
            }
            y[size_t(t) * y_stride + size_t(r)] = acc;
        }
    }
}

void group_q6k_scalar(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    for (int t = 0; t < n_tok; ++t) {
        const int64_t tok = t0 + t;
        for (int r = 0; r < MM_GROUP_ROWS; ++r) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t* gb = g + size_t(b) * Q6K_GROUP_BLOCK;
                const float* d0 = reinterpret_cast<const float*>(gb);
                const float* d1 = d0 + 16;
                const int8_t* q = reinterpret_cast<const int8_t*>(gb + 128);
                const int16_t* av = a.qs + tok * a.k + b * QK32;
                int32_t s[2] = {0, 0};
                for (int j = 0; j < 16; ++j) {
                    for (int e = 0; e < 2; ++e) s[j / 8] += int32_t(q[32 * j + 2 * r + e]) * av[2 * j + e];
                }
                const float da = a.d[tok * nb + b];
                acc = std::fma(float(s[0]), d0[r] * da, acc);
                acc = std::fma(float(s[1]), d1[r] * da, acc);
            }
            y[size_t(t) * y_stride + size_t(r)] = acc;
        }
    }
}

const kq_group_set KQ_GROUP_SCALAR = {group_q4k_scalar, group_q6k_scalar};

}  // namespace

bool kq_group_has(ggml_type type) { return type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K; }

size_t kq_group_bytes(ggml_type type, int64_t n_cols) {
    return size_t(n_cols / QK32) * (type == GGML_TYPE_Q4_K ? Q4K_GROUP_BLOCK : Q6K_GROUP_BLOCK);
}

void kq_group_pack(const weight_view& w, uint8_t* out) {
    const int64_t nb = w.n_cols / QK32;
    const size_t bb = w.type == GGML_TYPE_Q4_K ? Q4K_GROUP_BLOCK : Q6K_GROUP_BLOCK;
    for (int64_t g = 0; g < w.n_rows / MM_GROUP_ROWS; ++g) {
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t* o = out + size_t(g * nb + b) * bb;
            float* f = reinterpret_cast<float*>(o);
            uint8_t* q = o + 128;
            for (int r = 0; r < MM_GROUP_ROWS; ++r) {
                const uint8_t* row = w.data + size_t(g * MM_GROUP_ROWS + r) * w.row_bytes;
                if (w.type == GGML_TYPE_Q6_K) {
                    int8_t v[32];
                    q6k_block(row, b, &f[r], &f[16 + r], v);
                    group_put_bytes(q, r, v);
                    continue;
                }
                uint8_t v[32];
                q4k_block(row, b, &f[r], &f[16 + r], v);
                group_put_nibbles(q, r, v);
            }
        }
    }
}

const kq_group_set& kq_groups_scalar() { return KQ_GROUP_SCALAR; }

mm_group_fn kq_group_fn(const kernel_set& ks, ggml_type type) {
    const kq_group_set* set = nullptr;
    if (&ks == kernels_avx512()) set = kq_groups_avx512();
    else if (&ks == kernels_avx2()) set = kq_groups_avx2();
    else if (&ks == kernels_neon() || &ks == kernels_dotprod()) set = kq_groups_neon();
    if (!set) return nullptr;
    switch (type) {
    case GGML_TYPE_Q4_K: return set->q4_k;
    case GGML_TYPE_Q6_K: return set->q6_k;
    default: return nullptr;
    }
}

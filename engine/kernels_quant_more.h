// engine/kernels_quant_more.h — integer-dot row kernels for Q5_1, Q2_K, Q3_K and IQ4_XS against 16-bit
// activation blocks (kernels.h), written as plain loops that the compiler vectorises for each kernel set:
// kernels_quant_more.cpp (baseline), kernels_quant_more_avx2.cpp and kernels_quant_more_avx512.cpp include
// this header with their own -m flags, each yielding its set's table. kernels.cpp's row dispatch takes the
// table of the kernel set in use (quant_more_row). Per activation block b of 32 (da = its scale, qa its
// 16-bit values, dsum = da * sum(qa)), with the block formats of quants.h:
//   Q5_1:   w = d q + m, q 0..31           -> y += d da (q . qa) + m dsum
//   Q2_K:   super-block i, half h = b / 4, shift 2 (b % 4); sub-blocks of 16 with 4-bit scale sc and min mn:
//           w = d sc q - dmin mn           -> y += da (d (sc0 (q . qa)[0:16] + sc1 (q . qa)[16:32])
//                                                      - dmin (mn0 sum(qa)[0:16] + mn1 sum(qa)[16:32]))
//   Q3_K:   as Q2_K's layout, q minus 4 where its hmask bit is clear, 6-bit scales minus 32:
//           w = d sc q                     -> y += d da (sc0 (q . qa)[0:16] + sc1 (q . qa)[16:32])
//   IQ4_XS: sub-block b with 6-bit scale ls: w = d (ls - 32) kvalues_iq4nl[q] -> y += d (ls - 32) da (v . qa)
// Every integer sum fits int32 (|q| <= 127, |qa| <= 32767, at most 32 terms); the scale products are float.
#pragma once

#include <cstdint>

#include "kernels.h"
#include "quants.h"

// One kernel set's row kernels for these types (nullptr: not compiled in).
struct quant_more_rows {
    mm_row_fn q5_1, q2_k, q3_k, iq4_xs;
};
const quant_more_rows& quant_more_rows_scalar();
const quant_more_rows* quant_more_rows_avx2();
const quant_more_rows* quant_more_rows_avx512();
// The row kernel of type for kernel set ks (its own table; the scalar one for a set without), nullptr when
// type is not one of these four.
mm_row_fn quant_more_row(const kernel_set& ks, ggml_type type);

// The kernels themselves, only in the files that compile a table (they define QUANT_MORE_KERNELS first).
#ifdef QUANT_MORE_KERNELS
namespace {

inline int32_t qm_dot(const int16_t* q, const int16_t* a, int n) {
    int32_t s = 0;
    for (int l = 0; l < n; ++l) s += int32_t(q[l]) * int32_t(a[l]);
    return s;
}

inline int32_t qm_sum(const int16_t* a, int n) {
    int32_t s = 0;
    for (int l = 0; l < n; ++l) s += a[l];
    return s;
}

void row_q5_1_qm(const uint8_t* w, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    const block_q5_1* wb = reinterpret_cast<const block_q5_1*>(w);
    const int64_t nb = a.k / QK32;
    float acc[MM_TOK_TILE] = {};
    alignas(64) int16_t q[32];
    for (int64_t b = 0; b < nb; ++b) {
        for (int j = 0; j < 16; ++j) {
            q[j] = int16_t((wb[b].qs[j] & 0xF) | (((wb[b].qh[j / 8] >> (j % 8)) & 1) << 4));
            q[j + 16] = int16_t((wb[b].qs[j] >> 4) | (((wb[b].qh[(j + 16) / 8] >> ((j + 16) % 8)) & 1) << 4));
        }
        const float d = fp16_to_fp32(wb[b].d), m = fp16_to_fp32(wb[b].m);
        for (int t = 0; t < n_tok; ++t) {
            const int32_t isum = qm_dot(q, a.qs + (t0 + t) * a.k + b * QK32, 32);
            acc[t] += d * a.d[(t0 + t) * nb + b] * float(isum) + m * a.dsum[(t0 + t) * nb + b];
        }
    }
    for (int t = 0; t < n_tok; ++t) y[t * y_stride] = acc[t];
}

template <int KIND>  // 0: Q2_K, 1: Q3_K
void row_q23k_qm(const uint8_t* w, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    const int64_t nb = a.k / QK32, n_super = a.k / QK_K;
    float acc[MM_TOK_TILE] = {};
    alignas(64) int16_t q[32];
    for (int64_t i = 0; i < n_super; ++i) {
        const block_q2_k* b2 = reinterpret_cast<const block_q2_k*>(w) + i;
        const block_q3_k* b3 = reinterpret_cast<const block_q3_k*>(w) + i;
        const float d = fp16_to_fp32(KIND == 0 ? b2->d : b3->d), dmin = KIND == 0 ? fp16_to_fp32(b2->dmin) : 0.0f;
        for (int s32 = 0; s32 < 8; ++s32) {
            const int h = s32 / 4, k = s32 % 4;
            const uint8_t* qs = (KIND == 0 ? b2->qs : b3->qs) + h * 32;
            for (int l = 0; l < 32; ++l) {
                int v = (qs[l] >> (2 * k)) & 3;
                if constexpr (KIND == 1) v -= ((b3->hmask[l] >> (h * 4 + k)) & 1) ? 0 : 4;
                q[l] = int16_t(v);
            }
            float sc0, sc1, mn0 = 0.0f, mn1 = 0.0f;
            if constexpr (KIND == 0) {
                sc0 = float(b2->scales[2 * s32] & 0xF), sc1 = float(b2->scales[2 * s32 + 1] & 0xF);
                mn0 = float(b2->scales[2 * s32] >> 4), mn1 = float(b2->scales[2 * s32 + 1] >> 4);
            } else {
                int sc[2];
                for (int u = 0; u < 2; ++u) {
                    const int s = 2 * s32 + u;
                    const int lo = (s < 8 ? b3->scales[s] : b3->scales[s - 8] >> 4) & 0xF;
                    sc[u] = (lo | ((b3->scales[8 + s % 4] >> (2 * (s / 4))) & 3) << 4) - 32;
                }
                sc0 = float(sc[0]), sc1 = float(sc[1]);
            }
            const int64_t b = i * 8 + s32;
            for (int t = 0; t < n_tok; ++t) {
                const int16_t* ab = a.qs + (t0 + t) * a.k + b * QK32;
                float s = d * (sc0 * float(qm_dot(q, ab, 16)) + sc1 * float(qm_dot(q + 16, ab + 16, 16)));
                if constexpr (KIND == 0) s -= dmin * (mn0 * float(qm_sum(ab, 16)) + mn1 * float(qm_sum(ab + 16, 16)));
                acc[t] += a.d[(t0 + t) * nb + b] * s;
            }
        }
    }
    for (int t = 0; t < n_tok; ++t) y[t * y_stride] = acc[t];
}

void row_iq4_xs_qm(const uint8_t* w, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    const block_iq4_xs* wb = reinterpret_cast<const block_iq4_xs*>(w);
    const int64_t nb = a.k / QK32, n_super = a.k / QK_K;
    float acc[MM_TOK_TILE] = {};
    alignas(64) int16_t q[32];
    for (int64_t i = 0; i < n_super; ++i) {
        const float d = fp16_to_fp32(wb[i].d);
        for (int s = 0; s < 8; ++s) {
            const int ls = ((wb[i].scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | ((wb[i].scales_h >> (2 * s)) & 3) << 4;
            const uint8_t* qs = wb[i].qs + 16 * s;
            for (int j = 0; j < 16; ++j) {
                q[j] = kvalues_iq4nl[qs[j] & 0xF];
                q[j + 16] = kvalues_iq4nl[qs[j] >> 4];
            }
            const float dl = d * float(ls - 32);
            const int64_t b = i * 8 + s;
            for (int t = 0; t < n_tok; ++t) {
                acc[t] += dl * a.d[(t0 + t) * nb + b] * float(qm_dot(q, a.qs + (t0 + t) * a.k + b * QK32, 32));
            }
        }
    }
    for (int t = 0; t < n_tok; ++t) y[t * y_stride] = acc[t];
}

constexpr quant_more_rows QUANT_MORE_ROWS = {row_q5_1_qm, row_q23k_qm<0>, row_q23k_qm<1>, row_iq4_xs_qm};

}  // namespace
#endif  // QUANT_MORE_KERNELS

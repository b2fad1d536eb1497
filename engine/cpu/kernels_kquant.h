// engine/cpu/kernels_kquant.h — integer-dot row kernels for the K types (Q4_K, Q5_K, Q6_K) against 16-bit
// activation blocks, written as plain loops that the compiler vectorises for each kernel set: this header
// is included by kernels.cpp (baseline), kernels_avx2.cpp and kernels_avx512.cpp, each compiled with its
// own -m flags, and yields that set's functions (internal linkage in each).
//
// A K super-block of 256 elements spans 8 activation blocks of 32. Per activation block b:
//   Q4_K / Q5_K: sub-block s = b % 8 has 6-bit scale sc and min m:  w = d sc q - dmin m,  q 4 (5) bits
//                -> acc += (d sc da_b) * (q . a_b);  off += (dmin m) * dsum_b;  y = acc - off
//   Q6_K:        two 16-element sub-blocks with int8 scales sc0, sc1:  w = d sc (q - 32)
//                -> acc += (d da_b) * (sc0 (q . a)[0:16] + sc1 (q . a)[16:32])
// Every product and sum of one sub-block fits int32 (|q| <= 32, |a| <= 32767, 16 or 32 terms); the scale
// products are taken in float.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels.h"
#include "quants.h"

namespace {

inline float kq_h2f(uint16_t h) { return fp16_to_fp32(h); }

// sum over 32 lanes of q[l] * a[l]; q already expanded to int16
inline int32_t kq_dot32(const int16_t* q, const int16_t* a) {
    int32_t s = 0;
    for (int l = 0; l < 32; ++l) s += int32_t(q[l]) * int32_t(a[l]);
    return s;
}

inline int32_t kq_dot16(const int16_t* q, const int16_t* a) {
    int32_t s = 0;
    for (int l = 0; l < 16; ++l) s += int32_t(q[l]) * int32_t(a[l]);
    return s;
}

template <int KIND>  // 0: Q4_K, 1: Q5_K
void row_q45k_kq(const uint8_t* w, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    using blk = std::conditional_t<KIND == 0, block_q4_k, block_q5_k>;
    const blk* wb = reinterpret_cast<const blk*>(w);
    const int64_t nb = a.k / QK32, n_super = a.k / QK_K;
    float acc[MM_TOK_TILE] = {}, off[MM_TOK_TILE] = {};
    alignas(64) int16_t q[32];
    for (int64_t i = 0; i < n_super; ++i) {
        const float d = kq_h2f(wb[i].d), dmin = kq_h2f(wb[i].dmin);
        for (int s = 0; s < 8; ++s) {
            uint8_t sc, m;
            q4k_scale_min(s, wb[i].scales, &sc, &m);
            const uint8_t* qs = wb[i].qs + (s / 2) * 32;
            for (int l = 0; l < 32; ++l) {
                int v = (s & 1) ? (qs[l] >> 4) : (qs[l] & 0xF);
                if constexpr (KIND == 1) v += ((wb[i].qh[l] >> s) & 1) << 4;
                q[l] = static_cast<int16_t>(v);
            }
            const int64_t b = i * 8 + s;
            const float ds = d * sc, dm = dmin * m;
            for (int t = 0; t < n_tok; ++t) {
                const int32_t isum = kq_dot32(q, a.qs + (t0 + t) * a.k + b * QK32);
                acc[t] += ds * a.d[(t0 + t) * nb + b] * static_cast<float>(isum);
                off[t] += dm * a.dsum[(t0 + t) * nb + b];
            }
        }
    }
    for (int t = 0; t < n_tok; ++t) y[t * y_stride] = acc[t] - off[t];
}

void row_q6k_kq(const uint8_t* w, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    const block_q6_k* wb = reinterpret_cast<const block_q6_k*>(w);
    const int64_t nb = a.k / QK32, n_super = a.k / QK_K;
    float acc[MM_TOK_TILE] = {};
    alignas(64) int16_t q[32];
    for (int64_t i = 0; i < n_super; ++i) {
        const float d = kq_h2f(wb[i].d);
        for (int s32 = 0; s32 < 8; ++s32) {  // activation block within the super-block
            const int h = s32 / 4, qd = s32 % 4;
            const uint8_t* ql = wb[i].ql + h * 64 + (qd % 2) * 32;
            const uint8_t* qh = wb[i].qh + h * 32;
            for (int l = 0; l < 32; ++l) {
                const int lo = qd < 2 ? (ql[l] & 0xF) : (ql[l] >> 4);
                q[l] = static_cast<int16_t>((lo | (((qh[l] >> (2 * qd)) & 3) << 4)) - 32);
            }
            const float sc0 = wb[i].scales[h * 8 + qd * 2], sc1 = wb[i].scales[h * 8 + qd * 2 + 1];
            const int64_t b = i * 8 + s32;
            for (int t = 0; t < n_tok; ++t) {
                const int16_t* ab = a.qs + (t0 + t) * a.k + b * QK32;
                const float s = sc0 * static_cast<float>(kq_dot16(q, ab)) + sc1 * static_cast<float>(kq_dot16(q + 16, ab + 16));
                acc[t] += d * a.d[(t0 + t) * nb + b] * s;
            }
        }
    }
    for (int t = 0; t < n_tok; ++t) y[t * y_stride] = acc[t];
}

}  // namespace

// engine/cpu/kernels_kq_driver.h — the row-kernel driver shared by kernels_kq_avx2.cpp and kernels_kq_avx512.cpp
// (contract in kernels_kq.h). Each file includes it under its own -m flags with a vector policy V:
//   V::acc                         accumulator type (__m256 or __m512)
//   V::zero()                      a zero accumulator
//   V::dot(q, a)                   the 32 products of an expanded block q and a token's block a, as exact int32
//                                  pair sums converted to float, in an acc
//   V::fma(p, s, acc)              acc + p * s (s a scalar)
//   V::hsum(acc)                   the lanes' sum
// Per unit (kernels_kq_unpack.h): ws * da of every block and token in one 8-lane multiply per token, offsets
// mo * dsum in one 8-lane fma per token; then each block against every token of the tile, even and odd
// blocks in separate accumulators (the same split at every tile size: a token's value never depends on its
// neighbours in the tile).
#pragma once

#include <immintrin.h>

#include "kernels_kq.h"
#include "kernels_kq_unpack.h"

namespace {

inline float kq_hsum8(__m256 v) {
    const __m128 o = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 o2 = _mm_add_ps(o, _mm_movehl_ps(o, o));
    return _mm_cvtss_f32(_mm_add_ss(o2, _mm_movehdup_ps(o2)));
}

template <class V, class U, int T>
void kq_row(const uint8_t* w, const act_q16& a, int64_t t0, float* y, size_t y_stride) {
    using acc_t = typename V::acc;
    const int64_t nb = a.k / QK32;
    acc_t acc0[T], acc1[T];
    __m256 off[T];
    float offs[T];
    for (int t = 0; t < T; ++t) {
        acc0[t] = acc1[t] = V::zero();
        off[t] = _mm256_setzero_ps();
        offs[t] = 0.0f;
    }
    kq_unit u;
    alignas(32) float sc[T][8], sc2[T][8];
    for (int64_t b0 = 0; b0 < nb; b0 += U::NB) {
        const int nblk = nb - b0 < U::NB ? int(nb - b0) : U::NB;
        U::unpack(w + size_t(b0 / U::NB) * U::BYTES, nblk, &u);
        for (int t = 0; t < T; ++t) {  // per-block float scales ws * da (ws2 * da) of this token; offsets
            const float* ad = a.d + (t0 + t) * nb + b0;
            const float* as = a.dsum + (t0 + t) * nb + b0;
            if (nblk == 8) {
                const __m256 da = _mm256_loadu_ps(ad);
                _mm256_store_ps(sc[t], _mm256_mul_ps(_mm256_load_ps(u.ws), da));
                if constexpr (U::MINS) _mm256_store_ps(sc2[t], _mm256_mul_ps(_mm256_load_ps(u.ws2), da));
                if constexpr (U::OFF) off[t] = _mm256_fmadd_ps(_mm256_load_ps(u.mo), _mm256_loadu_ps(as), off[t]);
            } else {  // a short last unit (Q5_1 rows of K % 256 != 0)
                for (int b = 0; b < nblk; ++b) {
                    sc[t][b] = u.ws[b] * ad[b];
                    if constexpr (U::MINS) sc2[t][b] = u.ws2[b] * ad[b];
                    if constexpr (U::OFF) offs[t] += u.mo[b] * as[b];
                }
            }
        }
        auto block = [&](int b, acc_t* acc) {  // expanded block b against every token of the tile
            for (int t = 0; t < T; ++t) {
                const int16_t* av = a.qs + (t0 + t) * a.k + (b0 + b) * QK32;
                acc[t] = V::fma(V::dot(u.q + 32 * b, av), sc[t][b], acc[t]);
                if constexpr (U::MINS) acc[t] = V::fma(V::dot(u.m + 32 * b, av), sc2[t][b], acc[t]);
            }
        };
        int b = 0;
        for (; b + 1 < nblk; b += 2) {
            block(b, acc0);
            block(b + 1, acc1);
        }
        if (b < nblk) block(b, acc0);
    }
    for (int t = 0; t < T; ++t) {
        float total = V::hsum(acc0[t], acc1[t]);
        if constexpr (U::OFF) total += kq_hsum8(off[t]) + offs[t];
        y[t * y_stride] = total;
    }
}

template <class V, class U>
void kq_dispatch(const uint8_t* w, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    switch (n_tok) {
    case 1: kq_row<V, U, 1>(w, a, t0, y, y_stride); break;
    case 2: kq_row<V, U, 2>(w, a, t0, y, y_stride); break;
    case 3: kq_row<V, U, 3>(w, a, t0, y, y_stride); break;
    case 4: kq_row<V, U, 4>(w, a, t0, y, y_stride); break;
    case 5: kq_row<V, U, 5>(w, a, t0, y, y_stride); break;
    case 6: kq_row<V, U, 6>(w, a, t0, y, y_stride); break;
    case 7: kq_row<V, U, 7>(w, a, t0, y, y_stride); break;
    default: kq_row<V, U, 8>(w, a, t0, y, y_stride); break;
    }
}
static_assert(MM_TOK_TILE == 8, "kq_dispatch handles tiles of up to 8 tokens");

template <class V>
constexpr kq_row_set kq_make_set() {
    return {kq_dispatch<V, kq_q45k<false>>, kq_dispatch<V, kq_q45k<true>>, kq_dispatch<V, kq_q6k>,
            kq_dispatch<V, kq_q51>,         kq_dispatch<V, kq_q2k>,        kq_dispatch<V, kq_q3k>,
            kq_dispatch<V, kq_iq4xs>};
}

}  // namespace

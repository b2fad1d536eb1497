// engine/kernels_kq_avx512.cpp — AVX-512 row kernels of engine/kernels_kq.h: per unit, the expanded blocks
// (kernels_kq_unpack.h) are loaded once and each is dotted with every token of the tile (vpmaddwd: 32
// products into 16 int32 pair sums, exact), converted to float and scaled by ws * da in one fma. The
// per-(token, block) scales ws * da of a super-block are one vector multiply per token; offsets (mo * dsum)
// are one vector fma per token and super-block. Two accumulators per token (even / odd blocks) break the fma
// latency chain of a lone token; every tile size uses the same split, so a token's value never depends on
// its neighbours in the tile.
#include "kernels_kq.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__F16C__)

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels_kq_unpack.h"

namespace {

inline float hsum8(__m256 v) {
    const __m128 o = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 o2 = _mm_add_ps(o, _mm_movehl_ps(o, o));
    return _mm_cvtss_f32(_mm_add_ss(o2, _mm_movehdup_ps(o2)));
}

template <class U, int T>
void kq_row(const uint8_t* w, const act_q16& a, int64_t t0, float* y, size_t y_stride) {
    const int64_t nb = a.k / QK32;
    __m512 acc0[T], acc1[T];
    __m256 off[T];
    float offs[T];
    for (int t = 0; t < T; ++t) {
        acc0[t] = acc1[t] = _mm512_setzero_ps();
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
        auto block = [&](int b, __m512* acc) {  // expanded block b against every token of the tile
            const __m512i qv = _mm512_load_si512(u.q + 32 * b);
            for (int t = 0; t < T; ++t) {
                const __m512i av = _mm512_loadu_si512(a.qs + (t0 + t) * a.k + (b0 + b) * QK32);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_madd_epi16(qv, av)), _mm512_set1_ps(sc[t][b]), acc[t]);
                if constexpr (U::MINS) {
                    const __m512 pm = _mm512_cvtepi32_ps(_mm512_madd_epi16(_mm512_load_si512(u.m + 32 * b), av));
                    acc[t] = _mm512_fmadd_ps(pm, _mm512_set1_ps(sc2[t][b]), acc[t]);
                }
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
        float total = _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t]));
        if constexpr (U::OFF) total += hsum8(off[t]) + offs[t];
        y[t * y_stride] = total;
    }
}

template <class U>
void kq_dispatch(const uint8_t* w, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    switch (n_tok) {
    case 1: kq_row<U, 1>(w, a, t0, y, y_stride); break;
    case 2: kq_row<U, 2>(w, a, t0, y, y_stride); break;
    case 3: kq_row<U, 3>(w, a, t0, y, y_stride); break;
    case 4: kq_row<U, 4>(w, a, t0, y, y_stride); break;
    case 5: kq_row<U, 5>(w, a, t0, y, y_stride); break;
    case 6: kq_row<U, 6>(w, a, t0, y, y_stride); break;
    case 7: kq_row<U, 7>(w, a, t0, y, y_stride); break;
    default: kq_row<U, 8>(w, a, t0, y, y_stride); break;
    }
}
static_assert(MM_TOK_TILE == 8, "kq_dispatch handles tiles of up to 8 tokens");

const kq_row_set KQ_AVX512 = {
    kq_dispatch<kq_q45k<false>>, kq_dispatch<kq_q45k<true>>, kq_dispatch<kq_q6k>,   kq_dispatch<kq_q51>,
    kq_dispatch<kq_q2k>,         kq_dispatch<kq_q3k>,        kq_dispatch<kq_iq4xs>,
};

}  // namespace

const kq_row_set* kq_rows_avx512() { return &KQ_AVX512; }

#else

const kq_row_set* kq_rows_avx512() { return nullptr; }

#endif

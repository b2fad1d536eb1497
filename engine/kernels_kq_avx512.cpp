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

template <class U, int T>
void kq_row(const uint8_t* w, const act_q16& a, int64_t t0, float* y, size_t y_stride) {
    constexpr int NB = U::NB;
    const int64_t nb = a.k / QK32, n_units = nb / NB;
    __m512 acc[2][T];
    __m256 off[T];
    float offs[T];
    for (int t = 0; t < T; ++t) {
        acc[0][t] = acc[1][t] = _mm512_setzero_ps();
        off[t] = _mm256_setzero_ps();
        offs[t] = 0.0f;
    }
    kq_unit u;
    alignas(32) float sc[T][8], sc2[T][8];
    for (int64_t i = 0; i < n_units; ++i) {
        U::unpack(w + size_t(i) * U::BYTES, &u);
        const int64_t b0 = i * NB;
        for (int t = 0; t < T; ++t) {  // per-block float scales ws * da (and ws2 * da) of this token
            const float* ad = a.d + (t0 + t) * nb + b0;
            if constexpr (NB == 8) {
                const __m256 da = _mm256_loadu_ps(ad);
                _mm256_store_ps(sc[t], _mm256_mul_ps(_mm256_load_ps(u.ws), da));
                if constexpr (U::MINS) _mm256_store_ps(sc2[t], _mm256_mul_ps(_mm256_load_ps(u.ws2), da));
                if constexpr (U::OFF) off[t] = _mm256_fmadd_ps(_mm256_load_ps(u.mo), _mm256_loadu_ps(a.dsum + (t0 + t) * nb + b0), off[t]);
            } else {
                sc[t][0] = u.ws[0] * ad[0];
                if constexpr (U::MINS) sc2[t][0] = u.ws2[0] * ad[0];
                if constexpr (U::OFF) offs[t] += u.mo[0] * a.dsum[(t0 + t) * nb + b0];
            }
        }
        for (int b = 0; b < NB; ++b) {
            const __m512i qv = _mm512_load_si512(u.q + 32 * b);
            __m512i mv = _mm512_setzero_si512();
            if constexpr (U::MINS) mv = _mm512_load_si512(u.m + 32 * b);
            const int h = NB == 8 ? (b & 1) : int(i & 1);
            for (int t = 0; t < T; ++t) {
                const __m512i av = _mm512_loadu_si512(a.qs + (t0 + t) * a.k + (b0 + b) * QK32);
                const __m512 p = _mm512_cvtepi32_ps(_mm512_madd_epi16(qv, av));
                acc[h][t] = _mm512_fmadd_ps(p, _mm512_set1_ps(sc[t][b]), acc[h][t]);
                if constexpr (U::MINS) {
                    const __m512 pm = _mm512_cvtepi32_ps(_mm512_madd_epi16(mv, av));
                    acc[h][t] = _mm512_fmadd_ps(pm, _mm512_set1_ps(sc2[t][b]), acc[h][t]);
                }
            }
        }
    }
    for (int t = 0; t < T; ++t) {
        float total = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][t], acc[1][t]));
        if constexpr (U::OFF) {
            if constexpr (NB == 8) {
                const __m128 o = _mm_add_ps(_mm256_castps256_ps128(off[t]), _mm256_extractf128_ps(off[t], 1));
                const __m128 o2 = _mm_add_ps(o, _mm_movehl_ps(o, o));
                total += _mm_cvtss_f32(_mm_add_ss(o2, _mm_movehdup_ps(o2)));
            } else {
                total += offs[t];
            }
        }
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

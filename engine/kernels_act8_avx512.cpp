// engine/kernels_act8_avx512.cpp — the 8-bit-activation row-group kernels, AVX-512 VNNI (layout and
// contract in kernels_act8.h); compiled with -mavx512* and chosen only when the AVX-512 kernel set is.
//
// Per block: each 64-byte vector of the 16 rows' quants (Q4: low and high nibbles masked out as bytes, 0..15;
// Q8_0: stored + 128) meets one token's 4 activations of those elements, broadcast as one int32, in vpdpbusd
// (u8 x s8, 4 products per int32 lane): 8 instructions per block and token instead of the 16-bit kernels' 16.
// The integer sum starts at -8 (Q4) or -128 (Q8_0) times the block's activation sum, which makes it exactly
// the centred (or signed) sum; the float steps are those of the 16-bit row-group kernel.
#include "kernels_act8.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace {

using quad8 = int32_t __attribute__((may_alias, aligned(4)));

template <int KIND, int T>
void group8_kernel(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, float* y, size_t y_stride) {
    constexpr size_t SB = 64, QB = KIND == 2 ? 512 : 256, GB = SB + QB;
    constexpr int NACC = T >= 4 ? 1 : 2;
    constexpr int32_t BIAS = KIND == 2 ? -128 : -8;
    const int8_t* aq = a.qs8 + t0 * a.k;
    const float* ad = a.d + t0 * nb;
    const float* as = a.dsum + t0 * nb;
    const int32_t* ai = a.isum + t0 * nb;
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* gb = g + size_t(b) * GB;
        const uint8_t* q = gb + SB;
        __m512i s[T][NACC];
        const quad8* ap[T];  // the block's activations of each token, as 8 quads of int8
        for (int t = 0; t < T; ++t) {
            s[t][0] = _mm512_set1_epi32(BIAS * ai[t * nb + b]);
            for (int k = 1; k < NACC; ++k) s[t][k] = _mm512_setzero_si512();
            ap[t] = reinterpret_cast<const quad8*>(aq + t * a.k + b * QK32);
        }
        auto dot = [&](int j, __m512i v) {
            for (int t = 0; t < T; ++t) {
                s[t][j % NACC] = _mm512_dpbusd_epi32(s[t][j % NACC], v, _mm512_set1_epi32(ap[t][j]));
            }
        };
        if constexpr (KIND == 2) {
            for (int j = 0; j < 8; ++j) dot(j, _mm512_load_si512(q + 64 * j));
        } else {
            for (int c = 0; c < 4; ++c) {
                const __m512i w = _mm512_load_si512(q + 64 * c);
                dot(2 * c, _mm512_and_si512(w, low4));
                dot(2 * c + 1, _mm512_and_si512(_mm512_srli_epi16(w, 4), low4));
            }
        }
        __m512 dw, off = _mm512_setzero_ps();
        if constexpr (KIND == 1) {  // half d and m; off = m + 8 d (8 d exact: one rounding, as a float add)
            dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(gb)));
            off = _mm512_fmadd_ps(dw, _mm512_set1_ps(8.0f), _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(gb + 32))));
        } else {
            dw = _mm512_load_ps(reinterpret_cast<const float*>(gb));
        }
        for (int t = 0; t < T; ++t) {
            __m512i sum = s[t][0];
            for (int k = 1; k < NACC; ++k) sum = _mm512_add_epi32(sum, s[t][k]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw, _mm512_set1_ps(ad[t * nb + b])), acc[t]);
            if constexpr (KIND == 1) acc[t] = _mm512_fmadd_ps(off, _mm512_set1_ps(as[t * nb + b]), acc[t]);
        }
    }
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + size_t(t) * y_stride, acc[t]);
}

template <int KIND>
void group8_dispatch(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    switch (n_tok) {
    case 1: group8_kernel<KIND, 1>(g, nb, a, t0, y, y_stride); break;
    case 2: group8_kernel<KIND, 2>(g, nb, a, t0, y, y_stride); break;
    case 3: group8_kernel<KIND, 3>(g, nb, a, t0, y, y_stride); break;
    case 4: group8_kernel<KIND, 4>(g, nb, a, t0, y, y_stride); break;
    case 5: group8_kernel<KIND, 5>(g, nb, a, t0, y, y_stride); break;
    case 6: group8_kernel<KIND, 6>(g, nb, a, t0, y, y_stride); break;
    case 7: group8_kernel<KIND, 7>(g, nb, a, t0, y, y_stride); break;
    default: group8_kernel<KIND, 8>(g, nb, a, t0, y, y_stride); break;
    }
}
static_assert(MM_TOK_TILE == 8, "group8_dispatch handles tiles of up to 8 tokens");

const mm_group_fn ACT8_AVX512[3] = {group8_dispatch<0>, group8_dispatch<1>, group8_dispatch<2>};

}  // namespace

const mm_group_fn* kernels_act8_avx512() { return ACT8_AVX512; }

#else

const mm_group_fn* kernels_act8_avx512() { return nullptr; }

#endif

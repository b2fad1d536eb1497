// engine/cpu/kernels_act8_avx512.cpp — the 8-bit-activation row-group kernels, AVX-512 VNNI (layout and
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

#include "kernels_group_avx512.h"

namespace {

using quad8 = int32_t __attribute__((may_alias, aligned(4)));

template <int KIND, int T>
struct group8_kernel {
static void run(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, float* y, size_t y_stride) {
    constexpr size_t SB = KIND == 2 ? 32 : 64, QB = KIND == 2 ? 512 : 256, GB = SB + QB;
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
            for (int j = 0; j < 8; ++j) dot(j, _mm512_loadu_si512(q + 64 * j));  // 32-byte aligned (SB 32)
        } else {
            for (int c = 0; c < 4; ++c) {
                const __m512i w = _mm512_load_si512(q + 64 * c);
                dot(2 * c, _mm512_and_si512(w, low4));
                dot(2 * c + 1, _mm512_and_si512(_mm512_srli_epi16(w, 4), low4));
            }
        }
        __m512 dw, off;
        group_avx512::block_scales<KIND>(gb, dw, off);
        for (int t = 0; t < T; ++t) {
            __m512i sum = s[t][0];
            for (int k = 1; k < NACC; ++k) sum = _mm512_add_epi32(sum, s[t][k]);
            acc[t] = group_avx512::block_accumulate<KIND>(acc[t], sum, dw, off, ad + t * nb, as + t * nb, b);
        }
    }
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + size_t(t) * y_stride, acc[t]);
}
};

// quantize_act8 in AVX-512: the same steps as the scalar one (max |x| over the block, d = max / 127, x * (1 / d)
// rounded to nearest even, clamped to +-127), so the same values bit for bit
void quantize_act8_avx512(const float* x, int64_t k, int16_t* qs, int8_t* qs8, float* d, float* dsum) {
    const __m512 sign_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    const __m512i hi = _mm512_set1_epi32(127), lo = _mm512_set1_epi32(-127);
    for (int64_t b = 0; b < k / QK32; ++b) {
        const __m512 x0 = _mm512_loadu_ps(x + b * QK32), x1 = _mm512_loadu_ps(x + b * QK32 + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(x0, sign_mask), _mm512_and_ps(x1, sign_mask)));
        const float db = amax / 127.0f;
        const __m512 vid = _mm512_set1_ps(db != 0.0f ? 1.0f / db : 0.0f);
        const __m512i q0 = _mm512_max_epi32(lo, _mm512_min_epi32(hi, _mm512_cvtps_epi32(_mm512_mul_ps(x0, vid))));
        const __m512i q1 = _mm512_max_epi32(lo, _mm512_min_epi32(hi, _mm512_cvtps_epi32(_mm512_mul_ps(x1, vid))));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * QK32), _mm512_cvtepi32_epi16(q0));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * QK32 + 16), _mm512_cvtepi32_epi16(q1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qs8 + b * QK32), _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qs8 + b * QK32 + 16), _mm512_cvtepi32_epi8(q1));
        d[b] = db;
        dsum[b] = db * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
    }
}

const mm_group_fn ACT8_AVX512[3] = {group_avx512::tile_dispatch<group8_kernel, 0>,
                                    group_avx512::tile_dispatch<group8_kernel, 1>,
                                    group_avx512::tile_dispatch<group8_kernel, 2>};

}  // namespace

const mm_group_fn* kernels_act8_avx512() { return ACT8_AVX512; }
act8_quantize_fn kernels_act8_quantize_avx512() { return quantize_act8_avx512; }

#else

const mm_group_fn* kernels_act8_avx512() { return nullptr; }
act8_quantize_fn kernels_act8_quantize_avx512() { return nullptr; }

#endif

// engine/cpu/kernels_group_kq_avx2.cpp — AVX2 row-group kernels of Q4_K and Q6_K (layout and arithmetic in
// kernels_group_kq.h), the AVX-512 kernels' arithmetic on 8-row halves as kernels_avx2.cpp's group_half: in
// each 64-byte chunk of Q4_K nibbles the first 32 bytes are rows 0..7's words, the next 32 rows 8..15's; in
// each 32-byte chunk of Q6_K values the first 16 bytes are rows 0..7's pairs. Per half, block and token the
// element pairs go through pmaddwd (8 int32 row lanes) and paddd into exact sums (Q6_K: one per 16-element
// sub-block), then the header's float steps: the same bits as the AVX-512 and scalar kernels. Tiles of up
// to 4 tokens (16 ymm).
#include "kernels_group_kq.h"

#if defined(__AVX2__) && defined(__FMA__)

#include <immintrin.h>

#include "kernels_group_avx2.h"  // tile_walk

namespace {

using pair16 = int32_t __attribute__((may_alias, aligned(4)));

// KIND 0: Q4_K, 1: Q6_K; rows 8 half .. 8 half + 7 of the group
template <int KIND, int T>
void kq_group_half(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, int half, float* y, size_t y_stride) {
    constexpr size_t GB = KIND == 0 ? 384 : 640;
    const int16_t* aq = a.qs + t0 * a.k;
    const float* ad = a.d + t0 * nb;
    const float* as = a.dsum + t0 * nb;
    const int32_t* ai = a.isum + t0 * nb;
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi16(0x000F);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* gb = g + size_t(b) * GB;
        const uint8_t* q = gb + 128;
        __m256i s[T][2];
        const pair16* ap[T];
        for (int t = 0; t < T; ++t) {
            s[t][0] = KIND == 0 ? _mm256_set1_epi32(-8 * ai[t * nb + b]) : _mm256_setzero_si256();
            s[t][1] = _mm256_setzero_si256();
            ap[t] = reinterpret_cast<const pair16*>(aq + t * a.k + b * QK32);
        }
        auto dot = [&](int j, __m256i v) {
            const int k = KIND == 0 ? j % 2 : j / 8;
            for (int t = 0; t < T; ++t) s[t][k] = _mm256_add_epi32(s[t][k], _mm256_madd_epi16(v, _mm256_set1_epi32(ap[t][j])));
        };
        if constexpr (KIND == 0) {
            for (int c = 0; c < 4; ++c) {
                const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 64 * c + 32 * half));
                dot(4 * c + 0, _mm256_and_si256(w, low4));
                dot(4 * c + 1, _mm256_and_si256(_mm256_srli_epi16(w, 4), low4));
                dot(4 * c + 2, _mm256_and_si256(_mm256_srli_epi16(w, 8), low4));
                dot(4 * c + 3, _mm256_srli_epi16(w, 12));
            }
        } else {
#pragma GCC unroll 16
            for (int j = 0; j < 16; ++j) {  // unrolled: the accumulator index must be a constant (registers)
                dot(j, _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(q + 32 * j + 16 * half))));
            }
        }
        const __m256 f0 = _mm256_load_ps(reinterpret_cast<const float*>(gb) + 8 * half);       // ws / d0
        const __m256 f1 = _mm256_load_ps(reinterpret_cast<const float*>(gb) + 16 + 8 * half);  // off / d1
        for (int t = 0; t < T; ++t) {
            const __m256 da = _mm256_set1_ps(ad[t * nb + b]);
            if constexpr (KIND == 0) {
                const __m256i sum = _mm256_add_epi32(s[t][0], s[t][1]);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(f0, da), acc[t]);
                acc[t] = _mm256_fmadd_ps(f1, _mm256_set1_ps(as[t * nb + b]), acc[t]);
            } else {
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t][0]), _mm256_mul_ps(f0, da), acc[t]);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t][1]), _mm256_mul_ps(f1, da), acc[t]);
            }
        }
    }
    for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + size_t(t) * y_stride + 8 * half, acc[t]);
}

template <int KIND>
void kq_group_dispatch(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    group_avx2::tile_walk(n_tok, [&](auto tile, int done) {
        constexpr int T = decltype(tile)::value;
        float* yt = y + size_t(done) * y_stride;
        kq_group_half<KIND, T>(g, nb, a, t0 + done, 0, yt, y_stride);
        kq_group_half<KIND, T>(g, nb, a, t0 + done, 1, yt, y_stride);
    });
}

const kq_group_set KQ_GROUP_AVX2 = {kq_group_dispatch<0>, kq_group_dispatch<1>};

}  // namespace

const kq_group_set* kq_groups_avx2() { return &KQ_GROUP_AVX2; }

#else

const kq_group_set* kq_groups_avx2() { return nullptr; }

#endif

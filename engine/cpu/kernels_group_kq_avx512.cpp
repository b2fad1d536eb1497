// engine/cpu/kernels_group_kq_avx512.cpp — AVX-512 VNNI row-group kernels of Q4_K and Q6_K (layout and
// arithmetic in kernels_group_kq.h). As kernels_avx512.cpp's group_kernel: per block the 16 rows' quants
// become 16 vectors of int16 pairs (Q4_K: 4 per 64-byte load by shift and mask; Q6_K: one int8 -> int16
// widening per 32-byte chunk), each token's element pair is broadcast and vpdpwssd adds both products into
// the row's int32 lane; Q6_K keeps the two 16-element sub-blocks (pairs 0..7, 8..15) in separate sums. Short
// tiles split the sums over more accumulators (exact: the value does not change).
#include "kernels_group_kq.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels_group_avx512.h"  // tile_dispatch

namespace {

using pair16 = int32_t __attribute__((may_alias, aligned(4)));

// KIND 0: Q4_K, 1: Q6_K
template <int KIND, int T>
struct kq_group_kernel {
static void run(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, float* y, size_t y_stride) {
    constexpr size_t GB = KIND == 0 ? 384 : 640;
    // accumulators per token: Q4_K one sum (split for short tiles); Q6_K one or two per sub-block
    constexpr int NACC = KIND == 0 ? (T >= 4 ? 1 : (T == 1 ? 4 : 2)) : (T >= 4 ? 2 : 4);
    constexpr int HALF = NACC / 2;
    const int16_t* aq = a.qs + t0 * a.k;
    const float* ad = a.d + t0 * nb;
    const float* as = a.dsum + t0 * nb;
    const int32_t* ai = a.isum + t0 * nb;
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi16(0x000F);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* gb = g + size_t(b) * GB;
        const uint8_t* q = gb + 128;
        __m512i s[T][NACC];
        const pair16* ap[T];
        for (int t = 0; t < T; ++t) {
            s[t][0] = KIND == 0 ? _mm512_set1_epi32(-8 * ai[t * nb + b]) : _mm512_setzero_si512();
            for (int k = 1; k < NACC; ++k) s[t][k] = _mm512_setzero_si512();
            ap[t] = reinterpret_cast<const pair16*>(aq + t * a.k + b * QK32);
        }
        auto dot = [&](int j, __m512i v) {
            const int k = KIND == 0 ? j % NACC : (j / 8) * HALF + j % HALF;
            for (int t = 0; t < T; ++t) s[t][k] = _mm512_dpwssd_epi32(s[t][k], v, _mm512_set1_epi32(ap[t][j]));
        };
        if constexpr (KIND == 0) {
            for (int c = 0; c < 4; ++c) {
                const __m512i w = _mm512_load_si512(q + 64 * c);
                dot(4 * c + 0, _mm512_and_si512(w, low4));
                dot(4 * c + 1, _mm512_and_si512(_mm512_srli_epi16(w, 4), low4));
                dot(4 * c + 2, _mm512_and_si512(_mm512_srli_epi16(w, 8), low4));
                dot(4 * c + 3, _mm512_srli_epi16(w, 12));
            }
        } else {
#pragma GCC unroll 16
            for (int j = 0; j < 16; ++j) {  // unrolled: the accumulator index must be a constant (registers)
                dot(j, _mm512_cvtepi8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(q + 32 * j))));
            }
        }
        const __m512 f0 = _mm512_load_ps(reinterpret_cast<const float*>(gb));       // ws / d0
        const __m512 f1 = _mm512_load_ps(reinterpret_cast<const float*>(gb) + 16);  // off / d1
        for (int t = 0; t < T; ++t) {
            const __m512 da = _mm512_set1_ps(ad[t * nb + b]);
            if constexpr (KIND == 0) {
                __m512i sum = s[t][0];
                for (int k = 1; k < NACC; ++k) sum = _mm512_add_epi32(sum, s[t][k]);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(f0, da), acc[t]);
                acc[t] = _mm512_fmadd_ps(f1, _mm512_set1_ps(as[t * nb + b]), acc[t]);
            } else {
                __m512i s0 = s[t][0], s1 = s[t][HALF];
                for (int k = 1; k < HALF; ++k) {
                    s0 = _mm512_add_epi32(s0, s[t][k]);
                    s1 = _mm512_add_epi32(s1, s[t][HALF + k]);
                }
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(f0, da), acc[t]);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(f1, da), acc[t]);
            }
        }
    }
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + size_t(t) * y_stride, acc[t]);
}
};

const kq_group_set KQ_GROUP_AVX512 = {group_avx512::tile_dispatch<kq_group_kernel, 0>,
                                      group_avx512::tile_dispatch<kq_group_kernel, 1>};

}  // namespace

const kq_group_set* kq_groups_avx512() { return &KQ_GROUP_AVX512; }

#else

const kq_group_set* kq_groups_avx512() { return nullptr; }

#endif

// engine/cpu/kernels_group_q5_0_avx512.cpp — the AVX-512 VNNI row-group kernel for Q5_0 weights kept at 5 bits
// (layout and contract in kernels_group_q5_0.h). Per block: each 64-byte chunk of nibble words gives, by
// shift and mask, the low 4 bits of 4 element pairs of all 16 rows as 32 int16 lanes; the pair's fifth bits
// (one 32-bit mask, hi[j]) add 16 to their lanes in one masked add; each token's activation pair is
// broadcast and vpdpwssd adds both products into the row's int32 lane. Centring (q - 16) is exact in the
// integer sum: it starts at -16 * (the block's activation sum). Then acc += float(sum) * (d * da) in block
// order — the widened Q8_0 kernel's float steps (group_avx512::block_accumulate), so the same bits.
#include "kernels_group_q5_0.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__)

// GCC 12's false positives on its own intrinsics' placeholders (see kernels_avx512.cpp)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels_group_avx512.h"

namespace {

using pair16 = int32_t __attribute__((may_alias, aligned(4)));

// KIND is unused (tile_dispatch's shape); T tokens of the tile at once. Short tiles split the integer sum
// over more accumulators (exact, so the same value) to break a lone token's dependency chain.
template <int KIND, int T>
struct group_q5_0_kernel {
static void run(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, float* y, size_t y_stride) {
    constexpr int NACC = T >= 4 ? 1 : (T == 1 ? 4 : 2);
    const int16_t* aq = a.qs + t0 * a.k;
    const float* ad = a.d + t0 * nb;
    const float* as = a.dsum + t0 * nb;
    const int32_t* ai = a.isum + t0 * nb;
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi16(0x000F), sixteen = _mm512_set1_epi16(16);
    const __m512 no_off = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* gb = g + size_t(b) * Q5_0_GROUP_BLOCK_BYTES;
        const uint32_t* hi = reinterpret_cast<const uint32_t*>(gb + 288);
        __m512i s[T][NACC];
        for (int t = 0; t < T; ++t) {
            s[t][0] = _mm512_set1_epi32(-16 * ai[t * nb + b]);
            for (int k = 1; k < NACC; ++k) s[t][k] = _mm512_setzero_si512();
        }
        const pair16* ap[T];  // the block's activations of each token, as 16 pairs of int16
        for (int t = 0; t < T; ++t) ap[t] = reinterpret_cast<const pair16*>(aq + t * a.k + b * QK32);
        auto dot = [&](int j, __m512i lo) {
            const __m512i v = _mm512_mask_add_epi16(lo, _cvtu32_mask32(hi[j]), lo, sixteen);
            for (int t = 0; t < T; ++t) {
                s[t][j % NACC] = _mm512_dpwssd_epi32(s[t][j % NACC], v, _mm512_set1_epi32(ap[t][j]));
            }
        };
        for (int c = 0; c < 4; ++c) {
            const __m512i w = _mm512_loadu_si512(gb + 32 + 64 * c);
            dot(4 * c + 0, _mm512_and_si512(w, low4));
            dot(4 * c + 1, _mm512_and_si512(_mm512_srli_epi16(w, 4), low4));
            dot(4 * c + 2, _mm512_and_si512(_mm512_srli_epi16(w, 8), low4));
            dot(4 * c + 3, _mm512_srli_epi16(w, 12));
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb)));
        for (int t = 0; t < T; ++t) {
            __m512i sum = s[t][0];
            for (int k = 1; k < NACC; ++k) sum = _mm512_add_epi32(sum, s[t][k]);
            acc[t] = group_avx512::block_accumulate<0>(acc[t], sum, dw, no_off, ad + t * nb, as + t * nb, b);
        }
    }
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + size_t(t) * y_stride, acc[t]);
}
};

}  // namespace

mm_group_fn group_q5_0_avx512() { return group_avx512::tile_dispatch<group_q5_0_kernel, 0>; }

#else

mm_group_fn group_q5_0_avx512() { return nullptr; }

#endif

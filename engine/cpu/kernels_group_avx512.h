// engine/cpu/kernels_group_avx512.h — the float steps and the tile dispatch shared by the AVX-512 row-group
// kernels: the 16-bit ones (kernels_avx512.cpp, group_kernel) and the 8-bit ones (kernels_act8_avx512.cpp,
// group8_kernel). Included only by *_avx512.cpp files (compiled with -mavx512*; CMakeLists.txt).
//
// Contract (layout in kernels.cpp, weight_pack, and kernels_act8.h): per (group of 16 rows, block b of 32
// columns) the kernel computes each token's 16 exact integer sums (centred or signed: the 4-bit values'
// -8 and Q8_0's +128 already taken out), then
//   acc[t] = fma(float(sum[t]), dw * da[t][b], acc[t]);  Q4_1 also: acc[t] = fma(off, dsum[t][b], acc[t])
// in block order, with dw the rows' block scales and off = m + 8 d (Q4_1). Both kernel families run exactly
// these steps, so the same integer sums give the same bits.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__)

#include <immintrin.h>

#include "kernels.h"

namespace group_avx512 {

// KIND 0: Q4_0, 1: Q4_1, 2: Q8_0. The rows' block scales at gb (the block's scale bytes: 64, Q8_0's 32): dw,
// and for Q4_1 off = m + 8 d (half d and m; 8 d is exact, so the fma rounds once, as a float add would).
template <int KIND>
inline void block_scales(const uint8_t* gb, __m512& dw, __m512& off) {
    if constexpr (KIND == 2) {  // half d
        dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(gb)));
        off = _mm512_setzero_ps();
    } else if constexpr (KIND == 1) {
        dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(gb)));
        off = _mm512_fmadd_ps(dw, _mm512_set1_ps(8.0f),
                              _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(gb + 32))));
    } else {
        dw = _mm512_load_ps(reinterpret_cast<const float*>(gb));
        off = _mm512_setzero_ps();
    }
}

// One token's float step for block b: ad, as are the token's (K/32) block scales and scaled sums.
template <int KIND>
inline __m512 block_accumulate(__m512 acc, __m512i sum, __m512 dw, __m512 off, const float* ad, const float* as,
                               int64_t b) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw, _mm512_set1_ps(ad[b])), acc);
    if constexpr (KIND == 1) acc = _mm512_fmadd_ps(off, _mm512_set1_ps(as[b]), acc);
    return acc;
}

// mm_group_fn over tiles of 1..MM_TOK_TILE tokens: Kernel<KIND, T>::run(g, nb, a, t0, y, y_stride) for T = n_tok.
template <template <int, int> class Kernel, int KIND>
void tile_dispatch(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    switch (n_tok) {
    case 1: Kernel<KIND, 1>::run(g, nb, a, t0, y, y_stride); break;
    case 2: Kernel<KIND, 2>::run(g, nb, a, t0, y, y_stride); break;
    case 3: Kernel<KIND, 3>::run(g, nb, a, t0, y, y_stride); break;
    case 4: Kernel<KIND, 4>::run(g, nb, a, t0, y, y_stride); break;
    case 5: Kernel<KIND, 5>::run(g, nb, a, t0, y, y_stride); break;
    case 6: Kernel<KIND, 6>::run(g, nb, a, t0, y, y_stride); break;
    case 7: Kernel<KIND, 7>::run(g, nb, a, t0, y, y_stride); break;
    default: Kernel<KIND, 8>::run(g, nb, a, t0, y, y_stride); break;
    }
}
static_assert(MM_TOK_TILE == 8, "tile_dispatch handles tiles of up to 8 tokens");

}  // namespace group_avx512

#endif

// engine/cpu/kernels_group_avx2.h — what the AVX2 row-group kernels share (kernels_avx2.cpp's Q4_0 / Q4_1 / Q8_0,
// kernels_group_kq_avx2.cpp's Q4_K / Q6_K, kernels_act8_avx2.h's 8-bit ones): the walk over a chunk's tokens in
// tiles of at most 4 (16 ymm registers hold 4 tokens' accumulators and a block's weights), and the float steps
// of the Q4_0 / Q4_1 / Q8_0 kernels on one 8-row half of a group. Each token's result does not depend on the
// split: a tile computes every token exactly as a tile of one would.
#pragma once

#include <type_traits>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include <cstdint>
#endif

namespace group_avx2 {

// Calls tile(std::integral_constant<int, T>{}, done) for tiles of T = 4 tokens (the last one shorter) that
// start at token `done` of n_tok.
template <typename Tile>
inline void tile_walk(int n_tok, Tile&& tile) {
    for (int done = 0; done < n_tok;) {
        const int n = n_tok - done < 4 ? n_tok - done : 4;
        switch (n) {
        case 1: tile(std::integral_constant<int, 1>{}, done); break;
        case 2: tile(std::integral_constant<int, 2>{}, done); break;
        case 3: tile(std::integral_constant<int, 3>{}, done); break;
        default: tile(std::integral_constant<int, 4>{}, done); break;
        }
        done += n;
    }
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// Internal linkage: this header is compiled into files built for different ISAs (AVX2, AVX-VNNI, AVX-512); an
// out-of-line copy shared across them could hand an AVX2-only CPU another file's instructions.
namespace {

// KIND 0: Q4_0, 1: Q4_1, 2: Q8_0 (weight_pack's and weight_pack8's scale bytes are the same). Rows
// 8 half .. 8 half + 7 of the block's scales at gb: dw, and for Q4_1 off = m + 8 d (half d and m; 8 d is
// exact, so the fma rounds once, as a float add would).
template <int KIND>
inline void block_scales(const uint8_t* gb, int half, __m256& dw, __m256& off) {
    off = _mm256_setzero_ps();
    if constexpr (KIND == 1) {
        dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(gb) + half));
        const __m256 m = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(gb + 32) + half));
        off = _mm256_fmadd_ps(dw, _mm256_set1_ps(8.0f), m);
    } else if constexpr (KIND == 2) {
        dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(gb) + half));
    } else {
        dw = _mm256_load_ps(reinterpret_cast<const float*>(gb) + 8 * half);
    }
}

// One token's float step for a block: sum the 8 rows' exact integer sums, da / dsum the token's block scale
// and scaled sum. The AVX-512 kernels' steps (kernels_group_avx512.h) on 8 lanes: the same bits per row.
template <int KIND>
inline __m256 block_accumulate(__m256 acc, __m256i sum, __m256 dw, __m256 off, float da, float dsum) {
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dw, _mm256_set1_ps(da)), acc);
    if constexpr (KIND == 1) acc = _mm256_fmadd_ps(off, _mm256_set1_ps(dsum), acc);
    return acc;
}

}  // namespace

#endif

}  // namespace group_avx2

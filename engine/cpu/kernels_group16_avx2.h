// engine/cpu/kernels_group16_avx2.h — the 16-bit-activation row-group kernels of Q4_0 / Q4_1 / Q8_0 on 8-lane vectors
// (layout in kernels.cpp, weight_pack), in two forms: plain AVX2 (vpmaddwd + vpaddd; kernels_avx2.cpp) and
// AVX-VNNI (the VEX vpdpwssd, the two in one instruction; kernels_act8_avxvnni.cpp, chosen by
// kernels_avx2() where CPUID has AVX-VNNI). Both form the same exact int32 sums (pairs of s16 products: the
// weights are 4- or 8-bit, so no pair reaches 2^31), hence the same bits. The VNNI form is also compiled with
// the EVEX vpdpwssd (AVX-512 VNNI + VL, same semantics; kernels_act8_avxvnni_avx512.cpp) so that AVX-512 hosts
// test its code. Everything here has internal linkage (each includer is built for its own ISA).
#pragma once

#include <immintrin.h>

#include "kernels.h"
#include "kernels_group_avx2.h"  // tile_walk, block_scales, block_accumulate

namespace {

// s + (pairwise s16 products of v and a, summed per int32 lane)
template <bool VNNI>
inline __m256i dot_pairs(__m256i s, __m256i v, __m256i a) {
#if defined(__AVXVNNI__)
    if constexpr (VNNI) return _mm256_dpwssd_avx_epi32(s, v, a);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
    if constexpr (VNNI) return _mm256_dpwssd_epi32(s, v, a);
#endif
    return _mm256_add_epi32(s, _mm256_madd_epi16(v, a));
}

// Row-group kernel over packed weights (layout in kernels.cpp, weight_pack), the AVX-512 set's arithmetic on
// 8-row halves: in each 64-byte chunk the first 32 bytes are rows 0..7's words, the next 32 rows 8..15's.
// Per half, block and token: the 16 element pairs go through pmaddwd (8 int32 row lanes) and paddd into an
// exact integer sum that starts at -8 * (the block's activation sum) for 4-bit weights; then
// acc += float(sum) * (dw * da) and, for Q4_1, acc += off * dsum, in block order: per row the same float
// steps as the AVX-512 kernel, so the two sets give the same bits. Tiles of up to 4 tokens (16 ymm).
using pair16 = int32_t __attribute__((may_alias, aligned(4)));

template <int KIND, int T, bool VNNI>
void group_half(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, int half, float* y, size_t y_stride) {
    constexpr size_t SB = KIND == 2 ? 32 : 64, QB = KIND == 2 ? 512 : 256, GB = SB + QB;
    const int16_t* aq = a.qs + t0 * a.k;
    const float* ad = a.d + t0 * nb;
    const float* as = a.dsum + t0 * nb;
    const int32_t* ai = a.isum + t0 * nb;
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi16(0x000F);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* gb = g + size_t(b) * GB;
        const uint8_t* q = gb + SB;
        __m256i s[T];
        const pair16* ap[T];
        for (int t = 0; t < T; ++t) {
            s[t] = KIND == 2 ? _mm256_setzero_si256() : _mm256_set1_epi32(-8 * ai[t * nb + b]);
            ap[t] = reinterpret_cast<const pair16*>(aq + t * a.k + b * QK32);
        }
        auto dot = [&](int j, __m256i v) {
            for (int t = 0; t < T; ++t) s[t] = dot_pairs<VNNI>(s[t], v, _mm256_set1_epi32(ap[t][j]));
        };
        if constexpr (KIND == 2) {
            for (int j = 0; j < 16; ++j) {
                dot(j, _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(q + 32 * j + 16 * half))));
            }
        } else if constexpr (T == 1) {
            // one token (decode): nibbles 1 and 2 stay in place (masked, not shifted), so their products are 16
            // and 256 times the true ones, summed apart and shifted back once per block: exact (per block
            // |s1| <= 4 * 2 * 240 * 32768 < 2^27, |s2| <= 4 * 2 * 3840 * 32768 < 2^31; both multiples of their
            // factor); unpacking takes 16 instructions per half-block instead of 28, plus 4 to combine
            __m256i s1 = _mm256_setzero_si256(), s2 = _mm256_setzero_si256();
            const __m256i mid4 = _mm256_set1_epi16(0x00F0), high4 = _mm256_set1_epi16(0x0F00);
            for (int c = 0; c < 4; ++c) {
                const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 64 * c + 32 * half));
                dot(4 * c + 0, _mm256_and_si256(w, low4));
                s1 = dot_pairs<VNNI>(s1, _mm256_and_si256(w, mid4), _mm256_set1_epi32(ap[0][4 * c + 1]));
                s2 = dot_pairs<VNNI>(s2, _mm256_and_si256(w, high4), _mm256_set1_epi32(ap[0][4 * c + 2]));
                dot(4 * c + 3, _mm256_srli_epi16(w, 12));
            }
            s[0] = _mm256_add_epi32(s[0], _mm256_add_epi32(_mm256_srai_epi32(s1, 4), _mm256_srai_epi32(s2, 8)));
        } else {
            for (int c = 0; c < 4; ++c) {
                const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 64 * c + 32 * half));
                dot(4 * c + 0, _mm256_and_si256(w, low4));
                dot(4 * c + 1, _mm256_and_si256(_mm256_srli_epi16(w, 4), low4));
                dot(4 * c + 2, _mm256_and_si256(_mm256_srli_epi16(w, 8), low4));
                dot(4 * c + 3, _mm256_srli_epi16(w, 12));
            }
        }
        __m256 dw, off;
        group_avx2::block_scales<KIND>(gb, half, dw, off);
        for (int t = 0; t < T; ++t) acc[t] = group_avx2::block_accumulate<KIND>(acc[t], s[t], dw, off, ad[t * nb + b], as[t * nb + b]);
    }
    for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + size_t(t) * y_stride + 8 * half, acc[t]);
}

// One token (decode) over a Q8_0 group: both 8-row halves in one walk over the blocks. Each 32-byte piece of
// a block (element pair j: rows 0..7's 16 bytes, then rows 8..15's) is loaded once and the token's pair
// broadcast once for both halves, where group_half walks the group twice, reading half of every cache line
// each time. Per half the same integer sums and float steps as group_half<2, 1>: the same bits.
template <bool VNNI>
void group_q8_0_pair(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, float* y) {
    constexpr size_t SB = 32, GB = SB + 512;
    const int16_t* aq = a.qs + t0 * a.k;
    const float* ad = a.d + t0 * nb;
    const float* as = a.dsum + t0 * nb;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* gb = g + size_t(b) * GB;
        const uint8_t* q = gb + SB;
        const pair16* ap = reinterpret_cast<const pair16*>(aq + b * QK32);
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        for (int j = 0; j < 16; ++j) {
            const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * j));
            const __m256i av = _mm256_set1_epi32(ap[j]);
            s0 = dot_pairs<VNNI>(s0, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w)), av);
            s1 = dot_pairs<VNNI>(s1, _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1)), av);
        }
        __m256 dw0, off0, dw1, off1;
        group_avx2::block_scales<2>(gb, 0, dw0, off0);
        group_avx2::block_scales<2>(gb, 1, dw1, off1);
        acc0 = group_avx2::block_accumulate<2>(acc0, s0, dw0, off0, ad[b], as[b]);
        acc1 = group_avx2::block_accumulate<2>(acc1, s1, dw1, off1, ad[b], as[b]);
    }
    _mm256_storeu_ps(y, acc0);
    _mm256_storeu_ps(y + 8, acc1);
}

template <int KIND, bool VNNI>
void group_dispatch(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    if constexpr (KIND == 2) {
        if (n_tok == 1) return group_q8_0_pair<VNNI>(g, nb, a, t0, y);
    }
    group_avx2::tile_walk(n_tok, [&](auto tile, int done) {
        constexpr int T = decltype(tile)::value;
        float* yt = y + size_t(done) * y_stride;
        group_half<KIND, T, VNNI>(g, nb, a, t0 + done, 0, yt, y_stride);
        group_half<KIND, T, VNNI>(g, nb, a, t0 + done, 1, yt, y_stride);
    });
}

}  // namespace

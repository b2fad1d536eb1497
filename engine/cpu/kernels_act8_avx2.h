// engine/cpu/kernels_act8_avx2.h — the 8-bit-activation row-group kernels on 8-lane vectors (layout and contract in
// kernels_act8.h), in two forms: plain AVX2 (kernels_act8_avx2.cpp, vpmaddubsw + vpmaddwd) and AVX-VNNI
// (kernels_act8_avxvnni.cpp, the VEX vpdpbusd of Intel 12th gen+ and Zen 5). Included only by those two
// files, each compiled for its ISA (CMakeLists.txt); everything here is in an unnamed namespace, so each
// includer has its own copy.
//
// Per 8-row half of a group (bytes 32 half .. 32 half + 31 of each 64-byte vector of weight_pack8's layout),
// block and token, the exact integer sum of the 8 rows starts at -8 (Q4) or -128 (Q8_0) times the block's
// activation sum, and then the float steps of kernels_avx2.cpp's 16-bit kernel (group_avx2::block_accumulate)
// run: the same integer sums, so the same bits as the 16-bit row-group kernels (and AVX-512's).
//
// Plain AVX2 (Q4_0 / Q4_1): vpmaddubsw multiplies the 4-bit values (u8, 0..15) with the token's int8
// activations (-127..127, quantize_act8 clamps to +-127) and adds adjacent pairs into int16: |pair| <= 2 * 15 *
// 127 = 3810, so it never saturates; the block's 8 such vectors are added as int16 (each lane then holds 16
// products, |sum| <= 16 * 15 * 127 = 30480 < 32767: still exact), and one vpmaddwd with ones widens the pairs
// to the row's int32 sum. Per (half, block, token) for 256 multiply-adds: 8 vpmaddubsw, 7 vpaddw, the widening
// vpmaddwd and bias add, the float step's 4 (cvt, mul, 2 fma), and 8 activation broadcasts that are loads;
// the block's unpacking (12) is shared by the tile's tokens. Q8_0 has no plain-AVX2 8-bit kernel: its stored values + 128 (0..255) against int8 activations
// reach 2 * 255 * 127 per pair, past int16, and the sign trick (|w| x sign(a, w)) costs as many instructions
// as the 16-bit kernel; such weights keep weight_pack's layout and the 16-bit kernel (same results).
//
// AVX-VNNI: vpdpbusd (u8 x s8, 4 products into each int32 lane, no intermediate saturation) accumulates
// straight into the int32 sum: 8 instructions per (half, block, token), Q8_0 included (stored + 128).
//
// The VNNI form is compiled twice: with -mavxvnni (the VEX vpdpbusd: kernels_act8_avxvnni.cpp, the engine's)
// and with -mavx512vnni -mavx512vl (the EVEX vpdpbusd on ymm, same semantics: kernels_act8_avxvnni_avx512.cpp),
// so that the kernels' code is tested on AVX-512 VNNI hosts, which lack the VEX form's CPUID bit, and where
// QEMU's TCG (7.2) cannot run VEX vpdpbusd either.
#pragma once

#include <immintrin.h>

#include "kernels_act8.h"
#include "kernels_group_avx2.h"

namespace {

using quad8 = int32_t __attribute__((may_alias, aligned(4)));

#if defined(__AVXVNNI__)
inline __m256i dpbusd256(__m256i s, __m256i u8, __m256i s8) { return _mm256_dpbusd_avx_epi32(s, u8, s8); }
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
inline __m256i dpbusd256(__m256i s, __m256i u8, __m256i s8) { return _mm256_dpbusd_epi32(s, u8, s8); }
#endif

// An opaque step in a chain of int16 adds: GCC 12 at -O3 re-associates a chain of plain vector adds into one tree
// over all of a block's products, which for a tile of 4 tokens kept 32 products live at once, spilled to the stack
// (~57 instructions per (half, block, token) under callgrind, against the ~24 the arithmetic needs). Integer sums
// here are exact in any order, so this changes no bits; it only keeps the order written.
inline __m256i in_order(__m256i v) {
    asm("" : "+x"(v));
    return v;
}

// The plain-AVX2 integer sum of one token's block for one 8-row half: v the block's 8 unpacked weight vectors
// (4-bit values, u8), ap the token's activations as 8 quads of int8. Two chains of int16 pair sums (bounds in the
// header comment: every partial sum is exact), widened to int32 and started at BIAS * isum.
inline __m256i half_sum_maddubs(const __m256i* v, const quad8* ap, __m256i bias) {
    __m256i p0 = _mm256_maddubs_epi16(v[0], _mm256_set1_epi32(ap[0]));
    __m256i p1 = _mm256_maddubs_epi16(v[1], _mm256_set1_epi32(ap[1]));
    for (int j = 2; j < 8; j += 2) {
        p0 = in_order(_mm256_add_epi16(p0, _mm256_maddubs_epi16(v[j], _mm256_set1_epi32(ap[j]))));
        p1 = in_order(_mm256_add_epi16(p1, _mm256_maddubs_epi16(v[j + 1], _mm256_set1_epi32(ap[j + 1]))));
    }
    return _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(p0, p1), _mm256_set1_epi16(1)), bias);
}

// KIND 0: Q4_0, 1: Q4_1, 2: Q8_0 (VNNI only). Rows 8 half .. 8 half + 7 of the group at g, T tokens from t0.
// Per block the weights are unpacked once, then each token in turn takes its integer sum and its float step
// (so only one token's partial sums are live: 8 weight vectors, 2 chains and the scales fit the 16 registers).
template <int KIND, int T, bool VNNI>
void group8_half(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, int half, float* y, size_t y_stride) {
    static_assert(VNNI || KIND != 2, "Q8_0 has no plain-AVX2 8-bit kernel");
    constexpr size_t SB = KIND == 2 ? 32 : 64, QB = KIND == 2 ? 512 : 256, GB = SB + QB;
    constexpr int32_t BIAS = KIND == 2 ? -128 : -8;
    const int8_t* aq = a.qs8 + t0 * a.k;
    const float* ad = a.d + t0 * nb;
    const float* as = a.dsum + t0 * nb;
    const int32_t* ai = a.isum + t0 * nb;
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* gb = g + size_t(b) * GB;
        const uint8_t* q = gb + SB + 32 * half;
        const quad8* ap[T];  // the block's activations of each token, as 8 quads of int8
        for (int t = 0; t < T; ++t) ap[t] = reinterpret_cast<const quad8*>(aq + t * a.k + b * QK32);
        __m256 dw, off;
        group_avx2::block_scales<KIND>(gb, half, dw, off);
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
        if constexpr (VNNI) {
            __m256i s[T];
            for (int t = 0; t < T; ++t) s[t] = _mm256_set1_epi32(BIAS * ai[t * nb + b]);
            auto dot = [&](int j, __m256i v) {
                for (int t = 0; t < T; ++t) s[t] = dpbusd256(s[t], v, _mm256_set1_epi32(ap[t][j]));
            };
            if constexpr (KIND == 2) {
                for (int j = 0; j < 8; ++j) dot(j, _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 64 * j)));
            } else {
                for (int c = 0; c < 4; ++c) {
                    const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 64 * c));
                    dot(2 * c, _mm256_and_si256(w, low4));
                    dot(2 * c + 1, _mm256_and_si256(_mm256_srli_epi16(w, 4), low4));
                }
            }
            for (int t = 0; t < T; ++t) acc[t] = group_avx2::block_accumulate<KIND>(acc[t], s[t], dw, off, ad[t * nb + b], as[t * nb + b]);
        }
#endif
        if constexpr (!VNNI) {
            __m256i v[8];  // the block's 4-bit values, element quad j of the 8 rows in v[j]
            for (int c = 0; c < 4; ++c) {
                const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 64 * c));
                v[2 * c] = _mm256_and_si256(w, low4);
                v[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
            }
            for (int t = 0; t < T; ++t) {
                const __m256i s = half_sum_maddubs(v, ap[t], _mm256_set1_epi32(BIAS * ai[t * nb + b]));
                acc[t] = group_avx2::block_accumulate<KIND>(acc[t], s, dw, off, ad[t * nb + b], as[t * nb + b]);
            }
        }
    }
    for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + size_t(t) * y_stride + 8 * half, acc[t]);
}

// One token (decode, T = 1), both halves of the group in one walk over its blocks: the same operations per half
// as group8_half<KIND, 1, VNNI> (so the same bits), but the token's activation broadcasts and block scalars are
// loaded once for the 16 rows instead of twice, and the two halves' independent chains interleave, which hides
// the latency of each half's fma chain. Decode on AVX2 is bound by these instructions, not by memory
// (docs/BENCHMARKS.md): one thread's in-cache Q4_1 rate goes from 34.2 to 38.9 GB/s.
template <int KIND, bool VNNI>
void group8_pair(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, float* y) {
    constexpr size_t SB = KIND == 2 ? 32 : 64, QB = KIND == 2 ? 512 : 256, GB = SB + QB;
    constexpr int32_t BIAS = KIND == 2 ? -128 : -8;
    const int8_t* aq = a.qs8 + t0 * a.k;
    const float* ad = a.d + t0 * nb;
    const float* as = a.dsum + t0 * nb;
    const int32_t* ai = a.isum + t0 * nb;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* gb = g + size_t(b) * GB;
        const uint8_t* q = gb + SB;
        const quad8* ap = reinterpret_cast<const quad8*>(aq + b * QK32);
        const __m256i bias = _mm256_set1_epi32(BIAS * ai[b]);
        __m256i s0, s1;
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
        if constexpr (VNNI) {
            s0 = bias;
            s1 = bias;
            auto dot = [&](int j, __m256i v0, __m256i v1) {
                const __m256i x = _mm256_set1_epi32(ap[j]);
                s0 = dpbusd256(s0, v0, x);
                s1 = dpbusd256(s1, v1, x);
            };
            if constexpr (KIND == 2) {
                for (int j = 0; j < 8; ++j) {
                    dot(j, _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 64 * j)),
                        _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 64 * j + 32)));
                }
            } else {
                for (int c = 0; c < 4; ++c) {
                    const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 64 * c));
                    const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 64 * c + 32));
                    dot(2 * c, _mm256_and_si256(w0, low4), _mm256_and_si256(w1, low4));
                    dot(2 * c + 1, _mm256_and_si256(_mm256_srli_epi16(w0, 4), low4),
                        _mm256_and_si256(_mm256_srli_epi16(w1, 4), low4));
                }
            }
        }
#endif
        if constexpr (!VNNI) {
            __m256i p0 = _mm256_setzero_si256(), p1 = _mm256_setzero_si256();  // int16 pair sums, as group8_half
            auto dot = [&](int j, __m256i v0, __m256i v1) {
                const __m256i x = _mm256_set1_epi32(ap[j]);
                p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(v0, x));
                p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(v1, x));
            };
            for (int c = 0; c < 4; ++c) {
                const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 64 * c));
                const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 64 * c + 32));
                dot(2 * c, _mm256_and_si256(w0, low4), _mm256_and_si256(w1, low4));
                dot(2 * c + 1, _mm256_and_si256(_mm256_srli_epi16(w0, 4), low4),
                    _mm256_and_si256(_mm256_srli_epi16(w1, 4), low4));
            }
            const __m256i ones = _mm256_set1_epi16(1);
            s0 = _mm256_add_epi32(_mm256_madd_epi16(p0, ones), bias);
            s1 = _mm256_add_epi32(_mm256_madd_epi16(p1, ones), bias);
        }
        __m256 dw0, off0, dw1, off1;
        group_avx2::block_scales<KIND>(gb, 0, dw0, off0);
        group_avx2::block_scales<KIND>(gb, 1, dw1, off1);
        acc0 = group_avx2::block_accumulate<KIND>(acc0, s0, dw0, off0, ad[b], as[b]);
        acc1 = group_avx2::block_accumulate<KIND>(acc1, s1, dw1, off1, ad[b], as[b]);
    }
    _mm256_storeu_ps(y, acc0);
    _mm256_storeu_ps(y + 8, acc1);
}

template <int KIND, bool VNNI>
void group8_dispatch(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    group_avx2::tile_walk(n_tok, [&](auto tile, int done) {
        constexpr int T = decltype(tile)::value;
        float* yt = y + size_t(done) * y_stride;
        if constexpr (T == 1) {
            group8_pair<KIND, VNNI>(g, nb, a, t0 + done, yt);
            return;
        }
        group8_half<KIND, T, VNNI>(g, nb, a, t0 + done, 0, yt, y_stride);
        group8_half<KIND, T, VNNI>(g, nb, a, t0 + done, 1, yt, y_stride);
    });
}

}  // namespace

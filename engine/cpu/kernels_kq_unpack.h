// engine/cpu/kernels_kq_unpack.h — expansion of one unit of a weight row (a 256-element super-block, or a block
// of 32) into int16 values and per-32-block float factors, for the row kernels of engine/cpu/kernels_kq.h.
// Plain loops over contiguous bytes, written so that the compiler vectorises them for each kernel set: this
// header is included by kernels_kq.cpp (baseline), kernels_kq_avx2.cpp and kernels_kq_avx512.cpp, each
// compiled with its own -m flags, and yields internal-linkage functions in each.
//
// Per 32-element block b of the unit (element e = 32 b + l), with a the token's activations:
//   value of the block = ws[b] * (sum_l q[e] a[e]) + ws2[b] * (sum_l m[e] a[e]) + mo[b] * (sum_l a[e])
// Types (layouts in quants.h):
//   Q4_K / Q5_K: q = the 4 (5) bit value, ws = d sc, mo = -dmin m        (sub-blocks of 32: one per block)
//   Q6_K:        q = sc (q6 - 32), ws = d                                (int8 scales of 16-element halves)
//   Q3_K:        q = (sc - 32) q3, ws = d                                (6-bit scales of 16-element halves)
//   Q2_K:        q = sc q2, ws = d;  m = the half's 4-bit min, ws2 = -dmin
//   IQ4_XS:      q = kvalues_iq4nl[nibble], ws = d (ls - 32)
//   Q5_1:        q = q5 - 16 (centred, so the offset term is small), ws = d, mo = m + 16 d
// A unit is 8 blocks (a K super-block, or 8 Q5_1 blocks; a row's last Q5_1 unit may hold fewer: nblk).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quants.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

struct kq_unit {
    alignas(64) int16_t q[256];
    alignas(64) int16_t m[256];  // Q2_K's mins (MINS types only)
    alignas(32) float ws[8];
    alignas(32) float ws2[8];
    alignas(32) float mo[8];
};

inline float kq_f16(uint16_t h) { return fp16_to_fp32(h); }

#if defined(__AVX2__)
// 16 bytes at p widened to 16 uint16 lanes
inline __m256i kq_u8x16(const uint8_t* p) {
    return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void kq_store16(int16_t* q, __m256i v) { _mm256_store_si256(reinterpret_cast<__m256i*>(q), v); }
#endif

// Q4_K (HIGH false) / Q5_K (HIGH true)
template <bool HIGH>
struct kq_q45k {
    static constexpr int NB = 8;
    static constexpr bool OFF = true, MINS = false;
    using blk = std::conditional_t<HIGH, block_q5_k, block_q4_k>;
    static constexpr size_t BYTES = sizeof(blk);
    static void unpack(const uint8_t* p, int nblk, kq_unit* u) {
        (void)nblk;  // always 8
        const blk& b = *reinterpret_cast<const blk*>(p);
        const float d = kq_f16(b.d), dmin = kq_f16(b.dmin);
        for (int s = 0; s < 8; ++s) {
            uint8_t sc, m;
            q4k_scale_min(s, b.scales, &sc, &m);
            u->ws[s] = d * static_cast<float>(sc);
            u->mo[s] = -(dmin * static_cast<float>(m));
        }
#if defined(__AVX2__)
        const __m256i low4 = _mm256_set1_epi16(0x0F), one = _mm256_set1_epi16(1);
        for (int pr = 0; pr < 4; ++pr) {
            for (int h = 0; h < 2; ++h) {  // elements 16 h .. 16 h + 15 of sub-blocks 2 pr (low) and 2 pr + 1 (high)
                const __m256i v = kq_u8x16(b.qs + pr * 32 + 16 * h);
                __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_srli_epi16(v, 4);
                if constexpr (HIGH) {
                    const __m256i qh = kq_u8x16(b.qh + 16 * h);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * pr), one), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * pr + 1), one), 4));
                }
                kq_store16(u->q + 64 * pr + 16 * h, lo);
                kq_store16(u->q + 64 * pr + 32 + 16 * h, hi);
            }
        }
        return;
#endif
        for (int pr = 0; pr < 4; ++pr) {
            const uint8_t* qs = b.qs + pr * 32;
            int16_t* lo = u->q + 64 * pr;
            int16_t* hi = lo + 32;
            for (int l = 0; l < 32; ++l) {
                lo[l] = static_cast<int16_t>(qs[l] & 0xF);
                hi[l] = static_cast<int16_t>(qs[l] >> 4);
            }
            if constexpr (HIGH) {
                for (int l = 0; l < 32; ++l) {
                    lo[l] = static_cast<int16_t>(lo[l] | (((b.qh[l] >> (2 * pr)) & 1) << 4));
                    hi[l] = static_cast<int16_t>(hi[l] | (((b.qh[l] >> (2 * pr + 1)) & 1) << 4));
                }
            }
        }
    }
};

struct kq_q6k {
    static constexpr int NB = 8;
    static constexpr bool OFF = false, MINS = false;
    static constexpr size_t BYTES = sizeof(block_q6_k);
    static void unpack(const uint8_t* p, int nblk, kq_unit* u) {
        (void)nblk;  // always 8
        const block_q6_k& b = *reinterpret_cast<const block_q6_k*>(p);
        const float d = kq_f16(b.d);
        for (int s = 0; s < 8; ++s) u->ws[s] = d;
        for (int s = 0; s < 8; ++s) {  // block s: half h, quarter qd of the half
            const int h = s / 4, qd = s % 4;
            const uint8_t* ql = b.ql + h * 64 + (qd % 2) * 32;
            const uint8_t* qh = b.qh + h * 32;
            const int shift = qd < 2 ? 0 : 4;
            const int16_t sc0 = b.scales[h * 8 + qd * 2], sc1 = b.scales[h * 8 + qd * 2 + 1];
            int16_t* q = u->q + 32 * s;
#if defined(__AVX2__)
            for (int g = 0; g < 2; ++g) {  // elements 16 g .. 16 g + 15 (scale sc0, then sc1)
                const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(kq_u8x16(ql + 16 * g), shift), _mm256_set1_epi16(0x0F));
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(kq_u8x16(qh + 16 * g), 2 * qd), _mm256_set1_epi16(3));
                const __m256i v = _mm256_sub_epi16(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi16(32));
                kq_store16(q + 16 * g, _mm256_mullo_epi16(v, _mm256_set1_epi16(g ? sc1 : sc0)));
            }
            continue;
#endif
            for (int l = 0; l < 32; ++l) {
                const int v = (((ql[l] >> shift) & 0xF) | (((qh[l] >> (2 * qd)) & 3) << 4)) - 32;
                q[l] = static_cast<int16_t>(v * (l < 16 ? sc0 : sc1));
            }
        }
    }
};

// The 6-bit scale of sub-block s (0..15) of a Q3_K block, minus 32 (quants.cpp's q3k_scale).
inline int kq_q3k_scale(const uint8_t* sc, int s) {
    const int lo = (s < 8 ? sc[s] : sc[s - 8] >> 4) & 0xF;
    const int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    return (lo | hi << 4) - 32;
}

struct kq_q3k {
    static constexpr int NB = 8;
    static constexpr bool OFF = false, MINS = false;
    static constexpr size_t BYTES = sizeof(block_q3_k);
    static void unpack(const uint8_t* p, int nblk, kq_unit* u) {
        (void)nblk;  // always 8
        const block_q3_k& b = *reinterpret_cast<const block_q3_k*>(p);
        const float d = kq_f16(b.d);
        for (int s = 0; s < 8; ++s) u->ws[s] = d;
        for (int s = 0; s < 8; ++s) {  // block s: bytes of half s / 4, bit pair s % 4, hmask bit s
            const uint8_t* qs = b.qs + (s / 4) * 32;
            const int shift = 2 * (s % 4);
            const int16_t sc0 = static_cast<int16_t>(kq_q3k_scale(b.scales, 2 * s));
            const int16_t sc1 = static_cast<int16_t>(kq_q3k_scale(b.scales, 2 * s + 1));
            int16_t* q = u->q + 32 * s;
#if defined(__AVX2__)
            for (int g = 0; g < 2; ++g) {  // elements 16 g .. 16 g + 15: q2 + 4 hbit - 4, times the half's scale
                const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(kq_u8x16(qs + 16 * g), shift), _mm256_set1_epi16(3));
                const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(kq_u8x16(b.hmask + 16 * g), s), _mm256_set1_epi16(1));
                const __m256i v = _mm256_sub_epi16(_mm256_or_si256(lo, _mm256_slli_epi16(hb, 2)), _mm256_set1_epi16(4));
                kq_store16(q + 16 * g, _mm256_mullo_epi16(v, _mm256_set1_epi16(g ? sc1 : sc0)));
            }
            continue;
#endif
            for (int l = 0; l < 32; ++l) {
                const int v = ((qs[l] >> shift) & 3) - (((b.hmask[l] >> s) & 1) ? 0 : 4);
                q[l] = static_cast<int16_t>(v * (l < 16 ? sc0 : sc1));
            }
        }
    }
};

struct kq_q2k {
    static constexpr int NB = 8;
    static constexpr bool OFF = false, MINS = true;
    static constexpr size_t BYTES = sizeof(block_q2_k);
    static void unpack(const uint8_t* p, int nblk, kq_unit* u) {
        (void)nblk;  // always 8
        const block_q2_k& b = *reinterpret_cast<const block_q2_k*>(p);
        const float d = kq_f16(b.d), dmin = kq_f16(b.dmin);
        for (int s = 0; s < 8; ++s) {
            u->ws[s] = d;
            u->ws2[s] = -dmin;
        }
        for (int s = 0; s < 8; ++s) {
            const uint8_t* qs = b.qs + (s / 4) * 32;
            const int shift = 2 * (s % 4);
            const uint8_t s0 = b.scales[2 * s], s1 = b.scales[2 * s + 1];
            int16_t* q = u->q + 32 * s;
            int16_t* m = u->m + 32 * s;
#if defined(__AVX2__)
            for (int g = 0; g < 2; ++g) {  // elements 16 g .. 16 g + 15: q2 times the half's scale; its min
                const uint8_t sc = g ? s1 : s0;
                const __m256i v = _mm256_and_si256(_mm256_srli_epi16(kq_u8x16(qs + 16 * g), shift), _mm256_set1_epi16(3));
                kq_store16(q + 16 * g, _mm256_mullo_epi16(v, _mm256_set1_epi16(sc & 0xF)));
                kq_store16(m + 16 * g, _mm256_set1_epi16(sc >> 4));
            }
            continue;
#endif
            for (int l = 0; l < 32; ++l) {
                const uint8_t sc = l < 16 ? s0 : s1;
                q[l] = static_cast<int16_t>(((qs[l] >> shift) & 3) * (sc & 0xF));
                m[l] = static_cast<int16_t>(sc >> 4);
            }
        }
    }
};

struct kq_iq4xs {
    static constexpr int NB = 8;
    static constexpr bool OFF = false, MINS = false;
    static constexpr size_t BYTES = sizeof(block_iq4_xs);
    static void unpack(const uint8_t* p, int nblk, kq_unit* u) {
        (void)nblk;  // always 8
        const block_iq4_xs& b = *reinterpret_cast<const block_iq4_xs*>(p);
        const float d = kq_f16(b.d);
#if defined(__AVX2__)
        const __m128i tbl = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kvalues_iq4nl));
        const __m128i low4 = _mm_set1_epi8(0x0F);
#endif
        for (int s = 0; s < 8; ++s) {
            const int ls = ((b.scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | ((b.scales_h >> (2 * s)) & 3) << 4;
            u->ws[s] = d * static_cast<float>(ls - 32);
            const uint8_t* qs = b.qs + 16 * s;
            int16_t* q = u->q + 32 * s;
#if defined(__AVX2__)  // the 16-entry table lookup as one byte shuffle per 16 values
            const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
            const __m128i lo = _mm_shuffle_epi8(tbl, _mm_and_si128(raw, low4));
            const __m128i hi = _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(raw, 4), low4));
            _mm256_store_si256(reinterpret_cast<__m256i*>(q), _mm256_cvtepi8_epi16(lo));
            _mm256_store_si256(reinterpret_cast<__m256i*>(q + 16), _mm256_cvtepi8_epi16(hi));
#else
            for (int j = 0; j < 16; ++j) {
                q[j] = kvalues_iq4nl[qs[j] & 0xF];
                q[j + 16] = kvalues_iq4nl[qs[j] >> 4];
            }
#endif
        }
    }
};

struct kq_q51 {  // a unit is 8 blocks of 32 (the row's last unit may hold fewer: nblk)
    static constexpr int NB = 8;
    static constexpr bool OFF = true, MINS = false;
    static constexpr size_t BYTES = 8 * sizeof(block_q5_1);
    static void unpack(const uint8_t* p, int nblk, kq_unit* u) {
        for (int s = 0; s < nblk; ++s) {
            const block_q5_1& b = reinterpret_cast<const block_q5_1*>(p)[s];
            const float d = kq_f16(b.d);
            u->ws[s] = d;
            u->mo[s] = kq_f16(b.m) + 16.0f * d;  // 16 d exact: one rounding, as a float add
            uint32_t qh;
            std::memcpy(&qh, b.qh, 4);
            int16_t* q = u->q + 32 * s;
#if defined(__AVX2__)  // lane j's fifth bit: bit j of the word's low (high) half, tested against 1 << j
            const __m256i bits = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, -32768);
            const __m256i v = kq_u8x16(b.qs);
            const __m256i h0 = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16(static_cast<int16_t>(qh & 0xFFFF)), bits), bits);
            const __m256i h1 = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16(static_cast<int16_t>(qh >> 16)), bits), bits);
            const __m256i sixteen = _mm256_set1_epi16(16);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi16(0x0F)), _mm256_and_si256(h0, sixteen));
            const __m256i hi = _mm256_or_si256(_mm256_srli_epi16(v, 4), _mm256_and_si256(h1, sixteen));
            kq_store16(q, _mm256_sub_epi16(lo, sixteen));
            kq_store16(q + 16, _mm256_sub_epi16(hi, sixteen));
            continue;
#endif
            for (int j = 0; j < 16; ++j) {
                q[j] = static_cast<int16_t>(((b.qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16);
                q[j + 16] = static_cast<int16_t>(((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
            }
        }
    }
};

}  // namespace

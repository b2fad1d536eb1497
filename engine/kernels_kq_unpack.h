// engine/kernels_kq_unpack.h — expansion of one unit of a weight row (a 256-element super-block, or a block
// of 32) into int16 values and per-32-block float factors, for the row kernels of engine/kernels_kq.h.
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
//   Q5_1:        q = q5 - 16 (centred, so the offset term is small), ws = d, mo = m + 16 d   (unit = 1 block)
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quants.h"

namespace {

struct kq_unit {
    alignas(64) int16_t q[256];
    alignas(64) int16_t m[256];  // Q2_K's mins (MINS types only)
    alignas(32) float ws[8];
    alignas(32) float ws2[8];
    alignas(32) float mo[8];
};

inline float kq_f16(uint16_t h) { return fp16_to_fp32(h); }

// Q4_K (HIGH false) / Q5_K (HIGH true)
template <bool HIGH>
struct kq_q45k {
    static constexpr int NB = 8;
    static constexpr bool OFF = true, MINS = false;
    using blk = std::conditional_t<HIGH, block_q5_k, block_q4_k>;
    static constexpr size_t BYTES = sizeof(blk);
    static void unpack(const uint8_t* p, kq_unit* u) {
        const blk& b = *reinterpret_cast<const blk*>(p);
        const float d = kq_f16(b.d), dmin = kq_f16(b.dmin);
        for (int s = 0; s < 8; ++s) {
            uint8_t sc, m;
            q4k_scale_min(s, b.scales, &sc, &m);
            u->ws[s] = d * static_cast<float>(sc);
            u->mo[s] = -(dmin * static_cast<float>(m));
        }
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
    static void unpack(const uint8_t* p, kq_unit* u) {
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
    static void unpack(const uint8_t* p, kq_unit* u) {
        const block_q3_k& b = *reinterpret_cast<const block_q3_k*>(p);
        const float d = kq_f16(b.d);
        for (int s = 0; s < 8; ++s) u->ws[s] = d;
        for (int s = 0; s < 8; ++s) {  // block s: bytes of half s / 4, bit pair s % 4, hmask bit s
            const uint8_t* qs = b.qs + (s / 4) * 32;
            const int shift = 2 * (s % 4);
            const int16_t sc0 = static_cast<int16_t>(kq_q3k_scale(b.scales, 2 * s));
            const int16_t sc1 = static_cast<int16_t>(kq_q3k_scale(b.scales, 2 * s + 1));
            int16_t* q = u->q + 32 * s;
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
    static void unpack(const uint8_t* p, kq_unit* u) {
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
    static void unpack(const uint8_t* p, kq_unit* u) {
        const block_iq4_xs& b = *reinterpret_cast<const block_iq4_xs*>(p);
        const float d = kq_f16(b.d);
        for (int s = 0; s < 8; ++s) {
            const int ls = ((b.scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | ((b.scales_h >> (2 * s)) & 3) << 4;
            u->ws[s] = d * static_cast<float>(ls - 32);
            const uint8_t* qs = b.qs + 16 * s;
            int16_t* q = u->q + 32 * s;
            for (int j = 0; j < 16; ++j) {
                q[j] = kvalues_iq4nl[qs[j] & 0xF];
                q[j + 16] = kvalues_iq4nl[qs[j] >> 4];
            }
        }
    }
};

struct kq_q51 {
    static constexpr int NB = 1;
    static constexpr bool OFF = true, MINS = false;
    static constexpr size_t BYTES = sizeof(block_q5_1);
    static void unpack(const uint8_t* p, kq_unit* u) {
        const block_q5_1& b = *reinterpret_cast<const block_q5_1*>(p);
        const float d = kq_f16(b.d);
        u->ws[0] = d;
        u->mo[0] = kq_f16(b.m) + 16.0f * d;  // 16 d exact: one rounding, as a float add
        uint32_t qh;
        std::memcpy(&qh, b.qh, 4);
        for (int j = 0; j < 16; ++j) {
            u->q[j] = static_cast<int16_t>(((b.qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16);
            u->q[j + 16] = static_cast<int16_t>(((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
        }
    }
};

}  // namespace

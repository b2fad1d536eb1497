// engine/cpu/kernels_neon.cpp — the AArch64 NEON (ASIMD) kernel set; compiled for baseline armv8-a (CMakeLists:
// ASIMD is part of every AArch64 CPU, so this set needs no run-time check) and chosen at run time when the
// CPU lacks the dot-product extension's set (kernels_dotprod.cpp builds on this one).
//
// Same arithmetic as the x86 sets (kernels.h): 16-bit activation blocks of 32, integer dot products of the
// weights' values with them, exact int32 sums, the float scales applied once per block.
//  - quantize_q16: the scalar quantiser's steps (max |x|, d = max / 32767, q = round-to-nearest-even of x / d
//    by fcvtns, the sum of q), so the same bits.
//  - Row kernels (Q4_0 / Q4_1 / Q8_0): a weight block widened to 32 int16 values (4-bit values centred, q - 8),
//    smull / smlal against the token's 16-bit activations into 4 int32 lanes, converted to float and
//    accumulated with one fma by dw * da per block; Q4_1's offset m + 8 dw goes through the block sums.
//  - Row-group kernels over packed weights (layout in kernels.cpp, weight_pack): per half group of 8 rows,
//    uzp splits each chunk's element pairs into the pair's first and second elements of the 8 rows, and
//    smlal by lane multiplies them with the token's activation for that element (one vector of 8 activations
//    serves 4 pairs). Per row the integer sum starts at -8 * (the block's activation sum) for 4-bit weights,
//    then acc = fma(float(sum), dw * da, acc) and, for Q4_1, acc = fma(off, dsum, acc) with off = fma(dw, 8, m),
//    in block order: the float steps of the AVX2 and AVX-512 row-group kernels, so all three give the same bits.
//  - f16 helpers by the ASIMD half conversions (fcvtl / fcvtn: round to nearest even, as the scalar set).
//  - Q4_K / Q6_K row-group kernels (kq_groups_neon, kernels_group_kq.h's layout and float steps) by the same
//    loops; the other K types take the scalar row kernels (kernels_kq.h). attn: nullptr (model.cpp's generic path).
#include "kernels.h"
#include "kernels_group_kq.h"

#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>

#include <type_traits>
#include <utility>

#include "kernels_kquant.h"

namespace {

void quantize_q16_neon(const float* x, int64_t k, int16_t* qs, float* d, float* dsum) {
    const int32x4_t qmax = vdupq_n_s32(32767), qmin = vdupq_n_s32(-32767);
    for (int64_t b = 0; b < k / QK32; ++b) {
        const float* xb = x + b * QK32;
        float32x4_t v[8];
        for (int i = 0; i < 8; ++i) v[i] = vld1q_f32(xb + 4 * i);
        float32x4_t m = vabsq_f32(v[0]);
        for (int i = 1; i < 8; ++i) m = vmaxq_f32(m, vabsq_f32(v[i]));
        const float db = vmaxvq_f32(m) / 32767.0f;
        const float32x4_t vid = vdupq_n_f32(db != 0.0f ? 1.0f / db : 0.0f);
        int32x4_t s = vdupq_n_s32(0);
        for (int i = 0; i < 4; ++i) {
            // fcvtns rounds to nearest even, as nearbyint in the default rounding mode; the clamp is the scalar's
            const int32x4_t q0 = vminq_s32(vmaxq_s32(vcvtnq_s32_f32(vmulq_f32(v[2 * i], vid)), qmin), qmax);
            const int32x4_t q1 = vminq_s32(vmaxq_s32(vcvtnq_s32_f32(vmulq_f32(v[2 * i + 1], vid)), qmin), qmax);
            s = vaddq_s32(s, vaddq_s32(q0, q1));
            vst1q_s16(qs + b * QK32 + 8 * i, vcombine_s16(vmovn_s32(q0), vmovn_s32(q1)));
        }
        d[b] = db;
        dsum[b] = db * static_cast<float>(vaddvq_s32(s));
    }
}

inline float half_to_float(uint16_t h) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); }

// A weight block as 4 vectors of 8 int16: elements 0..7, 8..15, 16..23, 24..31 (4-bit values centred).
template <int KIND>
inline void widen_block(const uint8_t* blk, int16x8_t* w) {
    if constexpr (KIND == 2) {
        const int8x16_t lo = vld1q_s8(reinterpret_cast<const block_q8_0*>(blk)->qs);
        const int8x16_t hi = vld1q_s8(reinterpret_cast<const block_q8_0*>(blk)->qs + 16);
        w[0] = vmovl_s8(vget_low_s8(lo));
        w[1] = vmovl_high_s8(lo);
        w[2] = vmovl_s8(vget_low_s8(hi));
        w[3] = vmovl_high_s8(hi);
    } else {
        const uint8_t* q = KIND == 0 ? reinterpret_cast<const block_q4_0*>(blk)->qs
                                     : reinterpret_cast<const block_q4_1*>(blk)->qs;
        const uint8x16_t v = vld1q_u8(q);
        const int8x16_t eight = vdupq_n_s8(8);
        const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))), eight);  // elements 0..15
        const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), eight);              // elements 16..31
        w[0] = vmovl_s8(vget_low_s8(lo));
        w[1] = vmovl_high_s8(lo);
        w[2] = vmovl_s8(vget_low_s8(hi));
        w[3] = vmovl_high_s8(hi);
    }
}

template <int KIND, int T>
void row_kernel(const uint8_t* w, const act_q16& a, int64_t t0, float* y, size_t y_stride) {
    using blk = std::conditional_t<KIND == 0, block_q4_0, std::conditional_t<KIND == 1, block_q4_1, block_q8_0>>;
    const blk* wb = reinterpret_cast<const blk*>(w);
    const int64_t nb = a.k / QK32;
    float32x4_t acc[T];
    float acc_off[T];
    for (int t = 0; t < T; ++t) {
        acc[t] = vdupq_n_f32(0.0f);
        acc_off[t] = 0.0f;
    }
    for (int64_t b = 0; b < nb; ++b) {
        int16x8_t wv[4];
        widen_block<KIND>(reinterpret_cast<const uint8_t*>(wb + b), wv);
        const float dw = half_to_float(wb[b].d);
        for (int t = 0; t < T; ++t) {
            const int16_t* q = a.qs + (t0 + t) * a.k + b * QK32;
            int32x4_t p = vmull_s16(vget_low_s16(wv[0]), vld1_s16(q));
            for (int i = 0; i < 4; ++i) {
                const int16x8_t av = vld1q_s16(q + 8 * i);
                if (i > 0) p = vmlal_s16(p, vget_low_s16(wv[i]), vget_low_s16(av));
                p = vmlal_high_s16(p, wv[i], av);
            }
            acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(p), vdupq_n_f32(dw * a.d[(t0 + t) * nb + b]));
        }
        if constexpr (KIND == 1) {
            const float off = half_to_float(wb[b].m) + 8.0f * dw;
            for (int t = 0; t < T; ++t) acc_off[t] += off * a.dsum[(t0 + t) * nb + b];
        }
    }
    for (int t = 0; t < T; ++t) y[t * y_stride] = vaddvq_f32(acc[t]) + acc_off[t];
}

// Calls tile(std::integral_constant<int, T>{}, done) for tiles of T = 4 tokens (the last one shorter) that
// start at token `done` of n_tok; a token's result never depends on the split.
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

template <int KIND>
void row_dispatch(const uint8_t* w, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    tile_walk(n_tok, [&](auto tile, int done) {
        row_kernel<KIND, decltype(tile)::value>(w, a, t0 + done, y + size_t(done) * y_stride, y_stride);
    });
}

float dot_f32_neon(const float* a, const float* b, int64_t n) {
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        for (int j = 0; j < 4; ++j) acc[j] = vfmaq_f32(acc[j], vld1q_f32(a + i + 4 * j), vld1q_f32(b + i + 4 * j));
    }
    for (; i + 4 <= n; i += 4) acc[0] = vfmaq_f32(acc[0], vld1q_f32(a + i), vld1q_f32(b + i));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

inline float32x4_t load_half4(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

float dot_f16_f32_neon(const uint16_t* a, const float* b, int64_t n) {
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        acc0 = vfmaq_f32(acc0, load_half4(a + i), vld1q_f32(b + i));
        acc1 = vfmaq_f32(acc1, load_half4(a + i + 4), vld1q_f32(b + i + 4));
    }
    float s = vaddvq_f32(vaddq_f32(acc0, acc1));
    for (; i < n; ++i) s += half_to_float(a[i]) * b[i];
    return s;
}

void axpy_f16_neon(float a, const uint16_t* x, float* y, int64_t n) {
    const float32x4_t va = vdupq_n_f32(a);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), va, load_half4(x + i)));
    for (; i < n; ++i) y[i] += a * half_to_float(x[i]);
}

void fp32_to_fp16_row_neon(const float* x, uint16_t* y, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

// s[0] (rows 0..3 of the half) and s[1] (rows 4..7) += e0 * lane L of av + e1 * lane L + 1, where e0 / e1
// hold the first / second element of a pair for the half's 8 rows
template <int L>
inline void pair_mac(int32x4_t* s, int16x8_t e0, int16x8_t e1, int16x8_t av) {
    s[0] = vmlal_laneq_s16(s[0], vget_low_s16(e0), av, L);
    s[1] = vmlal_high_laneq_s16(s[1], e0, av, L);
    s[0] = vmlal_laneq_s16(s[0], vget_low_s16(e1), av, L + 1);
    s[1] = vmlal_high_laneq_s16(s[1], e1, av, L + 1);
}

template <int P, int T>
inline void pair_mac_all(int32x4_t (*s)[2], int16x8_t e0, int16x8_t e1, const int16x8_t* av) {
    for (int t = 0; t < T; ++t) pair_mac<2 * P>(s[t], e0, e1, av[t]);
}

// Row-group kernel, rows 8 half .. 8 half + 7 of a group for T tokens (contract at the top of this file).
// KIND: 0 Q4_0, 1 Q4_1, 2 Q8_0 (weight_pack's layout, kernels.cpp); 3 Q4_K, 4 Q6_K (kernels_group_kq.h: the
// same quant layouts, 4-bit as Q4_0's and int8 as Q8_0's, with fp32 factors; Q4_K: acc = fma(float(s), ws * da,
// acc), acc = fma(off, dsum, acc); Q6_K: chunks 0..7 and 8..15 summed apart, acc = fma(float(s0), d0 * da, acc),
// acc = fma(float(s1), d1 * da, acc)): the scalar reference's steps, so its bits.
template <int KIND, int T>
void group_half(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, int half, float* y, size_t y_stride) {
    constexpr bool BYTES = KIND == 2 || KIND == 4;  // int8 values (Q8_0's layout), else 4-bit words
    constexpr size_t SB = KIND == 2 ? 32 : KIND >= 3 ? 128 : 64, QB = BYTES ? 512 : 256, GB = SB + QB;
    float32x4_t acc[T][2];
    for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* gb = g + size_t(b) * GB;
        const float* gf = reinterpret_cast<const float*>(gb);
        const uint8_t* q = gb + SB;
        int32x4_t s[T][2];
        const int16_t* aq[T];
        for (int t = 0; t < T; ++t) {
            s[t][0] = s[t][1] = vdupq_n_s32(BYTES ? 0 : -8 * a.isum[(t0 + t) * nb + b]);
            aq[t] = a.qs + (t0 + t) * a.k + b * QK32;
        }
        // acc += float(s) * (dw * da) per token, for the rows' factors dw (8 lanes in two vectors)
        const auto scale_in = [&](float32x4_t dw0, float32x4_t dw1) {
            for (int t = 0; t < T; ++t) {
                const float32x4_t da = vdupq_n_f32(a.d[(t0 + t) * nb + b]);
                acc[t][0] = vfmaq_f32(acc[t][0], vcvtq_f32_s32(s[t][0]), vmulq_f32(dw0, da));
                acc[t][1] = vfmaq_f32(acc[t][1], vcvtq_f32_s32(s[t][1]), vmulq_f32(dw1, da));
            }
        };
        for (int c = 0; c < 4; ++c) {  // activations 8c .. 8c + 7: element pairs 4c .. 4c + 3
            int16x8_t av[T];
            for (int t = 0; t < T; ++t) av[t] = vld1q_s16(aq[t] + 8 * c);
            if constexpr (BYTES) {
                // chunk j = 4c + p: byte 2r + e is element 2j + e of row r; this half's 16 bytes are rows 8h..8h+7
                [&]<int... P>(std::integer_sequence<int, P...>) {
                    ((void)[&] {
                        const int8x16_t v = vld1q_s8(reinterpret_cast<const int8_t*>(q + 32 * (4 * c + P) + 16 * half));
                        const int16x8_t e0 = vmovl_s8(vget_low_s8(vuzp1q_s8(v, v)));
                        const int16x8_t e1 = vmovl_s8(vget_low_s8(vuzp2q_s8(v, v)));
                        pair_mac_all<P, T>(s, e0, e1, av);
                    }(), ...);
                }(std::make_integer_sequence<int, 4>{});
                if (KIND == 4 && c == 1) {  // Q6_K: the first 16-element sub-block is complete
                    scale_in(vld1q_f32(gf + 8 * half), vld1q_f32(gf + 8 * half + 4));
                    for (int t = 0; t < T; ++t) s[t][0] = s[t][1] = vdupq_n_s32(0);
                }
            } else {
                // chunk c: word 2r + e holds element 2 (4c + n) + e of row r in nibble n; this half's words are
                // 2 vectors of 4 rows each; uzp puts e = 0 of the 8 rows in u0, e = 1 in u1
                const uint16x8_t w0 = vld1q_u16(reinterpret_cast<const uint16_t*>(q + 64 * c + 32 * half));
                const uint16x8_t w1 = vld1q_u16(reinterpret_cast<const uint16_t*>(q + 64 * c + 32 * half + 16));
                const uint16x8_t u0 = vuzp1q_u16(w0, w1), u1 = vuzp2q_u16(w0, w1);
                const uint16x8_t low4 = vdupq_n_u16(0x000F);
                pair_mac_all<0, T>(s, vreinterpretq_s16_u16(vandq_u16(u0, low4)), vreinterpretq_s16_u16(vandq_u16(u1, low4)), av);
                pair_mac_all<1, T>(s, vreinterpretq_s16_u16(vandq_u16(vshrq_n_u16(u0, 4), low4)),
                                   vreinterpretq_s16_u16(vandq_u16(vshrq_n_u16(u1, 4), low4)), av);
                pair_mac_all<2, T>(s, vreinterpretq_s16_u16(vandq_u16(vshrq_n_u16(u0, 8), low4)),
                                   vreinterpretq_s16_u16(vandq_u16(vshrq_n_u16(u1, 8), low4)), av);
                pair_mac_all<3, T>(s, vreinterpretq_s16_u16(vshrq_n_u16(u0, 12)), vreinterpretq_s16_u16(vshrq_n_u16(u1, 12)), av);
            }
        }
        float32x4_t off[2];
        if constexpr (KIND == 0 || KIND == 3) {  // fp32 factors (Q4_K: ws, then off)
            scale_in(vld1q_f32(gf + 8 * half), vld1q_f32(gf + 8 * half + 4));
            if constexpr (KIND == 3) {
                off[0] = vld1q_f32(gf + 16 + 8 * half);
                off[1] = vld1q_f32(gf + 16 + 8 * half + 4);
            }
        } else if constexpr (KIND == 4) {  // Q6_K: the second sub-block's d1
            scale_in(vld1q_f32(gf + 16 + 8 * half), vld1q_f32(gf + 16 + 8 * half + 4));
        } else {  // half scales (Q8_0, Q4_1's d); Q4_1: off = m + 8 d (8 d exact: one rounding, as a float add)
            const uint16_t* dh = reinterpret_cast<const uint16_t*>(gb) + 8 * half;
            const float32x4_t dw0 = load_half4(dh), dw1 = load_half4(dh + 4);
            scale_in(dw0, dw1);
            if constexpr (KIND == 1) {
                const float32x4_t eight = vdupq_n_f32(8.0f);
                off[0] = vfmaq_f32(load_half4(dh + 16), dw0, eight);
                off[1] = vfmaq_f32(load_half4(dh + 20), dw1, eight);
            }
        }
        if constexpr (KIND == 1 || KIND == 3) {
            for (int t = 0; t < T; ++t) {
                const float32x4_t ds = vdupq_n_f32(a.dsum[(t0 + t) * nb + b]);
                acc[t][0] = vfmaq_f32(acc[t][0], off[0], ds);
                acc[t][1] = vfmaq_f32(acc[t][1], off[1], ds);
            }
        }
    }
    for (int t = 0; t < T; ++t) {
        vst1q_f32(y + size_t(t) * y_stride + 8 * half, acc[t][0]);
        vst1q_f32(y + size_t(t) * y_stride + 8 * half + 4, acc[t][1]);
    }
}

template <int KIND>
void group_dispatch(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    tile_walk(n_tok, [&](auto tile, int done) {
        constexpr int T = decltype(tile)::value;
        float* yt = y + size_t(done) * y_stride;
        group_half<KIND, T>(g, nb, a, t0 + done, 0, yt, y_stride);
        group_half<KIND, T>(g, nb, a, t0 + done, 1, yt, y_stride);
    });
}

const kernel_set NEON_SET = {
    "neon",          quantize_q16_neon,    row_dispatch<0>,  row_dispatch<1>,        row_dispatch<2>,
    row_q45k_kq<0>,  row_q45k_kq<1>,       row_q6k_kq,
    dot_f32_neon,    dot_f16_f32_neon,     axpy_f16_neon,    fp32_to_fp16_row_neon,
    nullptr,         group_dispatch<0>,    group_dispatch<1>, group_dispatch<2>,
};

// The dotprod set: this set's kernels (its 16-bit activations do not fit sdot's 8-bit lanes) plus, with
// `--act-bits 8`, the sdot row-group kernels of kernels_dotprod.cpp (kernels_act8.h, group8_fn). Defined here,
// in the baseline file, so that nothing compiled for armv8.2 runs before the CPU has been asked.
const kernel_set DOTPROD_SET = {
    "dotprod",       quantize_q16_neon,    row_dispatch<0>,  row_dispatch<1>,        row_dispatch<2>,
    row_q45k_kq<0>,  row_q45k_kq<1>,       row_q6k_kq,
    dot_f32_neon,    dot_f16_f32_neon,     axpy_f16_neon,    fp32_to_fp16_row_neon,
    nullptr,         group_dispatch<0>,    group_dispatch<1>, group_dispatch<2>,
};

const kq_group_set KQ_GROUP_NEON = {group_dispatch<3>, group_dispatch<4>};

}  // namespace

const kernel_set* kernels_neon() { return &NEON_SET; }
const kernel_set* kernels_dotprod() { return &DOTPROD_SET; }
const kq_group_set* kq_groups_neon() { return &KQ_GROUP_NEON; }

#else

const kernel_set* kernels_neon() { return nullptr; }
const kernel_set* kernels_dotprod() { return nullptr; }
const kq_group_set* kq_groups_neon() { return nullptr; }

#endif

// engine/cpu/kernels_dotprod.cpp — the dotprod set's sdot kernels (FEAT_DotProd, armv8.2-a+dotprod: CMakeLists
// compiles this file alone with that flag); the rest of the set is the NEON set's (kernels_neon.cpp). Called
// only when kernels_get() is the dotprod set, which it is only when getauxval(AT_HWCAP) has ASIMDDP.
//
// The 8-bit row-group kernels of `--act-bits 8` (contract and the 8-bit layout in kernels_act8.h): the layout
// puts 4 consecutive elements of a row in one 32-bit lane, which is sdot's shape: one sdot by lane covers 4
// rows x 4 elements against 4 of the token's int8 activations (16 products; the 16-bit NEON kernels' smlal
// does 4). Per half group of 8 rows, block and token: the exact int32 sums start at -8 * (the block's
// activation sum) for 4-bit weights (stored 0..15; Q8_0's bytes are stored plus 128, so xor 0x80 gives the
// signed value back and the sum needs no offset), then acc = fma(float(sum), dw * da, acc) and, for Q4_1,
// acc = fma(off, dsum, acc) with off = fma(dw, 8, m), in block order: the 16-bit row-group kernels' float
// steps over the same integer sums, so the same bits (tests/engine/act8_test.cpp).
#include "kernels_act8.h"

#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)

#include <arm_neon.h>

#include <type_traits>
#include <utility>

namespace {

inline float32x4_t load_half4(const uint8_t* p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p))));
}

// s[0] (rows 0..3 of the half) += w0 . group L of av, s[1] (rows 4..7) += w1 . group L
template <int L>
inline void dot_rows(int32x4_t* s, int8x16_t w0, int8x16_t w1, int8x16_t av) {
    s[0] = vdotq_laneq_s32(s[0], w0, av, L);
    s[1] = vdotq_laneq_s32(s[1], w1, av, L);
}

// Rows 8 half .. 8 half + 7 of a group in the 8-bit layout for T tokens.
template <int KIND, int T>
void group8_half(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, int half, float* y, size_t y_stride) {
    constexpr size_t SB = KIND == 2 ? 32 : 64, QB = KIND == 2 ? 512 : 256, GB = SB + QB;
    float32x4_t acc[T][2];
    for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* gb = g + size_t(b) * GB;
        const uint8_t* q = gb + SB + 32 * half;  // vector j's bytes for this half: q + 64 j, 32 bytes (8 rows x 4)
        int32x4_t s[T][2];
        int8x16_t av[T][2];  // the block's activations: elements 0..15 (groups 0..3), 16..31 (groups 4..7)
        for (int t = 0; t < T; ++t) {
            s[t][0] = s[t][1] = vdupq_n_s32(KIND == 2 ? 0 : -8 * a.isum[(t0 + t) * nb + b]);
            const int8_t* a8 = a.qs8 + (t0 + t) * a.k + b * QK32;
            av[t][0] = vld1q_s8(a8);
            av[t][1] = vld1q_s8(a8 + 16);
        }
        if constexpr (KIND == 2) {
            // vector j: elements 4j .. 4j + 3 of each row, the activations' group j
            const int8x16_t flip = vdupq_n_s8(int8_t(-128));
            [&]<int... J>(std::integer_sequence<int, J...>) {
                ((void)[&] {
                    const int8x16_t w0 = veorq_s8(vld1q_s8(reinterpret_cast<const int8_t*>(q + 64 * J)), flip);
                    const int8x16_t w1 = veorq_s8(vld1q_s8(reinterpret_cast<const int8_t*>(q + 64 * J + 16)), flip);
                    for (int t = 0; t < T; ++t) dot_rows<J % 4>(s[t], w0, w1, av[t][J / 4]);
                }(), ...);
            }(std::make_integer_sequence<int, 8>{});
        } else {
            // vector c: elements 8c + i in the low nibbles (group 2c), 8c + 4 + i in the high ones (group 2c + 1)
            const uint8x16_t low4 = vdupq_n_u8(0x0F);
            [&]<int... C>(std::integer_sequence<int, C...>) {
                ((void)[&] {
                    const uint8x16_t v0 = vld1q_u8(q + 64 * C), v1 = vld1q_u8(q + 64 * C + 16);
                    const int8x16_t lo0 = vreinterpretq_s8_u8(vandq_u8(v0, low4)), lo1 = vreinterpretq_s8_u8(vandq_u8(v1, low4));
                    const int8x16_t hi0 = vreinterpretq_s8_u8(vshrq_n_u8(v0, 4)), hi1 = vreinterpretq_s8_u8(vshrq_n_u8(v1, 4));
                    for (int t = 0; t < T; ++t) {
                        dot_rows<(2 * C) % 4>(s[t], lo0, lo1, av[t][C / 2]);
                        dot_rows<(2 * C + 1) % 4>(s[t], hi0, hi1, av[t][C / 2]);
                    }
                }(), ...);
            }(std::make_integer_sequence<int, 4>{});
        }
        float32x4_t dw[2], off[2];
        if constexpr (KIND == 0) {  // float scales
            dw[0] = vld1q_f32(reinterpret_cast<const float*>(gb) + 8 * half);
            dw[1] = vld1q_f32(reinterpret_cast<const float*>(gb) + 8 * half + 4);
        } else {  // half scales; Q4_1: off = m + 8 d
            dw[0] = load_half4(gb + 16 * half);
            dw[1] = load_half4(gb + 16 * half + 8);
            if constexpr (KIND == 1) {
                const float32x4_t eight = vdupq_n_f32(8.0f);
                off[0] = vfmaq_f32(load_half4(gb + 32 + 16 * half), dw[0], eight);
                off[1] = vfmaq_f32(load_half4(gb + 32 + 16 * half + 8), dw[1], eight);
            }
        }
        for (int t = 0; t < T; ++t) {
            const float32x4_t da = vdupq_n_f32(a.d[(t0 + t) * nb + b]);
            for (int i = 0; i < 2; ++i) {
                acc[t][i] = vfmaq_f32(acc[t][i], vcvtq_f32_s32(s[t][i]), vmulq_f32(dw[i], da));
                if constexpr (KIND == 1) acc[t][i] = vfmaq_f32(acc[t][i], off[i], vdupq_n_f32(a.dsum[(t0 + t) * nb + b]));
            }
        }
    }
    for (int t = 0; t < T; ++t) {
        vst1q_f32(y + size_t(t) * y_stride + 8 * half, acc[t][0]);
        vst1q_f32(y + size_t(t) * y_stride + 8 * half + 4, acc[t][1]);
    }
}

// tiles of up to 4 tokens; each token's result is the same in any tile
template <int KIND>
void group8(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    for (int done = 0; done < n_tok;) {
        const int n = n_tok - done < 4 ? n_tok - done : 4;
        float* yt = y + size_t(done) * y_stride;
        for (int half = 0; half < 2; ++half) {
            switch (n) {
            case 1: group8_half<KIND, 1>(g, nb, a, t0 + done, half, yt, y_stride); break;
            case 2: group8_half<KIND, 2>(g, nb, a, t0 + done, half, yt, y_stride); break;
            case 3: group8_half<KIND, 3>(g, nb, a, t0 + done, half, yt, y_stride); break;
            default: group8_half<KIND, 4>(g, nb, a, t0 + done, half, yt, y_stride); break;
            }
        }
        done += n;
    }
}

const mm_group_fn ACT8_DOTPROD[3] = {group8<0>, group8<1>, group8<2>};

}  // namespace

const mm_group_fn* kernels_act8_dotprod() { return ACT8_DOTPROD; }

#else

const mm_group_fn* kernels_act8_dotprod() { return nullptr; }

#endif

// engine/kernels_avx2.cpp — AVX2 + FMA + F16C kernel set; compiled with -mavx2 -mfma -mf16c (CMakeLists),
// chosen at run time when the CPU has AVX2 but not AVX-512 VNNI (kernels.cpp).
//
// Same arithmetic as the AVX-512 set: each 32-element weight block is widened to 32 int16 lanes (two ymm)
// (4-bit values centred, q - 8) and multiplied with the token's 16-bit activations by pmaddwd (s16 x s16
// pairs -> int32), converted to float and scaled by the block's dw; Q4_1's offset m + 8 dw goes through
// the activation block sums.
#include "kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>

#include <type_traits>

#include "kernels_kquant.h"

namespace {

inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

void quantize_q16_avx2(const float* x, int64_t k, int16_t* qs, float* d, float* dsum) {
    const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (int64_t b = 0; b < k / QK32; ++b) {
        const float* xb = x + b * QK32;
        __m256 ax = _mm256_and_ps(_mm256_loadu_ps(xb), sign_mask);
        for (int j = 8; j < QK32; j += 8) ax = _mm256_max_ps(ax, _mm256_and_ps(_mm256_loadu_ps(xb + j), sign_mask));
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(ax), _mm256_extractf128_ps(ax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float db = _mm_cvtss_f32(m) / 32767.0f;
        const __m256 vid = _mm256_set1_ps(db != 0.0f ? 1.0f / db : 0.0f);
        __m256i s = _mm256_setzero_si256();
        for (int j = 0; j < QK32; j += 16) {
            const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j), vid));
            const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j + 8), vid));
            s = _mm256_add_epi32(s, _mm256_add_epi32(q0, q1));
            // packs interleaves 128-bit lanes: permute back to element order
            const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * QK32 + j), p);
        }
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        d[b] = db;
        dsum[b] = db * static_cast<float>(_mm_cvtsi128_si32(s4));
    }
}

template <int KIND, int T>
void row_kernel(const uint8_t* w, const act_q16& a, int64_t t0, float* y, size_t y_stride) {
    using blk = std::conditional_t<KIND == 0, block_q4_0, std::conditional_t<KIND == 1, block_q4_1, block_q8_0>>;
    const blk* wb = reinterpret_cast<const blk*>(w);
    const int64_t nb = a.k / QK32;
    __m256 acc[T];
    float acc_off[T];
    for (int t = 0; t < T; ++t) {
        acc[t] = _mm256_setzero_ps();
        acc_off[t] = 0.0f;
    }
    for (int64_t b = 0; b < nb; ++b) {
        __m256i w0, w1;  // elements 0..15, 16..31 as int16
        if constexpr (KIND == 2) {
            w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[b].qs)));
            w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[b].qs + 16)));
        } else {
            const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[b].qs));
            const __m128i mk = _mm_set1_epi8(0x0F);
            const __m256i eight = _mm256_set1_epi16(8);  // centred: q - 8
            w0 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_and_si128(v, mk)), eight);
            w1 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), mk)), eight);
        }
        const float dw = _cvtsh_ss(wb[b].d);
        for (int t = 0; t < T; ++t) {
            const __m256 sc = _mm256_set1_ps(dw * a.d[(t0 + t) * nb + b]);
            const int16_t* q = a.qs + (t0 + t) * a.k + b * QK32;
            const __m256i p0 = _mm256_madd_epi16(w0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
            const __m256i p1 = _mm256_madd_epi16(w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 16)));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(p0, p1)), sc, acc[t]);
        }
        if constexpr (KIND == 1) {
            const float off = _cvtsh_ss(wb[b].m) + 8.0f * dw;
            for (int t = 0; t < T; ++t) acc_off[t] += off * a.dsum[(t0 + t) * nb + b];
        }
    }
    for (int t = 0; t < T; ++t) y[t * y_stride] = hsum8(acc[t]) + acc_off[t];
}

// up to 4 tokens at once (16 ymm registers); larger tiles in runs of 4 (per-token arithmetic is the same)
template <int KIND>
void row_dispatch(const uint8_t* w, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    for (int done = 0; done < n_tok; done += 4) {
        const int n = n_tok - done < 4 ? n_tok - done : 4;
        float* yy = y + size_t(done) * y_stride;
        switch (n) {
        case 1: row_kernel<KIND, 1>(w, a, t0 + done, yy, y_stride); break;
        case 2: row_kernel<KIND, 2>(w, a, t0 + done, yy, y_stride); break;
        case 3: row_kernel<KIND, 3>(w, a, t0 + done, yy, y_stride); break;
        default: row_kernel<KIND, 4>(w, a, t0 + done, yy, y_stride); break;
        }
    }
}

float dot_f32_avx2(const float* a, const float* b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum8(acc);
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

float dot_f16_f32_avx2(const uint16_t* a, const float* b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 av = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
        acc = _mm256_fmadd_ps(av, _mm256_loadu_ps(b + i), acc);
    }
    float s = hsum8(acc);
    for (; i < n; ++i) s += _cvtsh_ss(a[i]) * b[i];
    return s;
}

void axpy_f16_avx2(float a, const uint16_t* x, float* y, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, xv, _mm256_loadu_ps(y + i)));
    }
    for (; i < n; ++i) y[i] += a * _cvtsh_ss(x[i]);
}

void fp32_to_fp16_row_avx2(const float* x, uint16_t* y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

// Row-group kernel over packed weights (layout in kernels.cpp, weight_pack), the AVX-512 set's arithmetic on
// 8-row halves: in each 64-byte chunk the first 32 bytes are rows 0..7's words, the next 32 rows 8..15's.
// Per half, block and token: the 16 element pairs go through pmaddwd (8 int32 row lanes) and paddd into an
// exact integer sum that starts at -8 * (the block's activation sum) for 4-bit weights; then
// acc += float(sum) * (dw * da) and, for Q4_1, acc += off * dsum, in block order: per row the same float
// steps as the AVX-512 kernel, so the two sets give the same bits. Tiles of up to 4 tokens (16 ymm).
using pair16 = int32_t __attribute__((may_alias, aligned(4)));

template <int KIND, int T>
void group_half(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, int half, float* y, size_t y_stride) {
    constexpr size_t SB = KIND == 1 ? 128 : 64, QB = KIND == 2 ? 512 : 256, GB = SB + QB;
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
            for (int t = 0; t < T; ++t) s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(v, _mm256_set1_epi32(ap[t][j])));
        };
        if constexpr (KIND == 2) {
            for (int j = 0; j < 16; ++j) {
                dot(j, _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(q + 32 * j + 16 * half))));
            }
        } else {
            for (int c = 0; c < 4; ++c) {
                const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 64 * c + 32 * half));
                dot(4 * c + 0, _mm256_and_si256(w, low4));
                dot(4 * c + 1, _mm256_and_si256(_mm256_srli_epi16(w, 4), low4));
                dot(4 * c + 2, _mm256_and_si256(_mm256_srli_epi16(w, 8), low4));
                dot(4 * c + 3, _mm256_srli_epi16(w, 12));
            }
        }
        const __m256 dw = _mm256_load_ps(reinterpret_cast<const float*>(gb) + 8 * half);
        for (int t = 0; t < T; ++t) {
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), _mm256_mul_ps(dw, _mm256_set1_ps(ad[t * nb + b])), acc[t]);
            if constexpr (KIND == 1) {
                const __m256 off = _mm256_load_ps(reinterpret_cast<const float*>(gb + 64) + 8 * half);
                acc[t] = _mm256_fmadd_ps(off, _mm256_set1_ps(as[t * nb + b]), acc[t]);
            }
        }
    }
    for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + size_t(t) * y_stride + 8 * half, acc[t]);
}

template <int KIND, int T>
void group_tile(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, float* y, size_t y_stride) {
    group_half<KIND, T>(g, nb, a, t0, 0, y, y_stride);
    group_half<KIND, T>(g, nb, a, t0, 1, y, y_stride);
}

template <int KIND>
void group_dispatch(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    for (int done = 0; done < n_tok;) {  // tiles of 4: each token's result does not depend on the split
        const int n = n_tok - done < 4 ? n_tok - done : 4;
        float* yt = y + size_t(done) * y_stride;
        switch (n) {
        case 1: group_tile<KIND, 1>(g, nb, a, t0 + done, yt, y_stride); break;
        case 2: group_tile<KIND, 2>(g, nb, a, t0 + done, yt, y_stride); break;
        case 3: group_tile<KIND, 3>(g, nb, a, t0 + done, yt, y_stride); break;
        default: group_tile<KIND, 4>(g, nb, a, t0 + done, yt, y_stride); break;
        }
        done += n;
    }
}

const kernel_set AVX2_SET = {
    "avx2",          quantize_q16_avx2,    row_dispatch<0>,  row_dispatch<1>,        row_dispatch<2>,
    row_q45k_kq<0>, row_q45k_kq<1>, row_q6k_kq,
    dot_f32_avx2,    dot_f16_f32_avx2,     axpy_f16_avx2,    fp32_to_fp16_row_avx2,
    nullptr,         group_dispatch<0>,    group_dispatch<1>, group_dispatch<2>,
};

}  // namespace

const kernel_set* kernels_avx2() { return &AVX2_SET; }

#else

const kernel_set* kernels_avx2() { return nullptr; }

#endif

// engine/cpu/kernels_act8_avx2.cpp — the 8-bit-activation row-group kernels and quantiser in plain AVX2 (layout and
// arithmetic in kernels_act8_avx2.h); compiled with -mavx2 -mfma -mf16c (CMakeLists.txt) and chosen only with
// the AVX2 kernel set.
#include "kernels_act8.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include "kernels_act8_avx2.h"

namespace {

// quantize_act8 in AVX2: the scalar one's steps (max |x| over the block, d = max / 127, x * (1 / d) rounded to
// nearest even, clamped to +-127), so the same values bit for bit
void quantize_act8_avx2(const float* x, int64_t k, int16_t* qs, int8_t* qs8, float* d, float* dsum) {
    const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
    for (int64_t b = 0; b < k / QK32; ++b) {
        const float* xb = x + b * QK32;
        __m256 xv[4];
        for (int j = 0; j < 4; ++j) xv[j] = _mm256_loadu_ps(xb + 8 * j);
        const __m256 ax = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(xv[0], sign_mask), _mm256_and_ps(xv[1], sign_mask)),
                                        _mm256_max_ps(_mm256_and_ps(xv[2], sign_mask), _mm256_and_ps(xv[3], sign_mask)));
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(ax), _mm256_extractf128_ps(ax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float db = _mm_cvtss_f32(m) / 127.0f;
        const __m256 vid = _mm256_set1_ps(db != 0.0f ? 1.0f / db : 0.0f);
        __m256i q[4];
        for (int j = 0; j < 4; ++j) q[j] = _mm256_max_epi32(lo, _mm256_min_epi32(hi, _mm256_cvtps_epi32(_mm256_mul_ps(xv[j], vid))));
        // packs interleaves 128-bit lanes: permute back to element order
        const __m256i w01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
        const __m256i w23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * QK32), w01);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * QK32 + 16), w23);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs8 + b * QK32), _mm256_permute4x64_epi64(_mm256_packs_epi16(w01, w23), 0xD8));
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        d[b] = db;
        dsum[b] = db * static_cast<float>(_mm_cvtsi128_si32(s4));
    }
}

const mm_group_fn ACT8_AVX2[3] = {group8_dispatch<0, false>, group8_dispatch<1, false>, nullptr};

}  // namespace

const mm_group_fn* kernels_act8_avx2() { return ACT8_AVX2; }
act8_quantize_fn kernels_act8_quantize_avx2() { return quantize_act8_avx2; }

#else

const mm_group_fn* kernels_act8_avx2() { return nullptr; }
act8_quantize_fn kernels_act8_quantize_avx2() { return nullptr; }

#endif

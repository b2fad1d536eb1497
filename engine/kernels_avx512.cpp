// engine/kernels_avx512.cpp — AVX-512 (F/BW/VL/DQ) + VNNI kernel set; compiled with -mavx512* (CMakeLists),
// chosen at run time only when CPUID and XGETBV report the features (kernels.cpp).
//
// Row kernels: each 32-element weight block is widened once to 32 int16 lanes (4-bit values centred, q - 8)
// and used against each token of the tile with vpdpwssd (s16 x s16 -> 16 int32 lanes), converted to float
// and scaled by the block's dw; Q4_1's offset (m + 8 dw, small once q is centred, so little cancellation)
// is folded per block through the activation block sums; the token's scale multiplies the total once.
#include "kernels.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__)

// GCC 12 reports its own intrinsics' _mm512_undefined_*() placeholders (cvtph_ps, cvtps_ph, insert/extract,
// cvtepi32_ps) as uninitialised once they are inlined here: a known false positive, silenced for this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <type_traits>

namespace {

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

void quantize_q16_avx512(const float* x, int64_t k, int16_t* qs, float* d, int32_t* sum) {
    const __m512 sign_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    __m512 ax = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 16) ax = _mm512_max_ps(ax, _mm512_and_ps(_mm512_loadu_ps(x + i), sign_mask));
    const float amax = _mm512_reduce_max_ps(ax);
    const float dt = amax / 32767.0f;
    const __m512 vid = _mm512_set1_ps(dt != 0.0f ? 1.0f / dt : 0.0f);
    for (int64_t b = 0; b < k / QK32; ++b) {
        // cvtps_epi32 rounds to nearest even under the default MXCSR, as nearbyint does in the scalar set
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + b * QK32), vid));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + b * QK32 + 16), vid));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * QK32), _mm512_cvtsepi32_epi16(q0));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * QK32 + 16), _mm512_cvtsepi32_epi16(q1));
        sum[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
    *d = dt;
}

// 16 packed nibbles -> 32 int16 lanes in element order: low nibbles are elements 0..15, high ones 16..31
inline __m512i unpack_nibbles16(const uint8_t* qs) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i m = _mm_set1_epi8(0x0F);
    return _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m)));
}

// Offset multipliers of up to this many blocks live on the stack (K up to 64Ki elements); longer rows are
// split into runs of this many blocks.
constexpr int64_t ROW_MAX_BLOCKS = 2048;

// KIND 0: Q4_0, 1: Q4_1, 2: Q8_0.  T tokens of the tile at once, blocks [b0, b1) of the row.
template <int KIND, int T>
void row_run(const uint8_t* w, const act_q16& a, int64_t t0, int64_t b0, int64_t b1, float* part) {
    using blk = std::conditional_t<KIND == 0, block_q4_0, std::conditional_t<KIND == 1, block_q4_1, block_q8_0>>;
    const blk* wb = reinterpret_cast<const blk*>(w);
    const int64_t nb = a.k / QK32;
    alignas(64) float offs[ROW_MAX_BLOCKS + 16];
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = b0; b < b1; ++b) {
        __m512i wv;
        if constexpr (KIND == 2) {
            wv = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[b].qs)));
        } else {
            wv = _mm512_sub_epi16(unpack_nibbles16(wb[b].qs), _mm512_set1_epi16(8));  // centred: q - 8
        }
        const float dw = h2f(wb[b].d);
        const __m512 dwv = _mm512_set1_ps(dw);
        if constexpr (KIND == 1) offs[b - b0] = h2f(wb[b].m) + 8.0f * dw;
        for (int t = 0; t < T; ++t) {
            const __m512i av = _mm512_loadu_si512(a.qs + (t0 + t) * a.k + b * QK32);
            const __m512i p = _mm512_dpwssd_epi32(_mm512_setzero_si512(), wv, av);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), dwv, acc[t]);
        }
    }
    for (int t = 0; t < T; ++t) {
        float total = _mm512_reduce_add_ps(acc[t]);
        if constexpr (KIND == 1) {  // offset terms: sum_b offs[b] * block_sum[b], 16 blocks per step
            const int32_t* as = a.sum + (t0 + t) * nb + b0;
            __m512 o = _mm512_setzero_ps();
            int64_t i = 0;
            for (; i + 16 <= b1 - b0; i += 16) {
                o = _mm512_fmadd_ps(_mm512_load_ps(offs + i), _mm512_cvtepi32_ps(_mm512_loadu_si512(as + i)), o);
            }
            if (i < b1 - b0) {
                const __mmask16 m = static_cast<__mmask16>((1u << (b1 - b0 - i)) - 1);
                o = _mm512_fmadd_ps(_mm512_maskz_load_ps(m, offs + i), _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(m, as + i)), o);
            }
            total += _mm512_reduce_add_ps(o);
        }
        part[t] += total;
    }
}

template <int KIND, int T>
void row_kernel(const uint8_t* w, const act_q16& a, int64_t t0, float* y, size_t y_stride) {
    const int64_t nb = a.k / QK32;
    float part[T] = {};
    for (int64_t b0 = 0; b0 < nb; b0 += ROW_MAX_BLOCKS) {
        row_run<KIND, T>(w, a, t0, b0, b0 + ROW_MAX_BLOCKS < nb ? b0 + ROW_MAX_BLOCKS : nb, part);
    }
    for (int t = 0; t < T; ++t) y[t * y_stride] = a.d[t0 + t] * part[t];
}

template <int KIND>
void row_dispatch(const uint8_t* w, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    switch (n_tok) {
    case 1: row_kernel<KIND, 1>(w, a, t0, y, y_stride); break;
    case 2: row_kernel<KIND, 2>(w, a, t0, y, y_stride); break;
    case 3: row_kernel<KIND, 3>(w, a, t0, y, y_stride); break;
    case 4: row_kernel<KIND, 4>(w, a, t0, y, y_stride); break;
    case 5: row_kernel<KIND, 5>(w, a, t0, y, y_stride); break;
    case 6: row_kernel<KIND, 6>(w, a, t0, y, y_stride); break;
    case 7: row_kernel<KIND, 7>(w, a, t0, y, y_stride); break;
    default: row_kernel<KIND, 8>(w, a, t0, y, y_stride); break;
    }
}
static_assert(MM_TOK_TILE == 8, "row_dispatch handles tiles of up to 8 tokens");

float dot_f32_avx512(const float* a, const float* b, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    if (i < n) {
        const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

float dot_f16_f32_avx512(const uint16_t* a, const float* b, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 av = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i)));
        acc = _mm512_fmadd_ps(av, _mm512_loadu_ps(b + i), acc);
    }
    float s = _mm512_reduce_add_ps(acc);
    for (; i < n; ++i) s += _cvtsh_ss(a[i]) * b[i];
    return s;
}

void axpy_f16_avx512(float a, const uint16_t* x, float* y, int64_t n) {
    const __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 xv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, xv, _mm512_loadu_ps(y + i)));
    }
    for (; i < n; ++i) y[i] += a * _cvtsh_ss(x[i]);
}

void fp32_to_fp16_row_avx512(const float* x, uint16_t* y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

const kernel_set AVX512_SET = {
    "avx512_vnni",        quantize_q16_avx512,      row_dispatch<0>,   row_dispatch<1>,          row_dispatch<2>,
    dot_f32_avx512,       dot_f16_f32_avx512,      axpy_f16_avx512,   fp32_to_fp16_row_avx512,
};

}  // namespace

const kernel_set* kernels_avx512() { return &AVX512_SET; }

#else

const kernel_set* kernels_avx512() { return nullptr; }

#endif

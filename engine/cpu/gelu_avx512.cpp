// engine/cpu/gelu_avx512.cpp — AVX-512 form of gelu.h's GELU: x sigmoid(2 y), 16 lanes at a time.
#include <cstdint>

#if defined(__AVX512F__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "exp_avx512.h"

namespace {

// x sigmoid(2 y) with the exp of -|2 y| only (exp_neg's domain): 1 / (1 + e) for 2 y >= 0, e / (1 + e) below
inline __m512 gelu16(__m512 x) {
    const __m512 x2 = _mm512_mul_ps(x, x);
    const __m512 z = _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(2.0f * 0.7978845608f)),
                                   _mm512_fmadd_ps(x2, _mm512_set1_ps(0.044715f), _mm512_set1_ps(1.0f)));
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    const __m512 e = exp_neg(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_and_ps(z, abs_mask)));
    const __mmask16 neg = _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 num = _mm512_mask_blend_ps(neg, _mm512_set1_ps(1.0f), e);
    return _mm512_mul_ps(x, _mm512_div_ps(num, _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
}

}  // namespace

bool gelu_have_avx512() { return true; }

void gelu_mul_avx512(float* g, const float* u, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(g + i, _mm512_mul_ps(gelu16(_mm512_loadu_ps(g + i)), _mm512_loadu_ps(u + i)));
    if (i < n) {
        const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(gelu16(_mm512_maskz_loadu_ps(m, g + i)), _mm512_maskz_loadu_ps(m, u + i)));
    }
}

#else

bool gelu_have_avx512() { return false; }
void gelu_mul_avx512(float*, const float*, int64_t) {}

#endif

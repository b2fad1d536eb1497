// engine/gelu_avx512.cpp — AVX-512 form of gelu.h's GELU: x / (1 + exp(-2 y)), 16 lanes at a time.
#include <cstdint>

#if defined(__AVX512F__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>

namespace {

// exp(v): 2^n * 2^f with n = round(v log2 e), f ln2 = v - n ln2 in [-ln2/2, ln2/2], 2^f from its Taylor series
// to degree 7 (truncation < 2e-7 relative); v clamped to [-87, 88] (the sigmoid is then 0 or 1 to float).
inline __m512 exp_ps(__m512 v) {
    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 t = _mm512_mul_ps(v, _mm512_set1_ps(1.44269504f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), v));
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

inline __m512 gelu16(__m512 x) {
    const __m512 x2 = _mm512_mul_ps(x, x);
    const __m512 y = _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.7978845608f)),
                                   _mm512_fmadd_ps(x2, _mm512_set1_ps(0.044715f), _mm512_set1_ps(1.0f)));
    const __m512 e = exp_ps(_mm512_mul_ps(y, _mm512_set1_ps(-2.0f)));
    return _mm512_div_ps(x, _mm512_add_ps(e, _mm512_set1_ps(1.0f)));
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

// engine/cpu/exp_avx512.h — exp for the AVX-512 files (attention's softmax and SwiGLU in kernels_avx512.cpp, the
// GELU gate in gelu_avx512.cpp): one polynomial, exp_reduced. Include only from a file compiled with -mavx512f.
#pragma once

#include <immintrin.h>

namespace {

// 2^n e^f for |f| <= ln 2 / 2: e^f from its Taylor series to degree 7 (truncation < 2e-7 relative)
inline __m512 exp_reduced(__m512 f, __m512 n) {
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

// exp(x) for x <= 0 (softmax after the max is subtracted): 2^(x log2 e) = 2^n * 2^f, |f| <= 1/2, with
// 2^f = e^(f ln 2) by exp_reduced; below -87 the result is 0.
inline __m512 exp_neg(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147181f));  // f ln 2
    return exp_reduced(f, n);
}

// exp(x) over float's whole range (x clamped to [-87.3, 88.7]): x = n ln 2 + f with ln 2 in two parts
// (Cody-Waite: f exact to ~1 ulp for any n), 2^n e^f by exp_reduced, within 3e-7 relative of the true value
inline __m512 exp_full(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    f = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606820309417e-06f), f);
    return exp_reduced(f, n);
}

}  // namespace

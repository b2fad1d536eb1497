// engine/cpu/gelu.cpp — see gelu.h.
#include "gelu.h"

#include <cmath>

void gelu_mul_avx512(float* g, const float* u, int64_t n);  // gelu_avx512.cpp (when compiled in)
bool gelu_have_avx512();

void gelu_mul_scalar(float* g, const float* u, int64_t n) {
    constexpr float SQRT_2_OVER_PI = 0.7978845608f, GELU_A = 0.044715f;
    for (int64_t i = 0; i < n; ++i) {
        const float x = g[i];
        g[i] = 0.5f * x * (1.0f + std::tanh(SQRT_2_OVER_PI * x * (1.0f + GELU_A * x * x))) * u[i];
    }
}

void gelu_mul(const kernel_set& ks, float* g, const float* u, int64_t n) {
    if (gelu_have_avx512() && &ks == kernels_avx512()) {
        gelu_mul_avx512(g, u, n);
        return;
    }
    gelu_mul_scalar(g, u, n);
}

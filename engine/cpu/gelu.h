// engine/cpu/gelu.h — the gated FFN's GELU (tanh form) times the up projection, for Gemma's FFN.
//
// Contract: g[i] = gelu(g[i]) * u[i] for i < n, gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// The kernel set ks picks the code: AVX-512 computes it as x sigmoid(2 y) (the same function) with the
// attention softmax's polynomial exp of -|2 y| (engine/cpu/exp_avx512.h); error against a double reference
// below 1e-6 of |x u| like std::tanh's float form (tests/engine/kernels_kq_test.cpp prints both); every
// other set calls std::tanh per element
// (std::tanh was 14 % of a Gemma 3 270M prompt read's CPU time).
#pragma once

#include <cstdint>

#include "kernels.h"

void gelu_mul(const kernel_set& ks, float* g, const float* u, int64_t n);
// the scalar form (reference)
void gelu_mul_scalar(float* g, const float* u, int64_t n);

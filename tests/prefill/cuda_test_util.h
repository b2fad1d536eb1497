// tests/prefill/cuda_test_util.h — what the CUDA tests share: random rows of every natively read type (valid
// blocks: random quants, scales of a sane size), their float64 values, and the float64 attention reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "engine/cpu/quants.h"

// The types the CUDA path reads natively (prefill/cuda_math.h cm::native), with their names.
inline const ggml_type CUDA_TEST_TYPES[] = {GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q4_0,
                                            GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K,
                                            GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};

// n_rows rows of n_cols elements of `type` (n_cols a multiple of 256 for the K types).
inline std::vector<uint8_t> cuda_test_rows(ggml_type type, int64_t n_rows, int64_t n_cols, std::mt19937& rng) {
    const size_t rb = quant_row_bytes(type, n_cols);
    std::vector<uint8_t> out(rb * size_t(n_rows));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::uniform_int_distribution<int> byte(0, 255);
    auto put16 = [&](size_t at, uint16_t v) {
        out[at] = uint8_t(v & 0xFF);
        out[at + 1] = uint8_t(v >> 8);
    };
    if (type == GGML_TYPE_F32) {
        for (size_t i = 0; i < out.size() / 4; ++i) {
            const float f = u(rng);
            std::memcpy(&out[i * 4], &f, 4);
        }
        return out;
    }
    if (type == GGML_TYPE_F16 || type == GGML_TYPE_BF16) {
        for (size_t i = 0; i < out.size() / 2; ++i) {
            const float f = u(rng);
            uint32_t bits;
            std::memcpy(&bits, &f, 4);
            put16(i * 2, type == GGML_TYPE_F16 ? fp32_to_fp16(f) : uint16_t(bits >> 16));
        }
        return out;
    }
    for (uint8_t& b : out) b = uint8_t(byte(rng));
    const size_t bb = quant_block_bytes(type);
    auto scale = [&]() { return fp32_to_fp16(0.002f + 0.02f * std::fabs(u(rng))); };
    for (size_t blk = 0; blk < out.size() / bb; ++blk) {
        const size_t at = blk * bb;
        switch (type) {
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: put16(at, scale()); break;
        case GGML_TYPE_Q4_1: put16(at, scale()); put16(at + 2, fp32_to_fp16(0.05f * u(rng))); break;
        case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: put16(at, scale()); put16(at + 2, scale()); break;
        case GGML_TYPE_Q6_K: put16(at + 208, scale()); break;
        default: break;
        }
    }
    return out;
}

// Row r of rows as float64 (through the CPU engine's dequantize_row).
inline std::vector<double> cuda_test_row_f64(ggml_type type, const uint8_t* row, int64_t n_cols) {
    std::vector<float> f(static_cast<size_t>(n_cols));
    dequantize_row(type, row, f.data(), n_cols);
    return std::vector<double>(f.begin(), f.end());
}

// float64 attention of one query head over positions [first, last]: q (hd), k/v rows (position-indexed,
// hd each) -> out (hd).
inline void cuda_test_attention_f64(const float* q, const std::vector<std::vector<float>>& k,
                                    const std::vector<std::vector<float>>& v, int32_t first, int32_t last, int hd,
                                    double scale, double* out) {
    std::vector<double> s(static_cast<size_t>(last - first + 1));
    double mx = -1e300;
    for (int32_t p = first; p <= last; ++p) {
        double d = 0.0;
        for (int j = 0; j < hd; ++j) d += double(q[j]) * double(k[size_t(p)][size_t(j)]);
        s[size_t(p - first)] = d * scale;
        mx = std::max(mx, d * scale);
    }
    double sum = 0.0;
    for (double& x : s) sum += (x = std::exp(x - mx));
    for (int j = 0; j < hd; ++j) out[j] = 0.0;
    for (int32_t p = first; p <= last; ++p) {
        for (int j = 0; j < hd; ++j) out[j] += s[size_t(p - first)] / sum * double(v[size_t(p)][size_t(j)]);
    }
}

// tests/engine/kernels_kq_test.cpp — the row kernels of engine/kernels_kq.h (Q4_K, Q5_K, Q6_K, Q5_1, Q2_K,
// Q3_K, IQ4_XS) in every compiled-in set the CPU runs (scalar, AVX2, AVX-512) against a float64 dot product of
// the scalar dequantisation (quants.cpp) with the dequantised 16-bit activations.
//
// Checked, on random blocks (random bytes, modest half scales) and activations with an outlier channel:
//  - |kernel - reference| <= 1e-5 * sum |w a| + 1e-6 for every tile size 1..8 and token of the tile (float32
//    summation of up to K / 32 block terms: the bound is ~100x the observed error);
//  - a token's value is bit-identical whatever the tile size it is computed in (tile-independence: prompt
//    chunking must not change results);
//  - the matmul driver routes these types to these kernels: matmul equals the row kernel, bit for bit.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels.h"
#include "gelu.h"
#include "kernels_kq.h"
#include "quants.h"
#include "threadpool.h"
#include "test_check.h"

namespace {

std::mt19937 g_rng(4321);

float frand(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(g_rng); }

// random blocks of type with half scales at their offsets set to modest values
std::vector<uint8_t> random_rows(ggml_type type, int64_t k, int64_t n) {
    std::vector<uint8_t> buf(quant_row_bytes(type, k) * size_t(n));
    for (uint8_t& b : buf) b = uint8_t(g_rng());
    const size_t bb = quant_block_bytes(type);
    for (size_t o = 0; o < buf.size(); o += bb) {
        auto put = [&](size_t off, float v) {
            const uint16_t h = fp32_to_fp16(v);
            std::memcpy(buf.data() + o + off, &h, 2);
        };
        switch (type) {
        case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: put(0, frand(0.001f, 0.01f)); put(2, frand(0.0f, 0.01f)); break;
        case GGML_TYPE_Q6_K: put(208, frand(-0.01f, 0.01f)); break;
        case GGML_TYPE_Q5_1: put(0, frand(0.001f, 0.05f)); put(2, frand(-0.3f, 0.1f)); break;
        case GGML_TYPE_Q2_K: put(80, frand(0.001f, 0.05f)); put(82, frand(0.0f, 0.05f)); break;
        case GGML_TYPE_Q3_K: put(108, frand(-0.01f, 0.01f)); break;
        case GGML_TYPE_IQ4_XS: put(0, frand(-0.01f, 0.01f)); break;
        default: break;
        }
    }
    return buf;
}

struct named_set {
    const char* name;
    const kernel_set* ks;
};

std::vector<named_set> sets() {
    std::vector<named_set> v = {{"scalar", &kernels_scalar()}};
    const char* best = kernels_get().name;
    const bool avx512 = std::strcmp(best, "avx512_vnni") == 0, avx2 = avx512 || std::strcmp(best, "avx2") == 0;
    if (kernels_avx2() && avx2) v.push_back({"avx2", kernels_avx2()});
    if (kernels_avx512() && avx512) v.push_back({"avx512", kernels_avx512()});
    return v;
}

const ggml_type TYPES[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q5_1,
                           GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_IQ4_XS};

void test_rows_against_reference() {
    const int T = MM_TOK_TILE;
    for (int64_t k : {256, 768, 2048}) {
        std::vector<float> x(size_t(T * k));
        for (float& v : x) v = frand(-2, 2);
        x[5] = 40.0f;  // an outlier channel
        const int64_t nb = k / QK32;
        std::vector<int16_t> qs(x.size());
        std::vector<float> d(size_t(T * nb)), dsum(size_t(T * nb));
        for (int t = 0; t < T; ++t) {
            kernels_scalar().quantize_q16(x.data() + t * k, k, qs.data() + t * k, d.data() + t * nb, dsum.data() + t * nb);
        }
        const act_q16 a{qs.data(), d.data(), dsum.data(), k};
        for (ggml_type type : TYPES) {
            CHECK(kq_has_row(type), "%s: no row kernel", quant_name(type));
            const std::vector<uint8_t> w = random_rows(type, k, 1);
            std::vector<float> wf(static_cast<size_t>(k));
            dequantize_row(type, w.data(), wf.data(), k);
            for (const named_set& s : sets()) {
                const mm_row_fn row = kq_row_fn(*s.ks, type);
                for (int nt = 1; nt <= T; ++nt) {
                    std::vector<float> y(size_t(nt * 3), -1.0f);
                    row(w.data(), a, 0, nt, y.data(), 3);
                    for (int t = 0; t < nt; ++t) {
                        double ref = 0, mag = 0;
                        for (int64_t i = 0; i < k; ++i) {
                            const double av = double(qs[size_t(t * k + i)]) * double(d[size_t(t * nb + i / 32)]);
                            ref += double(wf[size_t(i)]) * av;
                            mag += std::fabs(double(wf[size_t(i)]) * av);
                        }
                        const float got = y[size_t(t * 3)];
                        CHECK(std::fabs(double(got) - ref) <= 1e-5 * mag + 1e-6, "%s %s k=%ld nt=%d t=%d: %.9g vs %.9g",
                              s.name, quant_name(type), long(k), nt, t, double(got), ref);
                        float one;
                        row(w.data(), a, t, 1, &one, 1);  // the same token alone
                        CHECK(got == one, "%s %s k=%ld: token %d differs in a tile of %d", s.name, quant_name(type), long(k), t, nt);
                    }
                }
            }
        }
    }
}

// matmul over several rows and a chunk of tokens equals the set's row kernel, bit for bit
void test_matmul_routes_here() {
    const int64_t k = 512, n = 21, n_tok = 11;
    std::vector<float> x(size_t(n_tok * k));
    for (float& v : x) v = frand(-1, 1);
    threadpool* pool = threadpool_init(2);
    for (ggml_type type : TYPES) {
        const std::vector<uint8_t> wbuf = random_rows(type, k, n);
        weight_view w{type, k, n, quant_row_bytes(type, k), wbuf.data()};
        const kernel_set& ks = kernels_get();
        mm_scratch s;
        std::vector<float> y(size_t(n_tok * n));
        matmul(pool, ks, w, x.data(), k, n_tok, y.data(), &s);
        const int64_t nb = k / QK32;
        std::vector<int16_t> qs(x.size());
        std::vector<float> d(size_t(n_tok * nb)), dsum(size_t(n_tok * nb));
        for (int64_t t = 0; t < n_tok; ++t) ks.quantize_q16(x.data() + t * k, k, qs.data() + t * k, d.data() + t * nb, dsum.data() + t * nb);
        const act_q16 a{qs.data(), d.data(), dsum.data(), k};
        int bad = 0;
        for (int64_t r = 0; r < n; ++r) {
            for (int64_t t = 0; t < n_tok; ++t) {
                float one;
                kq_row_fn(ks, type)(wbuf.data() + size_t(r) * w.row_bytes, a, t, 1, &one, 1);
                bad += one != y[size_t(t * n + r)];
            }
        }
        CHECK(bad == 0, "%s %s: matmul differs from the row kernel in %d outputs", ks.name, quant_name(type), bad);
    }
    threadpool_free(pool);
}

// gelu_mul of every set against the tanh form in double: |error| <= 1e-6 |x u| (the float tanh form itself
// loses relative precision where 1 + tanh(y) cancels, so the bar is on the input's scale); worst printed
void test_gelu() {
    const int64_t n = 4099;  // a masked tail
    std::vector<float> g0(static_cast<size_t>(n)), u(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        g0[size_t(i)] = -12.0f + 24.0f * float(i) / float(n);
        u[size_t(i)] = frand(-2, 2);
    }
    for (const named_set& s : sets()) {
        std::vector<float> g = g0;
        gelu_mul(*s.ks, g.data(), u.data(), n);
        double worst = 0;
        for (int64_t i = 0; i < n; ++i) {
            const double x = g0[size_t(i)], xu = std::fabs(x * u[size_t(i)]);
            const double ref = 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))) * u[size_t(i)];
            const double err = std::fabs(g[size_t(i)] - ref) / std::fmax(xu, 1e-30);
            worst = std::fmax(worst, err);
            CHECK(err <= 1e-6, "%s gelu(%g): %.9g vs %.9g", s.name, x, double(g[size_t(i)]), ref);
        }
        std::printf("gelu %s: worst |error| / |x u| %.3g\n", s.name, worst);
    }
}

}  // namespace

int main() {
    test_gelu();
    test_rows_against_reference();
    test_matmul_routes_here();
    if (g_failures) return 1;
    std::printf("kernels_kq_test: ok\n");
    return 0;
}

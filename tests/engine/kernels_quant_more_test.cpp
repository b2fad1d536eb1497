// tests/engine/kernels_quant_more_test.cpp — the Q5_1 / Q2_K / Q3_K / IQ4_XS row kernels
// (engine/kernels_quant_more.h) of every kernel set the CPU has, against float64 dot products of the scalar
// reference dequantisation (quants.cpp) with the activations, on random blocks; through matmul, so the
// dispatch by kernel set is covered, for 1, 5 and 13 tokens (tiles of 8 and a remainder); and a token's
// result is the same bits alone as inside a chunk. (Sets differ in their last bits: FMA contraction.)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels.h"
#include "kernels_quant_more.h"
#include "quants.h"
#include "test_check.h"
#include "threadpool.h"

namespace {

std::mt19937 g_rng(4321);

float frand(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(g_rng); }

void put_half(uint8_t* p, float v) {
    const uint16_t h = fp32_to_fp16(v);
    std::memcpy(p, &h, 2);
}

// random rows: random bytes, then each block's half scales set to modest values (offsets per quants.h)
std::vector<uint8_t> random_rows(ggml_type type, int64_t k, int64_t n) {
    std::vector<uint8_t> buf(quant_row_bytes(type, k) * size_t(n));
    for (uint8_t& b : buf) b = uint8_t(g_rng());
    const size_t bb = quant_block_bytes(type);
    for (size_t off = 0; off < buf.size(); off += bb) {
        uint8_t* blk = buf.data() + off;
        switch (type) {
        case GGML_TYPE_Q5_1: put_half(blk, frand(0.001f, 0.02f)); put_half(blk + 2, frand(-0.3f, 0.1f)); break;
        case GGML_TYPE_Q2_K: put_half(blk + 80, frand(0.001f, 0.01f)); put_half(blk + 82, frand(0.0f, 0.01f)); break;
        case GGML_TYPE_Q3_K: put_half(blk + 108, frand(-0.01f, 0.01f)); break;
        case GGML_TYPE_IQ4_XS: put_half(blk, frand(-0.002f, 0.002f)); break;
        default: break;
        }
    }
    return buf;
}

std::vector<const kernel_set*> kernel_sets() {
    std::vector<const kernel_set*> v = {&kernels_scalar()};
    const char* best = kernels_get().name;
    if (kernels_avx2() && (std::strcmp(best, "avx2") == 0 || std::strcmp(best, "avx512_vnni") == 0)) v.push_back(kernels_avx2());
    if (kernels_avx512() && std::strcmp(best, "avx512_vnni") == 0) v.push_back(kernels_avx512());
    return v;
}

void test_against_double() {
    const ggml_type types[] = {GGML_TYPE_Q5_1, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_IQ4_XS};
    const int64_t k = 512, n = 37, n_toks[] = {1, 5, 13};
    threadpool* pool = threadpool_init(2);
    for (ggml_type type : types) {
        CHECK(kernels_uses_q16(type), "%s must take the integer path", quant_name(type));
        const std::vector<uint8_t> wbuf = random_rows(type, k, n);
        const weight_view w{type, k, n, quant_row_bytes(type, k), wbuf.data()};
        std::vector<float> x(size_t(13 * k));
        std::vector<float> wf(static_cast<size_t>(k));
        for (float& v : x) v = frand(-1, 1);
        std::vector<std::vector<float>> alone;  // per set: every row for token 0 alone
        for (int64_t n_tok : n_toks) {
            size_t set_i = 0;
            for (const kernel_set* ks : kernel_sets()) {
                CHECK(quant_more_row(*ks, type) != nullptr, "%s: no %s row kernel", ks->name, quant_name(type));
                std::vector<float> y(size_t(n_tok * n));
                mm_scratch s;
                matmul(pool, *ks, w, x.data(), k, n_tok, y.data(), &s);
                double worst = 0;
                for (int64_t r = 0; r < n; ++r) {
                    dequantize_row(type, wbuf.data() + r * w.row_bytes, wf.data(), k);
                    for (int64_t t = 0; t < n_tok; ++t) {
                        double ref = 0, mag = 0;
                        for (int64_t i = 0; i < k; ++i) {
                            ref += double(wf[size_t(i)]) * x[size_t(t * k + i)];
                            mag += std::fabs(double(wf[size_t(i)]) * x[size_t(t * k + i)]);
                        }
                        worst = std::fmax(worst, std::fabs(y[size_t(t * n + r)] - ref) / mag);
                    }
                }
                CHECK(worst < 1e-4, "%s %s at %ld tokens: %g of the magnitude", ks->name, quant_name(type), long(n_tok), worst);
                if (n_tok == 1) alone.push_back(y);
                CHECK(std::memcmp(y.data(), alone[set_i].data(), size_t(n) * 4) == 0,
                      "%s %s: token 0 in a chunk of %ld differs from alone", ks->name, quant_name(type), long(n_tok));
                ++set_i;
            }
        }
    }
    threadpool_free(pool);
}

}  // namespace

int main() {
    test_against_double();
    if (g_failures) {
        std::fprintf(stderr, "%d failures\n", g_failures);
        return 1;
    }
    std::printf("PASS\n");
    return 0;
}

// tests/engine/kernels_group_q5_0_test.cpp — Q5_0 weights in their 5-bit row-group layout
// (engine/cpu/kernels_group_q5_0.h) on the sets that have the kernel.
//
// Checked: the packed size; the same bits as the same weight widened to Q8_0 and packed as Q8_0 (the path
// Q5_0 took before, and still takes on the other sets), for a token alone, every tile size and a chunk of
// 13, at 1, 2 and 3 threads, fused with another Q5_0 weight and with a Q8_0 one; a fused call that mixes a
// packed Q5_0 weight with an unpacked one still computes each weight exactly; against double.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/kernels_group_q5_0.h"
#include "cpu/quants.h"
#include "cpu/threadpool.h"
#include "test_check.h"
#include "test_sets.h"

namespace {

std::mt19937 g_rng(5150);

// random Q5_0 rows: every bit random but the scale, a modest finite half
std::vector<uint8_t> random_q5_0(int64_t k, int64_t n) {
    std::vector<uint8_t> buf(quant_row_bytes(GGML_TYPE_Q5_0, k) * size_t(n));
    for (uint8_t& b : buf) b = uint8_t(g_rng());
    for (size_t o = 0; o < buf.size(); o += sizeof(block_q5_0)) {
        const uint16_t h = fp32_to_fp16(std::uniform_real_distribution<float>(-0.05f, 0.05f)(g_rng));
        std::memcpy(buf.data() + o, &h, 2);
    }
    return buf;
}

struct packed_weight {
    std::vector<uint8_t> rows;  // the weight's rows as the view reads them
    uint8_t* packed = nullptr;
    weight_view w;
    packed_weight(ggml_type type, std::vector<uint8_t> r, int64_t k, int64_t n) : rows(std::move(r)) {
        w = weight_view{type, k, n, quant_row_bytes(type, k), rows.data()};
        const size_t pb = weight_packed_bytes(type, k, n);
        packed = static_cast<uint8_t*>(std::aligned_alloc(64, (pb + 63) / 64 * 64));
        weight_pack(w, packed);
        w.packed = packed;
    }
    ~packed_weight() { std::free(packed); }
};

std::vector<uint8_t> widen(const std::vector<uint8_t>& q5, int64_t k, int64_t n) {
    std::vector<uint8_t> out(quant_row_bytes(GGML_TYPE_Q8_0, k) * size_t(n));
    const size_t rb5 = quant_row_bytes(GGML_TYPE_Q5_0, k), rb8 = quant_row_bytes(GGML_TYPE_Q8_0, k);
    for (int64_t r = 0; r < n; ++r) {
        quant_row_to_q8_0(GGML_TYPE_Q5_0, q5.data() + size_t(r) * rb5, reinterpret_cast<block_q8_0*>(out.data() + size_t(r) * rb8), k);
    }
    return out;
}

void test_layout_size() {
    CHECK(weight_packed_bytes(GGML_TYPE_Q5_0, 64, 40) == 0, "40 rows (not a multiple of 16) must have no packed layout");
    CHECK(weight_group_bytes(GGML_TYPE_Q5_0, 640) == 20 * 352, "a group of 16 rows of 640: 20 blocks of 352 bytes");
    CHECK(weight_packed_bytes(GGML_TYPE_Q5_0, 640, 32) == 2 * weight_group_bytes(GGML_TYPE_Q5_0, 640), "packed size");
    // 352 bytes per 16 x 32 values: the file's 22 bytes per block of 32
    CHECK(weight_group_bytes(GGML_TYPE_Q5_0, 640) == 16 * quant_row_bytes(GGML_TYPE_Q5_0, 640), "5-bit size");
}

void test_against_widened(const kernel_set& ks) {
    const int64_t ks_[] = {64, 96, 640};
    const int64_t n = 48, n_tok = 13;
    threadpool* pools[3] = {threadpool_init(1), threadpool_init(2), threadpool_init(3)};
    for (int64_t k : ks_) {
        std::vector<float> x(size_t(n_tok * k));
        for (float& v : x) v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(g_rng);
        x[3] = 40.0f;  // an outlier channel, as in a residual stream
        const std::vector<uint8_t> q5 = random_q5_0(k, n);
        const packed_weight p5(GGML_TYPE_Q5_0, q5, k, n), p8(GGML_TYPE_Q8_0, widen(q5, k, n), k, n);
        std::vector<float> y8(size_t(n_tok * n));
        {
            mm_scratch s;
            matmul(pools[0], ks, p8.w, x.data(), k, n_tok, y8.data(), &s);
        }
        for (int p = 0; p < 3; ++p) {
            mm_scratch s;
            std::vector<float> y(size_t(n_tok * n));
            matmul(pools[p], ks, p5.w, x.data(), k, n_tok, y.data(), &s);
            CHECK(y == y8, "%s k=%lld %d threads: packed Q5_0 differs from widened Q8_0", ks.name, (long long)k, p + 1);
        }
        for (int nt = 1; nt <= MM_TOK_TILE; ++nt) {  // tokens [2, 2 + nt) alone: the chunk's bits
            mm_scratch s;
            std::vector<float> part(size_t(nt * n));
            matmul(pools[1], ks, p5.w, x.data() + 2 * k, k, nt, part.data(), &s);
            CHECK(std::memcmp(part.data(), y8.data() + 2 * n, size_t(nt * n) * 4) == 0, "%s k=%lld: tile of %d differs", ks.name, (long long)k, nt);
        }
        {  // fused with itself (one pass over both) and with the widened copy (both packed)
            mm_scratch s;
            std::vector<float> a(size_t(n_tok * n)), b(size_t(n_tok * n));
            float* ys[2] = {a.data(), b.data()};
            const weight_view* same[2] = {&p5.w, &p5.w};
            matmul_fused(pools[1], ks, same, ys, 2, x.data(), k, n_tok, &s);
            CHECK(a == y8 && b == y8, "%s k=%lld: fused Q5_0 + Q5_0 differs", ks.name, (long long)k);
            const weight_view* mixed[2] = {&p5.w, &p8.w};
            matmul_fused(pools[1], ks, mixed, ys, 2, x.data(), k, n_tok, &s);
            CHECK(a == y8 && b == y8, "%s k=%lld: fused Q5_0 + Q8_0 differs", ks.name, (long long)k);
        }
        {  // with an unpacked Q8_0 weight (row kernels) the fused call must not run Q5_0 on a row kernel
            mm_scratch s;
            weight_view rows8 = p8.w;
            rows8.packed = nullptr;
            std::vector<float> a(size_t(n_tok * n)), b(size_t(n_tok * n)), yr(size_t(n_tok * n));
            matmul(pools[1], ks, rows8, x.data(), k, n_tok, yr.data(), &s);
            float* ys[2] = {a.data(), b.data()};
            const weight_view* mixed[2] = {&p5.w, &rows8};
            matmul_fused(pools[1], ks, mixed, ys, 2, x.data(), k, n_tok, &s);
            CHECK(a == y8 && b == yr, "%s k=%lld: fused packed Q5_0 + row-kernel Q8_0 differs", ks.name, (long long)k);
        }
        double worst = 0;
        std::vector<float> wf(static_cast<size_t>(k));
        for (int64_t t = 0; t < n_tok; ++t) {
            for (int64_t r = 0; r < n; ++r) {
                dequantize_row(GGML_TYPE_Q5_0, q5.data() + size_t(r) * p5.w.row_bytes, wf.data(), k);
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < k; ++i) {
                    ref += double(wf[size_t(i)]) * x[size_t(t * k + i)];
                    mag += std::fabs(double(wf[size_t(i)]) * x[size_t(t * k + i)]);
                }
                worst = std::fmax(worst, std::fabs(y8[size_t(t * n + r)] - ref) / mag);
            }
        }
        CHECK(worst < 1e-3, "%s k=%lld: packed Q5_0 vs double: %g of the magnitude", ks.name, (long long)k, worst);
    }
    for (threadpool* p : pools) threadpool_free(p);
}

}  // namespace

int main(int argc, char** argv) {
    test_sets_from_args(argc, argv);  // --set NAME: kernels_get() is NAME, or the run is skipped
    test_layout_size();
    const kernel_set& ks = kernels_get();
    if (group_fn(ks, GGML_TYPE_Q5_0)) {
        test_against_widened(ks);
        std::printf("Q5_0 row-group kernel (%s): checked\n", ks.name);
    } else {
        CHECK(group_q5_0_fn(kernels_scalar()) == nullptr, "the scalar set has no Q5_0 row-group kernel");
        std::printf("no Q5_0 row-group kernel on this CPU's set (%s): Q5_0 is widened\n", ks.name);
    }
    return g_failures == 0 ? 0 : 1;
}

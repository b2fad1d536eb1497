// tests/engine/kernels_test.cpp — every compiled-in kernel set the CPU can run (scalar, AVX2, AVX-512 VNNI; one
// CTest entry per set, tests/engine/test_sets.h) against a float64 computation from the scalar dequantisation, and the matmul driver's guarantees.
//
// Checked: 16-bit activation quantisation is identical across sets; row kernels for Q4_0/Q4_1/Q8_0 at 1..4
// tokens (odd and even block counts) and Q4_K/Q5_K/Q6_K agree with double dot products of the dequantised weights and the
// dequantised activations; f16 dot/axpy/convert agree with the scalar set; matmul (integer and generic
// paths, K types included); silu(g) * u against double is bitwise identical for 1, 2 and 3 threads and for a token alone or inside a
// chunk; fused attention over tiles of queries equals each query alone; the row-group kernels over packed weights likewise, for every tile size and fused; fused attention over half and Q8_0 caches; RoPE (normal and NeoX ordering) and rmsnorm against
// double references.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/quants.h"
#include "cpu/threadpool.h"
#include "test_check.h"
#include "test_sets.h"

namespace {

std::mt19937 g_rng(1234);

float frand(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(g_rng); }

// random blocks of a type with sane (finite, modest) scales
std::vector<uint8_t> random_rows(ggml_type type, int64_t k, int64_t n) {
    const size_t rb = quant_row_bytes(type, k);
    std::vector<uint8_t> buf(rb * size_t(n));
    for (uint8_t& b : buf) b = uint8_t(g_rng());
    const size_t bb = quant_block_bytes(type);
    const int64_t n_blocks = int64_t(buf.size() / bb);
    for (int64_t i = 0; i < n_blocks; ++i) {
        uint8_t* blk = buf.data() + size_t(i) * bb;
        auto put = [&](size_t off, float v) {
            const uint16_t h = fp32_to_fp16(v);
            std::memcpy(blk + off, &h, 2);
        };
        switch (type) {
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q8_0: put(0, frand(-0.05f, 0.05f)); break;
        case GGML_TYPE_Q4_1: put(0, frand(0.001f, 0.05f)); put(2, frand(-0.3f, 0.1f)); break;
        case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: put(0, frand(0.001f, 0.01f)); put(2, frand(0.0f, 0.01f)); break;
        case GGML_TYPE_Q6_K: put(208, frand(-0.01f, 0.01f)); break;
        case GGML_TYPE_F16: for (size_t o = 0; o < bb; o += 2) put(o, frand(-1, 1)); break;
        case GGML_TYPE_BF16: {
            const float v = frand(-1, 1);
            uint32_t u;
            std::memcpy(&u, &v, 4);
            const uint16_t h = uint16_t(u >> 16);
            std::memcpy(blk, &h, 2);
            break;
        }
        case GGML_TYPE_F32: { const float v = frand(-1, 1); std::memcpy(blk, &v, 4); break; }
        default: break;  // the types this test does not draw (generic float path, quants_test covers them)
        }
    }
    return buf;
}

// the sets this run covers (tests/engine/test_sets.h): scalar first, then each the CPU can run, or the one --set names
std::vector<const kernel_set*> g_sets;

const std::vector<const kernel_set*>& kernel_sets() { return g_sets; }

void test_quantize_and_rows() {
    const ggml_type types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    for (int64_t k : {96, 576, 1536}) {
        const int T = MM_TOK_TILE;
        std::vector<float> x(static_cast<size_t>(T * k));
        for (float& v : x) v = frand(-2, 2);
        x[5] = 40.0f;  // an outlier channel, as real residual streams have
        std::vector<int16_t> qs_ref(static_cast<size_t>(T * k));
        std::vector<float> d_ref(static_cast<size_t>(T * k / 32));
        std::vector<float> sum_ref(static_cast<size_t>(T * k / 32));
        for (int t = 0; t < T; ++t) {
            kernels_scalar().quantize_q16(x.data() + t * k, k, qs_ref.data() + t * k, d_ref.data() + t * k / 32, sum_ref.data() + t * k / 32);
        }
        for (const kernel_set* ks : kernel_sets()) {
            std::vector<int16_t> qs(qs_ref.size());
            std::vector<float> d(d_ref.size());
            std::vector<float> sum(sum_ref.size());
            for (int t = 0; t < T; ++t) ks->quantize_q16(x.data() + t * k, k, qs.data() + t * k, d.data() + t * k / 32, sum.data() + t * k / 32);
            CHECK(qs == qs_ref && d == d_ref && sum == sum_ref, "%s: quantize_q16 differs from scalar (k=%ld)", ks->name, long(k));
            const act_q16 a{qs.data(), d.data(), sum.data(), k};
            for (ggml_type type : types) {
                if (k % quant_block_size(type) != 0) continue;
                const std::vector<uint8_t> w = random_rows(type, k, 1);
                std::vector<float> wf(static_cast<size_t>(k));
                dequantize_row(type, w.data(), wf.data(), k);
                const mm_row_fn row = type == GGML_TYPE_Q4_0 ? ks->row_q4_0 : type == GGML_TYPE_Q4_1 ? ks->row_q4_1
                                    : type == GGML_TYPE_Q8_0 ? ks->row_q8_0 : type == GGML_TYPE_Q4_K ? ks->row_q4_k
                                    : type == GGML_TYPE_Q5_K ? ks->row_q5_k : ks->row_q6_k;
                for (int nt = 1; nt <= T; ++nt) {
                    std::vector<float> y(size_t(nt * 3), -1.0f);
                    row(w.data(), a, 0, nt, y.data(), 3);
                    for (int t = 0; t < nt; ++t) {
                        double ref = 0, mag = 0;
                        for (int64_t i = 0; i < k; ++i) {
                            const double av = double(qs[size_t(t * k + i)]) * double(d[size_t((t * k + i) / 32)]);
                            ref += double(wf[size_t(i)]) * av;
                            mag += std::fabs(double(wf[size_t(i)]) * av);
                        }
                        const double err = std::fabs(double(y[size_t(t * 3)]) - ref);
                        CHECK(err <= 1e-5 * mag + 1e-6, "%s %s k=%ld nt=%d t=%d: %g vs %g", ks->name, quant_name(type), long(k), nt, t, double(y[size_t(t * 3)]), ref);
                    }
                }
            }
        }
    }
}

void test_f16_ops() {
    const int64_t n = 64 + 7;
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    for (float& v : a) v = frand(-3, 3);
    for (float& v : b) v = frand(-3, 3);
    std::vector<uint16_t> h_ref(static_cast<size_t>(n));
    kernels_scalar().fp32_to_fp16_row(a.data(), h_ref.data(), n);
    for (const kernel_set* ks : kernel_sets()) {
        std::vector<uint16_t> h(static_cast<size_t>(n));
        ks->fp32_to_fp16_row(a.data(), h.data(), n);
        CHECK(h == h_ref, "%s: fp32_to_fp16_row differs from scalar", ks->name);
        double ref = 0;
        for (int64_t i = 0; i < n; ++i) ref += double(fp16_to_fp32(h_ref[size_t(i)])) * b[size_t(i)];
        CHECK(std::fabs(ks->dot_f16_f32(h_ref.data(), b.data(), n) - ref) < 1e-4, "%s: dot_f16_f32", ks->name);
        double ref32 = 0;
        for (int64_t i = 0; i < n; ++i) ref32 += double(a[size_t(i)]) * b[size_t(i)];
        CHECK(std::fabs(ks->dot_f32(a.data(), b.data(), n) - ref32) < 1e-4, "%s: dot_f32", ks->name);
        std::vector<float> y = b;
        ks->axpy_f16(0.5f, h_ref.data(), y.data(), n);
        for (int64_t i = 0; i < n; ++i) {
            const double r = b[size_t(i)] + 0.5 * fp16_to_fp32(h_ref[size_t(i)]);
            CHECK(std::fabs(y[size_t(i)] - r) < 1e-6, "%s: axpy_f16 at %ld", ks->name, long(i));
        }
    }
}

// matmul: identical bits for any thread count, and a token's row is the same alone or inside a chunk
void test_matmul_determinism() {
    const ggml_type types[] = {GGML_TYPE_Q4_1, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
                               GGML_TYPE_Q6_K, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_F32};
    const int64_t k = 512, n = 77, n_tok = 11;
    std::vector<float> x(static_cast<size_t>(n_tok * k));
    for (float& v : x) v = frand(-1, 1);
    threadpool* pools[3] = {threadpool_init(1), threadpool_init(2), threadpool_init(3)};
    for (ggml_type type : types) {
        const std::vector<uint8_t> wbuf = random_rows(type, k, n);
        weight_view w{type, k, n, quant_row_bytes(type, k), wbuf.data()};
        std::vector<float> y[3];
        for (int p = 0; p < 3; ++p) {
            mm_scratch s;
            y[p].assign(size_t(n_tok * n), 0.0f);
            matmul(pools[p], kernels_get(), w, x.data(), k, n_tok, y[p].data(), &s);
        }
        CHECK(y[0] == y[1] && y[0] == y[2], "%s: matmul depends on the thread count", quant_name(type));
        mm_scratch s;
        std::vector<float> one(static_cast<size_t>(n));
        matmul(pools[1], kernels_get(), w, x.data() + 6 * k, k, 1, one.data(), &s);
        CHECK(std::memcmp(one.data(), y[0].data() + 6 * n, size_t(n) * 4) == 0, "%s: token 6 alone differs from in a chunk", quant_name(type));
        // and against double
        std::vector<float> wf(static_cast<size_t>(k));
        double worst = 0;
        for (int64_t r = 0; r < n; ++r) {
            dequantize_row(type, wbuf.data() + r * w.row_bytes, wf.data(), k);
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < k; ++i) {
                ref += double(wf[size_t(i)]) * x[size_t(6 * k + i)];
                mag += std::fabs(double(wf[size_t(i)]) * x[size_t(6 * k + i)]);
            }
            worst = std::fmax(worst, std::fabs(one[size_t(r)] - ref) / mag);
        }
        CHECK(worst < 1e-4, "%s: matmul vs double: %g of the magnitude", quant_name(type), worst);
    }
    for (threadpool* p : pools) threadpool_free(p);
}

// Row-group kernels over packed weights (sets that have them): against double, against the same weight on
// the row kernels, bitwise across thread counts, for every tile size (a token alone and in tiles of 2..8 and
// a chunk of 13), fused or not; shapes without a row-group layout report 0 bytes.
void test_packed_matmul() {
    CHECK(weight_packed_bytes(GGML_TYPE_Q4_1, 64, 40) == 0, "40 rows (not a multiple of 16) must have no packed layout");
    CHECK(weight_packed_bytes(GGML_TYPE_Q5_K, 256, 32) == 0, "Q5_K has no packed layout");
    CHECK(weight_packed_bytes(GGML_TYPE_Q4_K, 96, 32) == 0, "Q4_K rows are whole super-blocks");
    CHECK(weight_packed_bytes(GGML_TYPE_Q4_1, 64, 32) == 2 * weight_group_bytes(GGML_TYPE_Q4_1, 64), "packed size");
    const ggml_type types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K};
    // widths: odd and even block counts; the K types' rows are whole super-blocks of 256
    const auto widths = [](ggml_type t) {
        return quant_block_size(t) == 32 ? std::vector<int64_t>{64, 96, 576} : std::vector<int64_t>{256, 768, 1280};
    };
    const int64_t n = 48, n_tok = 13;
    threadpool* pools[3] = {threadpool_init(1), threadpool_init(2), threadpool_init(3)};
    int tested = 0;
    for (const kernel_set* ks : kernel_sets()) {
        for (ggml_type type : types) {
            if (!group_fn(*ks, type)) continue;
            for (int64_t k : widths(type)) {
                std::vector<float> x(static_cast<size_t>(n_tok * k));
                for (float& v : x) v = frand(-1, 1);
                x[3] = 40.0f;  // an outlier channel, as in a residual stream
                const std::vector<uint8_t> wbuf = random_rows(type, k, n);
                weight_view w{type, k, n, quant_row_bytes(type, k), wbuf.data()};
                const size_t pb = weight_packed_bytes(type, k, n);
                uint8_t* packed = static_cast<uint8_t*>(std::aligned_alloc(64, (pb + 63) / 64 * 64));
                weight_pack(w, packed);
                weight_view wp = w;
                wp.packed = packed;
                std::vector<float> y[3], yrow(size_t(n_tok * n));
                for (int p = 0; p < 3; ++p) {
                    mm_scratch s;
                    y[p].assign(size_t(n_tok * n), 0.0f);
                    matmul(pools[p], *ks, wp, x.data(), k, n_tok, y[p].data(), &s);
                }
                CHECK(y[0] == y[1] && y[0] == y[2], "%s %s k=%lld: packed matmul depends on the thread count", ks->name, quant_name(type), (long long)k);
                {
                    mm_scratch s;
                    matmul(pools[1], *ks, w, x.data(), k, n_tok, yrow.data(), &s);
                }
                // every tile size: tokens [0, nt) alone give the same bits as inside the chunk of 13
                for (int nt = 1; nt <= MM_TOK_TILE; ++nt) {
                    mm_scratch s;
                    std::vector<float> part(size_t(nt * n));
                    matmul(pools[1], *ks, wp, x.data() + 2 * k, k, nt, part.data(), &s);
                    CHECK(std::memcmp(part.data(), y[0].data() + 2 * n, size_t(nt * n) * 4) == 0, "%s %s k=%lld: tile of %d differs from the chunk", ks->name, quant_name(type), (long long)k, nt);
                }
                // fused (two copies of the weight side by side) equals the plain call
                {
                    mm_scratch s;
                    std::vector<float> a(size_t(n_tok * n)), b(size_t(n_tok * n));
                    const weight_view* ws[2] = {&wp, &wp};
                    float* ys[2] = {a.data(), b.data()};
                    matmul_fused(pools[1], *ks, ws, ys, 2, x.data(), k, n_tok, &s);
                    CHECK(a == y[0] && b == y[0], "%s %s k=%lld: fused packed matmul differs", ks->name, quant_name(type), (long long)k);
                }
                std::vector<float> wf(static_cast<size_t>(k));
                double worst = 0, worst_row = 0;
                for (int64_t t = 0; t < n_tok; ++t) {
                    for (int64_t r = 0; r < n; ++r) {
                        dequantize_row(type, wbuf.data() + r * w.row_bytes, wf.data(), k);
                        double ref = 0, mag = 0;
                        for (int64_t i = 0; i < k; ++i) {
                            ref += double(wf[size_t(i)]) * x[size_t(t * k + i)];
                            mag += std::fabs(double(wf[size_t(i)]) * x[size_t(t * k + i)]);
                        }
                        worst = std::fmax(worst, std::fabs(y[0][size_t(t * n + r)] - ref) / mag);
                        worst_row = std::fmax(worst_row, std::fabs(y[0][size_t(t * n + r)] - yrow[size_t(t * n + r)]) / mag);
                    }
                }
                // the outlier's block carries 16-bit steps of 40/32767 (the same on the row kernels, checked next)
                CHECK(worst < 1e-3, "%s %s k=%lld: packed matmul vs double: %g of the magnitude", ks->name, quant_name(type), (long long)k, worst);
                CHECK(worst_row < 1e-5, "%s %s k=%lld: packed vs row kernels: %g of the magnitude", ks->name, quant_name(type), (long long)k, worst_row);
                std::free(packed);
                ++tested;
            }
        }
    }
    // the AVX2 and AVX-512 row-group kernels take the same float steps per row: the same bits
    // (in the AVX-512 set's run, when this CPU runs both)
    const kernel_set* a2 = kernels_avx2();
    const kernel_set* a5 = kernels_avx512();
    const std::vector<const kernel_set*>& usable = kernel_sets();
    const bool covers_a5 = a5 && std::find(usable.begin(), usable.end(), a5) != usable.end();
    if (covers_a5 && a2 && !kernels_cpu_lacks(*a2)) {
        for (ggml_type type : types) {
            const int64_t k = widths(type)[2];
            std::vector<float> x(static_cast<size_t>(11 * k));
            for (float& v : x) v = frand(-1, 1);
            const std::vector<uint8_t> wbuf = random_rows(type, k, n);
            weight_view wp{type, k, n, quant_row_bytes(type, k), wbuf.data()};
            uint8_t* packed = static_cast<uint8_t*>(std::aligned_alloc(64, (weight_packed_bytes(type, k, n) + 63) / 64 * 64));
            weight_pack(wp, packed);
            wp.packed = packed;
            std::vector<float> y2(size_t(11 * n)), y5(size_t(11 * n));
            mm_scratch s2, s5;
            matmul(pools[1], *a2, wp, x.data(), k, 11, y2.data(), &s2);
            matmul(pools[1], *a5, wp, x.data(), k, 11, y5.data(), &s5);
            CHECK(y2 == y5, "%s: AVX2 and AVX-512 row-group kernels differ", quant_name(type));
            std::free(packed);
        }
    }
    std::printf("packed matmul: %d type/shape/set cases\n", tested);
    for (threadpool* p : pools) threadpool_free(p);
}

// a tile of queries at consecutive positions gives each query exactly what a tile of one gives it (1 to 3 heads:
// a lone query's own value loop on AVX2 and AVX-512, and 4: the blocked one)
void test_attention_tiles() {
    for (const kernel_set* ks : kernel_sets()) {
        if (!ks->attn) continue;
        for (int q8 = 0; q8 < 2; ++q8) {
            for (int hd : {64, 128, 256}) {
                for (int n_pos0 : {1, 13, 33}) {
                    for (int n_q : {1, 2, 3, 4}) {
                        const int n_tok = 7, n_last = n_pos0 + n_tok - 1;
                        const ggml_type t = q8 ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
                        const size_t row_bytes = quant_row_bytes(t, hd);
                        const std::vector<uint8_t> k = random_rows(t, hd, n_last), v = random_rows(t, hd, n_last);
                        const size_t qs = size_t(n_q * hd);
                        std::vector<float> q(size_t(n_tok) * qs), tiled(size_t(n_tok) * qs), one(qs);
                        std::vector<float> scores(size_t(n_tok * n_q * n_last));
                        for (float& x : q) x = frand(-2, 2);
                        const float scale = 1.0f / std::sqrt(float(hd));
                        ks->attn(q.data(), qs, n_q, n_tok, k.data(), v.data(), row_bytes, q8 != 0, n_pos0, hd, scale,
                                 scores.data(), tiled.data(), qs, nullptr);
                        for (int i = 0; i < n_tok; ++i) {
                            ks->attn(q.data() + size_t(i) * qs, qs, n_q, 1, k.data(), v.data(), row_bytes, q8 != 0, n_pos0 + i, hd,
                                     scale, scores.data(), one.data(), qs, nullptr);
                            CHECK(std::memcmp(one.data(), tiled.data() + size_t(i) * qs, qs * 4) == 0,
                                  "%s attn %s hd=%d n_q=%d: query %d of a tile differs from alone", ks->name, q8 ? "q8_0" : "f16", hd,
                                  n_q, i);
                        }
                    }
                }
            }
        }
    }
}

// fused attention (where a set has one) against softmax(q k^T * scale) v in double over the cache rows as
// stored (half, or Q8_0 blocks), each row wider than one head as in the (n_ctx, n_embd_kv) cache; with
// sinks (gpt-oss), each head's sink logit one more term of the softmax's max and denominator
void test_attention() {
    for (const kernel_set* ks : kernel_sets()) {
        if (!ks->attn) continue;
        for (int q8 = 0; q8 < 4; ++q8) {
            const bool with_sinks = q8 >= 2;
            std::vector<float> sinks(5);
            for (float& x : sinks) x = frand(-3, 3);
            for (int hd : {64, 128, 256}) {
                for (int n_pos : {1, 15, 16, 17, 100}) {
                    const int n_q = hd == 64 ? 3 : 5;
                    const ggml_type t = q8 % 2 ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
                    const size_t row_bytes = quant_row_bytes(t, 2 * hd);  // two heads per row; we use the first
                    std::vector<uint8_t> k(row_bytes * size_t(n_pos)), v(row_bytes * size_t(n_pos));
                    for (std::vector<uint8_t>* buf : {&k, &v}) {
                        for (int p = 0; p < n_pos; ++p) {
                            const std::vector<uint8_t> row = random_rows(t, 2 * hd, 1);
                            std::memcpy(buf->data() + size_t(p) * row_bytes, row.data(), row_bytes);
                        }
                    }
                    std::vector<float> q(size_t(n_q * hd)), out(size_t(n_q * hd)), scores(size_t(n_q * n_pos));
                    for (float& x : q) x = frand(-2, 2);
                    const float scale = 1.0f / std::sqrt(float(hd));
                    ks->attn(q.data(), size_t(n_q * hd), n_q, 1, k.data(), v.data(), row_bytes, q8 % 2 != 0, n_pos, hd, scale,
                             scores.data(), out.data(), size_t(n_q * hd), with_sinks ? sinks.data() : nullptr);
                    std::vector<float> kr(static_cast<size_t>(2 * hd)), vr(static_cast<size_t>(2 * hd));
                    double worst = 0, mag = 0;
                    for (int h = 0; h < n_q; ++h) {
                        std::vector<double> w(static_cast<size_t>(n_pos)), o(static_cast<size_t>(hd), 0.0);
                        double mx = -1e300, sum = 0;
                        for (int p = 0; p < n_pos; ++p) {
                            dequantize_row(t, k.data() + size_t(p) * row_bytes, kr.data(), 2 * hd);
                            double s = 0;
                            for (int j = 0; j < hd; ++j) s += double(q[size_t(h * hd + j)]) * kr[size_t(j)];
                            w[size_t(p)] = s * scale;
                            mx = std::fmax(mx, w[size_t(p)]);
                        }
                        if (with_sinks) mx = std::fmax(mx, double(sinks[size_t(h)]));
                        for (double& x : w) sum += (x = std::exp(x - mx));
                        if (with_sinks) sum += std::exp(double(sinks[size_t(h)]) - mx);
                        for (int p = 0; p < n_pos; ++p) {
                            dequantize_row(t, v.data() + size_t(p) * row_bytes, vr.data(), 2 * hd);
                            for (int j = 0; j < hd; ++j) o[size_t(j)] += w[size_t(p)] / sum * vr[size_t(j)];
                        }
                        for (int j = 0; j < hd; ++j) {
                            worst = std::fmax(worst, std::fabs(o[size_t(j)] - out[size_t(h * hd + j)]));
                            mag = std::fmax(mag, std::fabs(o[size_t(j)]));
                        }
                    }
                    CHECK(worst < 2e-5 * std::fmax(mag, 1.0), "%s attn %s%s hd=%d n_pos=%d: max error %g", ks->name, q8 % 2 ? "q8_0" : "f16",
                          with_sinks ? " sinks" : "", hd, n_pos, worst);
                }
            }
        }
    }
}

void test_rope_and_norm() {
    const int heads = 3, hd = 64, n_rot = 64;
    std::vector<float> inv(static_cast<size_t>(n_rot / 2));
    for (int i = 0; i < n_rot / 2; ++i) inv[size_t(i)] = float(std::pow(10000.0, -2.0 * i / n_rot));
    for (int neox = 0; neox < 2; ++neox) {
        std::vector<float> x(static_cast<size_t>(heads * hd));
        for (float& v : x) v = frand(-1, 1);
        std::vector<float> y = x;
        const int pos = 37;
        std::vector<float> cs(static_cast<size_t>(n_rot));
        rope_cos_sin(n_rot, pos, inv.data(), cs.data());
        rope_row_cs(y.data(), heads, hd, n_rot, neox != 0, cs.data());
        for (int h = 0; h < heads; ++h) {
            for (int i = 0; i < n_rot / 2; ++i) {
                // NeoX rotates (i, i + n_rot/2); normal ordering rotates (2i, 2i+1)
                const int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
                const double th = pos * std::pow(10000.0, -2.0 * i / n_rot);
                const double x0 = x[size_t(h * hd + a)], x1 = x[size_t(h * hd + b)];
                const double r0 = x0 * std::cos(th) - x1 * std::sin(th), r1 = x0 * std::sin(th) + x1 * std::cos(th);
                CHECK(std::fabs(y[size_t(h * hd + a)] - r0) < 1e-5 && std::fabs(y[size_t(h * hd + b)] - r1) < 1e-5,
                      "rope neox=%d head %d pair %d", neox, h, i);
            }
        }
    }
    std::vector<float> x(300), w(300), y(300);
    for (float& v : x) v = frand(-5, 5);
    for (float& v : w) v = frand(0, 2);
    rmsnorm_row(x.data(), w.data(), y.data(), 300, 1e-5f);
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    const double sc = 1.0 / std::sqrt(ss / 300 + 1e-5);
    for (int i = 0; i < 300; ++i) CHECK(std::fabs(y[size_t(i)] - x[size_t(i)] * sc * w[size_t(i)]) < 1e-5, "rmsnorm at %d", i);
}

// SwiGLU's silu(g) * u: every set against a double reference, over ordinary values, large ones of both signs
// (exp overflows past 88) and a length that is not a multiple of 16
void test_silu_mul() {
    const int64_t n = 1541;
    std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        g[size_t(i)] = i < 40 ? float(i * 5 - 100) : frand(-12, 12);
        u[size_t(i)] = frand(-3, 3);
    }
    for (const kernel_set* ks : kernel_sets()) {
        std::vector<float> y = g;
        silu_mul_row(*ks, y.data(), u.data(), n);
        for (int64_t i = 0; i < n; ++i) {
            const double x = g[size_t(i)], ref = x / (1.0 + std::exp(-x)) * u[size_t(i)];
            CHECK(std::fabs(y[size_t(i)] - ref) <= 2e-6 * std::fabs(ref) + 1e-30, "%s silu at %lld: %g vs %g", ks->name,
                  (long long)i, double(y[size_t(i)]), ref);
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    g_sets = test_sets_from_args(argc, argv);
    std::printf("dispatch picks %s; testing", kernels_get().name);
    for (const kernel_set* ks : kernel_sets()) std::printf(" %s", ks->name);
    std::printf("\n");
    test_quantize_and_rows();
    test_f16_ops();
    test_matmul_determinism();
    test_packed_matmul();
    test_attention();
    test_attention_tiles();
    test_rope_and_norm();
    test_silu_mul();
    if (g_failures) {
        std::fprintf(stderr, "%d failures\n", g_failures);
        return 1;
    }
    std::printf("PASS\n");
    return 0;
}

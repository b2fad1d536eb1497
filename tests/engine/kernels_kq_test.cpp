// tests/engine/kernels_kq_test.cpp — the row kernels of engine/cpu/kernels_kq.h (Q4_K, Q5_K, Q6_K, Q5_1, Q2_K,
// Q3_K, IQ4_XS) in every compiled-in set the CPU runs (scalar, AVX2, AVX-512) against a float64 dot product of
// the scalar dequantisation (quants.cpp) with the dequantised 16-bit activations.
//
// Checked, on random blocks (random bytes, modest half scales) and activations with an outlier channel:
//  - |kernel - reference| <= 1e-5 * sum |w a| + 1e-6 for every tile size 1..8 and token of the tile (float32
//    summation of up to K / 32 block terms: the bound is ~100x the observed error);
//  - a token's value is bit-identical whatever the tile size it is computed in (tile-independence: prompt
//    chunking must not change results);
//  - the matmul driver routes these types to these kernels: matmul equals the row kernel, bit for bit;
//  - the row-group kernels of Q4_K / Q6_K (engine/cpu/kernels_group_kq.h) in every set against the same float64
//    reference, bit-identical to the scalar reference kernels and across tile sizes, also at the extremes of
//    the integer sums (every value and activation at its largest magnitude: no int32 overflow).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/gelu.h"
#include "cpu/kernels_group_kq.h"
#include "cpu/kernels_kq.h"
#include "cpu/quants.h"
#include "cpu/threadpool.h"
#include "test_check.h"
#include "test_sets.h"

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

// the sets this run covers (tests/engine/test_sets.h): scalar first, then each the CPU can run, or the one --set names
std::vector<named_set> g_sets;

const std::vector<named_set>& sets() { return g_sets; }

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

// the 16-bit activations of n_tok tokens of x (scalar quantisation), with the block sums the driver adds
struct acts {
    std::vector<int16_t> qs;
    std::vector<float> d, dsum;
    std::vector<int32_t> isum;
    act_q16 view(int64_t k) const { return act_q16{qs.data(), d.data(), dsum.data(), k, isum.data()}; }
};

acts quantize_acts(const std::vector<float>& x, int64_t k, int n_tok) {
    const int64_t nb = k / QK32;
    acts a{std::vector<int16_t>(x.size()), std::vector<float>(size_t(n_tok * nb)), std::vector<float>(size_t(n_tok * nb)),
           std::vector<int32_t>(size_t(n_tok * nb))};
    for (int t = 0; t < n_tok; ++t) {
        kernels_scalar().quantize_q16(x.data() + t * k, k, a.qs.data() + t * k, a.d.data() + t * nb, a.dsum.data() + t * nb);
        for (int64_t b = 0; b < nb; ++b) {
            int32_t s = 0;
            for (int l = 0; l < QK32; ++l) s += a.qs[size_t(t * k + b * QK32 + l)];
            a.isum[size_t(t * nb + b)] = s;
        }
    }
    return a;
}

// every group kernel the CPU runs, the scalar reference first
std::vector<std::pair<const char*, const kq_group_set*>> group_sets() {
    std::vector<std::pair<const char*, const kq_group_set*>> v = {{"scalar", &kq_groups_scalar()}};
    for (const named_set& s : sets()) {
        if (s.ks == kernels_avx2() && kq_groups_avx2()) v.push_back({"avx2", kq_groups_avx2()});
        if (s.ks == kernels_avx512() && kq_groups_avx512()) v.push_back({"avx512", kq_groups_avx512()});
        if ((s.ks == kernels_neon() || s.ks == kernels_dotprod()) && kq_groups_neon()) v.push_back({s.ks->name, kq_groups_neon()});
    }
    return v;
}

// rows (n_rows, k) of type packed and run by every set against the float64 dot of the dequantised rows;
// extremes: the value bytes all set so that every element is at (or, Q4_K, next to) its largest magnitude
void check_groups(ggml_type type, int64_t k, const std::vector<float>& x, bool extremes) {
    const int T = MM_TOK_TILE, n_rows = 2 * MM_GROUP_ROWS;
    const int64_t nb = k / QK32;
    std::vector<uint8_t> w = random_rows(type, k, n_rows);
    const size_t rb = quant_row_bytes(type, k);
    // extremes: Q4_K q = 15, m = 0 (q = 0 would make every value 0: the reference could not bound the
    // centred form's rounding); Q6_K q = 0 (q - 32 = -32), scales -128
    if (extremes) {
        for (size_t o = 0; o < w.size(); o += quant_block_bytes(type)) {
            if (type == GGML_TYPE_Q4_K) {
                auto& b = *reinterpret_cast<block_q4_k*>(w.data() + o);
                std::memset(b.qs, 0xFF, sizeof b.qs);
                std::memset(b.scales, 0x3F, 4);  // sub-blocks 0..3: sc 63, m 0; 4..7: sc 15, m 0
                std::memset(b.scales + 4, 0, 4);
                std::memset(b.scales + 8, 0x0F, 4);
            } else {
                auto& b = *reinterpret_cast<block_q6_k*>(w.data() + o);
                std::memset(b.ql, 0, sizeof b.ql);
                std::memset(b.qh, 0, sizeof b.qh);
                std::memset(b.scales, 0x80, sizeof b.scales);
            }
        }
    }
    weight_view wv{type, k, n_rows, rb, w.data()};
    std::vector<uint8_t> packed(weight_packed_bytes(type, k, n_rows) + 64);
    uint8_t* pk = packed.data() + (64 - reinterpret_cast<uintptr_t>(packed.data()) % 64) % 64;
    CHECK(weight_packed_bytes(type, k, n_rows) == 2 * kq_group_bytes(type, k), "%s: packed size", quant_name(type));
    weight_pack(wv, pk);
    const acts a = quantize_acts(x, k, T);
    std::vector<double> ref(size_t(T * n_rows)), mag(size_t(T * n_rows));
    std::vector<float> wf(static_cast<size_t>(k));
    for (int r = 0; r < n_rows; ++r) {
        dequantize_row(type, w.data() + size_t(r) * rb, wf.data(), k);
        for (int t = 0; t < T; ++t) {
            for (int64_t i = 0; i < k; ++i) {
                const double av = double(a.qs[size_t(t * k + i)]) * double(a.d[size_t(t * nb + i / 32)]);
                ref[size_t(t * n_rows + r)] += double(wf[size_t(i)]) * av;
                mag[size_t(t * n_rows + r)] += std::fabs(double(wf[size_t(i)]) * av);
            }
        }
    }
    const size_t gbytes = kq_group_bytes(type, k);
    std::vector<float> yref(size_t(T * n_rows));
    for (int g = 0; g < 2; ++g) {
        const mm_group_fn f = type == GGML_TYPE_Q4_K ? kq_groups_scalar().q4_k : kq_groups_scalar().q6_k;
        f(pk + g * gbytes, nb, a.view(k), 0, T, yref.data() + g * MM_GROUP_ROWS, size_t(n_rows));
    }
    int bad = 0;
    for (int i = 0; i < T * n_rows; ++i) bad += !(std::fabs(double(yref[size_t(i)]) - ref[size_t(i)]) <= 1e-5 * mag[size_t(i)] + 1e-6);
    CHECK(bad == 0, "%s k=%ld%s: scalar group kernel vs double: %d outputs off", quant_name(type), long(k), extremes ? " (extremes)" : "", bad);
    for (const auto& [name, set] : group_sets()) {
        const mm_group_fn f = type == GGML_TYPE_Q4_K ? set->q4_k : set->q6_k;
        for (int nt = 1; nt <= T; ++nt) {
            for (int t0 = 0; t0 + nt <= T; t0 += nt) {
                std::vector<float> y(size_t(nt * n_rows), -1.0f);
                for (int g = 0; g < 2; ++g) f(pk + g * gbytes, nb, a.view(k), t0, nt, y.data() + g * MM_GROUP_ROWS, size_t(n_rows));
                CHECK(std::memcmp(y.data(), yref.data() + t0 * n_rows, y.size() * 4) == 0, "%s %s k=%ld: tile of %d at %d differs from the scalar reference",
                      name, quant_name(type), long(k), nt, t0);
            }
        }
    }
}

void test_groups_against_reference() {
    for (int64_t k : {256, 768, 2048}) {
        std::vector<float> x(size_t(MM_TOK_TILE * k));
        for (float& v : x) v = frand(-2, 2);
        x[5] = 40.0f;  // an outlier channel
        for (ggml_type type : {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K}) check_groups(type, k, x, false);
        // every activation at +-32767 (block maxima equal): the largest integer sums the kernels can meet
        for (size_t i = 0; i < x.size(); ++i) x[i] = (i / size_t(k)) % 2 ? -1.5f : 1.5f;
        for (ggml_type type : {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K}) check_groups(type, k, x, true);
    }
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

int main(int argc, char** argv) {
    for (const kernel_set* ks : test_sets_from_args(argc, argv)) g_sets.push_back({ks->name, ks});
    test_gelu();
    test_rows_against_reference();
    test_matmul_routes_here();
    test_groups_against_reference();
    if (g_failures) return 1;
    std::printf("kernels_kq_test: ok\n");
    return 0;
}

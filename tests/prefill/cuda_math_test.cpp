// tests/prefill/cuda_math_test.cpp — host emulation of the CUDA kernels' per-thread math (prefill/cuda_math.h),
// compiled by the host compiler and run in every build, GPU or not:
//  - half / bfloat16 conversions equal the CPU engine's (all 65536 halves; random and edge floats);
//  - cm::dequant32 gives dequantize_row's values, bit for bit, for every native type;
//  - the GEMV's lane split plus the warp's shuffle tree (emulated in its xor order) matches a float64 dot;
//  - the attention's split / chunked online softmax plus the combine matches a float64 softmax(q k^T) v with
//    grouped heads and windows; the device's cache addressing (cm::kv_cell on a layer's base) lands on the
//    cells engine/kv_cache.h uses, ring layers included;
//  - RoPE pairs, SiLU and GELU agree with the CPU's rope_row_cs / gelu_mul_scalar.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "engine/cpu/gelu.h"
#include "engine/cpu/kernels.h"
#include "engine/kv_cache.h"
#include "prefill/cuda_math.h"
#include "tests/engine/test_check.h"
#include "tests/prefill/cuda_test_util.h"

namespace {

void test_conversions() {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
        const float a = cm::half_to_float(uint16_t(h)), b = fp16_to_fp32(uint16_t(h));
        if (std::memcmp(&a, &b, 4) != 0) ++bad;
    }
    CHECK(bad == 0, "half_to_float differs from fp16_to_fp32 on %d halves", bad);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> e(-30.0f, 17.0f);
    std::vector<float> xs = {0.0f, -0.0f, 65504.0f, 65520.0f, 1e-8f, 5.96e-8f, 2.98e-8f, 8.94e-8f, 6.1e-5f, -1e30f};
    for (int i = 0; i < 200000; ++i) xs.push_back((i % 2 ? -1.0f : 1.0f) * std::exp2(e(rng)));
    bad = 0;
    for (float x : xs) bad += cm::float_to_half(x) != fp32_to_fp16(x);
    CHECK(bad == 0, "float_to_half differs from fp32_to_fp16 on %d of %zu floats", bad, xs.size());
    bad = 0;
    for (float x : xs) {  // bf16: round to nearest even, so the result is the nearest bf16 (ties: even)
        const float r = cm::bf16_to_float(cm::float_to_bf16(x));
        const float err = std::fabs(r - x), ulp = std::fabs(x) * (1.0f / 128.0f);
        bad += !(err <= ulp / 2 * 1.0001f);
    }
    CHECK(bad == 0, "float_to_bf16 off by more than half an ulp on %d floats", bad);
}

void test_dequant() {
    std::mt19937 rng(11);
    const int64_t n_cols = 512, n_rows = 6;
    for (ggml_type t : CUDA_TEST_TYPES) {
        CHECK(cm::native(t), "%s not native", quant_name(t));
        CHECK(cm::row_bytes(t, n_cols) == quant_row_bytes(t, n_cols), "%s: row bytes", quant_name(t));
        const std::vector<uint8_t> rows = cuda_test_rows(t, n_rows, n_cols, rng);
        const size_t rb = quant_row_bytes(t, n_cols);
        int bad = 0;
        for (int64_t r = 0; r < n_rows; ++r) {
            std::vector<float> ref(static_cast<size_t>(n_cols)), got(static_cast<size_t>(n_cols));
            dequantize_row(t, rows.data() + size_t(r) * rb, ref.data(), n_cols);
            for (int64_t s = 0; s < n_cols / 32; ++s) cm::dequant32(t, rows.data() + size_t(r) * rb, s, got.data() + s * 32);
            for (int64_t j = 0; j < n_cols; ++j) bad += std::memcmp(&ref[size_t(j)], &got[size_t(j)], 4) != 0;
        }
        CHECK(bad == 0, "%s: dequant32 differs from dequantize_row on %d elements", quant_name(t), bad);
    }
    CHECK(!cm::native(GGML_TYPE_Q2_K) && !cm::native(GGML_TYPE_IQ4_XS), "types read through F16 are not native");
}

// one warp: each lane's partial, then v[i] += v[i ^ o] for o = 16, 8, 4, 2, 1 (lane 0's value is the result)
float warp_tree(std::vector<float> v) {
    for (int o = 16; o > 0; o /= 2) {
        std::vector<float> w(v);
        for (int i = 0; i < 32; ++i) w[size_t(i)] = v[size_t(i)] + v[size_t(i ^ o)];
        v.swap(w);
    }
    return v[0];
}

void test_gemv() {
    std::mt19937 rng(13);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int64_t n_cols = 1536, n_rows = 5;  // 48 sub-blocks: lanes 0..15 take two
    for (ggml_type t : CUDA_TEST_TYPES) {
        const std::vector<uint8_t> rows = cuda_test_rows(t, n_rows, n_cols, rng);
        const size_t rb = quant_row_bytes(t, n_cols);
        for (int n_tok : {1, 3, 8}) {
            std::vector<float> x(size_t(n_tok) * size_t(n_cols));
            for (float& f : x) f = u(rng);
            double worst = 0.0;
            for (int64_t r = 0; r < n_rows; ++r) {
                const uint8_t* row = rows.data() + size_t(r) * rb;
                std::vector<std::vector<float>> part(size_t(n_tok), std::vector<float>(32, 0.0f));
                for (int lane = 0; lane < 32; ++lane) {
                    float acc[8] = {};
                    cm::gemv_lane(t, row, n_cols, lane, 32, x.data(), n_cols, n_tok, acc);
                    for (int k = 0; k < n_tok; ++k) part[size_t(k)][size_t(lane)] = acc[k];
                }
                const std::vector<double> w = cuda_test_row_f64(t, row, n_cols);
                for (int k = 0; k < n_tok; ++k) {
                    double ref = 0.0, mag = 0.0;
                    for (int64_t j = 0; j < n_cols; ++j) {
                        ref += w[size_t(j)] * x[size_t(k * n_cols + j)];
                        mag += std::fabs(w[size_t(j)] * x[size_t(k * n_cols + j)]);
                    }
                    worst = std::max(worst, std::fabs(warp_tree(part[size_t(k)]) - ref) / mag);
                }
            }
            // float32 sums of 1536 products: a few 1e-7 of the magnitude
            CHECK(worst < 2e-6, "%s n_tok %d: gemv error %.3g of sum|w x|", quant_name(t), n_tok, worst);
        }
    }
}

// The device's attention for one (entry, head): positions [first, last] in splits of split_len, each in chunks
// of 32 through cm::attn_chunk_scale, then cm::attn_combine.
void emulate_attention(const float* q, const std::vector<std::vector<float>>& k, const std::vector<std::vector<float>>& v,
                       int32_t lo, int32_t first, int32_t last, int32_t split_len, int n_split, int hd, float scale,
                       float* out) {
    std::vector<float> m(static_cast<size_t>(n_split)), l(static_cast<size_t>(n_split)), acc(size_t(n_split) * size_t(hd), 0.0f);
    for (int z = 0; z < n_split; ++z) {
        cm::attn_state st = cm::attn_init();
        float* a = acc.data() + size_t(z) * size_t(hd);
        const int32_t b = lo + z * split_len, e = std::min(last + 1, b + split_len);
        for (int32_t c0 = b; c0 < e; c0 += 32) {
            float s[32];
            for (int j = 0; j < 32; ++j) {
                const int32_t p = c0 + j;
                s[j] = -3.0e38f;
                if (p < e && p >= first && p <= last) {
                    float d = 0.0f;
                    for (int i = 0; i < hd; ++i) d += q[i] * k[size_t(p)][size_t(i)];
                    s[j] = d * scale;
                }
            }
            const float corr = cm::attn_chunk_scale(&st, s, 32);
            for (int i = 0; i < hd; ++i) a[i] *= corr;
            for (int j = 0; j < 32 && c0 + j < e; ++j) {
                for (int i = 0; i < hd; ++i) a[i] += s[j] * v[size_t(c0 + j)][size_t(i)];
            }
        }
        m[size_t(z)] = st.m;
        l[size_t(z)] = st.l;
    }
    cm::attn_combine(m.data(), l.data(), acc.data(), hd, n_split, hd, out);
}

void test_attention() {
    std::mt19937 rng(17);
    std::normal_distribution<float> g(0.0f, 1.0f);
    const int hd = 64, n_pos = 300;
    std::vector<std::vector<float>> k(n_pos, std::vector<float>(hd)), v(n_pos, std::vector<float>(hd));
    for (auto* kv : {&k, &v}) {
        for (auto& row : *kv) {
            for (float& f : row) f = g(rng);
        }
    }
    std::vector<float> q(hd);
    for (float& f : q) f = 0.5f * g(rng);
    const float scale = 1.0f / 8.0f;
    double worst = 0.0;
    for (int32_t n_swa : {0, 40}) {
        for (int32_t pos : {0, 31, 32, 33, 150, 299}) {
            for (int n_split : {1, 3, 8}) {
                const int32_t first = cm::attn_first(pos, n_swa);
                // the block's range starts at its tile's first entry's window (an earlier entry: lo <= first)
                const int32_t lo = std::max(0, first - 5);
                const int32_t span = pos + 1 - lo, per = (span + n_split - 1) / n_split;
                const int32_t split_len = std::max(32, (per + 31) / 32 * 32);
                float out[hd];
                double ref[hd];
                emulate_attention(q.data(), k, v, lo, first, pos, split_len, n_split, hd, scale, out);
                cuda_test_attention_f64(q.data(), k, v, first, pos, hd, scale, ref);
                for (int i = 0; i < hd; ++i) worst = std::max(worst, std::fabs(out[i] - ref[i]));
            }
        }
    }
    CHECK(worst < 1e-5, "attention emulation error %.3g (values ~1)", worst);
}

void test_kv_addressing() {
    // gemma3-like: layers 0, 2 window layers of 8, chunk 4: rings of 11 cells + 7 mirror cells, n_ctx 64
    const uint8_t swa[3] = {1, 0, 1};
    kv_cache* kv = kv_cache_create(3, 64, 2, 32, KV_TYPE_F16, swa, 8, 4);
    CHECK(kv && kv->n_ring == 11, "ring layout");
    if (!kv) return;
    int bad = 0;
    for (int32_t l = 0; l < 3; ++l) {
        const int64_t head_stride = int64_t(kv->layer_cells[size_t(l)]) * int64_t(kv->head_bytes);
        const int32_t n_ring = kv_is_ring(kv, l) ? kv->n_ring : 0;
        for (int32_t h = 0; h < 2; ++h) {
            for (int32_t p = 0; p < 64; ++p) {
                const size_t dev = kv->layer_off[size_t(l)] + size_t(h * head_stride) +
                                   size_t(cm::kv_cell(p, n_ring)) * kv->head_bytes;
                bad += dev != kv_cell_offset(kv, l, h, p);
            }
        }
    }
    CHECK(bad == 0, "device cache addressing differs from kv_cell_offset at %d cells", bad);
    kv_cache_free(kv);
}

void test_elementwise() {
    std::mt19937 rng(19);
    std::uniform_real_distribution<float> u(-4.0f, 4.0f);
    const int hd = 16, n_rot = 12, heads = 3;
    for (bool neox : {false, true}) {
        std::vector<float> x(static_cast<size_t>(heads * hd)), y;
        for (float& f : x) f = u(rng);
        y = x;
        std::vector<float> inv(n_rot / 2), cs(n_rot);
        for (int i = 0; i < n_rot / 2; ++i) inv[size_t(i)] = std::pow(10000.0f, -2.0f * i / n_rot);
        rope_cos_sin(n_rot, 77, inv.data(), cs.data());
        rope_row_cs(x.data(), heads, hd, n_rot, neox, cs.data());
        for (int h = 0; h < heads; ++h) {
            for (int i = 0; i < n_rot / 2; ++i) {
                int a, b;
                cm::rope_pair_index(i, n_rot, neox, &a, &b);
                cm::rope_pair(&y[size_t(h * hd + a)], &y[size_t(h * hd + b)], cs[size_t(2 * i)], cs[size_t(2 * i + 1)]);
            }
        }
        int bad = 0;
        for (size_t i = 0; i < x.size(); ++i) bad += x[i] != y[i];
        CHECK(bad == 0, "rope (neox %d) differs from rope_row_cs at %d values", int(neox), bad);
    }
    double worst_gelu = 0.0, worst_silu = 0.0;
    for (int i = 0; i < 10000; ++i) {
        float gx = u(rng), one = 1.0f;
        const float x = gx;
        gelu_mul_scalar(&gx, &one, 1);
        worst_gelu = std::max(worst_gelu, double(std::fabs(cm::gelu_tanh(x) - gx)));
        const double s = double(x) / (1.0 + std::exp(-double(x)));
        worst_silu = std::max(worst_silu, std::fabs(double(cm::silu(x)) - s));
    }
    CHECK(worst_gelu < 1e-6 && worst_silu < 1e-6, "gelu %.3g, silu %.3g off the CPU / float64", worst_gelu, worst_silu);
}

}  // namespace

int main() {
    test_conversions();
    test_dequant();
    test_gemv();
    test_attention();
    test_kv_addressing();
    test_elementwise();
    if (g_failures) std::fprintf(stderr, "cuda_math_test: %d failures\n", g_failures);
    else std::printf("cuda_math_test: ok\n");
    return g_failures ? 1 : 0;
}

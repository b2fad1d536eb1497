// tests/prefill/cuda_kernels_test.cpp — the CUDA kernels on the device against the CPU engine and float64
// references. Without a CUDA build or a device it prints SKIP with the reason and exits TEST_SKIP_EXIT
// (CTest: "skipped"). tools/device_check.sh runs it, and runs it again under compute-sanitizer's memcheck.
//  - GEMV per native type, 1..8 tokens: within 1e-5 of sum|w x| of a float64 dot (float32 sums);
//  - bf16 dequantisation: every element the bf16 nearest the CPU's dequantised value (an ulp for contraction);
//  - tensor-core GEMM on ragged shapes: within 1e-5 of sum|a b| of float64 on the same bf16 inputs;
//  - RMS norm, RoPE, SwiGLU / GELU against the CPU's rmsnorm_row, rope_row_cs, gelu_mul_scalar;
//  - KV write + attention (grouped heads, a window layer as a ring, prompt tiles and split decode) within 1e-4
//    of float64 softmax(q k^T) v over the half-rounded K and V.
#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "engine/cpu/gelu.h"
#include "engine/cpu/kernels.h"
#include "engine/kv_cache.h"
#include "prefill/cuda_kernels.h"
#include "prefill/cuda_math.h"
#include "tests/engine/model_test_util.h"
#include "tests/engine/test_check.h"
#include "tests/prefill/cuda_test_util.h"

namespace {

template <typename T>
T* upload(const std::vector<T>& v) {
    T* d = static_cast<T*>(cuk_alloc(v.size() * sizeof(T)));
    cuk_copy(d, v.data(), v.size() * sizeof(T));
    return d;
}
template <typename T>
std::vector<T> download(const T* d, size_t n) {
    std::vector<T> v(n);
    cuk_copy(v.data(), d, n * sizeof(T));
    return v;
}

void check_device(const char* what) {
    const std::string e = cuk_error();
    CHECK(e.empty(), "%s: device error: %s", what, e.c_str());
}

void test_gemv_and_dequant() {
    std::mt19937 rng(23);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int64_t n_rows = 67, n_cols = 2304;  // 67: a partial block of 8 warps
    for (ggml_type t : CUDA_TEST_TYPES) {
        const std::vector<uint8_t> w = cuda_test_rows(t, n_rows, n_cols, rng);
        const size_t rb = quant_row_bytes(t, n_cols);
        uint8_t* dw = upload(w);
        for (int n_tok : {1, 2, 8}) {
            std::vector<float> x(static_cast<size_t>(n_tok * n_cols));
            for (float& f : x) f = u(rng);
            float* dx = upload(x);
            float* dy = static_cast<float*>(cuk_alloc(size_t(n_tok * n_rows) * 4));
            cuk_gemv(t, dw, rb, n_rows, n_cols, dx, n_cols, n_tok, dy, n_rows);
            const std::vector<float> y = download(dy, size_t(n_tok * n_rows));
            check_device("gemv");
            double worst = 0.0;
            for (int64_t r = 0; r < n_rows; ++r) {
                const std::vector<double> wr = cuda_test_row_f64(t, w.data() + size_t(r) * rb, n_cols);
                for (int k = 0; k < n_tok; ++k) {
                    double ref = 0.0, mag = 0.0;
                    for (int64_t j = 0; j < n_cols; ++j) {
                        ref += wr[size_t(j)] * x[size_t(k * n_cols + j)];
                        mag += std::fabs(wr[size_t(j)] * x[size_t(k * n_cols + j)]);
                    }
                    worst = std::max(worst, std::fabs(y[size_t(k * n_rows + r)] - ref) / mag);
                }
            }
            CHECK(worst < 1e-5, "%s gemv n_tok %d: error %.3g of sum|w x|", quant_name(t), n_tok, worst);
            cuk_free(dx);
            cuk_free(dy);
        }
        uint16_t* db = static_cast<uint16_t*>(cuk_alloc(size_t(n_rows * n_cols) * 2));
        cuk_dequant_bf16(t, dw, rb, n_rows, n_cols, db);
        const std::vector<uint16_t> b = download(db, size_t(n_rows * n_cols));
        check_device("dequant_bf16");
        int bad = 0;
        for (int64_t r = 0; r < n_rows; ++r) {
            std::vector<float> ref(static_cast<size_t>(n_cols));
            dequantize_row(t, w.data() + size_t(r) * rb, ref.data(), n_cols);
            for (int64_t j = 0; j < n_cols; ++j) {
                const float got = cm::bf16_to_float(b[size_t(r * n_cols + j)]);
                bad += !(std::fabs(got - ref[size_t(j)]) <= std::fabs(ref[size_t(j)]) / 128.0f + 1e-30f);
            }
        }
        CHECK(bad == 0, "%s dequant_bf16: %d elements off by more than a bf16 ulp", quant_name(t), bad);
        cuk_free(db);
        cuk_free(dw);
    }
}

void test_gemm() {
    std::mt19937 rng(29);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto [m, n, k] : {std::array<int64_t, 3>{200, 300, 512}, {9, 130, 64}, {256, 256, 4096}}) {
        std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(n * k));
        for (float& f : a) f = u(rng);
        for (float& f : b) f = u(rng);
        std::vector<uint16_t> bb(b.size());
        for (size_t i = 0; i < b.size(); ++i) bb[i] = cm::float_to_bf16(b[i]);
        float* da = upload(a);
        uint16_t* dab = static_cast<uint16_t*>(cuk_alloc(a.size() * 2));
        uint16_t* dbb = upload(bb);
        float* dc = static_cast<float*>(cuk_alloc(size_t(m * n) * 4));
        cuk_to_bf16(da, int64_t(a.size()), dab);
        cuk_gemm_bf16(dab, dbb, dc, m, n, k);
        const std::vector<float> c = download(dc, size_t(m * n));
        check_device("gemm");
        double worst = 0.0;
        for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
                double ref = 0.0, mag = 0.0;
                for (int64_t p = 0; p < k; ++p) {
                    const double x = cm::bf16_to_float(cm::float_to_bf16(a[size_t(i * k + p)]));
                    const double y = cm::bf16_to_float(bb[size_t(j * k + p)]);
                    ref += x * y;
                    mag += std::fabs(x * y);
                }
                worst = std::max(worst, std::fabs(c[size_t(i * n + j)] - ref) / mag);
            }
        }
        CHECK(worst < 1e-5, "gemm %lldx%lldx%lld: error %.3g of sum|a b|", (long long)m, (long long)n, (long long)k, worst);
        for (void* p : {static_cast<void*>(da), static_cast<void*>(dab), static_cast<void*>(dbb), static_cast<void*>(dc)}) cuk_free(p);
    }
}

void test_elementwise() {
    std::mt19937 rng(31);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    const int rows = 5, n = 576;
    std::vector<float> x(rows * n), w(n);
    for (float& f : x) f = u(rng);
    for (float& f : w) f = u(rng);
    float* dx = upload(x);
    float* dw = upload(w);
    float* dy = static_cast<float*>(cuk_alloc(x.size() * 4));
    cuk_rmsnorm(dx, n, dw, dy, n, rows, n, 1e-5f);
    std::vector<float> y = download(dy, x.size());
    check_device("rmsnorm");
    double worst = 0.0;
    for (int r = 0; r < rows; ++r) {
        std::vector<float> ref(n);
        rmsnorm_row(x.data() + r * n, w.data(), ref.data(), n, 1e-5f);
        for (int i = 0; i < n; ++i) worst = std::max(worst, double(std::fabs(ref[size_t(i)] - y[size_t(r * n + i)])));
    }
    CHECK(worst < 1e-5, "rmsnorm error %.3g", worst);
    // RoPE: 3 entries x 4 heads of 64, 48 rotated dims, both pair layouts, against rope_row_cs
    const int heads = 4, hd = 64, n_rot = 48, n_ent = 3;
    std::vector<float> inv(n_rot / 2);
    for (int i = 0; i < n_rot / 2; ++i) inv[size_t(i)] = std::pow(10000.0f, -2.0f * i / n_rot);
    std::vector<cuk_entry> ents(n_ent);
    for (int e = 0; e < n_ent; ++e) ents[size_t(e)].pos = 1000 * e + 7;
    float* dinv = upload(inv);
    cuk_entry* dents = upload(ents);
    for (bool neox : {false, true}) {
        std::vector<float> q(static_cast<size_t>(n_ent * heads * hd));
        for (float& f : q) f = u(rng);
        float* dq = upload(q);
        cuk_rope(dq, n_ent, heads, hd, n_rot, neox, dents, dinv, nullptr, 1.0f);
        const std::vector<float> got = download(dq, q.size());
        check_device("rope");
        double worst_rope = 0.0;
        for (int e = 0; e < n_ent; ++e) {
            std::vector<float> cs(n_rot);
            rope_cos_sin(n_rot, ents[size_t(e)].pos, inv.data(), cs.data());
            rope_row_cs(q.data() + e * heads * hd, heads, hd, n_rot, neox, cs.data());
        }
        for (size_t i = 0; i < q.size(); ++i) worst_rope = std::max(worst_rope, double(std::fabs(q[i] - got[i])));
        CHECK(worst_rope < 1e-5, "rope (neox %d) error %.3g", int(neox), worst_rope);
        cuk_free(dq);
    }
    for (bool gelu : {false, true}) {
        std::vector<float> g(4096), up(4096);
        for (float& f : g) f = u(rng);
        for (float& f : up) f = u(rng);
        float* dg = upload(g);
        float* du = upload(up);
        cuk_glu(dg, du, 4096, gelu);
        const std::vector<float> got = download(dg, g.size());
        check_device("glu");
        if (gelu) gelu_mul_scalar(g.data(), up.data(), 4096);
        else for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * up[i];
        double worst_glu = 0.0;
        for (size_t i = 0; i < g.size(); ++i) worst_glu = std::max(worst_glu, double(std::fabs(g[i] - got[i])));
        CHECK(worst_glu < 1e-5, "glu (gelu %d) error %.3g", int(gelu), worst_glu);
        cuk_free(dg);
        cuk_free(du);
    }
    for (void* p : {static_cast<void*>(dx), static_cast<void*>(dw), static_cast<void*>(dy), static_cast<void*>(dinv),
                    static_cast<void*>(dents)}) cuk_free(p);
}

// One layer of a cache laid out by kv_cache_create (a window layer with a ring when swa), on the device; K/V for
// positions [0, n_pos) written in chunks by cuk_kv_write, then attention of the last `n_q` entries (one tile run
// each chunk) with n_split position splits, against float64 over the half-rounded rows.
void run_attention_case(int hd, int n_head, int n_head_kv, bool swa, int n_pos, int n_q, int n_split) {
    std::mt19937 rng(37 + hd + n_pos);
    std::normal_distribution<float> g(0.0f, 1.0f);
    const int32_t n_swa = swa ? 48 : 0, chunk = 64;
    const uint8_t swa_flags[1] = {uint8_t(swa ? 1 : 0)};
    kv_cache* layout = kv_cache_create(1, n_pos + 8, n_head_kv, hd, KV_TYPE_F16, swa ? swa_flags : nullptr, n_swa, chunk);
    const int nkv = n_head_kv * hd, nq = n_head * hd;
    uint8_t* dk = static_cast<uint8_t*>(cuk_alloc(layout->map_bytes));
    uint8_t* dv = static_cast<uint8_t*>(cuk_alloc(layout->map_bytes));
    cuk_kv_seq seq;
    seq.k = dk;
    seq.v = dv;
    seq.head_stride = int64_t(layout->layer_cells[0]) * int64_t(layout->head_bytes);
    seq.n_ring = kv_is_ring(layout, 0) ? layout->n_ring : 0;
    seq.n_swa = n_swa;
    cuk_kv_seq* dseq = upload(std::vector<cuk_kv_seq>{seq});
    std::vector<std::vector<float>> kh(static_cast<size_t>(n_head_kv)), vh(static_cast<size_t>(n_head_kv));  // per head: (n_pos, hd) halves
    std::vector<std::vector<std::vector<float>>> K(static_cast<size_t>(n_head_kv)), V(static_cast<size_t>(n_head_kv));
    for (int h = 0; h < n_head_kv; ++h) {
        K[size_t(h)].assign(size_t(n_pos), std::vector<float>(size_t(hd)));
        V[size_t(h)].assign(size_t(n_pos), std::vector<float>(size_t(hd)));
    }
    std::vector<float> q_all(size_t(n_pos) * size_t(nq));
    for (float& f : q_all) f = 0.3f * g(rng);
    for (int32_t p0 = 0; p0 < n_pos; p0 += chunk) {
        const int n = std::min(chunk, n_pos - p0);
        std::vector<float> k(static_cast<size_t>(n * nkv)), v(static_cast<size_t>(n * nkv));
        std::vector<cuk_entry> ents(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) {
            ents[size_t(i)].pos = p0 + i;
            for (int j = 0; j < nkv; ++j) {
                k[size_t(i * nkv + j)] = g(rng);
                v[size_t(i * nkv + j)] = g(rng);
                K[size_t(j / hd)][size_t(p0 + i)][size_t(j % hd)] = fp16_to_fp32(fp32_to_fp16(k[size_t(i * nkv + j)]));
                V[size_t(j / hd)][size_t(p0 + i)][size_t(j % hd)] = fp16_to_fp32(fp32_to_fp16(v[size_t(i * nkv + j)]));
            }
        }
        float* dkk = upload(k);
        float* dvv = upload(v);
        cuk_entry* de = upload(ents);
        cuk_kv_write(dkk, dvv, n, de, dseq, n_head_kv, hd);
        cuk_sync();
        cuk_free(dkk);
        cuk_free(dvv);
        cuk_free(de);
    }
    // the last n_q positions as one batch: tiles of cuk_attn_tile_entries
    const int group = n_head / n_head_kv, per_tile = cuk_attn_tile_entries(group);
    std::vector<cuk_entry> ents(static_cast<size_t>(n_q));
    std::vector<int32_t> tiles;
    for (int i = 0; i < n_q; ++i) {
        ents[size_t(i)].pos = n_pos - n_q + i;
        if (i % per_tile == 0) tiles.push_back(i);
    }
    const int n_tiles = int(tiles.size());
    tiles.push_back(n_q);
    int32_t max_span = 0;
    for (int t = 0; t < n_tiles; ++t) {
        const int32_t lo = cm::attn_first(ents[size_t(tiles[size_t(t)])].pos, n_swa);
        max_span = std::max(max_span, ents[size_t(tiles[size_t(t) + 1] - 1)].pos + 1 - lo);
    }
    float* dq = upload(std::vector<float>(q_all.end() - n_q * nq, q_all.end()));
    float* dout = static_cast<float*>(cuk_alloc(size_t(n_q * nq) * 4));
    float* dscr = static_cast<float*>(cuk_alloc(cuk_attn_scratch_floats(n_q, n_head, hd, n_split) * 4));
    cuk_entry* de = upload(ents);
    int32_t* dt = upload(tiles);
    const float scale = 1.0f / std::sqrt(float(hd));
    cuk_attention(dq, dout, n_q, de, dt, n_tiles, dseq, n_head, n_head_kv, hd, scale, n_split, max_span, dscr);
    const std::vector<float> out = download(dout, size_t(n_q * nq));
    check_device("attention");
    double worst = 0.0;
    std::vector<double> ref(static_cast<size_t>(hd));
    for (int i = 0; i < n_q; ++i) {
        const int32_t pos = ents[size_t(i)].pos;
        for (int h = 0; h < n_head; ++h) {
            const float* q = q_all.data() + size_t(pos) * size_t(nq) + size_t(h * hd);
            cuda_test_attention_f64(q, K[size_t(h / group)], V[size_t(h / group)], cm::attn_first(pos, n_swa), pos, hd,
                                    scale, ref.data());
            for (int d = 0; d < hd; ++d) worst = std::max(worst, std::fabs(out[size_t(i * nq + h * hd + d)] - ref[size_t(d)]));
        }
    }
    CHECK(worst < 1e-4, "attention hd %d heads %d/%d swa %d n_pos %d n_q %d splits %d: error %.3g", hd, n_head, n_head_kv,
          int(swa), n_pos, n_q, n_split, worst);
    for (void* p : {static_cast<void*>(dk), static_cast<void*>(dv), static_cast<void*>(dseq), static_cast<void*>(dq),
                    static_cast<void*>(dout), static_cast<void*>(dscr), static_cast<void*>(de), static_cast<void*>(dt)}) cuk_free(p);
    kv_cache_free(layout);
}

void test_attention() {
    run_attention_case(64, 9, 3, false, 200, 40, 1);    // SmolLM2's heads: a prompt chunk
    run_attention_case(64, 9, 3, false, 700, 1, 8);     // its decode step, split over positions
    run_attention_case(128, 32, 8, false, 333, 70, 2);  // Llama-3-8B's heads
    run_attention_case(256, 4, 1, true, 300, 64, 1);    // Gemma 3 270M's heads on a window layer (ring)
    run_attention_case(256, 4, 1, true, 300, 1, 4);     // ... its decode step
}

}  // namespace

int main() {
    std::string why;
    if (!cuk_available(&why)) {
        std::printf("SKIP: %s\n", why.c_str());
        return TEST_SKIP_EXIT;
    }
    std::printf("device: %s, %d SMs\n", cuk_device_name().c_str(), cuk_device_sms());
    test_gemv_and_dequant();
    test_gemm();
    test_elementwise();
    test_attention();
    if (g_failures) std::fprintf(stderr, "cuda_kernels_test: %d failures\n", g_failures);
    else std::printf("cuda_kernels_test: ok\n");
    return g_failures ? 1 : 0;
}

// tools/cpp/bench_kernels.cpp — `strata-bench-kernels`: CPU time of one matmul per weight type, the engine's
// row kernels (engine/cpu/kernels_kq.h and the Q4_0/Q4_1/Q8_0 ones) against the path each type took before
// them: the generic float path (each row dequantised by quants.cpp, then dot_f32 with every token) for Q5_1,
// Q2_K, Q3_K, IQ4_XS, and the compiler-vectorised kernels_kquant.h rows for Q4_K, Q5_K, Q6_K.
//
//   strata-bench-kernels [ROWS [COLS [REPEATS]]]      (defaults 2048 2048 5; kernel set: kernels_get())
//
// One thread (a pool of 1), CPU time of the process (CLOCK_PROCESS_CPUTIME_ID), best of REPEATS, so that a
// shared, loaded machine disturbs the figures least. Prints per type and token count (1 = a decode step,
// 64 = a prompt chunk): old and new ms per matmul, the speed-up, and the new kernel's weight GB/s (1 token)
// or GMAC/s (64 tokens). Random weights (random bytes with modest half scales); activations uniform.
// Then, for the types with a row-group layout (weight_pack: Q4_0, Q4_1, Q8_0, Q4_K, Q6_K), the same matmul on
// the row kernels against the packed copy's group kernels, and the packed copy's size against the rows'.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/kernels_kq.h"
#include "cpu/quants.h"
#include "cpu/threadpool.h"

namespace {

double cpu_s() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

std::vector<uint8_t> random_rows(ggml_type type, int64_t k, int64_t n, std::mt19937* rng) {
    std::vector<uint8_t> buf(quant_row_bytes(type, k) * size_t(n));
    for (uint8_t& b : buf) b = uint8_t((*rng)());
    const size_t bb = quant_block_bytes(type);
    size_t d_off[2] = {SIZE_MAX, SIZE_MAX};
    switch (type) {
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q5_1: case GGML_TYPE_Q4_1: d_off[0] = 0; d_off[1] = 2; break;
    case GGML_TYPE_Q6_K: d_off[0] = 208; break;
    case GGML_TYPE_Q2_K: d_off[0] = 80; d_off[1] = 82; break;
    case GGML_TYPE_Q3_K: d_off[0] = 108; break;
    default: d_off[0] = 0; break;  // Q4_0, Q8_0, IQ4_XS
    }
    for (size_t o = 0; o < buf.size(); o += bb) {
        for (size_t off : d_off) {
            if (off == SIZE_MAX) continue;
            const uint16_t h = fp32_to_fp16(0.01f);
            std::memcpy(buf.data() + o + off, &h, 2);
        }
    }
    return buf;
}

struct old_job {
    const kernel_set* ks;
    const weight_view* w;
    const float* x;
    int64_t n_tok;
    float* y;
};

// the old generic path: dequantise each row once, dot it with every token (mm_generic_range)
void old_generic(const old_job& j) {
    const int64_t k = j.w->n_cols, n = j.w->n_rows;
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = 0; r < n; ++r) {
        dequantize_row(j.w->type, j.w->data + r * j.w->row_bytes, row.data(), k);
        for (int64_t t = 0; t < j.n_tok; ++t) j.y[t * n + r] = j.ks->dot_f32(row.data(), j.x + t * k, k);
    }
}

// the old K-type rows (kernels_kquant.h through the set's row_q4_k / row_q5_k / row_q6_k), same driver shape
void old_krows(const old_job& j, mm_row_fn row) {
    const int64_t k = j.w->n_cols, n = j.w->n_rows, nb = k / QK32;
    std::vector<int16_t> qs(size_t(j.n_tok * k));
    std::vector<float> d(size_t(j.n_tok * nb)), ds(size_t(j.n_tok * nb));
    for (int64_t t = 0; t < j.n_tok; ++t) j.ks->quantize_q16(j.x + t * k, k, qs.data() + t * k, d.data() + t * nb, ds.data() + t * nb);
    const act_q16 a{qs.data(), d.data(), ds.data(), k};
    for (int64_t t0 = 0; t0 < j.n_tok; t0 += MM_TOK_TILE) {
        const int nt = int(j.n_tok - t0 < MM_TOK_TILE ? j.n_tok - t0 : MM_TOK_TILE);
        for (int64_t r = 0; r < n; ++r) row(j.w->data + r * j.w->row_bytes, a, t0, nt, j.y + t0 * n + r, size_t(n));
    }
}

template <class F>
double best_ms(int repeats, F&& f) {
    double best = 1e30;
    for (int i = 0; i < repeats; ++i) {
        const double t = cpu_s();
        f();
        const double dt = cpu_s() - t;
        best = dt < best ? dt : best;
    }
    return best * 1e3;
}

}  // namespace

int main(int argc, char** argv) {
    const int64_t n = argc > 1 ? std::atoll(argv[1]) : 2048, k = argc > 2 ? std::atoll(argv[2]) : 2048;
    const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
    if (n < 16 || k < 256 || k % 256 != 0 || repeats < 1) {
        std::fprintf(stderr, "usage: strata-bench-kernels [ROWS >= 16 [COLS, a multiple of 256 [REPEATS]]]\n");
        return 2;
    }
    const kernel_set& ks = kernels_get();
    threadpool* pool = threadpool_init(1);
    std::mt19937 rng(99);
    std::printf("kernels=%s  matmul %ld x %ld, 1 thread, CPU ms (best of %d)\n", ks.name, long(n), long(k), repeats);
    std::printf("%-7s %4s %10s %10s %8s %12s  %s\n", "type", "tok", "old ms", "new ms", "speedup", "new rate", "old path");
    const ggml_type types[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q5_1,
                               GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_IQ4_XS};
    for (ggml_type type : types) {
        const std::vector<uint8_t> wbuf = random_rows(type, k, n, &rng);
        const weight_view w{type, k, n, quant_row_bytes(type, k), wbuf.data()};
        const mm_row_fn old_row = type == GGML_TYPE_Q4_K ? ks.row_q4_k : type == GGML_TYPE_Q5_K ? ks.row_q5_k
                                : type == GGML_TYPE_Q6_K ? ks.row_q6_k : nullptr;
        for (int64_t n_tok : {1, 64}) {
            std::vector<float> x(size_t(n_tok * k)), y(size_t(n_tok * n));
            std::uniform_real_distribution<float> u(-1.0f, 1.0f);
            for (float& v : x) v = u(rng);
            mm_scratch s;
            const old_job j{&ks, &w, x.data(), n_tok, y.data()};
            const double t_old = best_ms(repeats, [&] { old_row ? old_krows(j, old_row) : old_generic(j); });
            const double t_new = best_ms(repeats, [&] { matmul(pool, ks, w, x.data(), k, n_tok, y.data(), &s); });
            char rate[32];
            if (n_tok == 1) std::snprintf(rate, sizeof rate, "%.2f GB/s", double(wbuf.size()) / (t_new * 1e6));
            else std::snprintf(rate, sizeof rate, "%.2f GMAC/s", double(n * k * n_tok) / (t_new * 1e6));
            std::printf("%-7s %4ld %10.3f %10.3f %7.1fx %12s  %s\n", quant_name(type), long(n_tok), t_old, t_new,
                        t_old / t_new, rate, old_row ? "kernels_kquant.h rows" : "dequantise + dot_f32");
        }
    }
    // the row-group layout (weight_pack) against the same weight on its row kernels
    std::printf("\n%-7s %4s %10s %10s %8s %12s  %s\n", "type", "tok", "row ms", "group ms", "speedup", "group rate", "packed bytes / row bytes");
    for (ggml_type type : {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K}) {
        const size_t pb = weight_packed_bytes(type, k, n);
        if (pb == 0 || !group_fn(ks, type)) continue;
        const std::vector<uint8_t> wbuf = random_rows(type, k, n, &rng);
        const weight_view w{type, k, n, quant_row_bytes(type, k), wbuf.data()};
        uint8_t* packed = weight_alloc(pb);
        weight_pack(w, packed);
        weight_view wp = w;
        wp.packed = packed;
        for (int64_t n_tok : {1, 64}) {
            std::vector<float> x(size_t(n_tok * k)), y(size_t(n_tok * n));
            std::uniform_real_distribution<float> u(-1.0f, 1.0f);
            for (float& v : x) v = u(rng);
            mm_scratch s;
            const double t_row = best_ms(repeats, [&] { matmul(pool, ks, w, x.data(), k, n_tok, y.data(), &s); });
            const double t_grp = best_ms(repeats, [&] { matmul(pool, ks, wp, x.data(), k, n_tok, y.data(), &s); });
            char rate[32];
            if (n_tok == 1) std::snprintf(rate, sizeof rate, "%.2f GB/s", double(pb) / (t_grp * 1e6));
            else std::snprintf(rate, sizeof rate, "%.2f GMAC/s", double(n * k * n_tok) / (t_grp * 1e6));
            std::printf("%-7s %4ld %10.3f %10.3f %7.1fx %12s  %.2f\n", quant_name(type), long(n_tok), t_row, t_grp,
                        t_row / t_grp, rate, double(pb) / double(wbuf.size()));
        }
        std::free(packed);
    }
    threadpool_free(pool);
    return 0;
}

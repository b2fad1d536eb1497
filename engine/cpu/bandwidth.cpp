// engine/cpu/bandwidth.cpp — the read-bandwidth probe (contract in bandwidth.h).
#include "bandwidth.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include <time.h>

#include <random>
#include <vector>

#include "kernels.h"
#include "kernels_act8.h"
#include "threadpool.h"

namespace {

// Bytes each thread reads per step of its range: a whole number of 64-byte lines.
constexpr size_t BW_LINE = 64;

struct bw_job {
    const uint8_t* buf;
    size_t n_lines;
    bandwidth_read_fn read;
    std::atomic<uint64_t> sink{0};
};

void bw_range(void* ctx, int64_t i0, int64_t i1, int) {
    bw_job& j = *static_cast<bw_job*>(ctx);
    const uint64_t s = j.read(j.buf + size_t(i0) * BW_LINE, size_t(i1 - i0) * BW_LINE);
    j.sink.fetch_add(s, std::memory_order_relaxed);
}

bandwidth_read_fn pick_reader(const char** name) {
    const std::string k = kernels_get().name;
    if (k == "avx512_vnni" && bandwidth_read_avx512()) {
        *name = "avx512";
        return bandwidth_read_avx512();
    }
    if ((k == "avx512_vnni" || k == "avx2") && bandwidth_read_avx2()) {
        *name = "avx2";
        return bandwidth_read_avx2();
    }
    *name = "scalar";
    return bandwidth_read_scalar;
}

double thread_cpu_s() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// random blocks of `type` with block scales in a model's range (so no half is a NaN or an infinity)
std::vector<uint8_t> random_blocks(ggml_type type, int64_t k, int64_t n) {
    std::mt19937 rng(15);
    std::vector<uint8_t> buf(quant_row_bytes(type, k) * size_t(n));
    for (uint8_t& b : buf) b = uint8_t(rng());
    const size_t bb = quant_block_bytes(type);
    for (size_t off = 0; off < buf.size(); off += bb) {
        const uint16_t d = fp32_to_fp16(0.01f), m = fp32_to_fp16(-0.05f);
        std::memcpy(buf.data() + off, &d, 2);
        if (type == GGML_TYPE_Q4_1) std::memcpy(buf.data() + off + 2, &m, 2);
    }
    return buf;
}

// a 256 x 576 weight: 92 KiB (Q4_0/Q4_1) to 156 KiB (Q8_0), in L2 with its packed copy
constexpr int64_t CEIL_COLS = 576, CEIL_ROWS = 256;
constexpr double CEIL_CPU_S = 0.05;

}  // namespace

double kernel_ceiling_gb_s(ggml_type type, int act_bits) {
    const size_t packed_bytes = weight_packed_bytes(type, CEIL_COLS, CEIL_ROWS);
    if (packed_bytes == 0) return 0.0;
    std::vector<uint8_t> raw = random_blocks(type, CEIL_COLS, CEIL_ROWS);
    weight_view w{type, CEIL_COLS, CEIL_ROWS, quant_row_bytes(type, CEIL_COLS), raw.data()};
    w.act_bits = act_bits;
    auto* packed = static_cast<uint8_t*>(std::aligned_alloc(64, (packed_bytes + 63) / 64 * 64));
    if (!packed) return 0.0;
    w.packed8 = act_bits == 8 && group8_fn(type) != nullptr;
    if (w.packed8) {
        weight_pack8(w, packed);
    } else {
        weight_pack(w, packed);
    }
    w.packed = packed;
    std::vector<float> x(static_cast<size_t>(CEIL_COLS)), y(static_cast<size_t>(CEIL_ROWS));
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 37 % 101) - 50) / 25.0f;
    threadpool* one = threadpool_init(1);
    mm_scratch scratch;
    const kernel_set& ks = kernels_get();
    matmul(one, ks, w, x.data(), CEIL_COLS, 1, y.data(), &scratch);  // warm: scratch sized, cache filled
    int64_t n_calls = 0;
    const double t0 = thread_cpu_s();
    double t = t0;
    while (t - t0 < CEIL_CPU_S) {
        for (int i = 0; i < 64; ++i) matmul(one, ks, w, x.data(), CEIL_COLS, 1, y.data(), &scratch);
        n_calls += 64;
        t = thread_cpu_s();
    }
    threadpool_free(one);
    std::free(packed);
    return t > t0 ? double(packed_bytes) * double(n_calls) / (t - t0) / 1e9 : 0.0;
}

uint64_t bandwidth_read_scalar(const uint8_t* p, size_t n_bytes) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < n_bytes; i += 32) {
        uint64_t w[4];
        std::memcpy(w, p + i, 32);
        s0 += w[0];
        s1 += w[1];
        s2 += w[2];
        s3 += w[3];
    }
    return s0 + s1 + s2 + s3;
}

bandwidth_result bandwidth_probe(threadpool* pool, size_t buffer_bytes, int n_passes) {
    bandwidth_result r;
    buffer_bytes = (buffer_bytes + BW_LINE - 1) / BW_LINE * BW_LINE;
    uint8_t* buf = weight_alloc(buffer_bytes);  // in the packed weights' pages (kernels.h)
    if (!buf) return r;
    for (size_t i = 0; i < buffer_bytes; i += 8) {  // every page touched, the words not all alike
        const uint64_t v = i * 0x9E3779B97F4A7C15ull;
        std::memcpy(buf + i, &v, 8);
    }
    bw_job j{buf, buffer_bytes / BW_LINE, pick_reader(&r.reader)};
    threadpool_run(pool, int64_t(j.n_lines), bw_range, &j);  // warm pass: the pool awake, the TLB filled
    double best_s = 0.0, sum_s = 0.0;
    for (int p = 0; p < n_passes; ++p) {
        const auto t0 = std::chrono::steady_clock::now();
        threadpool_run(pool, int64_t(j.n_lines), bw_range, &j);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        sum_s += s;
        if (p == 0 || s < best_s) best_s = s;
    }
    std::free(buf);
    r.buffer_bytes = buffer_bytes;
    r.n_passes = n_passes;
    r.n_threads = threadpool_n_threads(pool);
    if (best_s > 0.0) r.gb_s = double(buffer_bytes) / best_s / 1e9;
    if (sum_s > 0.0) r.mean_gb_s = double(buffer_bytes) * n_passes / sum_s / 1e9;
    return r;
}

// engine/cpu/bandwidth.h — the memory-read bandwidth probe behind `strata-engine --probe-bandwidth`.
//
// Contract:
//  - bandwidth_probe reads a buffer of buffer_bytes (far larger than the last-level cache) on the model's
//    thread pool the way the matmul kernels read weights: each thread one contiguous range of the same
//    static split (threadpool_run), 64-byte vector loads in address order, summed so that no load is
//    dropped. The buffer comes from weight_alloc, as the packed weights (2 MiB pages where the OS gives them).
//    It touches every page first, then times n_passes full passes and keeps the fastest.
//  - The reader is the widest the CPU has (AVX-512, else AVX2, else plain 64-bit loads), as kernels_get.
//  - model_decode_bytes (model.h) gives what one decode token reads; the decode bound is gb_s / bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quants.h"

struct threadpool;

struct bandwidth_result {
    double gb_s = 0.0;        // 1e9 bytes per second, fastest pass
    double mean_gb_s = 0.0;   // over all timed passes
    size_t buffer_bytes = 0;
    int n_passes = 0;
    int n_threads = 0;
    const char* reader = "";  // "avx512", "avx2" or "scalar"
};

bandwidth_result bandwidth_probe(threadpool* pool, size_t buffer_bytes, int n_passes);

// The compute ceiling of one decode matmul: weight bytes per second of CPU time that one thread's single-token
// matmul (activations quantised, then the chosen set's row-group kernel, as decode runs it) reaches when
// memory is not the limit: a 256 x 576 weight of `type` (Q4_0, Q4_1 or Q8_0; 16-bit or, with act_bits 8,
// 8-bit activations) that stays in the L2 cache, repeated for about 50 ms of the thread's CPU time. Decode
// can reach the memory bound only where this is well above the per-thread share of read_gb_s. 0 for a type
// without row-group kernels.
double kernel_ceiling_gb_s(ggml_type type, int act_bits);

// Sum of the 64-bit words of [p, p + n_bytes) (n_bytes a multiple of 64), per instruction set; nullptr where
// not compiled in. The sum is only there so that the loads cannot be elided.
uint64_t bandwidth_read_scalar(const uint8_t* p, size_t n_bytes);
using bandwidth_read_fn = uint64_t (*)(const uint8_t* p, size_t n_bytes);
bandwidth_read_fn bandwidth_read_avx512();
bandwidth_read_fn bandwidth_read_avx2();

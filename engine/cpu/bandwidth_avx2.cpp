// engine/cpu/bandwidth_avx2.cpp — the probe's AVX2 reader (bandwidth.h); compiled with -mavx2 and called only when
// kernels_get chose the AVX2 (or AVX-512) set.
#include "bandwidth.h"

#if defined(__AVX2__)
#include <immintrin.h>

namespace {

// 2 accumulators over 64-byte steps (n_bytes is a multiple of 64)
uint64_t read_avx2(const uint8_t* p, size_t n_bytes) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0;
    for (size_t i = 0; i < n_bytes; i += 64) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    }
    alignas(32) uint64_t w[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(w), _mm256_add_epi64(a0, a1));
    return w[0] + w[1] + w[2] + w[3];
}

}  // namespace

bandwidth_read_fn bandwidth_read_avx2() { return read_avx2; }

#else

bandwidth_read_fn bandwidth_read_avx2() { return nullptr; }

#endif

// engine/cpu/bandwidth_avx512.cpp — the probe's AVX-512 reader (bandwidth.h); compiled with -mavx512* and called
// only when kernels_get chose the AVX-512 set, so the CPU has these instructions.
#include "bandwidth.h"

#if defined(__AVX512F__)
// GCC 12's _mm512_reduce_add_epi64 placeholders: the false positive kernels_avx512.cpp silences too
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace {

// 4 independent accumulators over 256-byte steps (as a row-group kernel's loads: 64-byte aligned vectors)
uint64_t read_avx512(const uint8_t* p, size_t n_bytes) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 256 <= n_bytes; i += 256) {
        a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 64));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 128));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 192));
    }
    for (; i < n_bytes; i += 64) a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
    return uint64_t(_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3))));
}

}  // namespace

bandwidth_read_fn bandwidth_read_avx512() { return read_avx512; }

#else

bandwidth_read_fn bandwidth_read_avx512() { return nullptr; }

#endif

// engine/cpu/kernels_kq_avx512.cpp — AVX-512 row kernels of engine/cpu/kernels_kq.h (driver: kernels_kq_driver.h): a
// block of 32 is one vpmaddwd (32 products into 16 exact int32 pair sums), converted and scaled in one fma.
#include "kernels_kq.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__F16C__)

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels_kq_driver.h"

namespace {

struct vec_avx512 {
    using acc = __m512;
    static __m512 zero() { return _mm512_setzero_ps(); }
    static __m512 dot(const int16_t* q, const int16_t* a) {
        return _mm512_cvtepi32_ps(_mm512_madd_epi16(_mm512_load_si512(q), _mm512_loadu_si512(a)));
    }
    static __m512 fma(__m512 p, float s, __m512 acc) { return _mm512_fmadd_ps(p, _mm512_set1_ps(s), acc); }
    static float hsum(__m512 a, __m512 b) { return _mm512_reduce_add_ps(_mm512_add_ps(a, b)); }
};

const kq_row_set KQ_AVX512 = kq_make_set<vec_avx512>();

}  // namespace

const kq_row_set* kq_rows_avx512() { return &KQ_AVX512; }

#else

const kq_row_set* kq_rows_avx512() { return nullptr; }

#endif

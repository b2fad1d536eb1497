// engine/cpu/kernels_kq_avx2.cpp — AVX2 row kernels of engine/cpu/kernels_kq.h (driver: kernels_kq_driver.h): a block
// of 32 is two vpmaddwd into one vector of 8 exact int32 pair sums, converted and scaled in one fma.
#include "kernels_kq.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include "kernels_kq_driver.h"

namespace {

struct vec_avx2 {
    using acc = __m256;
    static __m256 zero() { return _mm256_setzero_ps(); }
    static __m256 dot(const int16_t* q, const int16_t* a) {
        const __m256i lo = _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(q)),
                                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
        const __m256i hi = _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(q + 16)),
                                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 16)));
        return _mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi));
    }
    static __m256 fma(__m256 p, float s, __m256 acc) { return _mm256_fmadd_ps(p, _mm256_set1_ps(s), acc); }
    static float hsum(__m256 a, __m256 b) { return kq_hsum8(_mm256_add_ps(a, b)); }
};

const kq_row_set KQ_AVX2 = kq_make_set<vec_avx2>();

}  // namespace

const kq_row_set* kq_rows_avx2() { return &KQ_AVX2; }

#else

const kq_row_set* kq_rows_avx2() { return nullptr; }

#endif

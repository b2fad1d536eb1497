// engine/kernels_quant_more_avx512.cpp — the Q5_1 / Q2_K / Q3_K / IQ4_XS row kernels of kernels_quant_more.h
// compiled for the AVX-512 kernel set (CMakeLists gives *_avx512.cpp its -m flags).
#define QUANT_MORE_KERNELS
#include "kernels_quant_more.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__)
const quant_more_rows* quant_more_rows_avx512() { return &QUANT_MORE_ROWS; }
#else
const quant_more_rows* quant_more_rows_avx512() { return nullptr; }
#endif

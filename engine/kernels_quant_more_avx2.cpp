// engine/kernels_quant_more_avx2.cpp — the Q5_1 / Q2_K / Q3_K / IQ4_XS row kernels of kernels_quant_more.h
// compiled for the AVX2 kernel set (CMakeLists gives *_avx2.cpp its -m flags).
#define QUANT_MORE_KERNELS
#include "kernels_quant_more.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
const quant_more_rows* quant_more_rows_avx2() { return &QUANT_MORE_ROWS; }
#else
const quant_more_rows* quant_more_rows_avx2() { return nullptr; }
#endif

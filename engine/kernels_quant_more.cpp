// engine/kernels_quant_more.cpp — the baseline (scalar set's) Q5_1 / Q2_K / Q3_K / IQ4_XS row kernels and the
// dispatch by kernel set (contract in kernels_quant_more.h).
#define QUANT_MORE_KERNELS
#include "kernels_quant_more.h"

const quant_more_rows& quant_more_rows_scalar() { return QUANT_MORE_ROWS; }

mm_row_fn quant_more_row(const kernel_set& ks, ggml_type type) {
    const quant_more_rows* t = &quant_more_rows_scalar();
    if (kernels_avx512() == &ks && quant_more_rows_avx512()) t = quant_more_rows_avx512();
    else if (kernels_avx2() == &ks && quant_more_rows_avx2()) t = quant_more_rows_avx2();
    switch (type) {
    case GGML_TYPE_Q5_1: return t->q5_1;
    case GGML_TYPE_Q2_K: return t->q2_k;
    case GGML_TYPE_Q3_K: return t->q3_k;
    case GGML_TYPE_IQ4_XS: return t->iq4_xs;
    default: return nullptr;
    }
}

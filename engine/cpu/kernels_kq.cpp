// engine/cpu/kernels_kq.cpp — the scalar row kernels of engine/cpu/kernels_kq.h (the reference of the AVX sets) and
// the dispatch by kernel set and type.
#include "kernels_kq.h"

#include "kernels_kq_unpack.h"

namespace {

// scalar driver: per unit, the expanded blocks against each token of the tile, exact int32 dots
template <class U>
void kq_row_scalar(const uint8_t* w, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    const int64_t nb = a.k / QK32;
    float acc[MM_TOK_TILE] = {}, off[MM_TOK_TILE] = {};
    kq_unit u;
    for (int64_t b0 = 0; b0 < nb; b0 += U::NB) {
        const int nblk = nb - b0 < U::NB ? int(nb - b0) : U::NB;
        U::unpack(w + size_t(b0 / U::NB) * U::BYTES, nblk, &u);
        for (int b = 0; b < nblk; ++b) {
            const int64_t ab = b0 + b;
            for (int t = 0; t < n_tok; ++t) {
                const int16_t* av = a.qs + (t0 + t) * a.k + ab * QK32;
                int32_t s = 0, sm = 0;
                for (int l = 0; l < QK32; ++l) s += int32_t(u.q[32 * b + l]) * int32_t(av[l]);
                if constexpr (U::MINS) {
                    for (int l = 0; l < QK32; ++l) sm += int32_t(u.m[32 * b + l]) * int32_t(av[l]);
                }
                const float da = a.d[(t0 + t) * nb + ab];
                acc[t] += u.ws[b] * da * static_cast<float>(s);
                if constexpr (U::MINS) acc[t] += u.ws2[b] * da * static_cast<float>(sm);
                if constexpr (U::OFF) off[t] += u.mo[b] * a.dsum[(t0 + t) * nb + ab];
            }
        }
    }
    for (int t = 0; t < n_tok; ++t) y[t * y_stride] = acc[t] + off[t];
}

const kq_row_set KQ_SCALAR = {
    kq_row_scalar<kq_q45k<false>>, kq_row_scalar<kq_q45k<true>>, kq_row_scalar<kq_q6k>, kq_row_scalar<kq_q51>,
    kq_row_scalar<kq_q2k>,         kq_row_scalar<kq_q3k>,        kq_row_scalar<kq_iq4xs>,
};

}  // namespace

const kq_row_set& kq_rows_scalar() { return KQ_SCALAR; }

bool kq_has_row(ggml_type type) {
    switch (type) {
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K: case GGML_TYPE_Q5_1: case GGML_TYPE_Q2_K:
    case GGML_TYPE_Q3_K: case GGML_TYPE_IQ4_XS:
        return true;
    default:
        return false;
    }
}

mm_row_fn kq_row_fn(const kernel_set& ks, ggml_type type) {
    const kq_row_set* set = &KQ_SCALAR;
    if (&ks == kernels_avx512() && kq_rows_avx512()) set = kq_rows_avx512();
    else if (&ks == kernels_avx2() && kq_rows_avx2()) set = kq_rows_avx2();
    switch (type) {
    case GGML_TYPE_Q4_K: return set->q4_k;
    case GGML_TYPE_Q5_K: return set->q5_k;
    case GGML_TYPE_Q6_K: return set->q6_k;
    case GGML_TYPE_Q5_1: return set->q5_1;
    case GGML_TYPE_Q2_K: return set->q2_k;
    case GGML_TYPE_Q3_K: return set->q3_k;
    case GGML_TYPE_IQ4_XS: return set->iq4_xs;
    default: return nullptr;
    }
}

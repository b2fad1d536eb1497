// engine/cpu/kernels_kq.h — row kernels of the K types and the other block types (Q4_K, Q5_K, Q6_K, Q5_1, Q2_K,
// Q3_K, IQ4_XS) against 16-bit activation blocks, one set per ISA (scalar, AVX2, AVX-512).
//
// Contract:
//  - Each kernel is an mm_row_fn (kernels.h): one weight row against a tile of up to MM_TOK_TILE tokens. The
//    row is expanded once per tile, unit by unit (a 256-element super-block, or Q5_1's block of 32), into
//    int16 values and per-32-block float factors (engine/cpu/kernels_kq_unpack.h, shared by every set), and each
//    expanded block is then dotted with every token of the tile: so a prompt chunk reads and expands each
//    weight block once per tile of 8 tokens, not once per token.
//  - A row's value: sum over blocks b of ws[b] * da_b * (q_b . a_b)  [+ ws2[b] * da_b * (m_b . a_b), Q2_K's
//    mins]  [+ mo[b] * dsum_b, offsets of Q4_K / Q5_K / Q5_1]. Integer dot products are exact; sub-block scales
//    of 16-element sub-blocks (Q6_K, Q3_K, Q2_K) are folded into the int16 values (|q| <= 128 * 63), so every
//    pair sum fits int32 and only the float steps round. The sets differ only in float summation order.
//  - kq_row_fn(ks, type) is the kernel of set ks for type, nullptr when the type has none here (the matmul
//    driver then uses ks's own row kernel or the generic float path).
#pragma once

#include "kernels.h"

// The types this file's kernels cover.
bool kq_has_row(ggml_type type);
// The row kernel of kernel set ks for type (ks one of kernels_scalar / kernels_avx2 / kernels_avx512).
mm_row_fn kq_row_fn(const kernel_set& ks, ggml_type type);

// One ISA's kernels, by type.
struct kq_row_set {
    mm_row_fn q4_k, q5_k, q6_k, q5_1, q2_k, q3_k, iq4_xs;
};
const kq_row_set& kq_rows_scalar();
const kq_row_set* kq_rows_avx2();    // nullptr when not compiled in
const kq_row_set* kq_rows_avx512();  // nullptr when not compiled in

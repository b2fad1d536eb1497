// engine/cpu/kernels_group_kq.h — row-group layout and kernels of the K types Q4_K and Q6_K (the rest of the
// row-group machinery, Q4_0 / Q4_1 / Q8_0, is in kernels.h / kernels.cpp; weight_pack and group_fn forward
// these two types here).
//
// Why: the row kernels of kernels_kq.h apply each 32-block's float scale per (row, block, token) (vpmaddwd +
// convert + fma per 32 products); in the row-group layout one vpdpwssd covers 16 rows x 2 elements, the
// block's exact integer sums of the 16 rows land in one vector and the float steps run once per (group,
// block, token): a prompt chunk's K-type matmuls cost about what Q8_0's do.
//
// Layout, per group of MM_GROUP_ROWS = 16 rows and block b of 32 columns (K super-blocks of 256 hold 8 such
// blocks; every float below is exact in fp32 and is computed once, at pack time):
//   Q4_K (384 bytes):  float ws[16]   the rows' d * sc of the block's sub-block
//                      float off[16]  -dmin * m + 8 * ws (one rounding: both terms are exact floats)
//                      256 bytes of 4-bit values q (0..15) in weight_pack's Q4_0 layout: 4 chunks of 32
//                      uint16 words; word 2r + e of chunk c holds, in nibble n, element 2 (4c + n) + e of row r
//     value of element l: ws * q - dmin * m = ws * (q - 8) + off
//   Q6_K (640 bytes):  float d0[16]   the rows' d * sc of the block's first 16-element sub-block
//                      float d1[16]   the same of its second sub-block
//                      512 bytes of int8 q - 32 (-32..31) in Q8_0's layout: 16 chunks of 32 bytes; byte
//                      2r + e of chunk j is element 2j + e of row r (chunks 0..7: the first sub-block)
//     value of element l: (l < 16 ? d0 : d1) * (q - 32)
//
// Kernel arithmetic per (group, block, token t), da / dsum / isum the token's block scale, scaled sum and sum:
//   Q4_K: s = sum_l (q_l - 8) a_l (int32, starting at -8 isum);  acc = fma(float(s), ws * da, acc);
//         acc = fma(off, dsum, acc)
//   Q6_K: s0, s1 = the two sub-blocks' sums of (q_l - 32) a_l;  acc = fma(float(s0), d0 * da, acc);
//         acc = fma(float(s1), d1 * da, acc)
// in block order; the result is acc. Integer bounds (|a| <= 32768): Q4_K |s| <= 32 * 8 * 2^15 = 2^23 (the
// start -8 isum included: 2^23 + 2^23); Q6_K |s0|, |s1| <= 16 * 32 * 2^15 = 2^24: exact in int32 and exact
// as floats. (Q6_K's int8 scales are not folded into the values: sc (q - 32) reaches 4096, and a 32-element
// sum of those against 16-bit activations can pass 2^31.) Every set (the scalar reference here, AVX-512,
// AVX2) takes exactly these float steps per row, so all give the same bits, and each output depends only on
// its row and its token.
#pragma once

#include "kernels.h"

// True for the types this file packs (Q4_K, Q6_K).
bool kq_group_has(ggml_type type);
// Bytes of one group of 16 rows of n_cols columns (n_cols a multiple of 256) in this layout.
size_t kq_group_bytes(ggml_type type, int64_t n_cols);
// Writes w (a kq_group_has type, rows a multiple of 16) in this layout: n_rows / 16 groups of kq_group_bytes.
void kq_group_pack(const weight_view& w, uint8_t* out);
// The kernel of set ks for packed weights of this type, nullptr when ks has none (the scalar set: it keeps
// the row kernels).
mm_group_fn kq_group_fn(const kernel_set& ks, ggml_type type);

// One ISA's kernels, by type.
struct kq_group_set {
    mm_group_fn q4_k, q6_k;
};
const kq_group_set& kq_groups_scalar();  // the reference: plain C++ (std::fma), for the tests
const kq_group_set* kq_groups_avx2();    // nullptr when not compiled in
const kq_group_set* kq_groups_avx512();  // nullptr when not compiled in
const kq_group_set* kq_groups_neon();    // the neon and dotprod sets' (kernels_neon.cpp); nullptr when not compiled in

// engine/cpu/kernels_group_q5_0.h — Q5_0 weights kept at 5 bits in a row-group layout, for the kernel sets that
// have a Q5_0 row-group kernel (AVX-512 VNNI); the others widen Q5_0 to Q8_0 at load (model.cpp).
//
// Why: decode streams every weight byte once per token. Widened and packed as Q8_0 (kernels.cpp,
// weight_pack) a Q5_0 weight costs 36 bytes per 32 values; here 22, the file's own size (Gemma 3 270M
// Q4_K_M: its Q5_0 matrices go from 73 to 45 MB per decoded token).
//
// Layout, per group of MM_GROUP_ROWS = 16 rows and block b of 32 columns (352 bytes, Q5_0_GROUP_BLOCK_BYTES):
//   uint16 d[16]          bytes   0..31: the rows' block scales as stored (half)
//   4 chunks of 32 uint16  bytes  32..287: word 2r + e of chunk c holds, in its nibble n (bits 4n..4n+3), the
//                                low 4 bits of element 2 (4c + n) + e of row r (Q4_0's packed layout)
//   uint32 hi[16]         bytes 288..351: bit 2r + e of hi[j] is the fifth bit of element 2j + e of row r
// so value = d * (nibble + 16 * bit - 16), exactly Q5_0's.
//
// Contract (as the other row-group kernels, kernels.h): per (group, block) the kernel forms each token's 16
// exact integer sums of (q - 16) * a and then acc = fma(float(sum), d * da, acc) in block order: the integer
// sums and the float steps are those of the widened Q8_0 row-group kernel (the widened block holds q - 16
// with the same half scale), so the two give the same bits, whatever n_threads or the batch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels.h"

constexpr size_t Q5_0_GROUP_BLOCK_BYTES = 32 + 256 + 64;

// Bytes of one group of 16 rows of n_cols columns (n_cols a multiple of 32).
size_t q5_0_group_bytes(int64_t n_cols);
// Writes w (Q5_0, n_rows a multiple of 16) in the layout above to out (q5_0_group_bytes * n_rows / 16 bytes).
void weight_pack_q5_0(const weight_view& w, uint8_t* out);
// The set's Q5_0 row-group kernel, nullptr when it has none (then Q5_0 is widened to Q8_0 at load).
mm_group_fn group_q5_0_fn(const kernel_set& ks);
mm_group_fn group_q5_0_avx512();  // nullptr when not compiled in

// engine/cpu/kernels_group_q5_0.cpp — packing of Q5_0 weights into their row-group layout and the kernel choice
// (layout and contract in kernels_group_q5_0.h).
#include "kernels_group_q5_0.h"

#include <cstring>

size_t q5_0_group_bytes(int64_t n_cols) { return size_t(n_cols / QK32) * Q5_0_GROUP_BLOCK_BYTES; }

void weight_pack_q5_0(const weight_view& w, uint8_t* out) {
    const int64_t nb = w.n_cols / QK32;
    for (int64_t g = 0; g < w.n_rows / MM_GROUP_ROWS; ++g) {
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t* o = out + size_t(g * nb + b) * Q5_0_GROUP_BLOCK_BYTES;
            uint32_t hi[16] = {};
            for (int r = 0; r < MM_GROUP_ROWS; ++r) {
                const uint8_t* row = w.data + size_t(g * MM_GROUP_ROWS + r) * w.row_bytes;
                const block_q5_0& blk = reinterpret_cast<const block_q5_0*>(row)[b];
                std::memcpy(o + 2 * r, &blk.d, 2);
                uint32_t qh;
                std::memcpy(&qh, blk.qh, 4);
                uint8_t lo[QK32];
                for (int i = 0; i < QK32; ++i) {  // element i: low nibble i of qs (i < 16) or high nibble i - 16
                    lo[i] = static_cast<uint8_t>(i < 16 ? (blk.qs[i] & 0xF) : (blk.qs[i - 16] >> 4));
                    hi[i / 2] |= ((qh >> i) & 1u) << (2 * r + i % 2);  // pair i / 2, its element i % 2
                }
                group_put_nibbles(o + 32, r, lo);
            }
            std::memcpy(o + 288, hi, sizeof hi);
        }
    }
}

mm_group_fn group_q5_0_fn(const kernel_set& ks) {
    return &ks == kernels_avx512() ? group_q5_0_avx512() : nullptr;
}

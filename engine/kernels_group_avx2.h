// engine/kernels_group_avx2.h — what the AVX2 row-group kernels share (kernels_avx2.cpp's Q4_0 / Q4_1 / Q8_0,
// kernels_group_kq_avx2.cpp's Q4_K / Q6_K): the walk over a chunk's tokens in tiles of at most 4 (16 ymm
// registers hold 4 tokens' accumulators and a block's weights). Each token's result does not depend on the
// split: a tile computes every token exactly as a tile of one would.
#pragma once

#include <type_traits>

namespace group_avx2 {

// Calls tile(std::integral_constant<int, T>{}, done) for tiles of T = 4 tokens (the last one shorter) that
// start at token `done` of n_tok.
template <typename Tile>
inline void tile_walk(int n_tok, Tile&& tile) {
    for (int done = 0; done < n_tok;) {
        const int n = n_tok - done < 4 ? n_tok - done : 4;
        switch (n) {
        case 1: tile(std::integral_constant<int, 1>{}, done); break;
        case 2: tile(std::integral_constant<int, 2>{}, done); break;
        case 3: tile(std::integral_constant<int, 3>{}, done); break;
        default: tile(std::integral_constant<int, 4>{}, done); break;
        }
        done += n;
    }
}

}  // namespace group_avx2

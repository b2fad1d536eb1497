// prefill/chunking.hpp — how a prompt read is cut into chunks.
//
// Chunk boundaries are multiples of the chunk size counted from position 0, whatever was reused: a read
// that starts at 700 with chunk 512 reads 700..1024, then 1024..1536, ... So a read that gave way (BYIELD)
// and goes on later, or one that reused a prefix, evaluates the same chunks an uninterrupted read from 0
// would past that point, and a chunk never exceeds the model's batch (n_batch = the chunk size).
#pragma once

#include <algorithm>
#include <cstdint>

namespace pf {

// Tokens the next chunk reads, reached < total, chunk >= 1.
inline int32_t chunk_next_len(int32_t reached, int32_t total, int32_t chunk) {
    const int64_t boundary = (static_cast<int64_t>(reached) / chunk + 1) * chunk;
    return static_cast<int32_t>(std::min<int64_t>(boundary, total) - reached);
}

}  // namespace pf

// engine/kv_cache.h — one sequence's K and V cache (the opaque kv_cache of model.h).
//
// Layout: K and V each (n_layer, n_ctx, n_embd_kv) in the cache's type: F16 rows of n_embd_kv halves, or
// Q8_0 rows of n_embd_kv / 32 blocks. Memory comes from an anonymous mapping, so positions never written
// cost no RSS.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model.h"

struct kv_cache {
    kv_type type = KV_TYPE_F16;
    int32_t n_layer = 0;
    int32_t n_ctx = 0;
    int32_t n_embd_kv = 0;
    size_t row_bytes = 0;
    uint8_t* k = nullptr;
    uint8_t* v = nullptr;
    size_t map_bytes = 0;  // of each of k and v
};

kv_cache* kv_cache_create(int32_t n_layer, int32_t n_ctx, int32_t n_embd_kv, kv_type type);
inline uint8_t* kv_row(kv_cache* kv, bool is_v, int32_t layer, int32_t pos) {
    return (is_v ? kv->v : kv->k) + (size_t(layer) * size_t(kv->n_ctx) + size_t(pos)) * kv->row_bytes;
}
inline const uint8_t* kv_row(const kv_cache* kv, bool is_v, int32_t layer, int32_t pos) {
    return (is_v ? kv->v : kv->k) + (size_t(layer) * size_t(kv->n_ctx) + size_t(pos)) * kv->row_bytes;
}

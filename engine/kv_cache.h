// engine/kv_cache.h — one sequence's K and V cache (the opaque kv_cache of model.h).
//
// Layout: K and V each (n_layer, n_head_kv, n_ctx, head) in the cache's type, where one head's part of a
// position is head_dim halves (F16) or head_dim / 32 Q8_0 blocks: the positions of one kv head are
// contiguous, so attention streams them (an interleaved (n_ctx, n_embd_kv) layout read with a stride made
// long-context decode 2.3x slower). Session files and kv_cache_read_rows keep the (n_pos, n_embd_kv) row
// form. Memory comes from an anonymous mapping, so positions never written cost no RSS.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model.h"

struct kv_cache {
    kv_type type = KV_TYPE_F16;
    int32_t n_layer = 0;
    int32_t n_ctx = 0;
    int32_t n_embd_kv = 0;
    int32_t n_head_kv = 0;
    size_t head_bytes = 0;  // one kv head's part of one position
    size_t row_bytes = 0;   // n_head_kv * head_bytes: one position of one layer
    uint8_t* k = nullptr;
    uint8_t* v = nullptr;
    size_t map_bytes = 0;  // of each of k and v
};

// Q8_0 needs head_dim % 32 == 0 (a block never spans two heads); nullptr otherwise or without memory.
kv_cache* kv_cache_create(int32_t n_layer, int32_t n_ctx, int32_t n_head_kv, int32_t head_dim, kv_type type);
inline uint8_t* kv_head(kv_cache* kv, bool is_v, int32_t layer, int32_t head, int32_t pos) {
    const size_t block = size_t(layer) * size_t(kv->n_head_kv) + size_t(head);
    return (is_v ? kv->v : kv->k) + (block * size_t(kv->n_ctx) + size_t(pos)) * kv->head_bytes;
}
inline const uint8_t* kv_head(const kv_cache* kv, bool is_v, int32_t layer, int32_t head, int32_t pos) {
    const size_t block = size_t(layer) * size_t(kv->n_head_kv) + size_t(head);
    return (is_v ? kv->v : kv->k) + (block * size_t(kv->n_ctx) + size_t(pos)) * kv->head_bytes;
}

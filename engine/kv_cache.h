// engine/kv_cache.h — one sequence's K and V cache (the opaque kv_cache of model.h).
//
// Layout: K and V each hold, per layer, (n_head_kv, n_cells, head) in the cache's type, where one head's part
// of a position is head_dim halves (F16) or head_dim / 32 Q8_0 blocks: the positions of one kv head are
// contiguous, so attention streams them (an interleaved (n_ctx, n_embd_kv) layout read with a stride made
// long-context decode 2.3x slower). Session files and kv_cache_read_rows keep the (n_pos, n_embd_kv) row
// form. Memory comes from an anonymous mapping, so positions never written cost no RSS.
//
// Sliding-window layers (gemma3) as rings: a query at position p of such a layer reads only positions
// [p + 1 - n_swa, p], so when the context is longer than the ring, the layer keeps n_ring = n_swa + n_chunk - 1
// cells (position p in cell p % n_ring) plus n_swa - 1 mirror cells after them that repeat cells
// [0, n_swa - 1) from the second lap on: every window is then one contiguous run of cells (the attention
// kernels need no change). n_chunk is the most entries of one sequence a model_eval call carries: all of a
// chunk's K/V are written before its attention runs, so its first query's window must survive the chunk's
// own writes. Global layers keep n_ctx cells.
// window_lo is the oldest position the rings still hold; a sequence may continue at n (truncated to n tokens,
// or copied at n) only when n == 0 or window_lo <= max(0, n + 1 - n_swa) (kv_cache_can_resume).
// A cache may live in a device's memory (the CUDA backend, prefill/cuda_forward.h): then k and v are device
// pointers with the same layout, kv->mem names the allocator and the copy, and only the functions of this
// header and prefill/ touch the bytes (never a host loop over kv_head).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model.h"

// Where a cache's K and V live when not in host memory.
struct kv_mem {
    void* (*alloc)(size_t n);                             // zeroed; nullptr without room
    void (*free)(void* p);
    void (*copy)(void* dst, const void* src, size_t n);   // host or device, either way; returns when done
};

struct kv_cache {
    kv_type type = KV_TYPE_F16;
    int32_t n_layer = 0;
    int32_t n_ctx = 0;
    int32_t n_embd_kv = 0;
    int32_t n_head_kv = 0;
    size_t head_bytes = 0;  // one kv head's part of one position
    size_t row_bytes = 0;   // n_head_kv * head_bytes: one position of one layer
    int32_t n_swa = 0;      // window of the window layers; 0 = the model has none
    int32_t n_ring = 0;     // ring length of the window layers; 0 = they keep n_ctx cells like the others
    int32_t window_lo = 0;  // oldest position the rings still hold (0 until a ring wraps)
    std::vector<uint8_t> layer_swa;      // (n_layer) 1 = a sliding-window layer
    std::vector<int32_t> layer_cells;    // (n_layer) cells per kv head: n_ctx, or n_ring + n_swa - 1
    std::vector<size_t> layer_off;       // (n_layer) byte offset of the layer in k and in v
    uint8_t* k = nullptr;
    uint8_t* v = nullptr;
    size_t map_bytes = 0;  // of each of k and v
    const kv_mem* mem = nullptr;  // nullptr: host anonymous mappings
};

// swa: (n_layer) window-layer flags, or nullptr (no window layers); n_chunk: the most entries of one
// sequence per model_eval call. Q8_0 needs head_dim % 32 == 0 (a block never spans two heads); nullptr
// otherwise or without memory.
// mem: device memory (nullptr: host).
kv_cache* kv_cache_create(int32_t n_layer, int32_t n_ctx, int32_t n_head_kv, int32_t head_dim, kv_type type,
                          const uint8_t* swa, int32_t n_swa, int32_t n_chunk, const kv_mem* mem = nullptr);

inline bool kv_is_ring(const kv_cache* kv, int32_t layer) { return kv->n_ring > 0 && kv->layer_swa[size_t(layer)]; }

inline size_t kv_cell_offset(const kv_cache* kv, int32_t layer, int32_t head, int32_t pos) {
    const int32_t cell = kv_is_ring(kv, layer) ? pos % kv->n_ring : pos;
    return kv->layer_off[size_t(layer)] +
           (size_t(head) * size_t(kv->layer_cells[size_t(layer)]) + size_t(cell)) * kv->head_bytes;
}
// Position pos of one kv head; the following positions (up to the window, on a ring) follow contiguously.
inline uint8_t* kv_head(kv_cache* kv, bool is_v, int32_t layer, int32_t head, int32_t pos) {
    return (is_v ? kv->v : kv->k) + kv_cell_offset(kv, layer, head, pos);
}
inline const uint8_t* kv_head(const kv_cache* kv, bool is_v, int32_t layer, int32_t head, int32_t pos) {
    return (is_v ? kv->v : kv->k) + kv_cell_offset(kv, layer, head, pos);
}
// The mirror cell that must get a copy of what is written at pos, or nullptr (not a ring, first lap, or a
// cell past the mirrored ones).
inline uint8_t* kv_head_mirror(kv_cache* kv, bool is_v, int32_t layer, int32_t head, int32_t pos) {
    if (!kv_is_ring(kv, layer) || pos < kv->n_ring || pos % kv->n_ring >= kv->n_swa - 1) return nullptr;
    return kv_head(kv, is_v, layer, head, pos % kv->n_ring) + size_t(kv->n_ring) * kv->head_bytes;
}
// Writes one head's bytes at pos (and its mirror).
void kv_put(kv_cache* kv, bool is_v, int32_t layer, int32_t head, int32_t pos, const uint8_t* src);
// Before a sequence's entries at positions [first, last] are written: window_lo follows the rings.
void kv_cache_note_writes(kv_cache* kv, int32_t first, int32_t last);

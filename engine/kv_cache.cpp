// engine/kv_cache.cpp — allocation, copy and raw row access of kv_cache (contract in kv_cache.h, model.h).
#include "kv_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "cpu/quants.h"

static uint8_t* map_zeroed(size_t n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

kv_cache* kv_cache_create(int32_t n_layer, int32_t n_ctx, int32_t n_head_kv, int32_t head_dim, kv_type type,
                          const uint8_t* swa, int32_t n_swa, int32_t n_chunk, const kv_mem* mem) {
    if (n_layer <= 0 || n_ctx <= 0 || n_head_kv <= 0 || head_dim <= 0) return nullptr;
    if (type == KV_TYPE_Q8_0 && head_dim % QK32 != 0) return nullptr;
    auto* kv = new kv_cache();
    kv->type = type;
    kv->n_layer = n_layer;
    kv->n_ctx = n_ctx;
    kv->n_embd_kv = n_head_kv * head_dim;
    kv->n_head_kv = n_head_kv;
    kv->head_bytes = type == KV_TYPE_F16 ? size_t(head_dim) * 2 : size_t(head_dim / QK32) * sizeof(block_q8_0);
    kv->row_bytes = kv->head_bytes * size_t(n_head_kv);
    kv->layer_swa.assign(size_t(n_layer), 0);
    if (swa != nullptr && n_swa > 0) {
        kv->n_swa = n_swa;
        std::copy(swa, swa + n_layer, kv->layer_swa.begin());
        const int64_t ring = int64_t(n_swa) + std::max(1, n_chunk) - 1;
        // a ring only when it (with its mirror cells) is shorter than the context
        if (ring + n_swa - 1 < n_ctx) kv->n_ring = static_cast<int32_t>(ring);
    }
    kv->layer_cells.resize(size_t(n_layer));
    kv->layer_off.resize(size_t(n_layer));
    size_t off = 0;
    for (int32_t l = 0; l < n_layer; ++l) {
        kv->layer_cells[size_t(l)] = kv_is_ring(kv, l) ? kv->n_ring + kv->n_swa - 1 : n_ctx;
        kv->layer_off[size_t(l)] = off;
        off += size_t(kv->layer_cells[size_t(l)]) * kv->row_bytes;
    }
    kv->map_bytes = off;
    kv->mem = mem;
    kv->k = mem ? static_cast<uint8_t*>(mem->alloc(kv->map_bytes)) : map_zeroed(kv->map_bytes);
    kv->v = mem ? static_cast<uint8_t*>(mem->alloc(kv->map_bytes)) : map_zeroed(kv->map_bytes);
    if (!kv->k || !kv->v) {
        kv_cache_free(kv);
        return nullptr;
    }
    return kv;
}

void kv_cache_free(kv_cache* kv) {
    if (!kv) return;
    for (uint8_t* p : {kv->k, kv->v}) {
        if (!p) continue;
        if (kv->mem) kv->mem->free(p);
        else ::munmap(p, kv->map_bytes);
    }
    delete kv;
}

int32_t kv_cache_n_ctx(const kv_cache* kv) { return kv->n_ctx; }

size_t kv_cache_row_bytes(const kv_cache* kv) { return kv->row_bytes; }

size_t kv_cache_bytes(const kv_cache* kv, int32_t n_pos) {
    size_t cells = 0;
    for (int32_t l = 0; l < kv->n_layer; ++l) {
        if (!kv_is_ring(kv, l)) {
            cells += size_t(n_pos);
            continue;
        }
        // the ring's cells, then the mirror cells written from the second lap on
        cells += size_t(std::min(n_pos, kv->n_ring)) + size_t(std::clamp(n_pos - kv->n_ring, 0, kv->n_swa - 1));
    }
    return 2 * cells * kv->row_bytes;
}

int32_t kv_cache_window_lo(const kv_cache* kv) { return kv->window_lo; }

bool kv_cache_can_resume(const kv_cache* kv, int32_t n_pos) {
    return n_pos == 0 || kv->n_swa == 0 || kv->window_lo <= std::max(0, n_pos + 1 - kv->n_swa);
}

// dst in kv's memory; src in host memory or in a cache's (a device copy works either way)
static void put_bytes(const kv_cache* kv, uint8_t* dst, const uint8_t* src, size_t n) {
    if (kv->mem) kv->mem->copy(dst, src, n);
    else std::memcpy(dst, src, n);
}

void kv_put(kv_cache* kv, bool is_v, int32_t layer, int32_t head, int32_t pos, const uint8_t* src) {
    put_bytes(kv, kv_head(kv, is_v, layer, head, pos), src, kv->head_bytes);
    if (uint8_t* mirror = kv_head_mirror(kv, is_v, layer, head, pos)) put_bytes(kv, mirror, src, kv->head_bytes);
}

void kv_cache_note_writes(kv_cache* kv, int32_t first, int32_t last) {
    if (first == 0) kv->window_lo = 0;  // a sequence read again from its start
    if (kv->n_ring > 0) kv->window_lo = std::max(kv->window_lo, last - kv->n_ring + 1);
}

// Positions [lo, n_pos) of a window layer are copied one by one (a ring's cells are not in position order);
// every other layer's [0, n_pos) as one run per head.
// Device caches (one copy call each, so fewer and longer runs): two rings of the same length are copied whole,
// cell for cell (cells past n_pos are never read before they are written again).
void kv_cache_copy(kv_cache* dst, const kv_cache* src, int32_t n_pos) {
    if (n_pos <= 0 || dst == src) return;
    const int32_t lo = std::max({0, src->window_lo, dst->n_ring > 0 ? n_pos - dst->n_ring : 0});
    for (int32_t l = 0; l < src->n_layer; ++l) {
        const bool by_pos = kv_is_ring(src, l) || kv_is_ring(dst, l);
        const bool whole_ring = dst->mem && kv_is_ring(src, l) && kv_is_ring(dst, l) && src->n_ring == dst->n_ring;
        for (int32_t h = 0; h < src->n_head_kv; ++h) {
            for (int is_v = 0; is_v < 2; ++is_v) {
                if (!by_pos || whole_ring) {
                    const size_t n = whole_ring ? size_t(src->layer_cells[size_t(l)]) * src->head_bytes
                                                : size_t(n_pos) * src->head_bytes;
                    put_bytes(dst, kv_head(dst, is_v != 0, l, h, 0), kv_head(src, is_v != 0, l, h, 0), n);
                    continue;
                }
                for (int32_t p = lo; p < n_pos; ++p) kv_put(dst, is_v != 0, l, h, p, kv_head(src, is_v != 0, l, h, p));
            }
        }
    }
    dst->window_lo = dst->n_swa > 0 ? lo : 0;
}

// A device cache's layer (its K or V) as host bytes laid out as in the cache, so that the loops below run on it
// with kv_cell_offset's offsets less the layer's.
static std::vector<uint8_t> layer_to_host(const kv_cache* kv, int32_t layer, bool is_v) {
    const size_t n = size_t(kv->layer_cells[size_t(layer)]) * kv->row_bytes;
    std::vector<uint8_t> h(n);
    kv->mem->copy(h.data(), (is_v ? kv->v : kv->k) + kv->layer_off[size_t(layer)], n);
    return h;
}

void kv_cache_read_rows(const kv_cache* kv, int32_t layer, bool is_v, int32_t n_pos, void* out) {
    if (kv->mem) {  // the same loop over a host copy of the layer
        std::vector<uint8_t> h = layer_to_host(kv, layer, is_v);
        kv_cache shadow = *kv;
        shadow.mem = nullptr;
        shadow.layer_off.assign(size_t(kv->n_layer), 0);
        (is_v ? shadow.v : shadow.k) = h.data();
        kv_cache_read_rows(&shadow, layer, is_v, n_pos, out);
        return;
    }
    uint8_t* o = static_cast<uint8_t*>(out);
    // positions a window layer no longer holds are written as zeros (the file then does not depend on what
    // a ring's cells held before)
    const int32_t lo = kv->layer_swa[size_t(layer)] ? std::min(kv->window_lo, n_pos) : 0;
    std::memset(o, 0, size_t(lo) * kv->row_bytes);
    for (int32_t h = 0; h < kv->n_head_kv; ++h) {
        for (int32_t p = lo; p < n_pos; ++p) {
            std::memcpy(o + size_t(p) * kv->row_bytes + size_t(h) * kv->head_bytes, kv_head(kv, is_v, layer, h, p),
                        kv->head_bytes);
        }
    }
}

void kv_cache_write_rows(kv_cache* kv, int32_t layer, bool is_v, int32_t n_pos, const void* in) {
    if (kv->mem) {  // into a host copy of the layer, then back whole
        std::vector<uint8_t> h = layer_to_host(kv, layer, is_v);
        kv_cache shadow = *kv;
        shadow.mem = nullptr;
        shadow.layer_off.assign(size_t(kv->n_layer), 0);
        (is_v ? shadow.v : shadow.k) = h.data();
        kv_cache_write_rows(&shadow, layer, is_v, n_pos, in);
        kv->mem->copy((is_v ? kv->v : kv->k) + kv->layer_off[size_t(layer)], h.data(), h.size());
        return;
    }
    const uint8_t* src = static_cast<const uint8_t*>(in);
    const int32_t lo = kv_is_ring(kv, layer) ? std::max(0, n_pos - kv->n_ring) : 0;
    for (int32_t h = 0; h < kv->n_head_kv; ++h) {
        for (int32_t p = lo; p < n_pos; ++p) kv_put(kv, is_v, layer, h, p, src + size_t(p) * kv->row_bytes + size_t(h) * kv->head_bytes);
    }
}

void kv_cache_set_window_lo(kv_cache* kv, int32_t n_pos, int32_t lo) {
    if (kv->n_swa == 0) return;
    kv->window_lo = std::max({0, lo, kv->n_ring > 0 ? n_pos - kv->n_ring : 0});
}

// engine/kv_cache.cpp — allocation, copy and raw row access of kv_cache (contract in kv_cache.h, model.h).
#include "kv_cache.h"

#include <sys/mman.h>

#include <cstring>

#include "quants.h"

static uint8_t* map_zeroed(size_t n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

kv_cache* kv_cache_create(int32_t n_layer, int32_t n_ctx, int32_t n_head_kv, int32_t head_dim, kv_type type) {
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
    kv->map_bytes = kv->row_bytes * size_t(n_ctx) * size_t(n_layer);
    kv->k = map_zeroed(kv->map_bytes);
    kv->v = map_zeroed(kv->map_bytes);
    if (!kv->k || !kv->v) {
        kv_cache_free(kv);
        return nullptr;
    }
    return kv;
}

void kv_cache_free(kv_cache* kv) {
    if (!kv) return;
    if (kv->k) ::munmap(kv->k, kv->map_bytes);
    if (kv->v) ::munmap(kv->v, kv->map_bytes);
    delete kv;
}

int32_t kv_cache_n_ctx(const kv_cache* kv) { return kv->n_ctx; }

size_t kv_cache_row_bytes(const kv_cache* kv) { return kv->row_bytes; }

size_t kv_cache_bytes(const kv_cache* kv, int32_t n_pos) {
    return 2 * size_t(kv->n_layer) * size_t(n_pos) * kv->row_bytes;
}

void kv_cache_copy(kv_cache* dst, const kv_cache* src, int32_t n_pos) {
    if (n_pos <= 0 || dst == src) return;
    for (int32_t l = 0; l < src->n_layer; ++l) {
        for (int32_t h = 0; h < src->n_head_kv; ++h) {
            for (int is_v = 0; is_v < 2; ++is_v) {
                std::memcpy(kv_head(dst, is_v != 0, l, h, 0), kv_head(src, is_v != 0, l, h, 0),
                            size_t(n_pos) * src->head_bytes);
            }
        }
    }
}

void kv_cache_read_rows(const kv_cache* kv, int32_t layer, bool is_v, int32_t n_pos, void* out) {
    uint8_t* o = static_cast<uint8_t*>(out);
    for (int32_t h = 0; h < kv->n_head_kv; ++h) {
        const uint8_t* src = kv_head(kv, is_v, layer, h, 0);
        for (int32_t p = 0; p < n_pos; ++p) {
            std::memcpy(o + size_t(p) * kv->row_bytes + size_t(h) * kv->head_bytes, src + size_t(p) * kv->head_bytes,
                        kv->head_bytes);
        }
    }
}

void kv_cache_write_rows(kv_cache* kv, int32_t layer, bool is_v, int32_t n_pos, const void* in) {
    const uint8_t* src = static_cast<const uint8_t*>(in);
    for (int32_t h = 0; h < kv->n_head_kv; ++h) {
        uint8_t* dst = kv_head(kv, is_v, layer, h, 0);
        for (int32_t p = 0; p < n_pos; ++p) {
            std::memcpy(dst + size_t(p) * kv->head_bytes, src + size_t(p) * kv->row_bytes + size_t(h) * kv->head_bytes,
                        kv->head_bytes);
        }
    }
}

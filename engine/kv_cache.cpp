// engine/kv_cache.cpp — allocation, copy and raw row access of kv_cache (contract in kv_cache.h, model.h).
#include "kv_cache.h"

#include <sys/mman.h>

#include <cstring>

#include "quants.h"

static uint8_t* map_zeroed(size_t n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

kv_cache* kv_cache_create(int32_t n_layer, int32_t n_ctx, int32_t n_embd_kv, kv_type type) {
    if (n_layer <= 0 || n_ctx <= 0 || n_embd_kv <= 0) return nullptr;
    if (type == KV_TYPE_Q8_0 && n_embd_kv % QK32 != 0) return nullptr;
    auto* kv = new kv_cache();
    kv->type = type;
    kv->n_layer = n_layer;
    kv->n_ctx = n_ctx;
    kv->n_embd_kv = n_embd_kv;
    kv->row_bytes = type == KV_TYPE_F16 ? size_t(n_embd_kv) * 2 : size_t(n_embd_kv / QK32) * sizeof(block_q8_0);
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
        std::memcpy(kv_row(dst, false, l, 0), kv_row(src, false, l, 0), size_t(n_pos) * src->row_bytes);
        std::memcpy(kv_row(dst, true, l, 0), kv_row(src, true, l, 0), size_t(n_pos) * src->row_bytes);
    }
}

void kv_cache_read_rows(const kv_cache* kv, int32_t layer, bool is_v, int32_t n_pos, void* out) {
    if (n_pos > 0) std::memcpy(out, kv_row(kv, is_v, layer, 0), size_t(n_pos) * kv->row_bytes);
}

void kv_cache_write_rows(kv_cache* kv, int32_t layer, bool is_v, int32_t n_pos, const void* in) {
    if (n_pos > 0) std::memcpy(kv_row(kv, is_v, layer, 0), in, size_t(n_pos) * kv->row_bytes);
}

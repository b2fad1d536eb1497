// engine/cpu/kernels_act8.cpp — 8-bit activations: quantiser, the 8-bit row-group layout, kernel choice
// (contract in kernels_act8.h).
#include "kernels_act8.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace {

int nibble_of(const uint8_t* qs, int i) { return i < 16 ? (qs[i] & 0xF) : (qs[i - 16] >> 4); }

// one block b of row r of w (Q4_0 / Q4_1 / Q8_0) into group slot r of the 8-bit layout at o
void pack8_block(const weight_view& w, const uint8_t* row, int64_t b, int r, uint8_t* o) {
    float* dw = reinterpret_cast<float*>(o);
    if (w.type == GGML_TYPE_Q8_0) {
        const block_q8_0& blk = reinterpret_cast<const block_q8_0*>(row)[b];
        std::memcpy(o + 2 * r, &blk.d, 2);
        uint8_t* q = o + 32;
        for (int j = 0; j < 8; ++j) {
            for (int i = 0; i < 4; ++i) q[64 * j + 4 * r + i] = static_cast<uint8_t>(blk.qs[4 * j + i] + 128);
        }
        return;
    }
    const uint8_t* qs;
    uint8_t* q;
    if (w.type == GGML_TYPE_Q4_1) {
        const block_q4_1& blk = reinterpret_cast<const block_q4_1*>(row)[b];
        std::memcpy(o + 2 * r, &blk.d, 2);
        std::memcpy(o + 32 + 2 * r, &blk.m, 2);
        qs = blk.qs;
        q = o + 64;
    } else {
        const block_q4_0& blk = reinterpret_cast<const block_q4_0*>(row)[b];
        dw[r] = fp16_to_fp32(blk.d);
        qs = blk.qs;
        q = o + 64;
    }
    for (int c = 0; c < 4; ++c) {
        for (int i = 0; i < 4; ++i) {
            q[64 * c + 4 * r + i] = static_cast<uint8_t>(nibble_of(qs, 8 * c + i) | (nibble_of(qs, 8 * c + 4 + i) << 4));
        }
    }
}

}  // namespace

void quantize_blocks_scalar(const float* x, int64_t k, int32_t qmax, int16_t* qs, int8_t* qs8, float* d, float* dsum) {
    const float fmax_q = static_cast<float>(qmax);
    for (int64_t b = 0; b < k / QK32; ++b) {
        const float* xb = x + b * QK32;
        float amax = 0.0f;
        for (int j = 0; j < QK32; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
        const float db = amax / fmax_q;
        const float id = db != 0.0f ? 1.0f / db : 0.0f;
        int32_t s = 0;
        for (int j = 0; j < QK32; ++j) {
            float v = std::nearbyint(xb[j] * id);
            v = v > fmax_q ? fmax_q : (v < -fmax_q ? -fmax_q : v);
            const int q = static_cast<int>(v);
            qs[b * QK32 + j] = static_cast<int16_t>(q);
            if (qs8) qs8[b * QK32 + j] = static_cast<int8_t>(q);
            s += q;
        }
        d[b] = db;
        dsum[b] = db * static_cast<float>(s);
    }
}

void quantize_act8(const float* x, int64_t k, int16_t* qs, int8_t* qs8, float* d, float* dsum) {
    static const act8_quantize_fn fast = std::strcmp(kernels_get().name, "avx512_vnni") == 0 ? kernels_act8_quantize_avx512()
                                         : std::strcmp(kernels_get().name, "avx2") == 0      ? kernels_act8_quantize_avx2()
                                                                                             : nullptr;
    if (fast) {
        fast(x, k, qs, qs8, d, dsum);
    } else {
        quantize_blocks_scalar(x, k, 127, qs, qs8, d, dsum);
    }
}

bool cpu_has_avx_vnni() {
#if defined(__x86_64__)
    const char* env = std::getenv("STRATA_AVXVNNI");
    if (env && std::strcmp(env, "0") == 0) return false;
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    if (!((c >> 27) & 1)) return false;  // OSXSAVE
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 0x6) != 0x6) return false;  // XMM and YMM state enabled
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || a < 1 || !((b >> 5) & 1)) return false;  // AVX2, leaf 7.1 exists
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
    return (a >> 4) & 1;
#else
    return false;
#endif
}

void weight_pack8(const weight_view& w, uint8_t* out) {
    const int64_t nb = w.n_cols / QK32;
    const size_t per_block = weight_group_bytes(w.type, w.n_cols) / size_t(nb);
    for (int64_t g = 0; g < w.n_rows / MM_GROUP_ROWS; ++g) {
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t* o = out + size_t(g * nb + b) * per_block;
            for (int r = 0; r < MM_GROUP_ROWS; ++r) {
                pack8_block(w, w.data + size_t(g * MM_GROUP_ROWS + r) * w.row_bytes, b, r, o);
            }
        }
    }
}

int32_t act_bits_default(ggml_type type) {
    return std::strcmp(kernels_get().name, "avx2") == 0 && group8_fn(type) != nullptr ? 8 : 16;
}

mm_group_fn group8_fn(ggml_type type) {
    static const mm_group_fn* k = std::strcmp(kernels_get().name, "avx512_vnni") == 0 ? kernels_act8_avx512()
                                  : std::strcmp(kernels_get().name, "dotprod") == 0  ? kernels_act8_dotprod()
                                  : std::strcmp(kernels_get().name, "avx2") != 0     ? nullptr
                                  : kernels_act8_avxvnni() && cpu_has_avx_vnni()     ? kernels_act8_avxvnni()
                                                                                     : kernels_act8_avx2();
    if (!k) return nullptr;
    switch (type) {
    case GGML_TYPE_Q4_0: return k[0];
    case GGML_TYPE_Q4_1: return k[1];
    case GGML_TYPE_Q8_0: return k[2];
    default: return nullptr;
    }
}

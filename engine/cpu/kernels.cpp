// engine/cpu/kernels.cpp — scalar kernel set, CPU dispatch and the matmul driver (contract in kernels.h).
#include "kernels.h"
#include "kernels_act8.h"
#include "kernels_group_kq.h"
#include "kernels_group_q5_0.h"
#include "kernels_kq.h"
#include "kernels_kquant.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "step_timer.h"
#include "threadpool.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace {

void quantize_q16_scalar(const float* x, int64_t k, int16_t* qs, float* d, float* dsum) {
    quantize_blocks_scalar(x, k, 32767, qs, nullptr, d, dsum);
}

// Row kernels: acc += (dw * da) * isum per block, plus the block's offset term times the block's dsum. 4-bit values are centred (q - 8) so that the offset term is small:
// Q4_0: w = d (q - 8), no offset;  Q4_1: w = d (q - 8) + (m + 8 d);  Q8_0: w = d q.
template <int KIND>
void row_scalar(const uint8_t* w, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    const int64_t nb = a.k / QK32;
    for (int t = 0; t < n_tok; ++t) {
        const int16_t* q = a.qs + (t0 + t) * a.k;
        const float* ad = a.d + (t0 + t) * nb;
        const float* as = a.dsum + (t0 + t) * nb;
        float acc = 0.0f, acc_off = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
            const int16_t* qb = q + b * QK32;
            int32_t isum = 0;
            float dw, off;
            if constexpr (KIND == 2) {
                const block_q8_0& wb = reinterpret_cast<const block_q8_0*>(w)[b];
                for (int j = 0; j < QK32; ++j) isum += wb.qs[j] * qb[j];
                dw = fp16_to_fp32(wb.d);
                off = 0.0f;
            } else {
                using blk = std::conditional_t<KIND == 0, block_q4_0, block_q4_1>;
                const blk& wb = reinterpret_cast<const blk*>(w)[b];
                for (int j = 0; j < 16; ++j) isum += ((wb.qs[j] & 0xF) - 8) * qb[j] + ((wb.qs[j] >> 4) - 8) * qb[j + 16];
                dw = fp16_to_fp32(wb.d);
                if constexpr (KIND == 0) off = 0.0f;
                else off = fp16_to_fp32(wb.m) + 8.0f * dw;
            }
            acc += dw * ad[b] * static_cast<float>(isum);
            acc_off += off * as[b];
        }
        y[t * y_stride] = acc + acc_off;
    }
}

float dot_f32_scalar(const float* a, const float* b, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

float dot_f16_f32_scalar(const uint16_t* a, const float* b, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) s += fp16_to_fp32(a[i]) * b[i];
    return s;
}

void axpy_f16_scalar(float a, const uint16_t* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += a * fp16_to_fp32(x[i]);
}

void fp32_to_fp16_row_scalar(const float* x, uint16_t* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

const kernel_set SCALAR_SET = {
    "scalar",         quantize_q16_scalar, row_scalar<0>,    row_scalar<1>,           row_scalar<2>,
    row_q45k_kq<0>, row_q45k_kq<1>, row_q6k_kq,
    dot_f32_scalar,   dot_f16_f32_scalar, axpy_f16_scalar,   fp32_to_fp16_row_scalar,
    nullptr,          nullptr,             nullptr,          nullptr,
};

bool cpu_has_avx512_vnni() {
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const bool osxsave = (c >> 27) & 1;
    if (!osxsave) return false;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 0xE6) != 0xE6) return false;  // XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM state enabled
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    const bool vnni = (c >> 11) & 1;
    return f && dq && bw && vl && vnni;
#else
    return false;
#endif
}

bool cpu_has_avx2() {
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const bool fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !fma || !f16c) return false;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 0x6) != 0x6) return false;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return (b >> 5) & 1;
#else
    return false;
#endif
}

// AArch64's dot-product extension (sdot / udot, FEAT_DotProd: Cortex-A55/A76 and later, Neoverse, Apple M):
// the kernel's word (AT_HWCAP's ASIMDDP bit, 1 << 20), so a CPU or a VM that hides it is never asked to run it.
bool cpu_has_dotprod() {
#if defined(__aarch64__) && defined(__linux__)
    return (getauxval(AT_HWCAP) >> 20) & 1;
#else
    return false;
#endif
}

// The sets compiled in, best first (dispatch order); scalar last. Each with what the CPU must have to run it.
struct set_entry {
    const kernel_set* ks;
    bool (*cpu_can_run)();
    const char* needs;  // what a CPU that cannot run it lacks, for the tests' skip reasons
};

bool cpu_any() { return true; }

std::vector<set_entry> compiled_sets() {
    std::vector<set_entry> v;
    if (const kernel_set* k = kernels_avx512()) v.push_back({k, cpu_has_avx512_vnni, "AVX-512 F/BW/VL/DQ and VNNI"});
    if (const kernel_set* k = kernels_avx2()) v.push_back({k, cpu_has_avx2, "AVX2, FMA and F16C"});
    if (const kernel_set* k = kernels_dotprod()) v.push_back({k, cpu_has_dotprod, "the dot-product extension (asimddp)"});
    if (const kernel_set* k = kernels_neon()) v.push_back({k, cpu_any, ""});  // ASIMD: every AArch64 CPU
    v.push_back({&SCALAR_SET, cpu_any, ""});
    return v;
}

const kernel_set& pick() {
    // STRATA_KERNELS=NAME steps down from the best set (tests, comparisons): the named set when this CPU runs
    // it, else the best runnable set below it in dispatch order; never up past the CPU. Unset or unknown: the best.
    const char* want = std::getenv("STRATA_KERNELS");
    const std::vector<set_entry> sets = compiled_sets();
    size_t from = 0;
    if (want && *want) {
        for (size_t i = 0; i < sets.size(); ++i) {
            if (std::strcmp(sets[i].ks->name, want) == 0) from = i;
        }
    }
    for (size_t i = from; i < sets.size(); ++i) {
        if (sets[i].cpu_can_run()) return *sets[i].ks;
    }
    return SCALAR_SET;
}

struct mm_job {
    const kernel_set* ks;
    const weight_view* w;
    const float* x;
    int64_t x_stride;
    int64_t n_tok;
    float* y;
    act_q16 act;
    mm_scratch* scratch;
    mm_row_fn row;
    mm_group_fn group;  // set when w is packed and the set has a kernel for it
};

// Rows per cache block: 64 rows of a 1536-wide Q4_1 matrix are 60 KiB, so a block and a tile of tokens'
// activations stay in L1/L2 while the tile walks the block.
constexpr int64_t MM_ROW_BLOCK = 64;

// rows [r0, r1) of w for every token: row blocks outside, token tiles inside, rows innermost
void mm_rows(const weight_view& w, mm_row_fn row, const act_q16& act, int64_t n_tok, float* y, int64_t r0, int64_t r1) {
    const int64_t n = w.n_rows;
    for (int64_t rb = r0; rb < r1; rb += MM_ROW_BLOCK) {
        const int64_t re = rb + MM_ROW_BLOCK < r1 ? rb + MM_ROW_BLOCK : r1;
        for (int64_t t0 = 0; t0 < n_tok; t0 += MM_TOK_TILE) {
            const int nt = static_cast<int>(n_tok - t0 < MM_TOK_TILE ? n_tok - t0 : MM_TOK_TILE);
            for (int64_t r = rb; r < re; ++r) row(w.data + r * w.row_bytes, act, t0, nt, y + t0 * n + r, static_cast<size_t>(n));
        }
    }
}

mm_row_fn row_fn(const kernel_set& ks, ggml_type t) {
    if (mm_row_fn f = kq_row_fn(ks, t)) return f;  // K types, Q5_1, IQ4_XS: engine/cpu/kernels_kq.h
    switch (t) {
    case GGML_TYPE_Q4_0: return ks.row_q4_0;
    case GGML_TYPE_Q4_1: return ks.row_q4_1;
    case GGML_TYPE_Q4_K: return ks.row_q4_k;
    case GGML_TYPE_Q5_K: return ks.row_q5_k;
    case GGML_TYPE_Q6_K: return ks.row_q6_k;
    default: return ks.row_q8_0;
    }
}

void mm_q16_range(void* ctx, int64_t r0, int64_t r1, int) {
    const mm_job& j = *static_cast<mm_job*>(ctx);
    mm_rows(*j.w, j.row, j.act, j.n_tok, j.y, r0, r1);
}

// several weights over the same activations: one row space [0, sum of n_rows), weight i at offset first[i]
struct mm_multi_job {
    const kernel_set* ks;
    const weight_view* const* ws;
    float* const* ys;
    int n_w;
    int64_t first[MM_MAX_FUSED + 1];
    act_q16 act;
    int64_t n_tok;
    mm_group_fn group[MM_MAX_FUSED];  // all set: first[] counts groups of MM_GROUP_ROWS, not rows
};

void mm_multi_range(void* ctx, int64_t r0, int64_t r1, int) {
    const mm_multi_job& j = *static_cast<mm_multi_job*>(ctx);
    for (int i = 0; i < j.n_w; ++i) {
        const int64_t a = r0 > j.first[i] ? r0 : j.first[i], b = r1 < j.first[i + 1] ? r1 : j.first[i + 1];
        if (a < b) mm_rows(*j.ws[i], row_fn(*j.ks, j.ws[i]->type), j.act, j.n_tok, j.ys[i], a - j.first[i], b - j.first[i]);
    }
}

void mm_generic_range(void* ctx, int64_t r0, int64_t r1, int thread) {
    const mm_job& j = *static_cast<mm_job*>(ctx);
    const int64_t k = j.w->n_cols, n = j.w->n_rows;
    float* row = j.scratch->rows.data() + thread * k;
    for (int64_t r = r0; r < r1; ++r) {
        dequantize_row(j.w->type, j.w->data + r * j.w->row_bytes, row, k);
        for (int64_t t = 0; t < j.n_tok; ++t) j.y[t * n + r] = j.ks->dot_f32(row, j.x + t * j.x_stride, k);
    }
}

void quantize_range(void* ctx, int64_t t0, int64_t t1, int) {
    const mm_job& j = *static_cast<mm_job*>(ctx);
    const int64_t k = j.w->n_cols, nb = k / QK32;
    mm_scratch& s = *j.scratch;
    const bool act8 = j.w->act_bits == 8;
    for (int64_t t = t0; t < t1; ++t) {
        int16_t* qs = s.qs.data() + t * k;
        if (act8) quantize_act8(j.x + t * j.x_stride, k, qs, s.qs8.data() + t * k, s.d.data() + t * nb, s.dsum.data() + t * nb);
        else j.ks->quantize_q16(j.x + t * j.x_stride, k, qs, s.d.data() + t * nb, s.dsum.data() + t * nb);
        int32_t* is = s.isum.data() + t * nb;
        for (int64_t b = 0; b < nb; ++b) {
            int32_t sum = 0;
            for (int i = 0; i < QK32; ++i) sum += qs[b * QK32 + i];
            is[b] = sum;
        }
    }
}

// Row-group layout, per group of 16 rows and block b of 32 columns (weight_group_bytes / nb bytes):
//   float dw[16]                       Q4_0: the rows' block scales
//   uint16 d[16]                       Q8_0: the rows' block scales as stored (half; 32 bytes, so a block is
//                                      544 bytes for 512 values, not 576: decode streams the output head's
//                                      copy once per token)
//   uint16 d[16], uint16 m[16]         Q4_1: the rows' d and m as stored (half), so the packed copy reads no
//                                      more bytes than the file's blocks; kernels take off = m + 8 d with
//                                      one fma (8 d is exact, so it rounds as a float add would)
//   Q4_0/Q4_1: 4 chunks of 32 uint16 words; word 2r + e of chunk c holds, in its nibble n (bits 4n..4n+3),
//              the 4-bit value of element 2 (4c + n) + e of row r (as stored: 0..15, not centred)
//   Q8_0:      16 chunks of 32 int8; byte 2r + e of chunk j is element 2j + e of row r
constexpr size_t group_scale_bytes(ggml_type t) { return t == GGML_TYPE_Q8_0 ? 32 : 64; }
constexpr size_t group_quant_bytes(ggml_type t) { return t == GGML_TYPE_Q8_0 ? 512 : 256; }

int nibble(const uint8_t* qs, int i) { return i < 16 ? (qs[i] & 0xF) : (qs[i - 16] >> 4); }

// Groups per cache block: 4 groups (64 rows) of a 1536-wide Q4_1 matrix are 72 KiB, as MM_ROW_BLOCK above.
constexpr int64_t MM_GROUP_BLOCK = 4;

// groups [g0, g1) of a packed weight for every token: group blocks outside, token tiles inside
void mm_groups(const weight_view& w, mm_group_fn fn, const act_q16& act, int64_t n_tok, float* y, int64_t g0,
               int64_t g1) {
    const int64_t n = w.n_rows, nb = w.n_cols / QK32;
    const size_t gbytes = weight_group_bytes(w.type, w.n_cols);
    for (int64_t gb = g0; gb < g1; gb += MM_GROUP_BLOCK) {
        const int64_t ge = gb + MM_GROUP_BLOCK < g1 ? gb + MM_GROUP_BLOCK : g1;
        for (int64_t t0 = 0; t0 < n_tok; t0 += MM_TOK_TILE) {
            const int nt = static_cast<int>(n_tok - t0 < MM_TOK_TILE ? n_tok - t0 : MM_TOK_TILE);
            for (int64_t g = gb; g < ge; ++g) {
                fn(w.packed + size_t(g) * gbytes, nb, act, t0, nt, y + t0 * n + g * MM_GROUP_ROWS, size_t(n));
            }
        }
    }
}

void mm_group_range(void* ctx, int64_t g0, int64_t g1, int) {
    const mm_job& j = *static_cast<mm_job*>(ctx);
    mm_groups(*j.w, j.group, j.act, j.n_tok, j.y, g0, g1);
}

void mm_multi_group_range(void* ctx, int64_t g0, int64_t g1, int) {
    const mm_multi_job& j = *static_cast<mm_multi_job*>(ctx);
    for (int i = 0; i < j.n_w; ++i) {
        const int64_t a = g0 > j.first[i] ? g0 : j.first[i], b = g1 < j.first[i + 1] ? g1 : j.first[i + 1];
        if (a < b) mm_groups(*j.ws[i], j.group[i], j.act, j.n_tok, j.ys[i], a - j.first[i], b - j.first[i]);
    }
}

}  // namespace

size_t weight_group_bytes(ggml_type type, int64_t n_cols) {
    if (type == GGML_TYPE_Q5_0) return q5_0_group_bytes(n_cols);  // engine/cpu/kernels_group_q5_0.h
    if (kq_group_has(type)) return kq_group_bytes(type, n_cols);  // Q4_K, Q6_K: engine/cpu/kernels_group_kq.h
    return size_t(n_cols / QK32) * (group_scale_bytes(type) + group_quant_bytes(type));
}

size_t weight_packed_bytes(ggml_type type, int64_t n_cols, int64_t n_rows) {
    const bool ok = (type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q8_0 ||
                     type == GGML_TYPE_Q5_0 || kq_group_has(type)) &&
                    n_cols > 0 && n_cols % quant_block_size(type) == 0 && n_rows > 0 && n_rows % MM_GROUP_ROWS == 0;
    return ok ? weight_group_bytes(type, n_cols) * size_t(n_rows / MM_GROUP_ROWS) : 0;
}

void weight_pack(const weight_view& w, uint8_t* out) {
    if (w.type == GGML_TYPE_Q5_0) return weight_pack_q5_0(w, out);
    if (kq_group_has(w.type)) return kq_group_pack(w, out);
    const int64_t nb = w.n_cols / QK32;
    const size_t sb = group_scale_bytes(w.type), qb = group_quant_bytes(w.type);
    for (int64_t g = 0; g < w.n_rows / MM_GROUP_ROWS; ++g) {
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t* o = out + size_t(g * nb + b) * (sb + qb);
            float* dw = reinterpret_cast<float*>(o);
            uint8_t* q = o + sb;
            for (int r = 0; r < MM_GROUP_ROWS; ++r) {
                const uint8_t* row = w.data + size_t(g * MM_GROUP_ROWS + r) * w.row_bytes;
                if (w.type == GGML_TYPE_Q8_0) {
                    const block_q8_0& blk = reinterpret_cast<const block_q8_0*>(row)[b];
                    std::memcpy(o + 2 * r, &blk.d, 2);
                    group_put_bytes(q, r, blk.qs);
                    continue;
                }
                const uint8_t* qs;
                if (w.type == GGML_TYPE_Q4_1) {
                    const block_q4_1& blk = reinterpret_cast<const block_q4_1*>(row)[b];
                    std::memcpy(o + 2 * r, &blk.d, 2);
                    std::memcpy(o + 32 + 2 * r, &blk.m, 2);
                    qs = blk.qs;
                } else {
                    const block_q4_0& blk = reinterpret_cast<const block_q4_0*>(row)[b];
                    dw[r] = fp16_to_fp32(blk.d);
                    qs = blk.qs;
                }
                uint8_t v[QK32];
                for (int i = 0; i < QK32; ++i) v[i] = static_cast<uint8_t>(nibble(qs, i));
                group_put_nibbles(q, r, v);
            }
        }
    }
}

void group_put_nibbles(uint8_t* q, int r, const uint8_t* v) {
    for (int c = 0; c < 4; ++c) {
        for (int e = 0; e < 2; ++e) {
            uint16_t word = 0;
            for (int n = 0; n < 4; ++n) word |= static_cast<uint16_t>(v[2 * (4 * c + n) + e] << (4 * n));
            std::memcpy(q + 64 * c + 2 * (2 * r + e), &word, 2);
        }
    }
}

void group_put_bytes(uint8_t* q, int r, const int8_t* v) {
    for (int j = 0; j < 16; ++j) {
        for (int e = 0; e < 2; ++e) q[32 * j + 2 * r + e] = static_cast<uint8_t>(v[2 * j + e]);
    }
}

uint8_t* weight_alloc(size_t bytes) {
    constexpr size_t HUGE_PAGE_BYTES = size_t(2) << 20;  // x86-64's transparent huge page
    const size_t n = (bytes + HUGE_PAGE_BYTES - 1) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    void* p = std::aligned_alloc(HUGE_PAGE_BYTES, n == 0 ? HUGE_PAGE_BYTES : n);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (p) ::madvise(p, n, MADV_HUGEPAGE);  // advice: before the first touch, so the faults take huge pages
#endif
    return static_cast<uint8_t*>(p);
}

mm_group_fn group_fn(const kernel_set& ks, ggml_type type) {
    switch (type) {
    case GGML_TYPE_Q4_0: return ks.group_q4_0;
    case GGML_TYPE_Q4_1: return ks.group_q4_1;
    case GGML_TYPE_Q8_0: return ks.group_q8_0;
    case GGML_TYPE_Q5_0: return group_q5_0_fn(ks);
    default: return kq_group_fn(ks, type);
    }
}

const kernel_set& kernels_scalar() { return SCALAR_SET; }

const kernel_set& kernels_get() {
    static const kernel_set& chosen = pick();
    return chosen;
}

std::vector<const kernel_set*> kernels_compiled() {
    std::vector<const kernel_set*> v;
    for (const set_entry& e : compiled_sets()) v.push_back(e.ks);
    return v;
}

const char* kernels_cpu_lacks(const kernel_set& ks) {
    for (const set_entry& e : compiled_sets()) {
        if (e.ks == &ks) return e.cpu_can_run() ? nullptr : e.needs;
    }
    return "a kernel set that is not compiled in";
}

bool kernels_uses_q16(ggml_type type) {
    return type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q8_0 || kq_has_row(type);
}

// Token counts at or above this quantise their activations on the pool (below, the fork costs more).
constexpr int64_t MM_PARALLEL_QUANT_TOKENS = 8;

static act_q16 quantize_acts(threadpool* pool, mm_job* j) {
    const int64_t k = j->w->n_cols, nb = k / QK32, n_tok = j->n_tok;
    mm_scratch* scratch = j->scratch;
    if (scratch->qs.size() < size_t(n_tok * k)) scratch->qs.resize(size_t(n_tok * k));
    if (scratch->d.size() < size_t(n_tok * nb)) scratch->d.resize(size_t(n_tok * nb));
    if (scratch->dsum.size() < size_t(n_tok * nb)) scratch->dsum.resize(size_t(n_tok * nb));
    if (scratch->isum.size() < size_t(n_tok * nb)) scratch->isum.resize(size_t(n_tok * nb));
    const bool act8 = j->w->act_bits == 8;
    if (act8 && scratch->qs8.size() < size_t(n_tok * k)) scratch->qs8.resize(size_t(n_tok * k));
    const int32_t outer = step_mark(STEP_QUANTIZE);
    if (n_tok >= MM_PARALLEL_QUANT_TOKENS) {
        threadpool_run(pool, n_tok, quantize_range, j);
    } else {
        quantize_range(j, 0, n_tok, 0);
    }
    step_mark(outer);
    return act_q16{scratch->qs.data(), scratch->d.data(), scratch->dsum.data(), k, scratch->isum.data(),
                   act8 ? scratch->qs8.data() : nullptr};
}

// The row-group kernel for w's packed copy (8-bit layout or not), nullptr when it has none.
static mm_group_fn packed_fn(const kernel_set& ks, const weight_view& w) {
    if (!w.packed) return nullptr;
    return w.packed8 ? group8_fn(w.type) : group_fn(ks, w.type);
}

void matmul_fused(threadpool* pool, const kernel_set& ks, const weight_view* const* ws, float* const* ys, int n_w,
                  const float* x, int64_t x_stride, int64_t n_tok, mm_scratch* scratch) {
    // one pass over all rows needs every weight on row kernels or every one packed (a packed Q5_0 weight
    // has no row kernel)
    bool fuse = n_w <= MM_MAX_FUSED, all_rows = true, all_packed = true;
    for (int i = 0; i < n_w; ++i) {
        all_rows = all_rows && kernels_uses_q16(ws[i]->type);
        all_packed = all_packed && packed_fn(ks, *ws[i]) != nullptr;
        fuse = fuse && ws[i]->n_cols == ws[0]->n_cols && ws[i]->act_bits == ws[0]->act_bits;
    }
    fuse = fuse && (all_rows || all_packed);
    if (!fuse) {
        for (int i = 0; i < n_w; ++i) matmul(pool, ks, *ws[i], x, x_stride, n_tok, ys[i], scratch);
        return;
    }
    mm_job q{&ks, ws[0], x, x_stride, n_tok, nullptr, act_q16{}, scratch, nullptr, nullptr};
    mm_multi_job j{&ks, ws, ys, n_w, {0}, quantize_acts(pool, &q), n_tok, {}};
    bool grouped = true;
    for (int i = 0; i < n_w; ++i) {
        j.group[i] = packed_fn(ks, *ws[i]);
        grouped = grouped && j.group[i] != nullptr;
    }
    const int64_t unit = grouped ? MM_GROUP_ROWS : 1;
    for (int i = 0; i < n_w; ++i) j.first[i + 1] = j.first[i] + ws[i]->n_rows / unit;
    threadpool_run(pool, j.first[n_w], grouped ? mm_multi_group_range : mm_multi_range, &j);
}

void matmul(threadpool* pool, const kernel_set& ks, const weight_view& w, const float* x, int64_t x_stride,
            int64_t n_tok, float* y, mm_scratch* scratch) {
    mm_job j{&ks, &w, x, x_stride, n_tok, y, act_q16{}, scratch, nullptr, nullptr};
    const int64_t k = w.n_cols;
    if (kernels_uses_q16(w.type) || packed_fn(ks, w)) {
        j.act = quantize_acts(pool, &j);
        j.group = packed_fn(ks, w);
        if (j.group) {
            threadpool_run(pool, w.n_rows / MM_GROUP_ROWS, mm_group_range, &j);
            return;
        }
        j.row = row_fn(ks, w.type);
        threadpool_run(pool, w.n_rows, mm_q16_range, &j);
        return;
    }
    const size_t need = size_t(threadpool_n_threads(pool)) * size_t(k);
    if (scratch->rows.size() < need) scratch->rows.resize(need);
    threadpool_run(pool, w.n_rows, mm_generic_range, &j);
}

void silu_mul_row(const kernel_set& ks, float* g, const float* u, int64_t n) {
    static const silu_mul_fn fast = kernels_silu_mul_avx512();
    static const silu_mul_fn fast8 = kernels_silu_mul_avx2();
    if (fast && &ks == kernels_avx512()) {
        fast(g, u, n);
        return;
    }
    if (fast8 && &ks == kernels_avx2()) {
        fast8(g, u, n);
        return;
    }
    for (int64_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void rmsnorm_row(const float* x, const float* w, float* y, int32_t n, float eps) {
    // 8 interleaved partial sums (each square is exact in double): independent chains the compiler
    // vectorises; one serial chain cost ~4 cycles an element, 3% of a Gemma 3 prompt read
    double part[8] = {};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; ++j) part[j] += double(x[i + j]) * double(x[i + j]);
    }
    for (; i < n; ++i) part[i % 8] += double(x[i]) * double(x[i]);
    const double ss = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
    const float scale = static_cast<float>(1.0 / std::sqrt(ss / n + double(eps)));
    for (i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

void rope_cos_sin(int32_t n_rot, int32_t pos, const float* inv_freq, float* cs) {
    for (int32_t i = 0; i < n_rot / 2; ++i) {
        const float theta = static_cast<float>(pos) * inv_freq[i];
        cs[2 * i] = std::cos(theta);
        cs[2 * i + 1] = std::sin(theta);
    }
}

void rope_row_cs(float* x, int32_t n_heads, int32_t head_dim, int32_t n_rot, bool neox, const float* cs) {
    const int32_t half = n_rot / 2;
    for (int32_t i = 0; i < half; ++i) {
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        for (int32_t h = 0; h < n_heads; ++h) {
            float* v = x + h * head_dim;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

// ---- matmul_runs (kernels.h): a MoE layer's experts in one job ---------------------------------------

namespace {

struct mm_runs_job {
    const kernel_set* ks;
    const mm_run* runs;
    int n_runs;
    const int64_t* first;  // (n_runs + 1) each run's first item (rows, or groups when grouped)
    act_q16 act;           // all n_x rows
    bool grouped;          // items are row groups (MM_GROUP_ROWS rows) of every run, else single rows
    bool mixed;            // grouped items, but a run without a packed copy reads its group on row kernels
};

// run i's view of the activations: its rows start at token 0
act_q16 act_from(const act_q16& a, int64_t t0) {
    const int64_t k = a.k, nb = k / QK32;
    return act_q16{a.qs + t0 * k, a.d + t0 * nb, a.dsum + t0 * nb, k, a.isum + t0 * nb, a.qs8 ? a.qs8 + t0 * k : nullptr};
}

void mm_runs_range(void* ctx, int64_t i0, int64_t i1, int) {
    const mm_runs_job& j = *static_cast<mm_runs_job*>(ctx);
    // the first run touching [i0, i1): binary search over first[]
    int lo = 0, hi = j.n_runs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (j.first[mid] <= i0) lo = mid;
        else hi = mid - 1;
    }
    for (int r = lo; r < j.n_runs && j.first[r] < i1; ++r) {
        const int64_t a = i0 > j.first[r] ? i0 : j.first[r], b = i1 < j.first[r + 1] ? i1 : j.first[r + 1];
        if (a >= b) continue;
        const mm_run& run = j.runs[r];
        const act_q16 act = act_from(j.act, run.t0);
        const mm_group_fn gfn = j.grouped ? packed_fn(*j.ks, *run.w) : nullptr;
        if (gfn) mm_groups(*run.w, gfn, act, run.n_tok, run.y, a - j.first[r], b - j.first[r]);
        else if (j.mixed) mm_rows(*run.w, row_fn(*j.ks, run.w->type), act, run.n_tok, run.y,
                                  (a - j.first[r]) * MM_GROUP_ROWS, (b - j.first[r]) * MM_GROUP_ROWS);
        else mm_rows(*run.w, row_fn(*j.ks, run.w->type), act, run.n_tok, run.y, a - j.first[r], b - j.first[r]);
    }
}

}  // namespace

void matmul_runs(threadpool* pool, const kernel_set& ks, const mm_run* runs, int n_runs, const float* x,
                 int64_t x_stride, int64_t n_x, mm_scratch* scratch) {
    if (n_runs < 1) return;
    bool all_rows = true, all_packed = true, any_packed = false, same = true, whole_groups = true;
    for (int i = 0; i < n_runs; ++i) {
        const weight_view& w = *runs[i].w;
        all_rows = all_rows && kernels_uses_q16(w.type);
        all_packed = all_packed && packed_fn(ks, w) != nullptr;
        any_packed = any_packed || packed_fn(ks, w) != nullptr;
        whole_groups = whole_groups && w.n_rows % MM_GROUP_ROWS == 0;
        same = same && w.n_cols == runs[0].w->n_cols && w.act_bits == runs[0].w->act_bits;
    }
    // experts in RAM (packed) beside experts read from the file (engine/expert_tiers.h): one job in groups of
    // rows, each run on its own kernels
    const bool mixed = same && all_rows && any_packed && !all_packed && whole_groups;
    if (!same || !(all_rows || all_packed)) {
        for (int i = 0; i < n_runs; ++i) {
            matmul(pool, ks, *runs[i].w, x + runs[i].t0 * x_stride, x_stride, runs[i].n_tok, runs[i].y, scratch);
        }
        return;
    }
    mm_job q{&ks, runs[0].w, x, x_stride, n_x, nullptr, act_q16{}, scratch, nullptr, nullptr};
    std::vector<int64_t> first(size_t(n_runs) + 1, 0);
    const int64_t unit = all_packed || mixed ? MM_GROUP_ROWS : 1;
    for (int i = 0; i < n_runs; ++i) first[size_t(i) + 1] = first[size_t(i)] + runs[i].w->n_rows / unit;
    mm_runs_job j{&ks, runs, n_runs, first.data(), quantize_acts(pool, &q), all_packed || mixed, mixed};
    threadpool_run(pool, first[size_t(n_runs)], mm_runs_range, &j);
}

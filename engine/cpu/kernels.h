// engine/cpu/kernels.h — CPU kernels for the forward pass, with runtime dispatch (scalar / AVX2 (+ AVX-VNNI) /
// AVX-512 VNNI).
//
// Contract:
//  - kernels_get() picks, once, the fastest kernel set the CPU supports (CPUID + XGETBV: AVX-512 needs the OS
//    to save zmm state; on AArch64: NEON always, dotprod when getauxval says HWCAP_ASIMDDP); env STRATA_KERNELS=NAME steps down for tests (the named set, or the best runnable one
//    below it; never up past the CPU). AMX is never used.
//  - Quantised matmuls (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K weights) quantise the activations to 16-bit blocks of 32 (one float
//    scale per block, round to nearest even, the block's scaled sum kept for offset terms) and use integer
//    dot products (vpdpwssd / pmaddwd); the product of the two blocks' float scales is applied once per
//    block. 16 rather than 8 bits: 8-bit blocks cost 7e-3..4e-2 relative error on the top logits against a
//    float64 forward (measured on SmolLM2), 16-bit ones reach the float32 / half-KV floor; decode is bound by
//    reading the 4-bit weights anyway. Per block rather than per token: residual-stream outlier channels
//    would otherwise leave ordinary channels ~9 bits.
//    That is the default on every set but AVX2. On the AVX2 set (AVX-VNNI CPUs included) the default is 8-bit
//    activations for the matrices it has 8-bit kernels for (act_bits_default, engine/cpu/kernels_act8.h, says
//    why with the figures): there the 16-bit vpmaddwd does half the multiply-adds per instruction and is the
//    limit even in decode, and the 8-bit logits are no further from the float64 forward than llama.cpp's
//    (top-10 error 3.5e-3 / 2.2e-2 / 1.1e-2 against its 4.0e-3 / 2.4e-2 / 1.4e-2; 16-bit 1.1e-4 / 2.8e-4 /
//    1.8e-4). `--act-bits 16` keeps the exact mode there. On AVX-VNNI CPUs the 16-bit mode gets vpdpwssd
//    (kernels_group16_avx2.h).
//    F32, F16 and BF16 weights take the generic path: each weight row is converted once per call and
//    dotted in float with every token of the chunk.
//  - matmul reads each weight row once per call (for a prompt chunk: once per chunk, not once per token) and
//    splits output rows over the pool; each output is computed by one thread with an operation order that
//    depends only on the token's own data, so results depend neither on n_threads nor on the other tokens
//    of the batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "quants.h"

struct threadpool;

// A 2-D weight: n_rows rows of n_cols elements, row r at data + r * row_bytes.
struct weight_view {
    ggml_type type = GGML_TYPE_F32;
    int64_t n_cols = 0;  // K (ne[0])
    int64_t n_rows = 0;  // N (ne[1])
    size_t row_bytes = 0;
    const uint8_t* data = nullptr;
    // The same weight in the row-group layout (weight_pack), when the model packed it; data stays valid.
    const uint8_t* packed = nullptr;
    // Activations this weight's matmuls quantise to: 16 (the default) or 8 (`--act-bits 8`,
    // engine/cpu/kernels_act8.h). packed8: `packed` holds the 8-bit layout (weight_pack8), not weight_pack's.
    int32_t act_bits = 16;
    bool packed8 = false;
};

// Activations of n_tok tokens quantised to 16-bit blocks of 32.
struct act_q16 {
    const int16_t* qs = nullptr;  // (n_tok, K)
    const float* d = nullptr;     // (n_tok, K/32) block scale: x ~= qs * d
    const float* dsum = nullptr;  // (n_tok, K/32) d * (sum of the block's qs)
    int64_t k = 0;                // K
    const int32_t* isum = nullptr; // (n_tok, K/32) sum of the block's qs (set by the matmul driver)
    const int8_t* qs8 = nullptr;   // (n_tok, K) the same values as int8, when quantised to 8 bits
};

// Most tokens one row kernel handles at once (the matmul walks a chunk in tiles of this many).
constexpr int MM_TOK_TILE = 8;

// Row-group kernels (kernel sets that have them) work on weights repacked at load time: rows in groups of
// MM_GROUP_ROWS, and per group and block of 32 columns the 16 rows' scales (Q4_0: floats; Q8_0: halves;
// Q4_1: their d and m as halves; Q5_0: engine/cpu/kernels_group_q5_0.h) followed by the quants interleaved so
// that one vector load yields element pair (2j, 2j+1) of all 16 rows (layout in kernels.cpp, weight_pack).
// One integer dot product then covers 16 rows x 2 elements, the block's exact integer sums of the 16 rows
// land in one vector, and the float scaling is one multiply and one fma per (group, block, token) instead of
// per (row, block, token). Each output's value depends only on its row and its token (integer sums are
// exact; the float steps run in block order).
constexpr int MM_GROUP_ROWS = 16;
// Kernel: y[t * y_stride + r] for r < 16, t < n_tok (<= MM_TOK_TILE): group g (nb blocks) times token t0 + t.
using mm_group_fn = void (*)(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, int n_tok, float* y,
                             size_t y_stride);

// Row kernel: for t in [0, n_tok) (n_tok <= MM_TOK_TILE), y[t * y_stride] = dot(weight row w, token t0 + t).
using mm_row_fn = void (*)(const uint8_t* w, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride);

struct kernel_set {
    const char* name;
    // x[0..k) -> qs, d, dsum per block of 32 (k a multiple of 32): d = max|x| / 32767, qs = nearbyint(x / d)
    void (*quantize_q16)(const float* x, int64_t k, int16_t* qs, float* d, float* dsum);
    mm_row_fn row_q4_0;
    mm_row_fn row_q4_1;
    mm_row_fn row_q8_0;
    mm_row_fn row_q4_k;
    mm_row_fn row_q5_k;
    mm_row_fn row_q6_k;
    float (*dot_f32)(const float* a, const float* b, int64_t n);
    float (*dot_f16_f32)(const uint16_t* a, const float* b, int64_t n);  // a in IEEE half
    void (*axpy_f16)(float a, const uint16_t* x, float* y, int64_t n);  // y += a * x, x in IEEE half
    void (*fp32_to_fp16_row)(const float* x, uint16_t* y, int64_t n);
    // Attention of a tile of n_tok queries of one sequence at consecutive positions, each with n_q query
    // heads sharing one kv head: query t has its heads at q + t * q_stride ((n_q, hd) floats) and sees
    // positions [0, n_pos0 + t) of the cache; k, v point at this kv head's part of position 0, positions
    // row_bytes apart, each hd halves (kv_q8 false) or hd / 32 Q8_0 blocks (kv_q8 true);
    // scores is scratch of n_tok * n_q * (n_pos0 + n_tok - 1) floats; out + t * out_stride gets query t's
    // (n_q, hd) = softmax(scale * q k^T) v. The cache rows are read and converted once per tile; each
    // query's result is computed exactly as for a tile of one. sinks (gpt-oss's attention sinks; nullptr:
    // none): n_q logits, head h's one more term of its softmax's max and denominator that takes no value row.
    // nullptr: the generic path in model.cpp.
    void (*attn)(const float* q, size_t q_stride, int n_q, int n_tok, const uint8_t* k, const uint8_t* v,
                 size_t row_bytes, bool kv_q8, int n_pos0, int hd, float scale, float* scores, float* out,
                 size_t out_stride, const float* sinks);
    // row-group kernels over packed weights; nullptr: this set uses the row kernels
    mm_group_fn group_q4_0;
    mm_group_fn group_q4_1;
    mm_group_fn group_q8_0;
};

// The fused attention kernels read a head's cache rows in position order, a row every few dozen cycles, and the
// hardware prefetcher alone left a long context's decode waiting on memory (a lone AVX2 query over 2,400
// positions: 53 ns a position from memory, 21 ns from cache). Each row read also prefetches the row about
// ATTN_PREFETCH_BYTES ahead (a hint: it never faults and changes no result). A kernel call takes the distance
// once (attn_prefetch_ahead: whole rows, at least 4), then prefetches per row read.
constexpr size_t ATTN_PREFETCH_BYTES = 4096;
inline size_t attn_prefetch_ahead(size_t row_bytes) {
    const size_t rows_ahead = ATTN_PREFETCH_BYTES / row_bytes > 4 ? ATTN_PREFETCH_BYTES / row_bytes : 4;
    return rows_ahead * row_bytes;
}
inline void attn_prefetch_row(const uint8_t* row, size_t row_bytes, size_t ahead) {
    for (size_t c = 0; c < row_bytes; c += 64) __builtin_prefetch(row + ahead + c, 0, 3);
}

const kernel_set& kernels_get();
const kernel_set& kernels_scalar();
const kernel_set* kernels_avx2();    // nullptr when not compiled in
const kernel_set* kernels_avx512();  // nullptr when not compiled in
const kernel_set* kernels_neon();     // AArch64 ASIMD (kernels_neon.cpp); nullptr when not compiled in
const kernel_set* kernels_dotprod();  // NEON + FEAT_DotProd sdot (kernels_dotprod.cpp); nullptr when not compiled in
// Every set compiled in, best first (the dispatch order), scalar last. A set compiled in need not run here:
// kernels_cpu_lacks(ks) is nullptr when this CPU can run ks, else what the CPU lacks (for a skip reason).
// Tests take each runnable set against the scalar reference this way, whatever kernels_get() picked.
std::vector<const kernel_set*> kernels_compiled();
const char* kernels_cpu_lacks(const kernel_set& ks);

// Bytes of w in the row-group layout, 0 when it has none (type other than Q4_0/Q4_1/Q8_0/Q5_0 and Q4_K/Q6_K,
// whose layout is engine/cpu/kernels_group_kq.h's; rows not a multiple of MM_GROUP_ROWS). Bytes of one group:
// weight_group_bytes.
size_t weight_packed_bytes(ggml_type type, int64_t n_cols, int64_t n_rows);
size_t weight_group_bytes(ggml_type type, int64_t n_cols);
// Writes w in the row-group layout to out (weight_packed_bytes bytes, 64-byte aligned).
void weight_pack(const weight_view& w, uint8_t* out);
// One row's block of 32 values into a row-group block's quant bytes q (every packer's layout, so that one
// vector load yields element pair (2j, 2j+1) of all 16 rows): 4-bit values v (0..15) as 4 chunks of 32
// uint16 words, word 2r + e of chunk c holding element 2 (4c + n) + e of row r in its nibble n; 8-bit values
// as 16 chunks of 32 bytes, byte 2r + e of chunk j holding element 2j + e. Only row r's words / bytes are
// written.
void group_put_nibbles(uint8_t* q, int r, const uint8_t* v);
void group_put_bytes(uint8_t* q, int r, const int8_t* v);
// Memory for packed weights (or anything read like them): bytes rounded up to 2 MiB, 2 MiB aligned, advised as
// transparent huge pages (Linux madvise mode; elsewhere, or refused, the pages stay 4 KiB). Decode streams
// every weight byte once per token: in 4 KiB pages that is a TLB miss per 4 KiB (about 24,000 per token for
// the default model), in 2 MiB pages about 50. Free with std::free. nullptr when out of memory.
uint8_t* weight_alloc(size_t bytes);
// The set's kernel for packed weights of this type, nullptr when it has none.
mm_group_fn group_fn(const kernel_set& ks, ggml_type type);

// True when a weight of this type takes the integer-dot path (activations quantised to 16 bits).
bool kernels_uses_q16(ggml_type type);

// Scratch for matmul; grows on demand and is then reused (no allocation per token once warm).
struct mm_scratch {
    std::vector<int16_t> qs;
    std::vector<float> d;
    std::vector<float> dsum;
    std::vector<int32_t> isum;
    std::vector<int8_t> qs8;  // 8-bit activations (weights with act_bits 8)
    std::vector<float> rows;  // (n_threads, K) dequantised weight rows for the generic path
};

// Most weights one matmul_fused call takes (Q, K, V).
constexpr int MM_MAX_FUSED = 3;

// y (n_tok, N) = x (n_tok, K) @ W^T, where W is (N, K). x rows are x_stride floats apart.
void matmul(threadpool* pool, const kernel_set& ks, const weight_view& w, const float* x, int64_t x_stride,
            int64_t n_tok, float* y, mm_scratch* scratch);

// Elementwise ops of the forward pass (plain C++; they are a small share of the time).
// y[0..n) = x * w / sqrt(mean(x^2) + eps); the sum of squares is taken in double. y may alias x.
void rmsnorm_row(const float* x, const float* w, float* y, int32_t n, float eps);
// RoPE at position pos, in two steps so that the forward pass takes the sines once per entry, not once per
// layer and head kind. rope_cos_sin: cs[2i], cs[2i + 1] = cos, sin of pos * inv_freq[i], i < n_rot / 2.
// rope_row_cs: on n_heads heads of head_dim floats, the first n_rot dims of each head are rotated in pairs,
// (2i, 2i+1) ("normal", llama) or (i, i + n_rot/2) (NeoX, qwen2/qwen3), by the angle whose cos, sin are
// cs[2i], cs[2i + 1].
void rope_cos_sin(int32_t n_rot, int32_t pos, const float* inv_freq, float* cs);
void rope_row_cs(float* x, int32_t n_heads, int32_t head_dim, int32_t n_rot, bool neox, const float* cs);

// g[0..n) = silu(g) * u (SwiGLU's gate times up). With the AVX-512 set: exp by its polynomial (within 1e-6
// relative of the true silu; decode calls this once per layer on the model thread, and the scalar loop cost
// ~9 us per 1536 values); with the AVX2 set the same on 8 lanes; with the others: g / (1 + std::exp(-g)) * u.
void silu_mul_row(const kernel_set& ks, float* g, const float* u, int64_t n);
using silu_mul_fn = void (*)(float* g, const float* u, int64_t n);
silu_mul_fn kernels_silu_mul_avx512();  // nullptr when not compiled in
silu_mul_fn kernels_silu_mul_avx2();    // nullptr when not compiled in

// ys[i] = x @ ws[i]^T for i < n_w weights of the same K: the activations are quantised once and all rows go
// to the pool as one job (one fork/join instead of n_w); each output is computed exactly as by matmul.
void matmul_fused(threadpool* pool, const kernel_set& ks, const weight_view* const* ws, float* const* ys, int n_w,
                  const float* x, int64_t x_stride, int64_t n_tok, mm_scratch* scratch);

// Several products over runs of one activation matrix, in one pool job (a MoE layer's experts, each over the
// tokens routed to it): run i computes y_i (n_tok_i, N_i) = x rows [t0_i, t0_i + n_tok_i) @ W_i^T. x's n_x
// rows (x_stride floats apart) are quantised once for all runs, then every run's rows (row groups when all
// are packed) form one item space split over the pool: one fork/join for the whole layer's experts instead of
// one per expert. Each output is computed exactly as matmul computes it. Runs whose weights mix kernel paths
// (float weights, packed with unpacked, another K or activation width) fall back to one matmul per run.
struct mm_run {
    const weight_view* w = nullptr;
    int64_t t0 = 0;
    int64_t n_tok = 0;
    float* y = nullptr;  // (n_tok, w->n_rows)
};
void matmul_runs(threadpool* pool, const kernel_set& ks, const mm_run* runs, int n_runs, const float* x,
                 int64_t x_stride, int64_t n_x, mm_scratch* scratch);

// prefill/cuda_kernels.h — the CUDA kernels of the prompt read and the whole forward, as a plain C++ API (no
// CUDA header here: the engine's C++ files and the tests include it whatever the build).
//
// Contract:
//  - Built with CUDA (STRATA_HAVE_CUDA, prefill/cuda_kernels.cu): cuk_available() says whether a device is
//    usable. Built without: prefill/cuda_none.cpp, where cuk_available() is false with the reason and every
//    other function is never to be called (they abort).
//  - One device, one stream: every kernel is queued on the engine's stream and returns at once; cuk_copy and
//    cuk_sync wait for it. All pointers below are device pointers unless said otherwise.
//  - Shapes are row-major, (rows, cols); a weight is (n_rows, n_cols) in its GGUF type, rows row_bytes apart.
//    Native types: cm::native (prefill/cuda_math.h); others are uploaded as F16 (prefill/cuda_forward.cu).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

// True when this build has CUDA and a device answers; else false and *why says which is missing.
bool cuk_available(std::string* why);
// The device's name, its streaming multiprocessors and memory (after cuk_available).
std::string cuk_device_name();
int cuk_device_sms();
size_t cuk_device_free_bytes();

void* cuk_alloc(size_t n);          // nullptr when the device has no room
void cuk_free(void* p);
void cuk_zero(void* p, size_t n);   // queued
void cuk_copy(void* dst, const void* src, size_t n);  // host/device in any direction; waits for the stream
void cuk_sync();
// The first error the device reported since the last call ("" when none): a failed launch, a fault.
std::string cuk_error();

// ---- timing (PfTimer on the device): events recorded on the stream, read after cuk_sync ----------------
struct cuk_event;
cuk_event* cuk_event_new();
void cuk_event_free(cuk_event* e);
void cuk_event_record(cuk_event* e);
float cuk_event_ms(const cuk_event* from, const cuk_event* to);  // after both completed

// ---- kernels -------------------------------------------------------------------------------------------
// y (n, n_cols) = rows ids[i] of w, dequantised, times scale (1 = none). ids: device (n).
void cuk_get_rows(uint32_t type, const void* w, size_t row_bytes, int64_t n_cols, const int32_t* ids, int n,
                  float scale, float* y);
// Memory-bound path for a few tokens: y[t * y_stride + r] = dot(w row r, x + t * x_stride), t < n_tok <= 8,
// one warp per row (cm::gemv_lane per lane, then a shuffle tree).
constexpr int CUK_GEMV_MAX_TOK = 8;
void cuk_gemv(uint32_t type, const void* w, size_t row_bytes, int64_t n_rows, int64_t n_cols, const float* x,
              int64_t x_stride, int n_tok, float* y, int64_t y_stride);
// out (n_rows, n_cols) bf16 = w dequantised (the tensor-core path's weight operand)
void cuk_dequant_bf16(uint32_t type, const void* w, size_t row_bytes, int64_t n_rows, int64_t n_cols,
                      uint16_t* out);
// y (n) bf16 = x (n) float
void cuk_to_bf16(const float* x, int64_t n, uint16_t* y);
// c (m, n) float = a (m, k) bf16 @ b (n, k) bf16 ^T on the tensor cores (WMMA 16x16x16, fp32 accumulation);
// k a multiple of 32; 128 x 128 tiles, 8 warps each.
void cuk_gemm_bf16(const uint16_t* a, const uint16_t* b, float* c, int64_t m, int64_t n, int64_t k);

// y row r (y_stride floats apart) = x row r * w / sqrt(mean(x row^2) + eps), n_rows rows of n; sums of squares
// in double, as the CPU's rmsnorm_row. y may alias x. w: (n) floats.
void cuk_rmsnorm(const float* x, int64_t x_stride, const float* w, float* y, int64_t y_stride, int64_t n_rows,
                 int n, float eps);
// y row i (n) = x row rows[i] (rows: device (n_rows)); x rows width floats apart
void cuk_gather_rows(const float* x, int64_t width, const int32_t* rows, int64_t n_rows, float* y);
void cuk_add(float* x, const float* y, int64_t n);                        // x += y
void cuk_add_bias(float* x, const float* b, int64_t n_rows, int n);        // x row r += b (n)
void cuk_scale(float* x, int64_t n, float s);                              // x *= s
void cuk_softcap(float* x, int64_t n, float c);                            // x = c tanh(x / c)
void cuk_glu(float* g, const float* u, int64_t n, bool gelu);              // g = act(g) * u, silu or gelu(tanh)

// One sequence's cache in one layer (engine/kv_cache.h layout, f16): head h's cell c at
// k + h * head_stride + c * head_dim * 2 bytes.
struct cuk_kv_seq {
    uint8_t* k = nullptr;
    uint8_t* v = nullptr;
    int64_t head_stride = 0;  // bytes
    int32_t n_ring = 0;       // ring length of a window layer's cells, 0 = position == cell
    int32_t n_swa = 0;        // this layer's window (a query reads its last n_swa positions); 0 = all
};
// One entry of the batch: its position and its sequence (index into a layer's cuk_kv_seq table).
struct cuk_entry {
    int32_t pos = 0;
    int32_t seq = 0;
    int32_t long_rope = 0;  // 1: LongRoPE's long frequencies (model.cpp rope_table_range)
};

// RoPE on x (n entries, n_heads heads of head_dim): the first n_rot dims of each head rotate in pairs (normal
// or NeoX) by pos * inv_freq[i] (inv_freq_long for a long_rope entry), cos and sin times mscale.
void cuk_rope(float* x, int n, int n_heads, int head_dim, int n_rot, bool neox, const cuk_entry* entries,
              const float* inv_freq, const float* inv_freq_long, float mscale);
// k, v (n, n_head_kv * head_dim) floats -> halves into each entry's cache cell (and the ring's mirror cell).
void cuk_kv_write(const float* k, const float* v, int n, const cuk_entry* entries, const cuk_kv_seq* kvs,
                  int n_head_kv, int head_dim);

// Flash-style attention over the caches, causal, grouped heads, windows: out (n, n_head * hd) = per entry and
// query head softmax(scale q k^T) v over positions [attn_first(pos), pos] of its sequence. Entries come in
// tiles (tiles[i]..tiles[i+1], runs of consecutive positions of one sequence, at most cuk_attn_tile_entries
// each); each block takes one tile, one kv head (or a part of its query heads) and one of n_split position
// ranges, keeps K/V chunks of 32 positions in shared memory, and writes a partial (m, l, acc) that a second
// kernel combines. scratch: cuk_attn_scratch_floats(...) floats.
int cuk_attn_heads_per_block(int group);                 // query heads of one kv head a block takes
int cuk_attn_tile_entries(int group);                    // entries of one tile
size_t cuk_attn_scratch_floats(int n, int n_head, int hd, int n_split);
void cuk_attention(const float* q, float* out, int n, const cuk_entry* entries, const int32_t* tiles,
                   int n_tiles, const cuk_kv_seq* kvs, int n_head, int n_head_kv, int hd, float scale,
                   int n_split, int32_t max_span, float* scratch);

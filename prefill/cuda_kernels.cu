// prefill/cuda_kernels.cu — the CUDA kernels (contract in prefill/cuda_kernels.h). The per-thread math is
// prefill/cuda_math.h's (shared with the host-emulation tests); this file adds the launch shapes: warps,
// shared memory, shuffles and the tensor cores.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "prefill/cuda_kernels.h"
#include "prefill/cuda_math.h"

namespace {

// the engine's stream, created at first use (one device, one caller thread: the protocol loop)
cudaStream_t g_stream = nullptr;
std::once_flag g_stream_once;
std::string g_first_error;  // first error reported since cuk_error() (one caller thread)

cudaStream_t stream() {
    std::call_once(g_stream_once, [] { cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking); });
    return g_stream;
}

void note(cudaError_t e, const char* what) {
    if (e != cudaSuccess && g_first_error.empty()) g_first_error = std::string(what) + ": " + cudaGetErrorString(e);
}
void note_launch(const char* what) { note(cudaGetLastError(), what); }

unsigned blocks_for(int64_t n, int per_block) { return static_cast<unsigned>((n + per_block - 1) / per_block); }

// Calls f with the type as a compile-time constant (one kernel instantiation per native type).
template <typename F>
void with_type(uint32_t type, F&& f) {
    switch (type) {
    case cm::CM_F32: f(std::integral_constant<uint32_t, cm::CM_F32>{}); return;
    case cm::CM_F16: f(std::integral_constant<uint32_t, cm::CM_F16>{}); return;
    case cm::CM_BF16: f(std::integral_constant<uint32_t, cm::CM_BF16>{}); return;
    case cm::CM_Q4_0: f(std::integral_constant<uint32_t, cm::CM_Q4_0>{}); return;
    case cm::CM_Q4_1: f(std::integral_constant<uint32_t, cm::CM_Q4_1>{}); return;
    case cm::CM_Q5_0: f(std::integral_constant<uint32_t, cm::CM_Q5_0>{}); return;
    case cm::CM_Q8_0: f(std::integral_constant<uint32_t, cm::CM_Q8_0>{}); return;
    case cm::CM_Q4_K: f(std::integral_constant<uint32_t, cm::CM_Q4_K>{}); return;
    case cm::CM_Q5_K: f(std::integral_constant<uint32_t, cm::CM_Q5_K>{}); return;
    case cm::CM_Q6_K: f(std::integral_constant<uint32_t, cm::CM_Q6_K>{}); return;
    default:
        if (g_first_error.empty()) g_first_error = "type " + std::to_string(type) + " is not read natively";
    }
}

__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}
__device__ float warp_max(float v) {
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}

// ---- matrices --------------------------------------------------------------------------------------------

// one warp per row; 8 warps a block
template <uint32_t T>
__global__ void __launch_bounds__(256) gemv_kernel(const uint8_t* w, size_t row_bytes, int64_t n_rows,
                                                   int64_t n_cols, const float* x, int64_t x_stride, int n_tok,
                                                   float* y, int64_t y_stride) {
    const int64_t row = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= n_rows) return;
    float acc[CUK_GEMV_MAX_TOK] = {};
    cm::gemv_lane(T, w + row * row_bytes, n_cols, lane, 32, x, x_stride, n_tok, acc);
#pragma unroll
    for (int t = 0; t < CUK_GEMV_MAX_TOK; ++t) {
        if (t >= n_tok) break;
        const float v = warp_sum(acc[t]);
        if (lane == 0) y[t * y_stride + row] = v;
    }
}

// one thread per sub-block of 32: 32 bf16 out as 4 16-byte stores (n_cols % 32 == 0 keeps them aligned)
template <uint32_t T>
__global__ void dequant_bf16_kernel(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t n_cols,
                                    uint16_t* out) {
    const int64_t per_row = n_cols / 32;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_rows * per_row) return;
    const int64_t r = i / per_row, s = i % per_row;
    float v[32];
    cm::dequant32(T, w + r * row_bytes, s, v);
    uint32_t packed[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        packed[j] = uint32_t(cm::float_to_bf16(v[2 * j])) | uint32_t(cm::float_to_bf16(v[2 * j + 1])) << 16;
    }
    uint4* dst = reinterpret_cast<uint4*>(out + r * n_cols + s * 32);
#pragma unroll
    for (int j = 0; j < 4; ++j) dst[j] = make_uint4(packed[4 * j], packed[4 * j + 1], packed[4 * j + 2], packed[4 * j + 3]);
}

// one block per entry, one thread per sub-block
template <uint32_t T>
__global__ void get_rows_kernel(const uint8_t* w, size_t row_bytes, int64_t n_cols, const int32_t* ids, float scale,
                                float* y) {
    const int64_t e = blockIdx.x;
    const uint8_t* row = w + int64_t(ids[e]) * row_bytes;
    float v[32];
    for (int64_t s = threadIdx.x; s < n_cols / 32; s += blockDim.x) {
        cm::dequant32(T, row, s, v);
        for (int j = 0; j < 32; ++j) y[e * n_cols + s * 32 + j] = scale != 1.0f ? v[j] * scale : v[j];
    }
}

__global__ void to_bf16_kernel(const float* x, int64_t n, uint16_t* y) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) y[i] = cm::float_to_bf16(x[i]);
}

// C (M, N) = A (M, K) B (N, K)^T, bf16 in, fp32 out. Block tile 128 x 128, k-tile 32, double-buffered in
// shared memory (rows padded to 40 bf16: 80-byte rows keep the 16-byte stores aligned and spread the banks);
// 8 warps, each 32 rows x 64 columns = 2 x 4 WMMA fragments. Edges: loads past M or N read zeros, and the
// results go out through a per-warp staging tile with a bounds check.
constexpr int GM = 128, GN = 128, GK = 32, GLD = GK + 8;

__global__ void __launch_bounds__(256) gemm_bf16_kernel(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C,
                                                        int64_t M, int64_t N, int64_t K) {
    using namespace nvcuda;
    __shared__ __align__(128) __nv_bfloat16 sA[2][GM * GLD];
    __shared__ __align__(128) __nv_bfloat16 sB[2][GN * GLD];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wm = warp / 2, wn = warp % 2;
    const int64_t m0 = int64_t(blockIdx.y) * GM, n0 = int64_t(blockIdx.x) * GN;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    }
    uint4 ra[2], rb[2];
    auto load = [&](int64_t k0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int c = tid + 256 * i, r = c / 4, col = (c % 4) * 8;
            ra[i] = m0 + r < M ? *reinterpret_cast<const uint4*>(A + (m0 + r) * K + k0 + col) : make_uint4(0, 0, 0, 0);
            rb[i] = n0 + r < N ? *reinterpret_cast<const uint4*>(B + (n0 + r) * K + k0 + col) : make_uint4(0, 0, 0, 0);
        }
    };
    auto store = [&](int buf) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int c = tid + 256 * i, r = c / 4, col = (c % 4) * 8;
            *reinterpret_cast<uint4*>(&sA[buf][r * GLD + col]) = ra[i];
            *reinterpret_cast<uint4*>(&sB[buf][r * GLD + col]) = rb[i];
        }
    };
    const int64_t nk = K / GK;
    load(0);
    store(0);
    __syncthreads();
    for (int64_t kt = 0; kt < nk; ++kt) {
        const int buf = int(kt % 2);
        if (kt + 1 < nk) load((kt + 1) * GK);
#pragma unroll
        for (int kk = 0; kk < GK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b[4];
#pragma unroll
            for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], &sA[buf][(wm * 32 + i * 16) * GLD + kk], GLD);
#pragma unroll
            for (int j = 0; j < 4; ++j) wmma::load_matrix_sync(b[j], &sB[buf][(wn * 64 + j * 16) * GLD + kk], GLD);
#pragma unroll
            for (int i = 0; i < 2; ++i) {
#pragma unroll
                for (int j = 0; j < 4; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
            }
        }
        if (kt + 1 < nk) store(1 - buf);
        __syncthreads();
    }
    float* stage = reinterpret_cast<float*>(&sA[0][0]) + warp * 256;  // 8 KiB of sA's 20, free after the loop
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            wmma::store_matrix_sync(stage, acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 256; e += 32) {
                const int64_t gm = m0 + wm * 32 + i * 16 + e / 16, gn = n0 + wn * 64 + j * 16 + e % 16;
                if (gm < M && gn < N) C[gm * N + gn] = stage[e];
            }
            __syncwarp();
        }
    }
}

// ---- elementwise -----------------------------------------------------------------------------------------

// one block of 256 per row; the sum of squares in double, as the CPU's rmsnorm_row
__global__ void rmsnorm_kernel(const float* x, int64_t x_stride, const float* w, float* y, int64_t y_stride, int n,
                               float eps) {
    const float* xr = x + int64_t(blockIdx.x) * x_stride;
    float* yr = y + int64_t(blockIdx.x) * y_stride;
    double ss = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += double(xr[i]) * double(xr[i]);
    for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
    __shared__ double part[8];
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    double total = 0.0;
    for (int i = 0; i < int(blockDim.x / 32); ++i) total += part[i];
    const float scale = static_cast<float>(1.0 / sqrt(total / n + double(eps)));
    __syncthreads();  // every thread has read part before any writes y (y may alias x; part is not touched)
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}

__global__ void gather_kernel(const float* x, int64_t width, const int32_t* rows, int64_t total, float* y) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < total) y[i] = x[int64_t(rows[i / width]) * width + i % width];
}
__global__ void add_kernel(float* x, const float* y, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}
__global__ void add_bias_kernel(float* x, const float* b, int64_t total, int n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < total) x[i] += b[i % n];
}
__global__ void scale_kernel(float* x, int64_t n, float s) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}
__global__ void softcap_kernel(float* x, int64_t n, float c) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] = c * tanhf(x[i] / c);
}
__global__ void glu_kernel(float* g, const float* u, int64_t n, bool gelu) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) g[i] = (gelu ? cm::gelu_tanh(g[i]) : cm::silu(g[i])) * u[i];
}

// one thread per (entry, head, pair)
__global__ void rope_kernel(float* x, int n, int n_heads, int head_dim, int n_rot, bool neox,
                            const cuk_entry* entries, const float* inv_freq, const float* inv_freq_long, float mscale) {
    const int half = n_rot / 2;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= int64_t(n) * n_heads * half) return;
    const int pair = int(i % half), h = int(i / half % n_heads), e = int(i / half / n_heads);
    const cuk_entry en = entries[e];
    const float theta = static_cast<float>(en.pos) * (en.long_rope && inv_freq_long ? inv_freq_long : inv_freq)[pair];
    float c = cosf(theta), s = sinf(theta);
    if (mscale != 1.0f) {
        c *= mscale;
        s *= mscale;
    }
    int a, b;
    cm::rope_pair_index(pair, n_rot, neox, &a, &b);
    float* v = x + (int64_t(e) * n_heads + h) * head_dim;
    cm::rope_pair(&v[a], &v[b], c, s);
}

// one thread per (entry, kv head, dim): the half into its cell, and into the ring's mirror cell when it has one
__global__ void kv_write_kernel(const float* k, const float* v, int n, const cuk_entry* entries, const cuk_kv_seq* kvs,
                                int n_head_kv, int hd) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const int n_embd_kv = n_head_kv * hd;
    if (i >= int64_t(n) * n_embd_kv) return;
    const int e = int(i / n_embd_kv), h = int(i % n_embd_kv / hd), d = int(i % hd);
    const cuk_entry en = entries[e];
    const cuk_kv_seq kv = kvs[en.seq];
    const int64_t cell = cm::kv_cell(en.pos, kv.n_ring);
    const int64_t off = h * kv.head_stride + (cell * hd + d) * 2;
    const uint16_t kh = cm::float_to_half(k[i]), vh = cm::float_to_half(v[i]);
    *reinterpret_cast<uint16_t*>(kv.k + off) = kh;
    *reinterpret_cast<uint16_t*>(kv.v + off) = vh;
    if (kv.n_ring > 0 && en.pos >= kv.n_ring && en.pos % kv.n_ring < kv.n_swa - 1) {
        const int64_t mirror = off + int64_t(kv.n_ring) * hd * 2;
        *reinterpret_cast<uint16_t*>(kv.k + mirror) = kh;
        *reinterpret_cast<uint16_t*>(kv.v + mirror) = vh;
    }
}

}  // namespace

#include "prefill/cuda_attention.cuh"

// ---- the API ---------------------------------------------------------------------------------------------

bool cuk_available(std::string* why) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        if (why) *why = e != cudaSuccess ? std::string("no CUDA device: ") + cudaGetErrorString(e) : "no CUDA device";
        cudaGetLastError();  // clear it
        return false;
    }
    return true;
}

std::string cuk_device_name() {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "?";
    return std::string(p.name) + " sm_" + std::to_string(p.major) + std::to_string(p.minor);
}

int cuk_device_sms() {
    int n = 0;
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0);
    return n;
}

size_t cuk_device_free_bytes() {
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    return free_b;
}

void* cuk_alloc(size_t n) {
    void* p = nullptr;
    if (cudaMalloc(&p, n == 0 ? 1 : n) != cudaSuccess) {
        cudaGetLastError();
        return nullptr;
    }
    return p;
}

void cuk_free(void* p) {
    if (p) cudaFree(p);
}

void cuk_zero(void* p, size_t n) { note(cudaMemsetAsync(p, 0, n, stream()), "memset"); }

void cuk_copy(void* dst, const void* src, size_t n) {
    if (n == 0) return;
    note(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream()), "copy");
    note(cudaStreamSynchronize(stream()), "copy (sync)");
}

void cuk_sync() { note(cudaStreamSynchronize(stream()), "sync"); }

std::string cuk_error() {
    note(cudaGetLastError(), "launch");
    std::string e;
    e.swap(g_first_error);
    return e;
}

struct cuk_event {
    cudaEvent_t e;
};
cuk_event* cuk_event_new() {
    auto* ev = new cuk_event();
    note(cudaEventCreate(&ev->e), "event");
    return ev;
}
void cuk_event_free(cuk_event* e) {
    if (!e) return;
    cudaEventDestroy(e->e);
    delete e;
}
void cuk_event_record(cuk_event* e) { note(cudaEventRecord(e->e, stream()), "event record"); }
float cuk_event_ms(const cuk_event* from, const cuk_event* to) {
    float ms = 0.0f;
    note(cudaEventElapsedTime(&ms, from->e, to->e), "event time");
    return ms;
}

void cuk_get_rows(uint32_t type, const void* w, size_t row_bytes, int64_t n_cols, const int32_t* ids, int n,
                  float scale, float* y) {
    with_type(type, [&](auto t) {
        get_rows_kernel<decltype(t)::value><<<n, 128, 0, stream()>>>(static_cast<const uint8_t*>(w), row_bytes,
                                                                      n_cols, ids, scale, y);
    });
    note_launch("get_rows");
}

void cuk_gemv(uint32_t type, const void* w, size_t row_bytes, int64_t n_rows, int64_t n_cols, const float* x,
              int64_t x_stride, int n_tok, float* y, int64_t y_stride) {
    with_type(type, [&](auto t) {
        gemv_kernel<decltype(t)::value><<<blocks_for(n_rows, 8), 256, 0, stream()>>>(
            static_cast<const uint8_t*>(w), row_bytes, n_rows, n_cols, x, x_stride, n_tok, y, y_stride);
    });
    note_launch("gemv");
}

void cuk_dequant_bf16(uint32_t type, const void* w, size_t row_bytes, int64_t n_rows, int64_t n_cols,
                      uint16_t* out) {
    with_type(type, [&](auto t) {
        dequant_bf16_kernel<decltype(t)::value><<<blocks_for(n_rows * (n_cols / 32), 256), 256, 0, stream()>>>(
            static_cast<const uint8_t*>(w), row_bytes, n_rows, n_cols, out);
    });
    note_launch("dequant_bf16");
}

void cuk_to_bf16(const float* x, int64_t n, uint16_t* y) {
    to_bf16_kernel<<<blocks_for(n, 256), 256, 0, stream()>>>(x, n, y);
    note_launch("to_bf16");
}

void cuk_gemm_bf16(const uint16_t* a, const uint16_t* b, float* c, int64_t m, int64_t n, int64_t k) {
    const dim3 grid(blocks_for(n, GN), blocks_for(m, GM));
    gemm_bf16_kernel<<<grid, 256, 0, stream()>>>(reinterpret_cast<const __nv_bfloat16*>(a),
                                                 reinterpret_cast<const __nv_bfloat16*>(b), c, m, n, k);
    note_launch("gemm_bf16");
}

void cuk_rmsnorm(const float* x, int64_t x_stride, const float* w, float* y, int64_t y_stride, int64_t n_rows, int n,
                 float eps) {
    rmsnorm_kernel<<<static_cast<unsigned>(n_rows), 256, 0, stream()>>>(x, x_stride, w, y, y_stride, n, eps);
    note_launch("rmsnorm");
}

void cuk_gather_rows(const float* x, int64_t width, const int32_t* rows, int64_t n_rows, float* y) {
    gather_kernel<<<blocks_for(n_rows * width, 256), 256, 0, stream()>>>(x, width, rows, n_rows * width, y);
    note_launch("gather_rows");
}

void cuk_add(float* x, const float* y, int64_t n) {
    add_kernel<<<blocks_for(n, 256), 256, 0, stream()>>>(x, y, n);
    note_launch("add");
}
void cuk_add_bias(float* x, const float* b, int64_t n_rows, int n) {
    add_bias_kernel<<<blocks_for(n_rows * n, 256), 256, 0, stream()>>>(x, b, n_rows * n, n);
    note_launch("add_bias");
}
void cuk_scale(float* x, int64_t n, float s) {
    scale_kernel<<<blocks_for(n, 256), 256, 0, stream()>>>(x, n, s);
    note_launch("scale");
}
void cuk_softcap(float* x, int64_t n, float c) {
    softcap_kernel<<<blocks_for(n, 256), 256, 0, stream()>>>(x, n, c);
    note_launch("softcap");
}
void cuk_glu(float* g, const float* u, int64_t n, bool gelu) {
    glu_kernel<<<blocks_for(n, 256), 256, 0, stream()>>>(g, u, n, gelu);
    note_launch("glu");
}

void cuk_rope(float* x, int n, int n_heads, int head_dim, int n_rot, bool neox, const cuk_entry* entries,
              const float* inv_freq, const float* inv_freq_long, float mscale) {
    const int64_t total = int64_t(n) * n_heads * (n_rot / 2);
    rope_kernel<<<blocks_for(total, 256), 256, 0, stream()>>>(x, n, n_heads, head_dim, n_rot, neox, entries, inv_freq,
                                                              inv_freq_long, mscale);
    note_launch("rope");
}

void cuk_kv_write(const float* k, const float* v, int n, const cuk_entry* entries, const cuk_kv_seq* kvs,
                  int n_head_kv, int head_dim) {
    const int64_t total = int64_t(n) * n_head_kv * head_dim;
    kv_write_kernel<<<blocks_for(total, 256), 256, 0, stream()>>>(k, v, n, entries, kvs, n_head_kv, head_dim);
    note_launch("kv_write");
}

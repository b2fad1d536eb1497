// prefill/cuda_none.cpp — the CUDA API (prefill/cuda_kernels.h) of a build without CUDA: cuk_available() says
// so, and nothing else may be called (the callers check cuk_available first; a call aborts with its name).
#ifndef STRATA_HAVE_CUDA

#include <cstdio>
#include <cstdlib>

#include "prefill/cuda_kernels.h"

namespace {
[[noreturn]] void not_built(const char* fn) {
    std::fprintf(stderr, "strata-engine: %s: this engine was built without CUDA\n", fn);
    std::abort();
}
}  // namespace

bool cuk_available(std::string* why) {
    if (why) *why = "this engine was built without CUDA (no nvcc at configure time; STRATA_CUDA=AUTO builds it where nvcc is)";
    return false;
}
std::string cuk_device_name() { return ""; }
int cuk_device_sms() { return 0; }
size_t cuk_device_free_bytes() { return 0; }
void* cuk_alloc(size_t) { return nullptr; }
void cuk_free(void*) {}
void cuk_zero(void*, size_t) { not_built("cuk_zero"); }
void cuk_copy(void*, const void*, size_t) { not_built("cuk_copy"); }
void cuk_sync() {}
std::string cuk_error() { return ""; }
cuk_event* cuk_event_new() { return nullptr; }
void cuk_event_free(cuk_event*) {}
void cuk_event_record(cuk_event*) { not_built("cuk_event_record"); }
float cuk_event_ms(const cuk_event*, const cuk_event*) { return 0.0f; }
void cuk_get_rows(uint32_t, const void*, size_t, int64_t, const int32_t*, int, float, float*) { not_built("cuk_get_rows"); }
void cuk_gemv(uint32_t, const void*, size_t, int64_t, int64_t, const float*, int64_t, int, float*, int64_t) { not_built("cuk_gemv"); }
void cuk_dequant_bf16(uint32_t, const void*, size_t, int64_t, int64_t, uint16_t*) { not_built("cuk_dequant_bf16"); }
void cuk_to_bf16(const float*, int64_t, uint16_t*) { not_built("cuk_to_bf16"); }
void cuk_gemm_bf16(const uint16_t*, const uint16_t*, float*, int64_t, int64_t, int64_t) { not_built("cuk_gemm_bf16"); }
void cuk_rmsnorm(const float*, int64_t, const float*, float*, int64_t, int64_t, int, float) { not_built("cuk_rmsnorm"); }
void cuk_gather_rows(const float*, int64_t, const int32_t*, int64_t, float*) { not_built("cuk_gather_rows"); }
void cuk_add(float*, const float*, int64_t) { not_built("cuk_add"); }
void cuk_add_bias(float*, const float*, int64_t, int) { not_built("cuk_add_bias"); }
void cuk_scale(float*, int64_t, float) { not_built("cuk_scale"); }
void cuk_softcap(float*, int64_t, float) { not_built("cuk_softcap"); }
void cuk_glu(float*, const float*, int64_t, bool) { not_built("cuk_glu"); }
void cuk_rope(float*, int, int, int, int, bool, const cuk_entry*, const float*, const float*, float) { not_built("cuk_rope"); }
void cuk_kv_write(const float*, const float*, int, const cuk_entry*, const cuk_kv_seq*, int, int) { not_built("cuk_kv_write"); }
int cuk_attn_heads_per_block(int group) { return group; }
int cuk_attn_tile_entries(int) { return 1; }
size_t cuk_attn_scratch_floats(int, int, int, int) { return 0; }
void cuk_attention(const float*, float*, int, const cuk_entry*, const int32_t*, int, const cuk_kv_seq*, int, int, int,
                   float, int, int32_t, float*) { not_built("cuk_attention"); }

#endif  // STRATA_HAVE_CUDA

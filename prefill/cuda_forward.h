// prefill/cuda_forward.h — the CUDA backend: the whole decoder forward (llama, qwen2, qwen3, gemma3) on the GPU,
// over the kernels of prefill/cuda_kernels.h. The CPU engine (engine/model.cpp) stays the reference; this is the
// same forward pass, step for step, with the weights uploaded once at load and the KV caches in device memory.
//
// Contract:
//  - model.cpp calls cuda_model_init after the architecture builder (backend cuda / auto); from then on
//    model_eval hands every checked batch to cuda_model_eval, and kv_cache_init makes device caches with
//    cuda_kv_mem() (engine/kv_cache.h kv_mem): prefix copies, SAVE / RESTORE rows and the ring rules are the
//    CPU's, on device bytes.
//  - cuda_model_supported says why a model cannot run here (MoE layers, a head size without an attention
//    kernel, rows not a multiple of 32, no device, a build without CUDA): "auto" then stays on the CPU.
//  - Plain C++ (no CUDA header): it compiles in every build; without CUDA cuk_available() is false.
//  - PfTimer on the device: with STRATA_PF_TIMING=1, CUDA events mark the phases (upload, embed, each layer's
//    matmuls, norms, attention, head, download) by prefill/timer_marks.hpp's rule, and each model_eval of more
//    than one entry prints `pf cuda timing: ...` and `pf cuda layers: ...` on stderr; with it unset no event
//    is recorded and nothing synchronises beyond the logits' copy.
#pragma once

#include <string>

struct strata_model;
struct eval_batch;
struct kv_mem;

bool cuda_model_supported(const strata_model* m, std::string* why);
// Uploads the weights and allocates the activations for m->n_batch entries; nullptr + *err on failure.
struct cuda_model;
cuda_model* cuda_model_init(const strata_model* m, std::string* err);
void cuda_model_free(cuda_model* c);
// model_eval's work on the device (the batch already checked, the caches' rings advanced).
int cuda_model_eval(strata_model* m, const eval_batch& b, float* logits, std::string* err);
const kv_mem* cuda_kv_mem();
// The device's name and compute capability ("NVIDIA H200 sm_90"); "" without one.
std::string cuda_device_name();
// Bytes of device memory the weights took.
size_t cuda_model_weight_bytes(const cuda_model* c);

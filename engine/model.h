// engine/model.h — the boundary between the protocol loop (engine/serve_loop.cpp and friends) and the
// model math (gguf reader, kernels, architecture builders).
//
// Contract:
//  - The protocol side knows only this header: token ids in, logits out, KV caches it owns and copies.
//  - The math side knows nothing of the protocol, slots, sessions or stdin/stdout.
//  - Everything here is single-caller: the protocol loop calls in from one thread; the math side
//    parallelises internally with its own thread pool (sized by model_params.n_threads).
//  - Results never depend on n_threads (reductions are split in a fixed order), so a seed reproduces
//    across thread counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

struct strata_model;  // opaque: weights (mmap'd GGUF), thread pool, scratch buffers
struct kv_cache;      // opaque: one sequence's K and V, (n_layer, n_ctx, n_embd_kv) each (window layers: rings)

enum kv_type : int32_t {
    KV_TYPE_F16  = 0,
    KV_TYPE_Q8_0 = 1,
};

struct model_params {
    std::string path;        // the GGUF file
    int32_t n_threads = 0;   // 0 = physical cores
    int32_t n_batch = 512;   // most tokens one model_eval call may carry (scratch is sized for it)
    int32_t act_bits = 0;    // matmul activations: 16-bit blocks, 8, or 0 = the kernel set's default per type
                             // (act_bits_default: 8 on AVX2 where it has 8-bit kernels; engine/cpu/kernels_act8.h)
    int64_t experts_ram_bytes = -1;  // RAM for packed experts (engine/expert_tiers.h); -1 = every expert
    // "cpu"; "cuda": the forward and the KV caches on the GPU (prefill/cuda_forward.h), an error when it cannot;
    // "auto": CUDA when this build has it, a device answers and the model's shapes have kernels, else the CPU
    std::string backend = "cpu";
};

// What the protocol loop needs to know about the loaded model (filled from GGUF metadata).
struct model_info {
    std::string arch;          // general.architecture: "llama", "qwen2", "qwen3", "gemma3", "phi3", "qwen3moe", "qwen2moe", "gpt-oss"
    std::string name;          // general.name, may be empty
    int32_t n_vocab = 0;
    int32_t n_ctx_train = 0;
    int32_t n_layer = 0;
    int32_t n_embd = 0;
    int32_t n_head = 0;
    int32_t n_head_kv = 0;
    int32_t head_dim = 0;
    int32_t n_threads = 0;     // threads actually used
    // special ids from tokenizer.ggml.* metadata and the vocabulary; -1 when absent
    int32_t bos_id = -1;
    int32_t eos_id = -1;       // tokenizer.ggml.eos_token_id
    int32_t eot_id = -1;       // tokenizer.ggml.eot_token_id, or "<|im_end|>" looked up in the vocabulary
    int32_t im_start_id = -1;  // "<|im_start|>" looked up in the vocabulary
    int32_t endoftext_id = -1; // "<|endoftext|>" looked up in the vocabulary
    int32_t call_id = -1;      // "<|call|>" where the vocabulary is harmony's (also "<|return|>"): ends a reply
                               // that calls a tool, as "<|return|>" (eos) ends one that answers
    size_t weights_bytes = 0;  // bytes of tensor data mapped
    int32_t act_bits = 16;     // model_params.act_bits as applied (default: 8 when any matrix got 8 bits)
    // expert tiers (engine/expert_tiers.h): experts of all layers, those with a packed copy in RAM now, and
    // what all of them would take packed; resident == total when no budget binds
    int32_t n_experts_total = 0;
    int32_t n_experts_resident = 0;
    size_t experts_packed_bytes = 0;
    std::string backend = "cpu";  // as applied: "cpu" or "cuda"
    std::string backend_note;     // why "auto" (or a model the GPU cannot run) stayed on the CPU; "" otherwise
    std::string device;           // the GPU's name with the CUDA backend
};

// Expert reads so far (one per used expert per layer per step): from RAM, from the mapped file; experts
// repacked into RAM after the start. All 0 without expert tiers.
struct expert_figures {
    uint64_t hits = 0, misses = 0, swaps = 0;
    int32_t resident = 0, total = 0;
};
expert_figures model_expert_figures(const strata_model* model);

// Loads the model. On failure returns nullptr and sets *err to one line naming the file, the tensor (when
// there is one) and the reason. Never aborts on a bad file.
strata_model* model_load(const model_params& params, std::string* err);
void model_free(strata_model* model);
const model_info& model_get_info(const strata_model* model);

// One sequence's cache, room for n_ctx positions. The model's sliding-window layers (gemma3) keep only the
// recent positions their windows read, as rings, when that is less than n_ctx (kv_cache.h).
kv_cache* kv_cache_init(const strata_model* model, int32_t n_ctx, kv_type type);
void kv_cache_free(kv_cache* kv);
int32_t kv_cache_n_ctx(const kv_cache* kv);
// Bytes that positions [0, n_pos) occupy (for memory accounting): a ring layer counts its cells only.
size_t kv_cache_bytes(const kv_cache* kv, int32_t n_pos);
// Reuse rule of the window layers: a sequence may continue at n_pos (keep its first n_pos positions, or have
// them copied elsewhere) only when its rings still hold the window of position n_pos, i.e. n_pos == 0 or
// kv_cache_window_lo(kv) <= max(0, n_pos + 1 - n_swa). Otherwise the prompt is read again from position 0.
// Always true for a model without window layers or a cache whose window layers are not rings.
bool kv_cache_can_resume(const kv_cache* kv, int32_t n_pos);
// The oldest position the window layers still hold (0 when they hold all).
int32_t kv_cache_window_lo(const kv_cache* kv);
// After kv_cache_write_rows of positions [0, n_pos) whose window rows hold positions from lo on.
void kv_cache_set_window_lo(kv_cache* kv, int32_t n_pos, int32_t lo);
// Copies positions [0, n_pos) of src into dst (same model, same type; dst->n_ctx >= n_pos); of the window
// layers, those src still holds (callers check kv_cache_can_resume(src, n_pos) first).
void kv_cache_copy(kv_cache* dst, const kv_cache* src, int32_t n_pos);
// Raw access for SAVE/RESTORE: the bytes of positions [0, n_pos) of one layer's K or V, as a contiguous
// block of kv_cache_row_bytes(kv) * n_pos bytes (layout: (n_pos, n_embd_kv) in the cache's type). Reading,
// a window layer's positions before kv_cache_window_lo are zeros; writing, a ring keeps the last ones.
size_t kv_cache_row_bytes(const kv_cache* kv);
void kv_cache_read_rows(const kv_cache* kv, int32_t layer, bool is_v, int32_t n_pos, void* out);
void kv_cache_write_rows(kv_cache* kv, int32_t layer, bool is_v, int32_t n_pos, const void* in);

// One evaluation step over any mix of sequences: entry i feeds token[i] at position pos[i] of sequence
// seq[i] (an index into kvs). Within one sequence, entries are consecutive and their positions rise by 1;
// positions < the first pos of a sequence must already be filled in its cache (window layers: the first
// pos's window, kv_cache_can_resume), and a sequence has at most n_batch entries. Every entry's K/V is written
// to its cache. For entries with want_logits[i] != 0 the logits (n_vocab floats) are written to
// logits + k * n_vocab, k counting only those entries, in entry order.
// A prompt chunk is one sequence with n entries (weights are read once per call, not once per token);
// a batched decode step is one entry per busy slot.
struct eval_batch {
    int32_t n = 0;
    const int32_t* token = nullptr;       // (n)
    const int32_t* pos = nullptr;         // (n)
    const int32_t* seq = nullptr;         // (n) index into kvs
    const uint8_t* want_logits = nullptr; // (n)
    kv_cache* const* kvs = nullptr;       // (n_seq)
    int32_t n_seq = 0;
    // Embeddings (engine/embed.h): for entries with want_hidden[i] != 0 the final-normed hidden state
    // (rmsnorm(x) * output_norm, the head's input; n_embd floats) is written to hidden + k * n_embd, k counting
    // only those entries, in entry order. Both nullptr = none wanted.
    const uint8_t* want_hidden = nullptr; // (n) or nullptr
    float* hidden = nullptr;              // (entries wanting it, n_embd) out
};
// Returns 0 on success, -1 on bad input (n > n_batch, pos out of range, ...) with *err set.
int model_eval(strata_model* model, const eval_batch& batch, float* logits, std::string* err);

// Convenience for the common case: one sequence, tokens[0..n) at positions pos0.., logits of the last.
int model_eval_seq(strata_model* model, kv_cache* kv, const int32_t* tokens, int32_t n, int32_t pos0,
                   float* logits_last, std::string* err);

// Bytes one decode token reads from the weights: every matrix of the forward pass once (its row-group copy
// when it has one) and one embedding row; the KV cache comes on top (kv_bytes_per_pos per position seen).
size_t model_decode_bytes(const strata_model* model);
// Bytes of K and V that one cached position adds to a decode step's reads (f16 cache).
size_t model_kv_bytes_per_pos(const strata_model* model);

// CPU features found at start and the kernel set chosen ("avx512_vnni", "avx2", "scalar").
const char* model_kernel_name();

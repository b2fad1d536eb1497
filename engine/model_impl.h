// engine/model_impl.h — internals shared by model.cpp (loading, forward pass) and the architecture builders
// in engine/models/*.cpp. Not part of the protocol boundary (that is model.h).
//
// A builder reads its architecture's hyperparameters and tensors from the GGUF file into model_hparams and
// layer_weights; the forward pass in model.cpp is one decoder loop whose optional parts (QKV biases,
// QK-norm, NeoX RoPE, tied head; gemma3's embedding scale, post-norms, GELU FFN, sliding-window layers with
// their own RoPE base, attention scale and logit soft-cap) are switched by what the builder found.
#pragma once

#include <string>
#include <vector>

#include "gguf.h"
#include "cpu/kernels.h"
#include "model.h"
#include "expert_tiers.h"
#include "moe.h"
#include "rope_scaling.h"

struct threadpool;
struct cuda_model;  // prefill/cuda_forward.h: the weights and activations on the GPU

struct model_hparams {
    int32_t n_vocab = 0;
    int32_t n_ctx_train = 0;
    int32_t n_layer = 0;
    int32_t n_embd = 0;
    int32_t n_head = 0;
    int32_t n_head_kv = 0;
    int32_t head_dim = 0;
    int32_t n_rot = 0;        // leading dims of each head that RoPE rotates
    int32_t n_ff = 0;
    float rope_base = 10000.0f;
    float rms_eps = 1e-5f;
    bool rope_neox = false;   // pairs (i, i + n_rot/2) instead of (2i, 2i+1)
    float embd_scale = 0.0f;  // token embeddings are multiplied by this (gemma3: sqrt(n_embd)); 0 = not
    float attn_scale = 0.0f;  // q k^T scale; 0 = 1 / sqrt(head_dim)
    bool ffn_gelu = false;    // gated FFN with GELU (tanh form) instead of SiLU
    int32_t n_swa = 0;        // sliding window of the window layers (a query sees its last n_swa positions)
    float rope_base_swa = 10000.0f;  // RoPE base of the window layers
    float logit_softcap = 0.0f;      // logits = c * tanh(logits / c) when > 0
    rope_scaling rope;               // rope.scaling.* (engine/rope_scaling.h)
    float rope_mscale = 1.0f;        // multiplier of the rotation's cos and sin (full layers, window layers)
    float rope_mscale_swa = 1.0f;
    // mixture of experts (engine/moe.h); n_expert 0 = a dense FFN
    int32_t n_expert = 0;
    int32_t n_expert_used = 0;
    int32_t n_ff_exp = 0;            // each expert's FFN width
    bool expert_weights_norm = false;  // the chosen experts' weights are divided by their sum
    bool expert_softmax_chosen = false;  // gpt-oss: the top k of the raw router logits, softmax over those k
    float swiglu_limit = 0.0f;       // > 0 (gpt-oss): act = min(g, lim) * sigmoid(alpha * min(g, lim)) * (clamp(u, +-lim) + 1)
    float swiglu_alpha = 0.0f;
    bool rope_swa_scaled = false;    // window layers take the full layers' rope scaling (gpt-oss); else scale 1
    int32_t n_embd_q() const { return n_head * head_dim; }
    int32_t n_embd_kv() const { return n_head_kv * head_dim; }
};

struct layer_weights {
    std::vector<float> attn_norm;             // (n_embd)
    weight_view wq, wk, wv, wo;               // (n_embd_q, n_embd), (n_embd_kv, n_embd) x2, (n_embd, n_embd_q)
    std::vector<float> bq, bk, bv;            // biases, empty when absent (qwen2 has them)
    std::vector<float> bo;                    // (n_embd) attention output bias, empty when absent (gpt-oss)
    std::vector<float> attn_sinks;            // (n_head) sink logit per query head, empty when absent (gpt-oss)
    std::vector<float> q_norm, k_norm;        // (head_dim) per-head RMS norm weights, empty when absent (qwen3)
    std::vector<float> ffn_norm;              // (n_embd)
    weight_view w_gate, w_up, w_down;         // (n_ff, n_embd) x2, (n_embd, n_ff)
    std::vector<float> attn_post_norm, ffn_post_norm;  // (n_embd) norms of the block outputs, empty when absent
    bool swa = false;                         // a sliding-window layer (hp.n_swa, rope_inv_freq_swa)
    // MoE layers (engine/moe.h): w_gate / w_up / w_down then hold the shared expert when there is one
    weight_view ffn_gate_inp;                 // (n_expert, n_embd) router
    std::vector<weight_view> exp_gate, exp_up, exp_down;  // n_expert slices: (n_ff_exp, n_embd) x2, (n_embd, n_ff_exp)
    std::vector<float> shexp_gate;            // (n_embd) the shared expert's gate (qwen2moe), empty when absent
    // biases of the router and the experts (gpt-oss), empty when absent
    std::vector<float> ffn_gate_inp_b;        // (n_expert)
    std::vector<float> exp_gate_b, exp_up_b;  // (n_expert, n_ff_exp)
    std::vector<float> exp_down_b;            // (n_expert, n_embd)
};

struct model_scratch {
    // activations for up to n_batch entries; shapes are (n_batch, width)
    std::vector<float> x, xn, q, k, v, att, tmp, gate, up;
    std::vector<float> att_scores;            // (n_threads, MODEL_ATT_TILE * group, n_ctx) per-thread scores
    std::vector<int32_t> att_tiles;           // first entry of each attention tile, then n
    std::vector<int32_t> att_runs;            // model_eval: first entry of each sequence's run, then n
    std::vector<float> kv_rows;               // (n_threads, 2, head_dim) dequantised q8_0 KV rows
    std::vector<uint16_t> kv_f16;             // (n_embd_kv) one K or V row in half
    std::vector<float> rope_cs;               // (n_batch, 2, n_rot) rope_cos_sin of each entry's position:
                                              // full-attention frequencies, then the window layers'
    mm_scratch mm;
    std::vector<int32_t> seq_pos, seq_idx;   // model_eval_seq's batch (reused: no allocation per call)
    std::vector<uint8_t> seq_want;
    moe_scratch moe;                          // MoE layers' step (engine/moe.h)
};

struct strata_model {
    gguf_file* file = nullptr;
    model_info info;
    model_hparams hp;
    weight_view tok_embd;                     // (n_vocab, n_embd)
    weight_view output;                       // (n_vocab, n_embd); == tok_embd when tied
    std::vector<float> output_norm;           // (n_embd)
    std::vector<layer_weights> layers;
    std::vector<float> rope_inv_freq;         // (n_rot / 2) base^(-2i / n_rot) / rope_freq_factors[i], scaled
                                              // (hp.rope: linear or YaRN)
    std::vector<float> rope_freq_factors;     // (n_rot / 2) from rope_freqs.weight (Llama 3.1+), empty if absent
    std::vector<float> rope_inv_freq_swa;     // (n_rot / 2) base_swa^(-2i / n_rot), for the window layers
    // LongRoPE (phi3): rope_freq_factors holds the short factors; these, the long ones and their frequencies,
    // which the entries of a cache of more than hp.rope.n_ctx_orig positions take; empty when absent
    std::vector<float> rope_freq_factors_long;  // (n_rot / 2)
    std::vector<float> rope_inv_freq_long;      // (n_rot / 2)
    int32_t n_batch = 512;
    threadpool* pool = nullptr;
    const kernel_set* ks = nullptr;
    model_scratch s;
    uint8_t* packed = nullptr;                // the row-group copies of the weights (pack_weights in model.cpp)
    std::vector<block_q8_0> widened;          // Q5_0 / IQ4_NL matrices rewritten as Q8_0 (widen_weights)
    expert_tiers tiers;                       // experts in RAM where the budget binds (engine/expert_tiers.h)
    cuda_model* cuda = nullptr;               // the CUDA backend; nullptr: the CPU forward
};

// Builds a model over an opened file (model_load = gguf_open + this). Takes ownership of f, also on failure.
strata_model* model_load_gguf(gguf_file* f, const model_params& params, std::string* err);

// Builders: fill m->hp and m->layers (and output/tok_embd) from m->file; false + *err on a missing or
// malformed tensor or key.
bool build_llama(strata_model* m, std::string* err);
bool build_qwen2(strata_model* m, std::string* err);
bool build_qwen3(strata_model* m, std::string* err);
bool build_gemma3(strata_model* m, std::string* err);
bool build_qwen3moe(strata_model* m, std::string* err);
bool build_qwen2moe(strata_model* m, std::string* err);
bool build_phi3(strata_model* m, std::string* err);
bool build_gpt_oss(strata_model* m, std::string* err);

// Helpers for builders (model.cpp). All set *err to "<file>: tensor '<name>': <reason>" on failure.
bool model_read_u32(const strata_model* m, const std::string& key, int32_t* out, bool required, std::string* err);
bool model_read_f32(const strata_model* m, const std::string& key, float* out, std::string* err);
// A 2-D weight that must have ne = (n_cols, n_rows); a missing optional weight leaves out->data null.
bool model_weight(const strata_model* m, const std::string& name, int64_t n_cols, int64_t n_rows, bool required,
                  weight_view* out, std::string* err);
// A 1-D vector of n floats (any supported type, dequantised); a missing optional one leaves out empty.
bool model_vector(const strata_model* m, const std::string& name, int64_t n, bool required,
                  std::vector<float>* out, std::string* err);
// Layer il's required Q, K and V projection biases (qwen2, qwen2moe, gpt-oss) into its bq / bk / bv.
bool model_qkv_biases(strata_model* m, int32_t il, std::string* err);
// Reads the hyperparameters every decoder here shares (arch is the GGUF key prefix).
bool model_read_common_hparams(strata_model* m, const std::string& arch, std::string* err);
// Loads the per-layer tensors common to llama/qwen2/qwen3 (norms, q/k/v/o, ffn) plus the embedding and head.
// dense_ffn false: without ffn_gate / ffn_up / ffn_down (MoE layers load their own, engine/moe.h).
// ffn_norm: the name of the FFN's input norm in the file (gpt-oss: post_attention_norm.weight).
bool model_load_common_tensors(strata_model* m, std::string* err, bool dense_ffn = true,
                               const std::string& ffn_norm = "ffn_norm.weight");

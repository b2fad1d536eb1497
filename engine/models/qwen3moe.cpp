// engine/models/qwen3moe.cpp — builder for "qwen3moe" (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B):
// qwen3's attention block (QK-norm per head, NeoX RoPE, head_dim from attention.key_length, no QKV biases)
// with a mixture-of-experts FFN in every layer (engine/moe.h): softmax router over expert_count experts,
// the expert_used_count best taken with their probabilities divided by their sum (the reference always
// normalises for this architecture), experts of expert_feed_forward_length, SwiGLU; no shared expert.
#include "model_impl.h"

bool build_qwen3moe(strata_model* m, std::string* err) {
    if (!model_read_common_hparams(m, "qwen3moe", err) || !moe_read_hparams(m, "qwen3moe", err)) return false;
    model_hparams& hp = m->hp;
    hp.rope_neox = true;
    hp.expert_weights_norm = true;
    hp.n_ff = hp.n_ff_exp;  // no dense FFN: the dense scratch need only fit an expert
    if (!model_load_common_tensors(m, err, false) || !moe_load_tensors(m, err)) return false;
    for (int32_t il = 0; il < hp.n_layer; ++il) {
        layer_weights& l = m->layers[size_t(il)];
        const std::string p = "blk." + std::to_string(il) + ".";
        if (!model_vector(m, p + "attn_q_norm.weight", hp.head_dim, true, &l.q_norm, err) ||
            !model_vector(m, p + "attn_k_norm.weight", hp.head_dim, true, &l.k_norm, err)) {
            return false;
        }
    }
    return true;
}

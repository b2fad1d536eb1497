// engine/models/qwen3.cpp — builder for "qwen3": the llama block plus QK-norm (an RMS norm over each head of
// Q and K, weights of head_dim, applied before RoPE), NeoX RoPE, head_dim from attention.key_length (may
// differ from n_embd / n_head), no QKV biases, tied or separate output head.
#include "model_impl.h"

bool build_qwen3(strata_model* m, std::string* err) {
    if (!model_read_common_hparams(m, "qwen3", err)) return false;
    m->hp.rope_neox = true;
    if (!model_load_common_tensors(m, err)) return false;
    const model_hparams& hp = m->hp;
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

// engine/models/qwen2moe.cpp — builder for "qwen2moe" (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): qwen2's attention
// block (biases on Q, K and V, NeoX RoPE) with a mixture-of-experts FFN (engine/moe.h): softmax router, the
// expert_used_count best taken with their probabilities as they are (not renormalised), experts of
// expert_feed_forward_length; plus a shared expert every token takes (ffn_{gate,up,down}_shexp, width
// expert_shared_feed_forward_length, default feed_forward_length), scaled by sigmoid(x . ffn_gate_inp_shexp).
#include "model_impl.h"

bool build_qwen2moe(strata_model* m, std::string* err) {
    if (!model_read_common_hparams(m, "qwen2moe", err) || !moe_read_hparams(m, "qwen2moe", err)) return false;
    model_hparams& hp = m->hp;
    hp.rope_neox = true;
    hp.expert_weights_norm = false;
    // the shared expert runs as the dense FFN of width hp.n_ff
    if (!model_read_u32(m, "qwen2moe.expert_shared_feed_forward_length", &hp.n_ff, false, err)) return false;
    if (hp.n_ff < 1) {
        *err = m->file->path + ": implausible expert_shared_feed_forward_length";
        return false;
    }
    if (!model_load_common_tensors(m, err, false) || !moe_load_tensors(m, err)) return false;
    for (int32_t il = 0; il < hp.n_layer; ++il) {
        layer_weights& l = m->layers[size_t(il)];
        const std::string p = "blk." + std::to_string(il) + ".";
        if (!model_qkv_biases(m, il, err) ||
            !model_vector(m, p + "ffn_gate_inp_shexp.weight", hp.n_embd, true, &l.shexp_gate, err) ||
            !model_weight(m, p + "ffn_gate_shexp.weight", hp.n_embd, hp.n_ff, true, &l.w_gate, err) ||
            !model_weight(m, p + "ffn_up_shexp.weight", hp.n_embd, hp.n_ff, true, &l.w_up, err) ||
            !model_weight(m, p + "ffn_down_shexp.weight", hp.n_ff, hp.n_embd, true, &l.w_down, err)) {
            return false;
        }
    }
    return true;
}

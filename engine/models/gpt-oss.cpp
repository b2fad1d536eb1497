// engine/models/gpt-oss.cpp — builder for "gpt-oss" (OpenAI gpt-oss-20b / gpt-oss-120b), as llama.cpp runs
// the architecture (its OPENAI_MOE graph; facts read there, the code written here):
//  - attention with biases on Q, K, V and the output (attn_{q,k,v,output}.bias), head_dim from
//    attention.key_length (64; n_head * head_dim need not be n_embd), q k^T scaled by 1 / sqrt(head_dim),
//    NeoX RoPE with the file's rope.scaling (YaRN, factor 32 over 4096 positions in the released files);
//  - attention sinks: attn_sinks.weight (n_head), a learned logit per query head that joins each softmax's max
//    and denominator and takes no value row (attention can give a query "nowhere" to look);
//  - sliding-window attention on alternating layers: layer il is a window layer when il % pattern <
//    pattern - 1 (attention.sliding_window_pattern, default 2: the even layers), window attention.sliding_window
//    positions; the window layers take the same RoPE (base rope.freq_base_swa, default rope.freq_base, and the
//    same scaling) as the full ones;
//  - the FFN's input norm is named post_attention_norm.weight (there is no ffn_norm);
//  - a mixture of experts in every layer (engine/moe.h): router logits + ffn_gate_inp.bias, the top
//    expert_used_count logits, weights the softmax over those; experts with biases on gate, up and down; the
//    clamped SwiGLU act = min(g, 7) * sigmoid(1.702 * min(g, 7)) * (clamp(u, -7, 7) + 1); no shared expert;
//  - an untied output head (output.weight required). Experts are MXFP4 in the released files (widened to
//    Q8_0 at load where exact, engine/cpu/quants.h).
#include "model_impl.h"

namespace {

constexpr float GPT_OSS_SWIGLU_ALPHA = 1.702f;  // the sigmoid's slope in the reference's clamped SwiGLU
constexpr float GPT_OSS_SWIGLU_LIMIT = 7.0f;    // gate clamped above, up clamped both sides, at this value

bool read_window(strata_model* m, std::string* err) {
    model_hparams& hp = m->hp;
    int32_t pattern = 2;
    hp.rope_base_swa = hp.rope_base;
    if (!model_read_u32(m, "gpt-oss.attention.sliding_window", &hp.n_swa, true, err) ||
        !model_read_u32(m, "gpt-oss.attention.sliding_window_pattern", &pattern, false, err) ||
        !model_read_f32(m, "gpt-oss.rope.freq_base_swa", &hp.rope_base_swa, err)) {
        return false;
    }
    if (hp.n_swa < 1 || hp.rope_base_swa <= 1.0f) {
        *err = m->file->path + ": implausible gpt-oss attention.sliding_window or rope.freq_base_swa";
        return false;
    }
    for (int32_t il = 0; il < hp.n_layer; ++il) {  // pattern 0: every layer a window layer, as the reference
        m->layers[size_t(il)].swa = pattern == 0 || il % pattern < pattern - 1;
    }
    return true;
}

}  // namespace

bool build_gpt_oss(strata_model* m, std::string* err) {
    if (!model_read_common_hparams(m, "gpt-oss", err) || !moe_read_hparams(m, "gpt-oss", err)) return false;
    model_hparams& hp = m->hp;
    hp.rope_neox = true;
    hp.rope_swa_scaled = true;
    hp.expert_softmax_chosen = true;
    hp.swiglu_alpha = GPT_OSS_SWIGLU_ALPHA;
    hp.swiglu_limit = GPT_OSS_SWIGLU_LIMIT;
    hp.n_ff = hp.n_ff_exp;  // no dense FFN: the dense scratch need only fit an expert
    if (!model_load_common_tensors(m, err, false, "post_attention_norm.weight") || !moe_load_tensors(m, err) ||
        !moe_load_biases(m, err) || !read_window(m, err)) {
        return false;
    }
    if (m->output.data == m->tok_embd.data) {
        *err = m->file->path + ": tensor 'output.weight': missing (gpt-oss has an untied head)";
        return false;
    }
    for (int32_t il = 0; il < hp.n_layer; ++il) {
        layer_weights& l = m->layers[size_t(il)];
        const std::string p = "blk." + std::to_string(il) + ".";
        if (!model_qkv_biases(m, il, err) ||
            !model_vector(m, p + "attn_output.bias", hp.n_embd, true, &l.bo, err) ||
            !model_vector(m, p + "attn_sinks.weight", hp.n_head, true, &l.attn_sinks, err)) {
            return false;
        }
    }
    return true;
}

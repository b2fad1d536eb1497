// engine/models/gemma3.cpp — builder for "gemma3" (Gemma 3 text models, e.g. Gemma 3 270M):
//  - token embeddings scaled by sqrt(n_embd); tied output head unless output.weight is present;
//  - RMS norms before and after attention and FFN (attn_norm / post_attention_norm, ffn_norm / post_ffw_norm).
//    Gemma's (1 + w) norm convention is already applied by the GGUF converter (the file stores 1 + w), so
//    every norm here is the plain x * w, as llama.cpp computes it;
//  - Q/K RMS norms per head (head_dim from attention.key_length, here 256 != n_embd / n_head), NeoX RoPE;
//  - sliding-window layers (attention.sliding_window positions, RoPE base rope.freq_base_swa, default 10000)
//    interleaved with global layers (rope.freq_base): with attention.sliding_window_pattern n (default 6),
//    layer il is a window layer unless il % n == n - 1;
//  - attention scale 1 / sqrt(head_dim) (1 / sqrt(n_embd / n_head) for the 62-layer 27B, as its config says);
//  - gated FFN with GELU (tanh form); optional final_logit_softcapping.
#include <cmath>

#include "model_impl.h"

namespace {

constexpr int32_t GEMMA3_SWA_PATTERN = 6;  // five window layers, then one global (Gemma 3's layout)
constexpr int32_t GEMMA3_27B_LAYERS = 62;

}  // namespace

bool build_gemma3(strata_model* m, std::string* err) {
    if (!model_read_common_hparams(m, "gemma3", err)) return false;
    model_hparams& hp = m->hp;
    hp.rope_neox = true;
    hp.ffn_gelu = true;
    hp.embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
    hp.attn_scale = hp.n_layer == GEMMA3_27B_LAYERS ? 1.0f / std::sqrt(float(hp.n_embd / hp.n_head))
                                                   : 1.0f / std::sqrt(float(hp.head_dim));
    int32_t pattern = GEMMA3_SWA_PATTERN;
    if (!model_read_u32(m, "gemma3.attention.sliding_window", &hp.n_swa, false, err) ||
        !model_read_u32(m, "gemma3.attention.sliding_window_pattern", &pattern, false, err) ||
        !model_read_f32(m, "gemma3.rope.freq_base_swa", &hp.rope_base_swa, err) ||
        !model_read_f32(m, "gemma3.final_logit_softcapping", &hp.logit_softcap, err)) {
        return false;
    }
    if (hp.rope_base_swa <= 1.0f || hp.logit_softcap < 0.0f || pattern < 1) {
        *err = m->file->path + ": implausible gemma3 rope.freq_base_swa, sliding window pattern or soft-cap";
        return false;
    }
    if (!model_load_common_tensors(m, err)) return false;
    for (int32_t il = 0; il < hp.n_layer; ++il) {
        layer_weights& l = m->layers[size_t(il)];
        const std::string p = "blk." + std::to_string(il) + ".";
        l.swa = hp.n_swa > 0 && il % pattern < pattern - 1;
        if (!model_vector(m, p + "attn_q_norm.weight", hp.head_dim, true, &l.q_norm, err) ||
            !model_vector(m, p + "attn_k_norm.weight", hp.head_dim, true, &l.k_norm, err) ||
            !model_vector(m, p + "post_attention_norm.weight", hp.n_embd, true, &l.attn_post_norm, err) ||
            !model_vector(m, p + "post_ffw_norm.weight", hp.n_embd, true, &l.ffn_post_norm, err)) {
            return false;
        }
    }
    return true;
}

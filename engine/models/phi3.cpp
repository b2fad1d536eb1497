// engine/models/phi3.cpp — builder for "phi3" (Phi-3 / Phi-3.5 mini and medium, Phi-4-mini): the llama block
// with
//  - fused projections: attn_qkv (n_embd, n_embd_q + 2 n_embd_kv), rows Q then K then V, and ffn_up
//    (n_embd, 2 n_ff), rows gate then up (the gate half goes through silu); each part is taken as a row slice
//    of the stored matrix (a view, no copy), so the forward pass is the llama one. Files with separate
//    attn_q / attn_k / attn_v are read as well;
//  - NeoX RoPE over the first rope.dimension_count dims of each head (partial rotary when that is less than
//    the head size, Phi-4-mini: 96 of 128);
//  - LongRoPE: per-frequency divisors rope_factors_short / rope_factors_long (n_rot / 2 each); a cache of more
//    than rope.scaling.original_context_length positions uses the long ones, a shorter one the short ones
//    (the reference chooses by its context size the same way); rope.scaling.attn_factor scales the rotation
//    (engine/rope_scaling.h). attention.sliding_window is not applied (the reference ignores it for phi3).
#include "model_impl.h"

namespace {

// rows [r0, r0 + n) of w as a weight of its own
weight_view row_slice(const weight_view& w, int64_t r0, int64_t n) {
    weight_view s = w;
    s.n_rows = n;
    s.data = w.data + size_t(r0) * w.row_bytes;
    return s;
}

bool positive_factors(const strata_model* m, const std::vector<float>& f, const char* name, std::string* err) {
    for (float v : f) {
        if (!(v > 0.0f)) {
            *err = m->file->path + ": tensor '" + name + "': factors must be positive";
            return false;
        }
    }
    return true;
}

}  // namespace

bool build_phi3(strata_model* m, std::string* err) {
    if (!model_read_common_hparams(m, "phi3", err)) return false;
    model_hparams& hp = m->hp;
    hp.rope_neox = true;
    const int32_t half = hp.n_rot / 2;
    if (!model_vector(m, "rope_factors_short.weight", half, false, &m->rope_freq_factors, err) ||
        !model_vector(m, "rope_factors_long.weight", half, false, &m->rope_freq_factors_long, err) ||
        !positive_factors(m, m->rope_freq_factors, "rope_factors_short.weight", err) ||
        !positive_factors(m, m->rope_freq_factors_long, "rope_factors_long.weight", err)) {
        return false;
    }
    if (!model_weight(m, "token_embd.weight", hp.n_embd, hp.n_vocab, true, &m->tok_embd, err) ||
        !model_vector(m, "output_norm.weight", hp.n_embd, true, &m->output_norm, err) ||
        !model_weight(m, "output.weight", hp.n_embd, hp.n_vocab, false, &m->output, err)) {
        return false;
    }
    if (!m->output.data) m->output = m->tok_embd;
    const int64_t nq = hp.n_embd_q(), nkv = hp.n_embd_kv();
    m->layers.resize(size_t(hp.n_layer));
    for (int32_t il = 0; il < hp.n_layer; ++il) {
        layer_weights& l = m->layers[size_t(il)];
        const std::string p = "blk." + std::to_string(il) + ".";
        weight_view qkv, up;
        if (!model_vector(m, p + "attn_norm.weight", hp.n_embd, true, &l.attn_norm, err) ||
            !model_weight(m, p + "attn_qkv.weight", hp.n_embd, nq + 2 * nkv, false, &qkv, err) ||
            !model_weight(m, p + "attn_output.weight", nq, hp.n_embd, true, &l.wo, err) ||
            !model_vector(m, p + "ffn_norm.weight", hp.n_embd, true, &l.ffn_norm, err) ||
            !model_weight(m, p + "ffn_up.weight", hp.n_embd, 2 * int64_t(hp.n_ff), true, &up, err) ||
            !model_weight(m, p + "ffn_down.weight", hp.n_ff, hp.n_embd, true, &l.w_down, err)) {
            return false;
        }
        if (qkv.data) {
            l.wq = row_slice(qkv, 0, nq);
            l.wk = row_slice(qkv, nq, nkv);
            l.wv = row_slice(qkv, nq + nkv, nkv);
        } else if (!model_weight(m, p + "attn_q.weight", hp.n_embd, nq, true, &l.wq, err) ||
                   !model_weight(m, p + "attn_k.weight", hp.n_embd, nkv, true, &l.wk, err) ||
                   !model_weight(m, p + "attn_v.weight", hp.n_embd, nkv, true, &l.wv, err)) {
            return false;
        }
        l.w_gate = row_slice(up, 0, hp.n_ff);
        l.w_up = row_slice(up, hp.n_ff, hp.n_ff);
    }
    return true;
}

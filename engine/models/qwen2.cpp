// engine/models/qwen2.cpp — builder for "qwen2": the llama block plus biases on the Q, K and V projections,
// NeoX RoPE (pairs i, i + n_rot/2), tied or separate output head.
#include "model_impl.h"

bool build_qwen2(strata_model* m, std::string* err) {
    if (!model_read_common_hparams(m, "qwen2", err)) return false;
    m->hp.rope_neox = true;
    if (!model_load_common_tensors(m, err)) return false;
    const model_hparams& hp = m->hp;
    for (int32_t il = 0; il < hp.n_layer; ++il) {
        layer_weights& l = m->layers[size_t(il)];
        const std::string p = "blk." + std::to_string(il) + ".";
        if (!model_vector(m, p + "attn_q.bias", hp.n_embd_q(), true, &l.bq, err) ||
            !model_vector(m, p + "attn_k.bias", hp.n_embd_kv(), true, &l.bk, err) ||
            !model_vector(m, p + "attn_v.bias", hp.n_embd_kv(), true, &l.bv, err)) {
            return false;
        }
    }
    return true;
}

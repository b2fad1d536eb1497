// engine/models/qwen2.cpp — builder for "qwen2": the llama block plus biases on the Q, K and V projections,
// NeoX RoPE (pairs i, i + n_rot/2), tied or separate output head.
#include "model_impl.h"

bool build_qwen2(strata_model* m, std::string* err) {
    if (!model_read_common_hparams(m, "qwen2", err)) return false;
    m->hp.rope_neox = true;
    if (!model_load_common_tensors(m, err)) return false;
    for (int32_t il = 0; il < m->hp.n_layer; ++il) {
        if (!model_qkv_biases(m, il, err)) return false;
    }
    return true;
}

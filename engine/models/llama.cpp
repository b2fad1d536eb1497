// engine/models/llama.cpp — builder for general.architecture "llama" (SmolLM2, Llama 2/3 without rope
// scaling): RMS norm, GQA attention without biases, "normal" RoPE on adjacent pairs (the GGUF converter
// permutes Q/K rows for it), SwiGLU FFN, tied or separate output head.
#include "model_impl.h"

bool build_llama(strata_model* m, std::string* err) {
    if (!model_read_common_hparams(m, "llama", err)) return false;
    m->hp.rope_neox = false;
    return model_load_common_tensors(m, err);
}

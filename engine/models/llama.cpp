// engine/models/llama.cpp — builder for general.architecture "llama" (SmolLM2, Llama 2/3; rope.scaling.* as
// engine/rope_scaling.h reads it, rope_freqs.weight factors applied when present): RMS norm, GQA attention
// without biases, "normal" RoPE on adjacent pairs (the GGUF converter permutes Q/K rows for it), SwiGLU FFN,
// tied or separate output head.
#include "model_impl.h"

bool build_llama(strata_model* m, std::string* err) {
    if (!model_read_common_hparams(m, "llama", err)) return false;
    m->hp.rope_neox = false;
    // Llama 3.1+ files carry per-frequency divisors for RoPE (their long-context scaling)
    if (!model_vector(m, "rope_freqs.weight", m->hp.n_rot / 2, false, &m->rope_freq_factors, err)) return false;
    for (float f : m->rope_freq_factors) {
        if (!(f > 0.0f)) {
            *err = m->file->path + ": tensor 'rope_freqs.weight': factors must be positive";
            return false;
        }
    }
    return model_load_common_tensors(m, err);
}

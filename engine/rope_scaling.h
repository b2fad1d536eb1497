// engine/rope_scaling.h — RoPE frequency scaling read from GGUF metadata: none, linear and YaRN, for every
// architecture (the same keys and the same arithmetic as llama.cpp, so that a scaled file's logits match).
//
// Keys read ({arch} = general.architecture):
//   {arch}.rope.scaling.type                     "none" | "linear" | "yarn"; absent = "linear" (a bare factor
//                                                 then scales linearly, as llama.cpp reads it); others refused
//   {arch}.rope.scaling.factor                    s (else the older {arch}.rope.scale_linear); absent or 0 = 1
//   {arch}.rope.scaling.attn_factor               a, multiplies the rotation (default 1)
//   {arch}.rope.scaling.original_context_length   n_orig, YaRN's pre-training context (default context_length)
// The per-file YaRN knobs ({arch}.rope.scaling.yarn_*) are not read: llama.cpp reads them only for
// architectures Strata does not run, and uses beta_fast 32, beta_slow 1, ext_factor 1 for the others.
//
// The math (freq_scale f = 1 / s; dimension pair i < n_rot / 2 of a head; base frequency
// w_i = base^(-2i / n_rot) / rope_freqs[i]):
//   linear:  angle = pos * f * w_i; the rotation's cos and sin are multiplied by m = a.
//   yarn:    angle = pos * w_i * (f (1 - r_i) + r_i): pairs rotating fast enough to have seen n_orig positions
//            keep their frequency (r_i = 1), slow ones are interpolated (r_i = 0), a linear ramp between;
//            r_i = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1) with lo = max(0, floor(d(32))),
//            hi = min(n_rot - 1, ceil(d(1))), d(b) = n_rot ln(n_orig / (2 pi b)) / (2 ln base) (the pair index
//            whose wavelength fits b turns into n_orig positions). The rotation is multiplied by
//            m = a (1 + 0.1 ln s) (for s > 1: YaRN's attention temperature sqrt(1/t) applied to q and k
//            both, so q.k scales by m^2).
// Window layers (gemma3) keep f = 1 (llama.cpp scales only the global layers), so only a applies there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

struct gguf_file;

enum rope_scaling_type : int32_t {
    ROPE_SCALING_NONE = 0,
    ROPE_SCALING_LINEAR = 1,
    ROPE_SCALING_YARN = 2,
};

struct rope_scaling {
    rope_scaling_type type = ROPE_SCALING_NONE;
    float freq_scale = 1.0f;   // f = 1 / rope.scaling.factor
    float attn_factor = 1.0f;  // a = rope.scaling.attn_factor
    int32_t n_ctx_orig = 0;    // n_orig
    float beta_fast = 32.0f;   // YaRN's ramp ends, in rotations over n_orig positions
    float beta_slow = 1.0f;
};

// Reads the keys above (n_ctx_train: the file's context_length). False + *err naming the key on a type other
// than none / linear / yarn or an implausible value.
bool rope_scaling_read(const gguf_file* f, const std::string& arch, int32_t n_ctx_train, rope_scaling* out,
                       std::string* err);

// inv_freq[i] for i < n_rot / 2: the angle per position of pair i, as above (freq_factors: n_rot / 2 divisors or
// nullptr; freq_scale: rs.freq_scale, or 1 for window layers).
void rope_scaling_inv_freq(const rope_scaling& rs, int32_t n_rot, float base, const float* freq_factors,
                           float freq_scale, std::vector<float>* inv_freq);

// m: the multiplier of the rotation's cos and sin for layers whose frequencies scale by freq_scale.
float rope_scaling_mscale(const rope_scaling& rs, float freq_scale);

// engine/rope_scaling.cpp — RoPE scaling from GGUF metadata (contract and math in rope_scaling.h).
#include "rope_scaling.h"

#include <climits>
#include <cmath>

#include "gguf.h"

namespace {

constexpr double ROPE_PI = 3.14159265358979323846;
// Largest factor accepted: 1024x a pre-training context is beyond any published long-context recipe; a larger
// value is a broken file, not a model.
constexpr float ROPE_MAX_FACTOR = 1024.0f;
// Smallest nonzero factor accepted: YaRN's temperature 1 + 0.1 ln s must stay well above 0.
constexpr float ROPE_MIN_FACTOR = 1e-3f;

// The pair index whose wavelength turns b times over n_orig positions (YaRN's correction dimension), in float
// as the reference computes it so that floor / ceil land on the same pair.
float corr_dim(int32_t n_rot, int32_t n_orig, float b, float base) {
    return float(n_rot) * std::log(float(n_orig) / (b * 2.0f * float(ROPE_PI))) / (2.0f * std::log(base));
}

bool read_float(const gguf_file* f, const std::string& key, float* out, bool* found, std::string* err) {
    const gguf_value* v = gguf_find(f, key);
    if (found) *found = v != nullptr;
    if (!v) return true;
    if (v->type == GGUF_TYPE_STRING || v->type == GGUF_TYPE_ARRAY || !std::isfinite(v->f)) {
        *err = f->path + ": metadata " + key + ": not a finite number";
        return false;
    }
    *out = static_cast<float>(v->f);
    return true;
}

}  // namespace

bool rope_scaling_read(const gguf_file* f, const std::string& arch, int32_t n_ctx_train, rope_scaling* out,
                       std::string* err) {
    *out = rope_scaling{};
    const std::string a = arch + ".rope.";
    std::string type = "linear";  // llama.cpp's default when the key is absent
    if (const gguf_value* v = gguf_find(f, a + "scaling.type")) {
        if (v->type != GGUF_TYPE_STRING) {
            *err = f->path + ": metadata " + a + "scaling.type: not a string";
            return false;
        }
        type = std::string(v->str);
    }
    if (type == "none") {
        out->type = ROPE_SCALING_NONE;
    } else if (type == "linear") {
        out->type = ROPE_SCALING_LINEAR;
    } else if (type == "yarn") {
        out->type = ROPE_SCALING_YARN;
    } else {
        *err = f->path + ": unsupported rope scaling '" + gguf_printable(type) + "'";
        return false;
    }
    float factor = 0.0f;
    bool found = false;
    if (!read_float(f, a + "scaling.factor", &factor, &found, err)) return false;
    if (!found && !read_float(f, a + "scale_linear", &factor, nullptr, err)) return false;
    if (!read_float(f, a + "scaling.attn_factor", &out->attn_factor, nullptr, err)) return false;
    if ((factor != 0.0f && factor < ROPE_MIN_FACTOR) || factor > ROPE_MAX_FACTOR || !(out->attn_factor > 0.0f)) {
        *err = f->path + ": implausible rope scaling factor or attn_factor";
        return false;
    }
    // 0 (or absent) means unscaled; "none" never scales whatever the factor says
    out->freq_scale = factor == 0.0f || out->type == ROPE_SCALING_NONE ? 1.0f : 1.0f / factor;
    out->n_ctx_orig = n_ctx_train;
    if (const gguf_value* v = gguf_find(f, a + "scaling.original_context_length")) {
        if (v->type == GGUF_TYPE_STRING || v->type == GGUF_TYPE_ARRAY || v->type == GGUF_TYPE_FLOAT32 ||
            v->type == GGUF_TYPE_FLOAT64 || v->i < 1 || v->i > INT32_MAX) {
            *err = f->path + ": metadata " + a + "scaling.original_context_length: not a positive integer";
            return false;
        }
        out->n_ctx_orig = static_cast<int32_t>(v->i);
    }
    return true;
}

void rope_scaling_inv_freq(const rope_scaling& rs, int32_t n_rot, float base, const float* freq_factors,
                           float freq_scale, std::vector<float>* inv_freq) {
    const int32_t half = n_rot / 2;
    inv_freq->resize(size_t(half));
    float lo = 0.0f, hi = 0.0f;
    const bool yarn = rs.type == ROPE_SCALING_YARN;
    if (yarn) {
        lo = std::fmax(0.0f, std::floor(corr_dim(n_rot, rs.n_ctx_orig, rs.beta_fast, base)));
        hi = std::fmin(float(n_rot - 1), std::ceil(corr_dim(n_rot, rs.n_ctx_orig, rs.beta_slow, base)));
    }
    for (int32_t i = 0; i < half; ++i) {
        double w = std::pow(double(base), -2.0 * i / n_rot);
        if (freq_factors) w /= double(freq_factors[i]);
        double scale = freq_scale;
        if (yarn) {
            const float y = (float(i) - lo) / std::fmax(0.001f, hi - lo);
            const double r = 1.0 - std::fmin(1.0, std::fmax(0.0, double(y)));  // 1: extrapolate (keep w)
            scale = freq_scale * (1.0 - r) + r;
        }
        (*inv_freq)[size_t(i)] = static_cast<float>(w * scale);
    }
}

float rope_scaling_mscale(const rope_scaling& rs, float freq_scale) {
    if (rs.type != ROPE_SCALING_YARN) return rs.attn_factor;
    // The reference sets its attention factor to get_mscale(s) / (1 + 0.1 ln s) (= 1 for s > 1) and its rope
    // then multiplies by 1 + 0.1 ln(1 / f) for the layer's own f: for s <= 1 the first cancels to 1 / (1 + 0.1 ln s).
    const float s = 1.0f / rs.freq_scale;
    const float attn = (s <= 1.0f ? 1.0f : 1.0f + 0.1f * std::log(s)) / (1.0f + 0.1f * std::log(s));
    return attn * rs.attn_factor * (1.0f + 0.1f * std::log(1.0f / freq_scale));
}

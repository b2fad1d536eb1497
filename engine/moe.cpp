// engine/moe.cpp — mixture-of-experts FFN: expert tensors, router and the expert-batched step (moe.h).
#include "moe.h"

#include <cmath>
#include <cstring>

#include "model_impl.h"
#include "cpu/threadpool.h"

namespace {

constexpr int32_t MOE_MAX_EXPERTS = 1024;  // the largest published MoE has 384 routed experts per layer
// Rows of an elementwise pass below which it runs on the caller's thread (the fork costs more).
constexpr int64_t MOE_PARALLEL_ROWS = 16;
// The reference clamps the sum of the chosen weights below at the smallest normal half (2^-14) before
// dividing by it.
constexpr float MOE_MIN_WEIGHT_SUM = 6.103515625e-5f;

std::string file_err(const strata_model* m, const std::string& what) { return m->file->path + ": " + what; }

// The n_expert slices of one stacked expert tensor ne = (n_cols, n_rows, n_expert).
bool expert_views(const strata_model* m, const std::string& name, int64_t n_cols, int64_t n_rows,
                  std::vector<weight_view>* out, std::string* err) {
    const int64_t n_expert = m->hp.n_expert;
    const gguf_tensor* t = gguf_find_tensor(m->file, name);
    if (!t) {
        *err = file_err(m, "tensor '" + name + "': missing");
        return false;
    }
    if (t->n_dims != 3 || t->ne[0] != n_cols || t->ne[1] != n_rows || t->ne[2] != n_expert) {
        *err = file_err(m, "tensor '" + name + "': shape [" + std::to_string(t->ne[0]) + ", " +
                               std::to_string(t->ne[1]) + ", " + std::to_string(t->ne[2]) + "], expected [" +
                               std::to_string(n_cols) + ", " + std::to_string(n_rows) + ", " +
                               std::to_string(n_expert) + "]");
        return false;
    }
    if (n_cols % QK32 != 0 && kernels_uses_q16(t->type)) {
        *err = file_err(m, "tensor '" + name + "': row not a multiple of 32");
        return false;
    }
    const size_t row_bytes = quant_row_bytes(t->type, n_cols);
    if (t->n_bytes < size_t(n_expert) * size_t(n_rows) * row_bytes) {
        *err = file_err(m, "tensor '" + name + "': shorter than its shape");
        return false;
    }
    out->assign(size_t(n_expert), weight_view{});
    for (int64_t e = 0; e < n_expert; ++e) {
        weight_view& w = (*out)[size_t(e)];
        w.type = t->type;
        w.n_cols = n_cols;
        w.n_rows = n_rows;
        w.row_bytes = row_bytes;
        w.data = t->data + size_t(e) * size_t(n_rows) * row_bytes;
    }
    return true;
}

// the k largest of p[0..ne) into sel, largest first (ties: the lower expert)
static void pick_top_k(const float* p, int32_t ne, int32_t k, int32_t* sel) {
    for (int32_t j = 0; j < k; ++j) {
        int32_t best = -1;
        for (int32_t e = 0; e < ne; ++e) {
            bool taken = false;
            for (int32_t i = 0; i < j && !taken; ++i) taken = sel[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        sel[j] = best;
    }
}

// top n_used of the logits (ties: the lower expert) and a softmax over those k (gpt-oss)
void route_chosen(const model_hparams& hp, const float* p, int32_t* sel, float* sel_w) {
    const int32_t k = hp.n_expert_used;
    pick_top_k(p, hp.n_expert, k, sel);
    const float mx = p[sel[0]];
    double sum = 0.0;
    for (int32_t j = 0; j < k; ++j) {
        sel_w[j] = std::exp(p[sel[j]] - mx);
        sum += sel_w[j];
    }
    for (int32_t j = 0; j < k; ++j) sel_w[j] = static_cast<float>(sel_w[j] / sum);
}

// The per-expert biases of one stacked tensor ne = (n, n_expert), dequantised to (n_expert, n) floats.
bool expert_bias(const strata_model* m, const std::string& name, int64_t n, std::vector<float>* out,
                 std::string* err) {
    const int64_t n_expert = m->hp.n_expert;
    const gguf_tensor* t = gguf_find_tensor(m->file, name);
    if (!t) {
        *err = file_err(m, "tensor '" + name + "': missing");
        return false;
    }
    if (t->n_dims != 2 || t->ne[0] != n || t->ne[1] != n_expert || quant_row_bytes(t->type, n) == 0 ||
        t->n_bytes < size_t(n_expert) * quant_row_bytes(t->type, n)) {
        *err = file_err(m, "tensor '" + name + "': shape [" + std::to_string(t->ne[0]) + ", " +
                               std::to_string(t->ne[1]) + "], expected [" + std::to_string(n) + ", " +
                               std::to_string(n_expert) + "]");
        return false;
    }
    out->resize(size_t(n * n_expert));
    for (int64_t e = 0; e < n_expert; ++e) {
        dequantize_row(t->type, t->data + size_t(e) * quant_row_bytes(t->type, n), out->data() + e * n, n);
    }
    for (float f : *out) {
        if (!std::isfinite(f)) {
            *err = file_err(m, "tensor '" + name + "': non-finite value");
            return false;
        }
    }
    return true;
}

// softmax over the router's logits, top n_used (ties: the lower expert), weights optionally normalised
void route(const model_hparams& hp, float* p, int32_t* sel, float* sel_w) {
    const int32_t ne = hp.n_expert, k = hp.n_expert_used;
    if (hp.expert_softmax_chosen) {
        route_chosen(hp, p, sel, sel_w);
        return;
    }
    float mx = p[0];
    for (int32_t e = 1; e < ne; ++e) mx = p[e] > mx ? p[e] : mx;
    double sum = 0.0;
    for (int32_t e = 0; e < ne; ++e) {
        p[e] = std::exp(p[e] - mx);
        sum += p[e];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int32_t e = 0; e < ne; ++e) p[e] *= inv;
    pick_top_k(p, ne, k, sel);
    for (int32_t j = 0; j < k; ++j) sel_w[j] = p[sel[j]];
    if (hp.expert_weights_norm) {
        float s = 0.0f;
        for (int32_t j = 0; j < k; ++j) s += sel_w[j];
        s = s < MOE_MIN_WEIGHT_SUM ? MOE_MIN_WEIGHT_SUM : s;
        for (int32_t j = 0; j < k; ++j) sel_w[j] /= s;
    }
}

struct moe_job {
    strata_model* m;
    const layer_weights* l;
    int32_t n;
};

void route_range(void* ctx, int64_t i0, int64_t i1, int) {
    const moe_job& j = *static_cast<moe_job*>(ctx);
    const model_hparams& hp = j.m->hp;
    moe_scratch& s = j.m->s.moe;
    const std::vector<float>& bias = j.l->ffn_gate_inp_b;
    for (int64_t i = i0; i < i1; ++i) {
        float* p = s.logits.data() + i * hp.n_expert;
        if (!bias.empty()) {
            for (int32_t e = 0; e < hp.n_expert; ++e) p[e] += bias[size_t(e)];
        }
        route(hp, p, s.sel.data() + i * hp.n_expert_used, s.sel_w.data() + i * hp.n_expert_used);
    }
}

void gather_range(void* ctx, int64_t i0, int64_t i1, int) {
    const moe_job& j = *static_cast<moe_job*>(ctx);
    const int64_t E = j.m->hp.n_embd, k = j.m->hp.n_expert_used;
    moe_scratch& s = j.m->s.moe;
    for (int64_t i = i0; i < i1; ++i) {
        for (int64_t slot = 0; slot < k; ++slot) {
            std::memcpy(s.xg.data() + size_t(s.slot_row[size_t(i * k + slot)]) * size_t(E),
                        j.m->s.xn.data() + i * E, size_t(E) * sizeof(float));
        }
    }
}

// gpt-oss's clamped SwiGLU of rows [r0, r1) with their experts' gate and up biases:
// g = min(gate + bg, limit), u = clamp(up + bu, -limit, limit), gate = g * sigmoid(alpha * g) * (u + 1)
void act_clamped(const moe_job& j, int64_t r0, int64_t r1) {
    const model_hparams& hp = j.m->hp;
    const int64_t F = hp.n_ff_exp;
    moe_scratch& s = j.m->s.moe;
    const float lim = hp.swiglu_limit, alpha = hp.swiglu_alpha;
    const bool biased = !j.l->exp_gate_b.empty();
    for (int64_t r = r0; r < r1; ++r) {
        const size_t e = size_t(s.row_expert[size_t(r)]);
        const float* bg = biased ? j.l->exp_gate_b.data() + e * size_t(F) : nullptr;
        const float* bu = biased ? j.l->exp_up_b.data() + e * size_t(F) : nullptr;
        float* g = s.gate.data() + r * F;
        const float* u = s.up.data() + r * F;
        for (int64_t c = 0; c < F; ++c) {
            float x = g[c] + (bg ? bg[c] : 0.0f), y = u[c] + (bu ? bu[c] : 0.0f);
            x = x < lim ? x : lim;
            y = y < -lim ? -lim : (y > lim ? lim : y);
            g[c] = x / (1.0f + std::exp(-alpha * x)) * (y + 1.0f);
        }
    }
}

void act_range(void* ctx, int64_t r0, int64_t r1, int) {
    const moe_job& j = *static_cast<moe_job*>(ctx);
    const int64_t F = j.m->hp.n_ff_exp;
    moe_scratch& s = j.m->s.moe;
    if (j.m->hp.swiglu_limit > 0.0f) {
        act_clamped(j, r0, r1);
        return;
    }
    silu_mul_row(*j.m->ks, s.gate.data() + r0 * F, s.up.data() + r0 * F, (r1 - r0) * F);
}

// out[i] = sum of weight * down row over i's slots, in slot order (plus the shared expert's share)
void combine_range(void* ctx, int64_t i0, int64_t i1, int) {
    const moe_job& j = *static_cast<moe_job*>(ctx);
    const int64_t E = j.m->hp.n_embd, k = j.m->hp.n_expert_used;
    moe_scratch& s = j.m->s.moe;
    const bool shared = j.l->w_down.data != nullptr;
    for (int64_t i = i0; i < i1; ++i) {
        float* out = j.m->s.tmp.data() + i * E;
        std::memset(out, 0, size_t(E) * sizeof(float));
        for (int64_t slot = 0; slot < k; ++slot) {
            const float w = s.sel_w[size_t(i * k + slot)];
            const float* d = s.down.data() + size_t(s.slot_row[size_t(i * k + slot)]) * size_t(E);
            if (!j.l->exp_down_b.empty()) {  // the expert's down bias joins its row before the weight
                const float* b = j.l->exp_down_b.data() + size_t(s.sel[size_t(i * k + slot)]) * size_t(E);
                for (int64_t c = 0; c < E; ++c) out[c] += w * (d[c] + b[c]);
                continue;
            }
            for (int64_t c = 0; c < E; ++c) out[c] += w * d[c];
        }
        if (shared) {
            // sigmoid(xn . w_shexp_gate) scales the shared expert
            const float g = j.m->ks->dot_f32(j.m->s.xn.data() + i * E, j.l->shexp_gate.data(), E);
            const float sg = 1.0f / (1.0f + std::exp(-g));
            const float* sh = s.shared.data() + i * E;
            for (int64_t c = 0; c < E; ++c) out[c] += sg * sh[c];
        }
    }
}

void run(strata_model* m, int64_t n, threadpool_fn fn, moe_job* j) {
    if (n >= MOE_PARALLEL_ROWS) threadpool_run(m->pool, n, fn, j);
    else fn(j, 0, n, 0);
}

}  // namespace

bool moe_read_hparams(strata_model* m, const std::string& arch, std::string* err) {
    model_hparams& hp = m->hp;
    const std::string a = arch + ".";
    if (!model_read_u32(m, a + "expert_count", &hp.n_expert, true, err) ||
        !model_read_u32(m, a + "expert_used_count", &hp.n_expert_used, true, err)) {
        return false;
    }
    if (hp.n_expert < 1 || hp.n_expert > MOE_MAX_EXPERTS || hp.n_expert_used < 1 || hp.n_expert_used > hp.n_expert) {
        *err = file_err(m, "implausible expert_count / expert_used_count");
        return false;
    }
    hp.n_ff_exp = hp.n_ff / hp.n_expert_used;  // the reference's default
    if (!model_read_u32(m, a + "expert_feed_forward_length", &hp.n_ff_exp, false, err)) return false;
    if (hp.n_ff_exp < 1) {
        *err = file_err(m, "implausible expert_feed_forward_length");
        return false;
    }
    return true;
}

bool moe_load_tensors(strata_model* m, std::string* err) {
    const model_hparams& hp = m->hp;
    for (int32_t il = 0; il < hp.n_layer; ++il) {
        layer_weights& l = m->layers[size_t(il)];
        const std::string p = "blk." + std::to_string(il) + ".";
        if (!model_weight(m, p + "ffn_gate_inp.weight", hp.n_embd, hp.n_expert, true, &l.ffn_gate_inp, err) ||
            !expert_views(m, p + "ffn_gate_exps.weight", hp.n_embd, hp.n_ff_exp, &l.exp_gate, err) ||
            !expert_views(m, p + "ffn_up_exps.weight", hp.n_embd, hp.n_ff_exp, &l.exp_up, err) ||
            !expert_views(m, p + "ffn_down_exps.weight", hp.n_ff_exp, hp.n_embd, &l.exp_down, err)) {
            return false;
        }
    }
    return true;
}

bool moe_load_biases(strata_model* m, std::string* err) {
    const model_hparams& hp = m->hp;
    for (int32_t il = 0; il < hp.n_layer; ++il) {
        layer_weights& l = m->layers[size_t(il)];
        const std::string p = "blk." + std::to_string(il) + ".";
        if (!model_vector(m, p + "ffn_gate_inp.bias", hp.n_expert, true, &l.ffn_gate_inp_b, err) ||
            !expert_bias(m, p + "ffn_gate_exps.bias", hp.n_ff_exp, &l.exp_gate_b, err) ||
            !expert_bias(m, p + "ffn_up_exps.bias", hp.n_ff_exp, &l.exp_up_b, err) ||
            !expert_bias(m, p + "ffn_down_exps.bias", hp.n_embd, &l.exp_down_b, err)) {
            return false;
        }
    }
    return true;
}

void moe_scratch_init(strata_model* m) {
    const model_hparams& hp = m->hp;
    moe_scratch& s = m->s.moe;
    const size_t nb = size_t(m->n_batch), rows = nb * size_t(hp.n_expert_used);
    s.logits.resize(nb * size_t(hp.n_expert));
    s.sel.resize(rows);
    s.sel_w.resize(rows);
    s.slot_row.resize(rows);
    s.row_expert.resize(rows);
    s.run_first.resize(size_t(hp.n_expert) + 1);
    s.run_fill.resize(size_t(hp.n_expert));
    s.xg.resize(rows * size_t(hp.n_embd));
    s.gate.resize(rows * size_t(hp.n_ff_exp));
    s.up.resize(rows * size_t(hp.n_ff_exp));
    s.down.resize(rows * size_t(hp.n_embd));
    s.runs.reserve(2 * size_t(hp.n_expert));
    bool shared = false;
    for (const layer_weights& l : m->layers) shared = shared || l.w_down.data != nullptr;
    if (shared) s.shared.resize(nb * size_t(hp.n_embd));
}

void moe_ffn(strata_model* m, const layer_weights& l, int32_t n) {
    const model_hparams& hp = m->hp;
    model_scratch& ms = m->s;
    moe_scratch& s = ms.moe;
    const int32_t E = hp.n_embd, F = hp.n_ff_exp, k = hp.n_expert_used, ne = hp.n_expert;
    moe_job j{m, &l, n};
    const int32_t il = int32_t(&l - m->layers.data());
    if (m->tiers.active && il == 0) expert_tiers_step(m);  // between steps: no worker reads a weight now
    // 1. router
    matmul(m->pool, *m->ks, l.ffn_gate_inp, ms.xn.data(), E, n, s.logits.data(), &ms.mm);
    run(m, n, route_range, &j);
    // 2. runs: expert e's rows are [run_first[e], run_first[e + 1]), entries in order within a run
    std::fill(s.run_fill.begin(), s.run_fill.end(), 0);
    for (int32_t i = 0; i < n * k; ++i) ++s.run_fill[size_t(s.sel[size_t(i)])];
    s.run_first[0] = 0;
    for (int32_t e = 0; e < ne; ++e) s.run_first[size_t(e) + 1] = s.run_first[size_t(e)] + s.run_fill[size_t(e)];
    std::fill(s.run_fill.begin(), s.run_fill.end(), 0);
    for (int32_t i = 0; i < n * k; ++i) {
        const int32_t e = s.sel[size_t(i)];
        s.slot_row[size_t(i)] = s.run_first[size_t(e)] + s.run_fill[size_t(e)]++;
        s.row_expert[size_t(s.slot_row[size_t(i)])] = e;
    }
    run(m, n, gather_range, &j);
    // 3. gate and up of every used expert in one job, act, then down in one job
    const int64_t n_rows = int64_t(n) * k;
    s.runs.clear();
    for (int32_t e = 0; e < ne; ++e) {
        const int64_t t0 = s.run_first[size_t(e)], nt = s.run_fill[size_t(e)];
        if (nt == 0) continue;
        if (m->tiers.active) expert_tiers_count(m, il, e);
        s.runs.push_back(mm_run{&l.exp_gate[size_t(e)], t0, nt, s.gate.data() + t0 * F});
        s.runs.push_back(mm_run{&l.exp_up[size_t(e)], t0, nt, s.up.data() + t0 * F});
    }
    matmul_runs(m->pool, *m->ks, s.runs.data(), int(s.runs.size()), s.xg.data(), E, n_rows, &ms.mm);
    run(m, n_rows, act_range, &j);
    s.runs.clear();
    for (int32_t e = 0; e < ne; ++e) {
        const int64_t t0 = s.run_first[size_t(e)], nt = s.run_fill[size_t(e)];
        if (nt > 0) s.runs.push_back(mm_run{&l.exp_down[size_t(e)], t0, nt, s.down.data() + t0 * E});
    }
    matmul_runs(m->pool, *m->ks, s.runs.data(), int(s.runs.size()), s.gate.data(), F, n_rows, &ms.mm);
    // 5. the shared expert (qwen2moe): a dense SwiGLU FFN of width hp.n_ff over every entry
    if (l.w_down.data) {
        const weight_view* gu[2] = {&l.w_gate, &l.w_up};
        float* gu_out[2] = {ms.gate.data(), ms.up.data()};
        matmul_fused(m->pool, *m->ks, gu, gu_out, 2, ms.xn.data(), E, n, &ms.mm);
        silu_mul_row(*m->ks, ms.gate.data(), ms.up.data(), int64_t(n) * hp.n_ff);
        matmul(m->pool, *m->ks, l.w_down, ms.gate.data(), hp.n_ff, n, s.shared.data(), &ms.mm);
    }
    // 4. each entry's weighted sum
    run(m, n, combine_range, &j);
}

size_t moe_decode_bytes(const strata_model* m) {
    size_t n = 0;
    for (const layer_weights& l : m->layers) {
        size_t all = 0;
        for (const auto* v : {&l.exp_gate, &l.exp_up, &l.exp_down}) {
            for (const weight_view& w : *v) {
                all += w.packed ? weight_packed_bytes(w.type, w.n_cols, w.n_rows) : size_t(w.n_rows) * w.row_bytes;
            }
        }
        if (!l.exp_gate.empty()) {
            n += all / size_t(m->hp.n_expert) * size_t(m->hp.n_expert_used);
            n += size_t(l.ffn_gate_inp.n_rows) * l.ffn_gate_inp.row_bytes;
        }
    }
    return n;
}

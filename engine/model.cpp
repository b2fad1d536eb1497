// engine/model.cpp — model loading (GGUF -> builder), the decoder forward pass and model_eval (model.h).
//
// Forward pass of one eval_batch of n entries (all buffers (n, width) row-major, entry-major):
//   x = embed(token) [* embd_scale]                               (n, n_embd)
//   per layer: xn = rmsnorm(x) * attn_norm
//              q, k, v = xn Wq^T (+bq), xn Wk^T (+bk), xn Wv^T (+bv) (n, n_embd_q), (n, n_embd_kv) x2
//              [qwen3] per-head rmsnorm of q and k; RoPE on q and k at each entry's position
//              K/V rows -> each entry's cache at its position (f16 or q8_0)
//              att = softmax(q k^T * attn_scale) v over positions 0..pos of the entry's sequence (a window
//              layer: the last n_swa of them) [gpt-oss: each head's sink logit joins the softmax]
//              x += att Wo^T [+ bo] [post-norm];  xn = rmsnorm(x) * ffn_norm;
//              x += (act(xn Wg^T) * (xn Wu^T)) Wd^T [post-norm], act = silu or gelu (tanh form)
//   logits = (rmsnorm(x) * output_norm) Wout^T [soft-capped] for the entries that want them.
// Every per-entry result is computed from that entry's data alone, in a fixed order, on whichever thread.
#include <sys/mman.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <unordered_map>

#include "cpu/kernels_act8.h"
#include "prefill/cuda_forward.h"
#include "kv_cache.h"
#include "model_impl.h"
#include "cpu/gelu.h"
#include "cpu/step_timer.h"
#include "cpu/threadpool.h"

namespace {

constexpr int32_t MODEL_MAX_LAYERS = 1024;
constexpr int32_t MODEL_MAX_EMBD = 1 << 16;
constexpr int32_t MODEL_MAX_HEAD_DIM = 512;
constexpr int32_t MODEL_MAX_BATCH = 1 << 14;
constexpr int32_t MODEL_MAX_VOCAB = 1 << 22;
// Elementwise passes over fewer entries than this run on the caller's thread (the fork costs more).
constexpr int32_t MODEL_PARALLEL_ENTRIES = 8;
// Most entries of one sequence whose attention reads the cache together (one pass over K and V per tile).
constexpr int32_t MODEL_ATT_TILE = 8;
// Layers attending to fewer positions than this keep a lone (tile, kv head) item whole: below, the extra
// fork and join cost about what half the attention saves (Gemma 3 270M decode at 2 threads: ~19 us of
// attention per layer at 144 positions, ~25 us of barrier per extra job; after 6000 positions the split
// took decode from 67 to 91 tok/s).
constexpr int32_t MODEL_ATT_SPLIT_POSITIONS = 512;

std::string file_err(const strata_model* m, const std::string& what) { return m->file->path + ": " + what; }

int32_t find_token(const gguf_file* f, const char* text) {
    const gguf_value* v = gguf_find(f, "tokenizer.ggml.tokens");
    if (!v || v->type != GGUF_TYPE_ARRAY || v->arr_type != GGUF_TYPE_STRING) return -1;
    for (size_t i = 0; i < v->strs.size(); ++i) {
        if (v->strs[i] == text) return static_cast<int32_t>(i);
    }
    return -1;
}

int32_t read_id(const gguf_file* f, const char* key, int32_t n_vocab) {
    const gguf_value* v = gguf_find(f, key);
    if (!v || v->type == GGUF_TYPE_STRING || v->type == GGUF_TYPE_ARRAY) return -1;
    return v->i >= 0 && v->i < n_vocab ? static_cast<int32_t>(v->i) : -1;
}

// The matrices the forward pass multiplies by, for packing (experts: also the MoE routers and experts).
std::vector<weight_view*> matmul_weights(strata_model* m, bool experts = true) {
    std::vector<weight_view*> ws;
    for (layer_weights& l : m->layers) {
        for (weight_view* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
            if (w->data) ws.push_back(w);  // a MoE layer without a shared expert has no dense FFN
        }
        if (experts) {
            if (l.ffn_gate_inp.data) ws.push_back(&l.ffn_gate_inp);
            for (auto* v : {&l.exp_gate, &l.exp_up, &l.exp_down}) {
                for (weight_view& w : *v) ws.push_back(&w);
            }
        }
    }
    ws.push_back(&m->output);
    return ws;
}

// Matrices whose blocks have an exact Q8_0 form (quant_widens_to_q8_0: Q5_0, IQ4_NL) are rewritten as Q8_0
// into m->widened and take Q8_0's integer kernels (and its row-group packing) instead of the generic float
// path. Same values, 34 / 22 or 34 / 18 of the bytes. Except Q5_0 with 16-bit activations where the kernel set
// has a Q5_0 row-group kernel and the shape a packed layout (pack_weights packs it): it stays 5-bit
// (engine/cpu/kernels_group_q5_0.h), with the same results as widened.
// The activation bits of w's matmuls: --act-bits when given (8 or 16), else its type's default on this kernel set
// (act_bits_default: 8 only where the set has an 8-bit kernel for the type, and the set's default is 8).
int32_t weight_act_bits(const weight_view& w, int32_t act_bits) {
    return act_bits == 8 || act_bits == 16 ? act_bits : act_bits_default(w.type);
}

bool widens(const strata_model* m, const weight_view& w, int32_t act_bits) {
    if (!quant_widens_to_q8_0(w.type)) return false;
    act_bits = weight_act_bits(w, act_bits);
    if (!quant_rows_widen_exactly(w.type, w.data, w.n_cols * w.n_rows)) return false;  // MXFP4 scales past a half
    return !(w.type == GGML_TYPE_Q5_0 && act_bits == 16 && group_fn(*m->ks, w.type) &&
             weight_packed_bytes(w.type, w.n_cols, w.n_rows) > 0);
}

void widen_weights(strata_model* m, int32_t act_bits) {
    size_t n_blocks = 0;
    for (weight_view* w : matmul_weights(m)) {
        if (widens(m, *w, act_bits)) n_blocks += size_t(w->n_rows) * size_t(w->n_cols / QK32);
    }
    if (n_blocks == 0) return;
    m->widened.resize(n_blocks);
    size_t at = 0;
    for (weight_view* w : matmul_weights(m)) {
        if (!widens(m, *w, act_bits)) continue;
        block_q8_0* dst = m->widened.data() + at;
        const int64_t per_row = w->n_cols / QK32;
        for (int64_t r = 0; r < w->n_rows; ++r) quant_row_to_q8_0(w->type, w->data + size_t(r) * w->row_bytes, dst + r * per_row, w->n_cols);
        w->type = GGML_TYPE_Q8_0;
        w->row_bytes = size_t(per_row) * sizeof(block_q8_0);
        w->data = reinterpret_cast<const uint8_t*>(dst);
        at += size_t(w->n_rows) * size_t(per_row);
    }
}

// When the kernel set has row-group kernels, every matrix that has a row-group layout gets a packed copy
// (one 64-byte aligned allocation); the mapped pages of the originals are then released to the page cache
// (the embedding rows are read from the mapping again on demand). Without memory for the copy the model
// runs on the row kernels.
// With 8-bit activations (act_bits 8, or 0 where weight_act_bits gives 8) a matrix whose type has an 8-bit
// row-group kernel on this CPU gets the 8-bit layout instead (weight_pack8, kernels_act8.h).
void pack_weights(strata_model* m, int32_t act_bits, int64_t experts_ram_bytes) {
    std::vector<weight_view*> ws;
    size_t total = 0;
    for (weight_view* w : matmul_weights(m)) {
        w->act_bits = weight_act_bits(*w, act_bits);
        w->packed8 = w->act_bits == 8 && group8_fn(w->type) != nullptr;
    }
    // a budget below the experts' packed size: they take their slots there, the rest stay in the mapping
    const bool tiered = experts_ram_bytes >= 0 && expert_tiers_init(m, size_t(experts_ram_bytes));
    std::vector<weight_view*> all = matmul_weights(m, !tiered);
    for (layer_weights& l : m->layers) {
        if (tiered && l.ffn_gate_inp.data) all.push_back(&l.ffn_gate_inp);
    }
    for (weight_view* w : all) {
        const size_t n = weight_packed_bytes(w->type, w->n_cols, w->n_rows);
        if (n == 0 || !(w->packed8 || group_fn(*m->ks, w->type))) continue;
        ws.push_back(w);
        total += n;
    }
    if (total == 0) return;
    m->packed = weight_alloc(total);
    if (!m->packed) return;
    size_t off = 0;
    for (weight_view* w : ws) {
        if (w->packed8) weight_pack8(*w, m->packed + off);
        else weight_pack(*w, m->packed + off);
        w->packed = m->packed + off;
        off += weight_packed_bytes(w->type, w->n_cols, w->n_rows);
    }
    if (m->file->map_addr) ::madvise(m->file->map_addr, m->file->map_size, MADV_DONTNEED);
}

// The backend rule (model_params.backend): "cuda" uploads the model or fails with the reason; "auto" uploads it
// when it can and otherwise notes why it stays on the CPU (model_info.backend_note).
bool use_cuda(strata_model* m, const std::string& backend, std::string* err) {
    if (backend != "cuda" && backend != "auto") return true;
    std::string why;
    m->cuda = cuda_model_init(m, &why);
    if (m->cuda) {
        m->info.device = cuda_device_name();
        return true;
    }
    if (backend == "cuda") {
        *err = m->file->path + ": --backend cuda: " + why;
        return false;
    }
    m->info.backend_note = why;
    return true;
}

}  // namespace

bool model_read_u32(const strata_model* m, const std::string& key, int32_t* out, bool required, std::string* err) {
    const gguf_value* v = gguf_find(m->file, key);
    if (!v) {
        if (required) *err = file_err(m, "missing metadata " + key);
        return !required;
    }
    if (v->type == GGUF_TYPE_STRING || v->type == GGUF_TYPE_ARRAY || v->type == GGUF_TYPE_FLOAT32 ||
        v->type == GGUF_TYPE_FLOAT64 || v->i < 0 || v->i > INT32_MAX) {
        *err = file_err(m, "metadata " + key + ": not a non-negative 32-bit integer");
        return false;
    }
    *out = static_cast<int32_t>(v->i);
    return true;
}

bool model_read_f32(const strata_model* m, const std::string& key, float* out, std::string* err) {
    const gguf_value* v = gguf_find(m->file, key);
    if (!v) return true;  // every float key here has a default
    if (v->type == GGUF_TYPE_STRING || v->type == GGUF_TYPE_ARRAY || !std::isfinite(v->f)) {
        *err = file_err(m, "metadata " + key + ": not a finite number");
        return false;
    }
    *out = static_cast<float>(v->f);
    return true;
}

bool model_weight(const strata_model* m, const std::string& name, int64_t n_cols, int64_t n_rows, bool required,
                  weight_view* out, std::string* err) {
    *out = weight_view{};
    const gguf_tensor* t = gguf_find_tensor(m->file, name);
    if (!t) {
        if (required) *err = file_err(m, "tensor '" + name + "': missing");
        return !required;
    }
    if (t->n_dims > 2 || t->ne[0] != n_cols || t->ne[1] != n_rows) {
        *err = file_err(m, "tensor '" + name + "': shape [" + std::to_string(t->ne[0]) + ", " +
                               std::to_string(t->ne[1]) + "], expected [" + std::to_string(n_cols) + ", " +
                               std::to_string(n_rows) + "]");
        return false;
    }
    if (n_cols % QK32 != 0 && kernels_uses_q16(t->type)) {
        *err = file_err(m, "tensor '" + name + "': row not a multiple of 32");
        return false;
    }
    out->type = t->type;
    out->n_cols = n_cols;
    out->n_rows = n_rows;
    out->row_bytes = quant_row_bytes(t->type, n_cols);
    out->data = t->data;
    return true;
}

bool model_vector(const strata_model* m, const std::string& name, int64_t n, bool required, std::vector<float>* out,
                  std::string* err) {
    out->clear();
    const gguf_tensor* t = gguf_find_tensor(m->file, name);
    if (!t) {
        if (required) *err = file_err(m, "tensor '" + name + "': missing");
        return !required;
    }
    if (t->n_dims != 1 || t->ne[0] != n) {
        *err = file_err(m, "tensor '" + name + "': " + std::to_string(t->ne[0]) + " elements, expected " +
                               std::to_string(n));
        return false;
    }
    out->resize(size_t(n));
    dequantize_row(t->type, t->data, out->data(), n);
    for (float f : *out) {
        if (!std::isfinite(f)) {
            *err = file_err(m, "tensor '" + name + "': non-finite value");
            return false;
        }
    }
    return true;
}

bool model_qkv_biases(strata_model* m, int32_t il, std::string* err) {
    const model_hparams& hp = m->hp;
    layer_weights& l = m->layers[size_t(il)];
    const std::string p = "blk." + std::to_string(il) + ".";
    return model_vector(m, p + "attn_q.bias", hp.n_embd_q(), true, &l.bq, err) &&
           model_vector(m, p + "attn_k.bias", hp.n_embd_kv(), true, &l.bk, err) &&
           model_vector(m, p + "attn_v.bias", hp.n_embd_kv(), true, &l.bv, err);
}

bool model_read_common_hparams(strata_model* m, const std::string& arch, std::string* err) {
    model_hparams& hp = m->hp;
    const std::string a = arch + ".";
    if (!model_read_u32(m, a + "block_count", &hp.n_layer, true, err) ||
        !model_read_u32(m, a + "embedding_length", &hp.n_embd, true, err) ||
        !model_read_u32(m, a + "feed_forward_length", &hp.n_ff, true, err) ||
        !model_read_u32(m, a + "attention.head_count", &hp.n_head, true, err) ||
        !model_read_u32(m, a + "context_length", &hp.n_ctx_train, true, err)) {
        return false;
    }
    hp.n_head_kv = hp.n_head;
    if (!model_read_u32(m, a + "attention.head_count_kv", &hp.n_head_kv, false, err)) return false;
    if (hp.n_layer < 1 || hp.n_layer > MODEL_MAX_LAYERS || hp.n_embd < 1 || hp.n_embd > MODEL_MAX_EMBD ||
        hp.n_ff < 1 || hp.n_ff > 16 * MODEL_MAX_EMBD || hp.n_head < 1 || hp.n_head_kv < 1 ||
        hp.n_head % hp.n_head_kv != 0 || hp.n_ctx_train < 1) {
        *err = file_err(m, "implausible hyperparameters (layers, embedding, heads or context)");
        return false;
    }
    hp.head_dim = hp.n_embd % hp.n_head == 0 ? hp.n_embd / hp.n_head : 0;
    if (!model_read_u32(m, a + "attention.key_length", &hp.head_dim, false, err)) return false;
    int32_t v_len = hp.head_dim;
    if (!model_read_u32(m, a + "attention.value_length", &v_len, false, err)) return false;
    if (hp.head_dim < 2 || hp.head_dim > MODEL_MAX_HEAD_DIM || hp.head_dim % 2 != 0 || v_len != hp.head_dim) {
        *err = file_err(m, "unsupported head dimension " + std::to_string(hp.head_dim));
        return false;
    }
    hp.n_rot = hp.head_dim;
    if (!model_read_u32(m, a + "rope.dimension_count", &hp.n_rot, false, err)) return false;
    if (hp.n_rot < 2 || hp.n_rot > hp.head_dim || hp.n_rot % 2 != 0) {
        *err = file_err(m, "unsupported rope.dimension_count " + std::to_string(hp.n_rot));
        return false;
    }
    if (!model_read_f32(m, a + "rope.freq_base", &hp.rope_base, err) ||
        !model_read_f32(m, a + "attention.layer_norm_rms_epsilon", &hp.rms_eps, err)) {
        return false;
    }
    if (hp.rope_base <= 1.0f || hp.rms_eps <= 0.0f) {
        *err = file_err(m, "implausible rope.freq_base or rms epsilon");
        return false;
    }
    if (!rope_scaling_read(m->file, arch, hp.n_ctx_train, &hp.rope, err)) return false;
    const gguf_tensor* emb = gguf_find_tensor(m->file, "token_embd.weight");
    if (!emb) {
        *err = file_err(m, "tensor 'token_embd.weight': missing");
        return false;
    }
    hp.n_vocab = static_cast<int32_t>(emb->ne[1] > MODEL_MAX_VOCAB ? 0 : emb->ne[1]);
    if (hp.n_vocab < 1) {
        *err = file_err(m, "tensor 'token_embd.weight': implausible vocabulary size");
        return false;
    }
    return true;
}

bool model_load_common_tensors(strata_model* m, std::string* err, bool dense_ffn, const std::string& ffn_norm) {
    const model_hparams& hp = m->hp;
    if (!model_weight(m, "token_embd.weight", hp.n_embd, hp.n_vocab, true, &m->tok_embd, err) ||
        !model_vector(m, "output_norm.weight", hp.n_embd, true, &m->output_norm, err) ||
        !model_weight(m, "output.weight", hp.n_embd, hp.n_vocab, false, &m->output, err)) {
        return false;
    }
    if (!m->output.data) m->output = m->tok_embd;  // tied head
    m->layers.resize(size_t(hp.n_layer));
    for (int32_t il = 0; il < hp.n_layer; ++il) {
        layer_weights& l = m->layers[size_t(il)];
        const std::string p = "blk." + std::to_string(il) + ".";
        if (!model_vector(m, p + "attn_norm.weight", hp.n_embd, true, &l.attn_norm, err) ||
            !model_weight(m, p + "attn_q.weight", hp.n_embd, hp.n_embd_q(), true, &l.wq, err) ||
            !model_weight(m, p + "attn_k.weight", hp.n_embd, hp.n_embd_kv(), true, &l.wk, err) ||
            !model_weight(m, p + "attn_v.weight", hp.n_embd, hp.n_embd_kv(), true, &l.wv, err) ||
            !model_weight(m, p + "attn_output.weight", hp.n_embd_q(), hp.n_embd, true, &l.wo, err) ||
            !model_vector(m, p + ffn_norm, hp.n_embd, true, &l.ffn_norm, err) ||
            (dense_ffn && (!model_weight(m, p + "ffn_gate.weight", hp.n_embd, hp.n_ff, true, &l.w_gate, err) ||
                           !model_weight(m, p + "ffn_up.weight", hp.n_embd, hp.n_ff, true, &l.w_up, err) ||
                           !model_weight(m, p + "ffn_down.weight", hp.n_ff, hp.n_embd, true, &l.w_down, err)))) {
            return false;
        }
    }
    return true;
}

strata_model* model_load(const model_params& params, std::string* err) {
    std::string local_err;
    if (!err) err = &local_err;
    if (params.n_batch < 1 || params.n_batch > MODEL_MAX_BATCH) {
        *err = params.path + ": n_batch " + std::to_string(params.n_batch) + " out of range";
        return nullptr;
    }
    gguf_file* f = gguf_open(params.path, err);
    if (!f) return nullptr;
    return model_load_gguf(f, params, err);
}

strata_model* model_load_gguf(gguf_file* f, const model_params& params, std::string* err) {
    std::string local_err;
    if (!err) err = &local_err;
    auto* m = new strata_model();
    m->file = f;
    const gguf_value* arch = gguf_find(f, "general.architecture");
    std::string arch_name = arch && arch->type == GGUF_TYPE_STRING ? std::string(arch->str) : "";
    bool ok = false;
    if (arch_name == "llama") {
        ok = build_llama(m, err);
    } else if (arch_name == "qwen2") {
        ok = build_qwen2(m, err);
    } else if (arch_name == "qwen3") {
        ok = build_qwen3(m, err);
    } else if (arch_name == "gemma3") {
        ok = build_gemma3(m, err);
    } else if (arch_name == "qwen3moe") {
        ok = build_qwen3moe(m, err);
    } else if (arch_name == "qwen2moe") {
        ok = build_qwen2moe(m, err);
    } else if (arch_name == "phi3") {
        ok = build_phi3(m, err);
    } else if (arch_name == "gpt-oss") {
        ok = build_gpt_oss(m, err);
    } else {
        *err = f->path + ": unsupported architecture '" + gguf_printable(arch_name) + "'";
    }
    if (!ok) {
        model_free(m);
        return nullptr;
    }
    const model_hparams& hp = m->hp;
    // window layers keep their frequencies (freq_scale 1) and factors-free, as llama.cpp runs them, except
    // where the architecture scales them as the full layers (gpt-oss)
    const float* factors = m->rope_freq_factors.empty() ? nullptr : m->rope_freq_factors.data();
    const float swa_scale = hp.rope_swa_scaled ? hp.rope.freq_scale : 1.0f;
    rope_scaling_inv_freq(hp.rope, hp.n_rot, hp.rope_base, factors, hp.rope.freq_scale, &m->rope_inv_freq);
    rope_scaling_inv_freq(hp.rope, hp.n_rot, hp.rope_base_swa, nullptr, swa_scale, &m->rope_inv_freq_swa);
    if (!m->rope_freq_factors_long.empty()) {
        rope_scaling_inv_freq(hp.rope, hp.n_rot, hp.rope_base, m->rope_freq_factors_long.data(), hp.rope.freq_scale,
                              &m->rope_inv_freq_long);
    }
    m->hp.rope_mscale = rope_scaling_mscale(hp.rope, hp.rope.freq_scale);
    m->hp.rope_mscale_swa = rope_scaling_mscale(hp.rope, swa_scale);
    m->n_batch = params.n_batch;
    m->info.arch = arch_name;
    if (!use_cuda(m, params.backend, err)) {
        model_free(m);
        return nullptr;
    }
    const int n_threads = params.n_threads > 0 ? params.n_threads : threadpool_physical_cores();
    m->pool = threadpool_init(m->cuda ? 1 : n_threads);  // the CUDA backend's host side is one thread
    m->ks = &kernels_get();
    if (!m->cuda) {  // the CPU's copies of the weights; the GPU has its own
        widen_weights(m, params.act_bits);
        pack_weights(m, params.act_bits, params.experts_ram_bytes);
    }

    model_info& info = m->info;
    info.arch = arch_name;
    if (const gguf_value* n = gguf_find(f, "general.name"); n && n->type == GGUF_TYPE_STRING) {
        info.name = std::string(n->str);
    }
    info.n_vocab = hp.n_vocab;
    info.n_ctx_train = hp.n_ctx_train;
    info.n_layer = hp.n_layer;
    info.n_embd = hp.n_embd;
    info.n_head = hp.n_head;
    info.n_head_kv = hp.n_head_kv;
    info.head_dim = hp.head_dim;
    info.n_threads = threadpool_n_threads(m->pool);
    // the mode as applied: --act-bits, else 8 where the set's default gives any matrix 8 bits (kernels_act8.h)
    info.act_bits = params.act_bits == 8 || params.act_bits == 16 ? params.act_bits : 16;
    if (params.act_bits != 16 && !m->cuda) {
        for (const weight_view* w : matmul_weights(m)) info.act_bits = w->act_bits == 8 ? 8 : info.act_bits;
    }
    if (hp.n_expert > 0) {
        info.n_experts_total = hp.n_layer * hp.n_expert;
        info.n_experts_resident = m->tiers.active ? m->tiers.n_slots : info.n_experts_total;
        info.experts_packed_bytes = m->tiers.all_bytes;
    }
    info.backend = m->cuda ? "cuda" : "cpu";
    info.bos_id = read_id(f, "tokenizer.ggml.bos_token_id", hp.n_vocab);
    info.eos_id = read_id(f, "tokenizer.ggml.eos_token_id", hp.n_vocab);
    info.eot_id = read_id(f, "tokenizer.ggml.eot_token_id", hp.n_vocab);
    // end of turn and turn opener: ChatML's, else Gemma's
    if (info.eot_id < 0) info.eot_id = find_token(f, "<|im_end|>");
    if (info.eot_id < 0) info.eot_id = find_token(f, "<end_of_turn>");
    info.im_start_id = find_token(f, "<|im_start|>");
    if (info.im_start_id < 0) info.im_start_id = find_token(f, "<start_of_turn>");
    info.endoftext_id = find_token(f, "<|endoftext|>");
    // harmony (gpt-oss): <|return|> and <|call|> end a reply; <|end|> only ends one of its messages (analysis,
    // then final), so it ends nothing even where the file names it the end of turn (as llama.cpp reads it)
    if (const int32_t ret = find_token(f, "<|return|>"), call = find_token(f, "<|call|>"); ret >= 0 && call >= 0) {
        info.call_id = call;
        if (info.eos_id < 0) info.eos_id = ret;
        if (info.eot_id >= 0 && info.eot_id == find_token(f, "<|end|>")) info.eot_id = -1;
    }
    for (const gguf_tensor& t : f->tensors) info.weights_bytes += t.n_bytes;

    // scratch for n_batch entries, allocated once
    model_scratch& s = m->s;
    const size_t nb = size_t(params.n_batch);
    s.x.resize(nb * size_t(hp.n_embd));
    s.xn.resize(nb * size_t(hp.n_embd > hp.n_embd_q() ? hp.n_embd : hp.n_embd_q()));
    s.q.resize(nb * size_t(hp.n_embd_q()));
    s.k.resize(nb * size_t(hp.n_embd_kv()));
    s.v.resize(nb * size_t(hp.n_embd_kv()));
    s.att.resize(nb * size_t(hp.n_embd_q()));
    s.tmp.resize(nb * size_t(hp.n_embd));
    s.gate.resize(nb * size_t(hp.n_ff));
    s.up.resize(nb * size_t(hp.n_ff));
    s.kv_rows.resize(size_t(info.n_threads) * 2 * size_t(hp.head_dim));
    s.kv_f16.resize(size_t(hp.n_embd_kv()));
    if (hp.n_expert > 0) moe_scratch_init(m);
    return m;
}

expert_figures model_expert_figures(const strata_model* m) {
    expert_figures f;
    f.total = m->info.n_experts_total;
    f.resident = m->info.n_experts_resident;
    if (m->tiers.active) {
        f.hits = m->tiers.hits;
        f.misses = m->tiers.misses;
        f.swaps = m->tiers.swaps;
    }
    return f;
}

void model_free(strata_model* m) {
    if (!m) return;
    cuda_model_free(m->cuda);
    std::free(m->packed);
    expert_tiers_free(&m->tiers);
    threadpool_free(m->pool);
    gguf_close(m->file);
    delete m;
}

const model_info& model_get_info(const strata_model* m) { return m->info; }

const char* model_kernel_name() { return kernels_get().name; }

size_t model_decode_bytes(const strata_model* m) {
    size_t n = m->tok_embd.row_bytes;
    for (weight_view* w : matmul_weights(const_cast<strata_model*>(m), false)) {
        n += w->packed ? weight_packed_bytes(w->type, w->n_cols, w->n_rows) : size_t(w->n_rows) * w->row_bytes;
    }
    return n + moe_decode_bytes(m);
}

size_t model_kv_bytes_per_pos(const strata_model* m) {
    return size_t(2) * size_t(m->hp.n_layer) * size_t(m->hp.n_embd_kv()) * sizeof(uint16_t);
}

kv_cache* kv_cache_init(const strata_model* m, int32_t n_ctx, kv_type type) {
    std::vector<uint8_t> swa(size_t(m->hp.n_layer), 0);
    for (int32_t il = 0; il < m->hp.n_layer; ++il) swa[size_t(il)] = m->layers[size_t(il)].swa ? 1 : 0;
    if (m->cuda && type != KV_TYPE_F16) return nullptr;  // the CUDA attention reads f16 caches only
    return kv_cache_create(m->hp.n_layer, n_ctx, m->hp.n_head_kv, m->hp.head_dim, type, swa.data(), m->hp.n_swa,
                           m->n_batch, m->cuda ? cuda_kv_mem() : nullptr);
}

// ---- forward pass -------------------------------------------------------------------------------------

namespace {

struct fwd {
    strata_model* m;
    const eval_batch* b;
    int32_t layer;
    bool post_ffn = false;  // post_norm_range: the FFN's post-norm, else attention's
    int32_t att_split = 1;  // attn_range: parts each kv head's group of query heads is split into
};

// attention-input norm (or ffn norm) of entries [i0, i1)
void norm_range(void* ctx, int64_t i0, int64_t i1, int) {
    const fwd& f = *static_cast<fwd*>(ctx);
    const model_hparams& hp = f.m->hp;
    const std::vector<float>& w = f.layer < 0 ? f.m->output_norm : f.m->layers[size_t(f.layer)].attn_norm;
    for (int64_t i = i0; i < i1; ++i) {
        rmsnorm_row(f.m->s.x.data() + i * hp.n_embd, w.data(), f.m->s.xn.data() + i * hp.n_embd, hp.n_embd,
                    hp.rms_eps);
    }
}

void ffn_norm_range(void* ctx, int64_t i0, int64_t i1, int) {
    const fwd& f = *static_cast<fwd*>(ctx);
    const model_hparams& hp = f.m->hp;
    const std::vector<float>& w = f.m->layers[size_t(f.layer)].ffn_norm;
    for (int64_t i = i0; i < i1; ++i) {
        rmsnorm_row(f.m->s.x.data() + i * hp.n_embd, w.data(), f.m->s.xn.data() + i * hp.n_embd, hp.n_embd,
                    hp.rms_eps);
    }
}

// biases, QK-norm, RoPE, then the entry's K/V rows into its cache
void qk_range(void* ctx, int64_t i0, int64_t i1, int) {
    const fwd& f = *static_cast<fwd*>(ctx);
    strata_model* m = f.m;
    const model_hparams& hp = m->hp;
    const layer_weights& l = m->layers[size_t(f.layer)];
    const int32_t nq = hp.n_embd_q(), nkv = hp.n_embd_kv();
    for (int64_t i = i0; i < i1; ++i) {
        float* q = m->s.q.data() + i * nq;
        float* k = m->s.k.data() + i * nkv;
        float* v = m->s.v.data() + i * nkv;
        if (!l.bq.empty()) {
            for (int32_t j = 0; j < nq; ++j) q[j] += l.bq[size_t(j)];
            for (int32_t j = 0; j < nkv; ++j) k[j] += l.bk[size_t(j)];
            for (int32_t j = 0; j < nkv; ++j) v[j] += l.bv[size_t(j)];
        }
        if (!l.q_norm.empty()) {
            for (int32_t h = 0; h < hp.n_head; ++h) {
                rmsnorm_row(q + h * hp.head_dim, l.q_norm.data(), q + h * hp.head_dim, hp.head_dim, hp.rms_eps);
            }
            for (int32_t h = 0; h < hp.n_head_kv; ++h) {
                rmsnorm_row(k + h * hp.head_dim, l.k_norm.data(), k + h * hp.head_dim, hp.head_dim, hp.rms_eps);
            }
        }
        const int32_t pos = f.b->pos[i];
        const float* cs = m->s.rope_cs.data() + (size_t(i) * 2 + (l.swa ? 1 : 0)) * size_t(hp.n_rot);
        rope_row_cs(q, hp.n_head, hp.head_dim, hp.n_rot, hp.rope_neox, cs);
        rope_row_cs(k, hp.n_head_kv, hp.head_dim, hp.n_rot, hp.rope_neox, cs);
        kv_cache* kv = f.b->kvs[f.b->seq[i]];
        const int32_t hd = hp.head_dim;
        for (int32_t h = 0; h < hp.n_head_kv; ++h) {
            for (int is_v = 0; is_v < 2; ++is_v) {
                const float* src = (is_v ? v : k) + h * hd;
                uint8_t* dst = kv_head(kv, is_v != 0, f.layer, h, pos);
                if (kv->type == KV_TYPE_F16) {
                    m->ks->fp32_to_fp16_row(src, reinterpret_cast<uint16_t*>(dst), hd);
                } else {
                    block_q8_0* blk = reinterpret_cast<block_q8_0*>(dst);
                    for (int32_t bi = 0; bi < hd / QK32; ++bi) {
                        float amax = 0.0f;
                        for (int j = 0; j < QK32; ++j) amax = std::fmax(amax, std::fabs(src[bi * QK32 + j]));
                        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
                        blk[bi].d = fp32_to_fp16(d);
                        for (int j = 0; j < QK32; ++j) {
                            blk[bi].qs[j] = static_cast<int8_t>(std::nearbyint(src[bi * QK32 + j] * id));
                        }
                    }
                }
                if (uint8_t* mirror = kv_head_mirror(kv, is_v != 0, f.layer, h, pos)) std::memcpy(mirror, dst, kv->head_bytes);
            }
        }
    }
}

// each entry's RoPE rotation (rope_cos_sin) for the full-attention and the window layers' frequencies
void rope_table_range(void* ctx, int64_t i0, int64_t i1, int) {
    const fwd& f = *static_cast<fwd*>(ctx);
    strata_model* m = f.m;
    const int32_t n_rot = m->hp.n_rot;
    for (int64_t i = i0; i < i1; ++i) {
        float* cs = m->s.rope_cs.data() + size_t(i) * 2 * size_t(n_rot);
        // LongRoPE: a cache longer than the original context takes the long factors
        const bool long_rope = !m->rope_inv_freq_long.empty() && f.b->kvs[f.b->seq[i]]->n_ctx > m->hp.rope.n_ctx_orig;
        rope_cos_sin(n_rot, f.b->pos[i], long_rope ? m->rope_inv_freq_long.data() : m->rope_inv_freq.data(), cs);
        if (m->hp.rope_mscale != 1.0f) {
            for (int32_t j = 0; j < n_rot; ++j) cs[j] *= m->hp.rope_mscale;
        }
        if (m->hp.n_swa > 0) {
            rope_cos_sin(n_rot, f.b->pos[i], m->rope_inv_freq_swa.data(), cs + n_rot);
            if (m->hp.rope_mscale_swa != 1.0f) {
                for (int32_t j = n_rot; j < 2 * n_rot; ++j) cs[j] *= m->hp.rope_mscale_swa;
            }
        }
    }
}

// First position an entry at pos attends to in this layer: 0, or the start of its window on a window layer.
int32_t attn_first(const model_hparams& hp, const layer_weights& l, int32_t pos) {
    return l.swa && pos + 1 > hp.n_swa ? pos + 1 - hp.n_swa : 0;
}

// item = (tile, kv head, part): a tile is a run of up to MODEL_ATT_TILE consecutive entries of one sequence (a
// prompt chunk's tokens; a decode entry alone); part p of f.att_split of the group of query heads sharing
// that kv head (each head's result is computed the same way whichever heads share the call), over
// positions first..pos of each entry (first = attn_first). The kernel set's fused attention reads the cache
// once per tile when it has one for this head size (on a window layer whose window has started, once per
// entry from its window's start), else dot / softmax / axpy here per entry.
void attn_range(void* ctx, int64_t i0, int64_t i1, int thread) {
    const fwd& f = *static_cast<fwd*>(ctx);
    strata_model* m = f.m;
    const model_hparams& hp = m->hp;
    const kernel_set& ks = *m->ks;
    const layer_weights& l = m->layers[size_t(f.layer)];
    const int32_t hd = hp.head_dim, group = hp.n_head / hp.n_head_kv;
    const int32_t nq = hp.n_embd_q();
    const float scale = hp.attn_scale > 0.0f ? hp.attn_scale : 1.0f / std::sqrt(static_cast<float>(hd));
    const size_t per_thread = m->s.att_scores.size() / size_t(m->info.n_threads);
    float* scores = m->s.att_scores.data() + size_t(thread) * per_thread;
    const size_t n_ctx_max = per_thread / (size_t(MODEL_ATT_TILE) * size_t(group));
    float* kbuf = m->s.kv_rows.data() + size_t(thread) * 2 * size_t(hd);
    const int32_t hs = group / f.att_split;  // query heads per item
    const int64_t n_tiles = static_cast<int64_t>(m->s.att_tiles.size()) - 1;
    const float* sinks_all = l.attn_sinks.empty() ? nullptr : l.attn_sinks.data();  // (n_head) or none
    for (int64_t it = i0; it < i1; ++it) {
        const int64_t unit = it / f.att_split;  // (tile slot, kv head)
        // tiles in zigzag order (0, last, 1, last - 1, ...): a prompt's later tiles see more positions, so
        // the pool's contiguous item ranges get about equal work (in tile order the last thread got ~3/4)
        const int64_t slot = unit / hp.n_head_kv;
        const int64_t tile = slot % 2 == 0 ? slot / 2 : n_tiles - 1 - slot / 2;
        const int32_t g = static_cast<int32_t>(unit % hp.n_head_kv);
        const int32_t qh = g * group + static_cast<int32_t>(it % f.att_split) * hs;  // the item's first query head
        const int32_t e0 = m->s.att_tiles[size_t(tile)], e1 = m->s.att_tiles[size_t(tile) + 1];
        const kv_cache* kv = f.b->kvs[f.b->seq[e0]];
        const float* sinks = sinks_all ? sinks_all + qh : nullptr;  // the item's heads' sinks
        if (ks.attn && (hd == 64 || hd == 128 || hd == 256)) {
            if (attn_first(hp, l, f.b->pos[e1 - 1]) == 0) {
                ks.attn(m->s.q.data() + size_t(e0) * nq + qh * hd, size_t(nq), hs, e1 - e0,
                        kv_head(kv, false, f.layer, g, 0), kv_head(kv, true, f.layer, g, 0), kv->head_bytes,
                        kv->type == KV_TYPE_Q8_0, f.b->pos[e0] + 1, hd, scale, scores,
                        m->s.att.data() + size_t(e0) * nq + qh * hd, size_t(nq), sinks);
                continue;
            }
            for (int32_t i = e0; i < e1; ++i) {
                const int32_t p0 = attn_first(hp, l, f.b->pos[i]);
                ks.attn(m->s.q.data() + size_t(i) * nq + qh * hd, size_t(nq), hs, 1,
                        kv_head(kv, false, f.layer, g, p0), kv_head(kv, true, f.layer, g, p0), kv->head_bytes,
                        kv->type == KV_TYPE_Q8_0, f.b->pos[i] + 1 - p0, hd, scale, scores,
                        m->s.att.data() + size_t(i) * nq + qh * hd, size_t(nq), sinks);
            }
            continue;
        }
        for (int32_t i = e0; i < e1; ++i) {
            const int32_t p0 = attn_first(hp, l, f.b->pos[i]);
            const int32_t n_pos = f.b->pos[i] + 1 - p0;  // scores[j] is position p0 + j
            const float* q = m->s.q.data() + i * nq + qh * hd;
            float* out = m->s.att.data() + i * nq + qh * hd;
            for (int32_t p = 0; p < n_pos; ++p) {
                const uint8_t* krow = kv_head(kv, false, f.layer, g, p0 + p);
                if (kv->type == KV_TYPE_F16) {
                    const uint16_t* k = reinterpret_cast<const uint16_t*>(krow);
                    for (int32_t h = 0; h < hs; ++h) scores[size_t(h) * n_ctx_max + p] = ks.dot_f16_f32(k, q + h * hd, hd) * scale;
                } else {
                    dequantize_row(GGML_TYPE_Q8_0, krow, kbuf, hd);
                    for (int32_t h = 0; h < hs; ++h) scores[size_t(h) * n_ctx_max + p] = ks.dot_f32(kbuf, q + h * hd, hd) * scale;
                }
            }
            for (int32_t h = 0; h < hs; ++h) {
                float* sc = scores + size_t(h) * n_ctx_max;
                float mx = sc[0];
                for (int32_t p = 1; p < n_pos; ++p) mx = sc[p] > mx ? sc[p] : mx;
                if (sinks) mx = sinks[h] > mx ? sinks[h] : mx;  // a sink: one more term, no value row
                float sum = sinks ? std::exp(sinks[h] - mx) : 0.0f;
                for (int32_t p = 0; p < n_pos; ++p) {
                    sc[p] = std::exp(sc[p] - mx);
                    sum += sc[p];
                }
                const float inv = 1.0f / sum;
                for (int32_t p = 0; p < n_pos; ++p) sc[p] *= inv;
                std::memset(out + h * hd, 0, size_t(hd) * sizeof(float));
            }
            for (int32_t p = 0; p < n_pos; ++p) {
                const uint8_t* vrow = kv_head(kv, true, f.layer, g, p0 + p);
                if (kv->type == KV_TYPE_F16) {
                    const uint16_t* v = reinterpret_cast<const uint16_t*>(vrow);
                    for (int32_t h = 0; h < hs; ++h) ks.axpy_f16(scores[size_t(h) * n_ctx_max + p], v, out + h * hd, hd);
                } else {
                    dequantize_row(GGML_TYPE_Q8_0, vrow, kbuf, hd);
                    for (int32_t h = 0; h < hs; ++h) {
                        const float w = scores[size_t(h) * n_ctx_max + p];
                        float* o = out + h * hd;
                        for (int32_t j = 0; j < hd; ++j) o[j] += w * kbuf[j];
                    }
                }
            }
        }
    }
}

// gate = act(gate) * up, act = silu, or gelu in its tanh form (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))))
void swiglu_range(void* ctx, int64_t i0, int64_t i1, int) {
    const fwd& f = *static_cast<fwd*>(ctx);
    const int64_t n_ff = f.m->hp.n_ff;
    float* g = f.m->s.gate.data();
    const float* u = f.m->s.up.data();
    if (f.m->hp.ffn_gelu) {
        gelu_mul(*f.m->ks, g + i0 * n_ff, u + i0 * n_ff, (i1 - i0) * n_ff);  // engine/cpu/gelu.h
        return;
    }
    silu_mul_row(*f.m->ks, g + i0 * n_ff, u + i0 * n_ff, (i1 - i0) * n_ff);
}

// the block output in tmp gets its post-norm (gemma3) before it joins the residual stream
void post_norm_range(void* ctx, int64_t i0, int64_t i1, int) {
    const fwd& f = *static_cast<fwd*>(ctx);
    const model_hparams& hp = f.m->hp;
    const layer_weights& l = f.m->layers[size_t(f.layer)];
    const std::vector<float>& w = f.post_ffn ? l.ffn_post_norm : l.attn_post_norm;
    for (int64_t i = i0; i < i1; ++i) {
        float* t = f.m->s.tmp.data() + i * hp.n_embd;
        rmsnorm_row(t, w.data(), t, hp.n_embd, hp.rms_eps);
    }
}

// x += the block output in tmp (attention's with its output bias, when the layer has one: gpt-oss)
void add_range(void* ctx, int64_t i0, int64_t i1, int) {
    const fwd& f = *static_cast<fwd*>(ctx);
    const int64_t e = f.m->hp.n_embd;
    float* x = f.m->s.x.data();
    const float* t = f.m->s.tmp.data();
    const std::vector<float>& bo = f.m->layers[size_t(f.layer)].bo;
    if (!f.post_ffn && !bo.empty()) {
        for (int64_t i = i0; i < i1; ++i) {
            for (int64_t c = 0; c < e; ++c) x[i * e + c] += t[i * e + c] + bo[size_t(c)];
        }
        return;
    }
    for (int64_t i = i0 * e; i < i1 * e; ++i) x[i] += t[i];
}

void run_entries(strata_model* m, int32_t n, threadpool_fn fn, fwd* f) {
    if (n >= MODEL_PARALLEL_ENTRIES) {
        threadpool_run(m->pool, n, fn, f);
    } else {
        fn(f, 0, n, 0);
    }
}

bool check_batch(const strata_model* m, const eval_batch& b, std::string* err) {
    auto bad = [&](const std::string& why) {
        if (err) *err = why;
        return false;
    };
    if (b.n < 1 || b.n > m->n_batch) return bad("batch of " + std::to_string(b.n) + " entries (limit " + std::to_string(m->n_batch) + ")");
    if (!b.token || !b.pos || !b.seq || !b.want_logits || !b.kvs || b.n_seq < 1) return bad("incomplete batch");
    for (int32_t i = 0; i < b.n; ++i) {
        if (b.token[i] < 0 || b.token[i] >= m->hp.n_vocab) return bad("token " + std::to_string(b.token[i]) + " outside the vocabulary");
        if (b.seq[i] < 0 || b.seq[i] >= b.n_seq || !b.kvs[b.seq[i]]) return bad("entry " + std::to_string(i) + ": bad sequence index");
        const kv_cache* kv = b.kvs[b.seq[i]];
        if (kv->n_layer != m->hp.n_layer || kv->n_embd_kv != m->hp.n_embd_kv()) return bad("cache of another model");
        if (b.pos[i] < 0 || b.pos[i] >= kv->n_ctx) return bad("position " + std::to_string(b.pos[i]) + " outside the cache");
        if (i > 0 && b.seq[i] == b.seq[i - 1] && b.pos[i] != b.pos[i - 1] + 1) return bad("positions of a sequence must rise by 1");
        if ((i == 0 || b.seq[i] != b.seq[i - 1]) && !kv_cache_can_resume(kv, b.pos[i])) {
            return bad("position " + std::to_string(b.pos[i]) + ": the window layers no longer hold its window (they hold from " +
                       std::to_string(kv_cache_window_lo(kv)) + ")");
        }
    }
    return true;
}

// Each sequence's run of entries [i0, i): its cache's rings advance before the pass writes them.
void note_writes(const eval_batch& b) {
    int32_t i0 = 0;
    for (int32_t i = 1; i <= b.n; ++i) {
        if (i == b.n || b.seq[i] != b.seq[i - 1]) {
            kv_cache_note_writes(b.kvs[b.seq[i0]], b.pos[i0], b.pos[i - 1]);
            i0 = i;
        }
    }
}

}  // namespace

int model_eval(strata_model* m, const eval_batch& b, float* logits, std::string* err) {
    if (!check_batch(m, b, err)) return -1;
    if (m->cuda) {
        note_writes(b);
        return cuda_model_eval(m, b, logits, err);  // prefill/cuda_forward.h: this function's steps on the GPU
    }
    // step_mark: decode phase marks (STRATA_STEP_TIMING=1, engine/cpu/step_timer.h); a branch when off
    const int32_t outer = step_mark(STEP_NORMS);
    note_writes(b);
    const model_hparams& hp = m->hp;
    model_scratch& s = m->s;
    const kernel_set& ks = *m->ks;
    const int32_t n = b.n, E = hp.n_embd;
    // attention scores: room for the longest sequence in this batch (grows once, then reused)
    int32_t max_pos = 0;
    for (int32_t i = 0; i < n; ++i) max_pos = b.pos[i] + 1 > max_pos ? b.pos[i] + 1 : max_pos;
    const size_t group = size_t(hp.n_head / hp.n_head_kv), nt = size_t(m->info.n_threads);
    const size_t tile_rows = size_t(MODEL_ATT_TILE) * group;
    size_t n_ctx_max = s.att_scores.size() / (nt * tile_rows);
    if (n_ctx_max < size_t(max_pos)) {
        n_ctx_max = size_t(max_pos) < 256 ? 256 : size_t(max_pos);
        s.att_scores.assign(nt * tile_rows * n_ctx_max, 0.0f);
    }
    // attention tiles: each run of consecutive entries of one sequence cut into parts of about equal length,
    // at most MODEL_ATT_TILE each (a drafting verify step's 9 entries: 5 + 4, not 8 + 1). When that leaves
    // fewer (tile, kv head) items than twice the threads, in a count they cannot share evenly, and the query
    // heads do not split in two (att_split below), each run is cut into up to n_thr / gcd(n_kv, n_thr) parts,
    // which makes the item count a multiple of the threads (a verify step of one sequence: SmolLM2's 3 kv heads
    // on 2 threads put two heads' queries on one thread). The kernels' results do not depend on the tile
    // (each entry's bits are the same in any tile: tests/engine/kernels_test.cpp), so no output changes.
    std::vector<int32_t>& runs = s.att_runs;
    runs.clear();
    for (int32_t i = 0; i < n; ++i) {
        if (i == 0 || b.seq[i] != b.seq[i - 1]) runs.push_back(i);
    }
    runs.push_back(n);
    const int64_t n_thr = m->info.n_threads;
    int64_t n_items = 0;
    for (size_t r = 0; r + 1 < runs.size(); ++r) n_items += (runs[r + 1] - runs[r] + MODEL_ATT_TILE - 1) / MODEL_ATT_TILE;
    n_items *= hp.n_head_kv;
    int64_t parts_min = 1;
    if (max_pos >= MODEL_ATT_SPLIT_POSITIONS && n_items % n_thr != 0 && n_items < 2 * n_thr &&
        !(n_items < n_thr && (hp.n_head / hp.n_head_kv) % 2 == 0)) {
        parts_min = n_thr / std::gcd(n_thr, int64_t{hp.n_head_kv});
    }
    s.att_tiles.clear();
    for (size_t r = 0; r + 1 < runs.size(); ++r) {
        const int64_t e0 = runs[r], len = runs[r + 1] - e0;
        int64_t np = (len + MODEL_ATT_TILE - 1) / MODEL_ATT_TILE;
        np = np > parts_min ? np : (parts_min < len ? parts_min : len);
        for (int64_t j = 0; j < np; ++j) s.att_tiles.push_back(static_cast<int32_t>(e0 + len * j / np));
    }
    const int64_t n_tiles = static_cast<int64_t>(s.att_tiles.size());
    s.att_tiles.push_back(n);
    for (int32_t i = 0; i < n; ++i) dequantize_row(m->tok_embd.type, m->tok_embd.data + size_t(b.token[i]) * m->tok_embd.row_bytes, s.x.data() + size_t(i) * size_t(E), E);
    if (hp.embd_scale > 0.0f) {
        for (size_t i = 0; i < size_t(n) * size_t(E); ++i) s.x[i] *= hp.embd_scale;
    }

    fwd f{m, &b, 0};
    // fewer (tile, kv head) items than threads (a decode step of a model with one kv head, Gemma 3 270M):
    // split each group of query heads so that every thread gets some, on layers that attend to enough
    // positions (MODEL_ATT_SPLIT_POSITIONS)
    int32_t att_split = 1;
    while (n_tiles * hp.n_head_kv * att_split < m->info.n_threads && (hp.n_head / hp.n_head_kv) % (2 * att_split) == 0) {
        att_split *= 2;
    }
    if (s.rope_cs.size() < size_t(n) * 2 * size_t(hp.n_rot)) s.rope_cs.resize(size_t(m->n_batch) * 2 * size_t(hp.n_rot));
    run_entries(m, n, rope_table_range, &f);
    for (int32_t il = 0; il < hp.n_layer; ++il) {
        const layer_weights& l = m->layers[size_t(il)];
        f.layer = il;
        step_mark(STEP_NORMS);
        run_entries(m, n, norm_range, &f);
        const weight_view* qkv[3] = {&l.wq, &l.wk, &l.wv};
        float* qkv_out[3] = {s.q.data(), s.k.data(), s.v.data()};
        step_mark(step_phase_of(l.wq.type));
        matmul_fused(m->pool, ks, qkv, qkv_out, 3, s.xn.data(), E, n, &s.mm);
        step_mark(STEP_NORMS);
        run_entries(m, n, qk_range, &f);
        step_mark(STEP_ATTENTION);
        const int32_t span = l.swa && hp.n_swa > 0 && hp.n_swa < max_pos ? hp.n_swa : max_pos;
        f.att_split = span >= MODEL_ATT_SPLIT_POSITIONS ? att_split : 1;
        threadpool_run(m->pool, n_tiles * hp.n_head_kv * f.att_split, attn_range, &f);
        step_mark(step_phase_of(l.wo.type));
        matmul(m->pool, ks, l.wo, s.att.data(), hp.n_embd_q(), n, s.tmp.data(), &s.mm);
        step_mark(STEP_NORMS);
        f.post_ffn = false;
        if (!l.attn_post_norm.empty()) run_entries(m, n, post_norm_range, &f);
        run_entries(m, n, add_range, &f);
        run_entries(m, n, ffn_norm_range, &f);
        if (!l.exp_gate.empty()) {
            step_mark(step_phase_of(l.exp_gate[0].type));
            moe_ffn(m, l, n);  // engine/moe.h: s.tmp = the experts' (and shared expert's) sum
            step_mark(STEP_NORMS);
            f.post_ffn = true;
            if (!l.ffn_post_norm.empty()) run_entries(m, n, post_norm_range, &f);
            run_entries(m, n, add_range, &f);
            continue;
        }
        const weight_view* gu[2] = {&l.w_gate, &l.w_up};
        float* gu_out[2] = {s.gate.data(), s.up.data()};
        step_mark(step_phase_of(l.w_gate.type));
        matmul_fused(m->pool, ks, gu, gu_out, 2, s.xn.data(), E, n, &s.mm);
        step_mark(STEP_NORMS);
        run_entries(m, n, swiglu_range, &f);
        step_mark(step_phase_of(l.w_down.type));
        matmul(m->pool, ks, l.w_down, s.gate.data(), hp.n_ff, n, s.tmp.data(), &s.mm);
        step_mark(STEP_NORMS);
        f.post_ffn = true;
        if (!l.ffn_post_norm.empty()) run_entries(m, n, post_norm_range, &f);
        run_entries(m, n, add_range, &f);
    }
    if (b.want_hidden && b.hidden) {  // embeddings: the final-normed rows, as the head would read them
        int32_t k = 0;
        for (int32_t i = 0; i < n; ++i) {
            if (!b.want_hidden[i]) continue;
            rmsnorm_row(s.x.data() + size_t(i) * size_t(E), m->output_norm.data(), b.hidden + size_t(k) * size_t(E), E, hp.rms_eps);
            ++k;
        }
    }
    // final norm of the entries that want logits, compacted, then the head straight into logits
    int32_t n_out = 0;
    for (int32_t i = 0; i < n; ++i) {
        if (!b.want_logits[i]) continue;
        rmsnorm_row(s.x.data() + size_t(i) * size_t(E), m->output_norm.data(), s.xn.data() + size_t(n_out) * size_t(E), E, hp.rms_eps);
        ++n_out;
    }
    step_mark(STEP_LM_HEAD);
    if (n_out > 0 && logits) matmul(m->pool, ks, m->output, s.xn.data(), E, n_out, logits, &s.mm);
    if (n_out > 0 && logits && hp.logit_softcap > 0.0f) {
        const float c = hp.logit_softcap;
        for (size_t i = 0; i < size_t(n_out) * size_t(hp.n_vocab); ++i) logits[i] = c * std::tanh(logits[i] / c);
    }
    step_mark(outer);
    return 0;
}

int model_eval_seq(strata_model* m, kv_cache* kv, const int32_t* tokens, int32_t n, int32_t pos0,
                   float* logits_last, std::string* err) {
    if (n < 1) {
        if (err) *err = "empty token list";
        return -1;
    }
    model_scratch& s = m->s;
    s.seq_pos.resize(static_cast<size_t>(n));
    s.seq_idx.assign(static_cast<size_t>(n), 0);
    s.seq_want.assign(static_cast<size_t>(n), 0);
    for (int32_t i = 0; i < n; ++i) s.seq_pos[static_cast<size_t>(i)] = pos0 + i;
    s.seq_want[static_cast<size_t>(n - 1)] = 1;
    kv_cache* kvs[1] = {kv};
    eval_batch b;
    b.n = n;
    b.token = tokens;
    b.pos = s.seq_pos.data();
    b.seq = s.seq_idx.data();
    b.want_logits = s.seq_want.data();
    b.kvs = kvs;
    b.n_seq = 1;
    return model_eval(m, b, logits_last, err);
}

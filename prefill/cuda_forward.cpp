// prefill/cuda_forward.cpp — the decoder forward on the GPU (contract in prefill/cuda_forward.h). It follows
// engine/model.cpp's model_eval step for step (same shapes, same optional parts); every buffer below is
// (n_batch, width) row-major on the device unless said otherwise.
#include "prefill/cuda_forward.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/model_impl.h"
#include "prefill/cuda_kernels.h"
#include "prefill/cuda_math.h"
#include "prefill/timer_marks.hpp"

namespace {

// Batches of at most this many entries take the GEMV (the weights read once per 8 entries); larger ones the
// tensor-core GEMM over a bf16 copy of the weight made per call. The crossover is a first guess: the device
// check measures both sides of it (tools/device_check.sh).
constexpr int CUDA_GEMV_MAX_ENTRIES = 16;
// Attention blocks wanted per streaming multiprocessor before a layer's positions are split between blocks
// (a decode step of a model with few kv heads would otherwise leave most of the GPU idle).
constexpr int CUDA_ATT_BLOCKS_PER_SM = 2;
constexpr int CUDA_ATT_MAX_SPLIT = 32;  // at most this many partials per (entry, head) to combine
// Entries of a large decode step (8 slots, each with its drafts) whose attention may take CUDA_ATT_MAX_SPLIT.
constexpr int CUDA_DECODE_ENTRIES = 64;
// Events one model_eval may record with timing on (each layer marks ~10 phases; 1024 layers at most).
constexpr size_t CUDA_TIMER_EVENTS = 16384;

struct dev_weight {
    uint32_t type = 0;
    int64_t n_rows = 0, n_cols = 0;
    size_t row_bytes = 0;
    const uint8_t* data = nullptr;  // device
};

struct dev_layer {
    dev_weight wq, wk, wv, wo, w_gate, w_up, w_down;
    const float *attn_norm = nullptr, *ffn_norm = nullptr, *bq = nullptr, *bk = nullptr, *bv = nullptr;
    const float *q_norm = nullptr, *k_norm = nullptr, *attn_post_norm = nullptr, *ffn_post_norm = nullptr;
};

// device phases of the timer (PfTimer's rule: a mark of the running phase is not recorded)
enum cuda_phase : int32_t { CP_UPLOAD, CP_EMBED, CP_NORMS, CP_QKV, CP_ATTENTION, CP_WO, CP_FFN, CP_HEAD, CP_DOWNLOAD, CP_COUNT };
const char* const CUDA_PHASE_NAMES[CP_COUNT] = {"upload", "embed", "norms", "qkv", "attention", "wo", "ffn", "head", "download"};

}  // namespace

struct cuda_model {
    std::vector<void*> allocs;  // every device allocation, freed together
    size_t weight_bytes = 0;
    std::vector<dev_layer> layers;
    dev_weight tok_embd, output;
    const float *output_norm = nullptr, *inv_freq = nullptr, *inv_freq_swa = nullptr, *inv_freq_long = nullptr;
    int32_t n_batch = 0;
    // activations
    float *x = nullptr, *xn = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *att = nullptr, *tmp = nullptr;
    float *gate = nullptr, *up = nullptr, *logits = nullptr, *att_scratch = nullptr;
    uint16_t *a_bf16 = nullptr, *w_bf16 = nullptr;  // (n_batch, max K) activations, (largest matrix) weights
    size_t att_scratch_floats = 0;
    // per-call tables: tokens (n), entries (n), tiles (n + 1), out rows (n), hidden rows (n), kv (n_layer, n_seq)
    int32_t *d_tokens = nullptr, *d_tiles = nullptr, *d_out_rows = nullptr, *d_hidden_rows = nullptr;
    cuk_entry* d_entries = nullptr;
    cuk_kv_seq* d_kvs = nullptr;
    int32_t kv_seq_cap = 0;
    std::vector<cuk_kv_seq> h_kvs;
    std::vector<cuk_entry> h_entries;
    std::vector<int32_t> h_tiles, h_rows;
    int sms = 0;
    // timing
    bool timing = false;
    std::vector<cuk_event*> events;
    std::vector<pf::timer_mark> marks;  // t_ns holds the event's index
    std::vector<int32_t> mark_layer;    // the layer of each mark (-1 outside the layers)
};

namespace {

template <typename T>
T* dev_alloc(cuda_model* c, size_t n, std::string* err, const char* what) {
    void* p = cuk_alloc(n * sizeof(T));
    if (!p && err->empty()) *err = std::string("CUDA: no device memory for ") + what;
    if (p) c->allocs.push_back(p);
    return static_cast<T*>(p);
}

const float* upload_vec(cuda_model* c, const std::vector<float>& v, std::string* err, const char* what) {
    if (v.empty()) return nullptr;
    float* d = dev_alloc<float>(c, v.size(), err, what);
    if (d) cuk_copy(d, v.data(), v.size() * sizeof(float));
    return d;
}

// A weight in its own type when the kernels read it, else as F16 (dequantised on the host once). Tied weights
// (the same host bytes) share one upload.
bool upload_weight(cuda_model* c, const weight_view& w, std::unordered_map<const uint8_t*, dev_weight>* seen,
                   dev_weight* out, std::string* err) {
    if (!w.data) return true;
    if (auto it = seen->find(w.data); it != seen->end() && it->second.n_rows == w.n_rows) {
        *out = it->second;
        return true;
    }
    out->n_rows = w.n_rows;
    out->n_cols = w.n_cols;
    const bool native = cm::native(w.type);
    out->type = native ? w.type : uint32_t(GGML_TYPE_F16);
    out->row_bytes = native ? w.row_bytes : size_t(w.n_cols) * 2;
    const size_t bytes = out->row_bytes * size_t(w.n_rows);
    uint8_t* d = dev_alloc<uint8_t>(c, bytes, err, "the weights");
    if (!d) return false;
    if (native) {
        cuk_copy(d, w.data, bytes);
    } else {
        std::vector<float> row(static_cast<size_t>(w.n_cols));
        std::vector<uint16_t> half(size_t(w.n_cols) * 256);
        for (int64_t r0 = 0; r0 < w.n_rows; r0 += 256) {  // 256 rows a copy
            const int64_t nr = std::min<int64_t>(256, w.n_rows - r0);
            for (int64_t r = 0; r < nr; ++r) {
                dequantize_row(w.type, w.data + size_t(r0 + r) * w.row_bytes, row.data(), w.n_cols);
                for (int64_t j = 0; j < w.n_cols; ++j) half[size_t(r * w.n_cols + j)] = fp32_to_fp16(row[size_t(j)]);
            }
            cuk_copy(d + size_t(r0) * out->row_bytes, half.data(), size_t(nr) * out->row_bytes);
        }
    }
    out->data = d;
    c->weight_bytes += bytes;
    (*seen)[w.data] = *out;
    return true;
}

void timer_mark(cuda_model* c, int32_t phase, int32_t layer) {
    if (!c->timing || c->events.size() >= CUDA_TIMER_EVENTS) return;
    const size_t i = c->marks.size();
    if (!pf::timer_marks_add(c->marks, phase, int64_t(i))) {
        if (!c->mark_layer.empty() && c->mark_layer.back() != layer) {
            // the same phase in the next layer: a new record, so the per-layer figures stay apart
            c->marks.push_back(pf::timer_mark{phase, int64_t(i)});
        } else {
            return;
        }
    }
    c->mark_layer.push_back(layer);
    if (c->events.size() <= i) c->events.push_back(cuk_event_new());
    cuk_event_record(c->events[i]);
}

// after cuk_sync: the per-phase totals and each layer's matmul time, two stderr lines
void timer_print(cuda_model* c, int32_t n_tokens, int32_t n_layer) {
    const size_t n = c->marks.size();
    if (n < 2) return;
    double totals[CP_COUNT] = {};
    std::vector<double> layer_mm(size_t(n_layer), 0.0);
    for (size_t i = 0; i + 1 < n; ++i) {
        const double ms = cuk_event_ms(c->events[i], c->events[i + 1]);
        const int32_t p = c->marks[i].phase;
        if (p >= 0 && p < CP_COUNT) totals[p] += ms;
        const int32_t l = c->mark_layer[i];
        if (l >= 0 && l < n_layer && (p == CP_QKV || p == CP_WO || p == CP_FFN)) layer_mm[size_t(l)] += ms;
    }
    const double total = cuk_event_ms(c->events[0], c->events[n - 1]);
    std::string line = "pf cuda timing: tokens=" + std::to_string(n_tokens);
    char buf[64];
    std::snprintf(buf, sizeof buf, " total_ms=%.3f", total);
    line += buf;
    for (int p = 0; p < CP_COUNT; ++p) {
        std::snprintf(buf, sizeof buf, " %s=%.3f", CUDA_PHASE_NAMES[p], totals[p]);
        line += buf;
    }
    std::fprintf(stderr, "%s records=%zu\n", line.c_str(), n);
    std::string layers = "pf cuda layers: matmul_ms=";
    for (int32_t l = 0; l < n_layer; ++l) {
        std::snprintf(buf, sizeof buf, "%s%.3f", l ? "," : "", layer_mm[size_t(l)]);
        layers += buf;
    }
    std::fprintf(stderr, "%s\n", layers.c_str());
}

// y (n, N) = x (n, K) W^T. a_ready: c->a_bf16 already holds x as bf16 (the Q/K/V or gate/up of one input).
void mm(cuda_model* c, const dev_weight& w, const float* x, int n, float* y, bool a_ready = false) {
    if (n <= CUDA_GEMV_MAX_ENTRIES) {
        for (int t0 = 0; t0 < n; t0 += CUK_GEMV_MAX_TOK) {
            cuk_gemv(w.type, w.data, w.row_bytes, w.n_rows, w.n_cols, x + size_t(t0) * size_t(w.n_cols), w.n_cols,
                     std::min(CUK_GEMV_MAX_TOK, n - t0), y + size_t(t0) * size_t(w.n_rows), w.n_rows);
        }
        return;
    }
    if (!a_ready) cuk_to_bf16(x, int64_t(n) * w.n_cols, c->a_bf16);
    cuk_dequant_bf16(w.type, w.data, w.row_bytes, w.n_rows, w.n_cols, c->w_bf16);
    cuk_gemm_bf16(c->a_bf16, c->w_bf16, y, n, w.n_rows, w.n_cols);
}

// Each weight of one input (Q, K, V; gate, up): the input converted to bf16 once.
void mm_shared(cuda_model* c, const dev_weight* const* ws, float* const* ys, int n_w, const float* x, int n) {
    if (n > CUDA_GEMV_MAX_ENTRIES) cuk_to_bf16(x, int64_t(n) * ws[0]->n_cols, c->a_bf16);
    for (int i = 0; i < n_w; ++i) mm(c, *ws[i], x, n, ys[i], true);
}

}  // namespace

bool cuda_model_supported(const strata_model* m, std::string* why) {
    const model_hparams& hp = m->hp;
    const std::string& a = m->info.arch;
    if (a != "llama" && a != "qwen2" && a != "qwen3" && a != "gemma3") {
        *why = "the CUDA forward covers llama, qwen2, qwen3 and gemma3, not " + a;
        return false;
    }
    if (hp.n_expert > 0) {
        *why = "the CUDA forward has no MoE layers";
        return false;
    }
    if (hp.head_dim != 64 && hp.head_dim != 128 && hp.head_dim != 256) {
        *why = "no CUDA attention kernel for head size " + std::to_string(hp.head_dim);
        return false;
    }
    if (hp.n_embd % 32 || hp.n_embd_q() % 32 || hp.n_ff % 32) {
        *why = "the CUDA matmuls need rows that are a multiple of 32";
        return false;
    }
    return cuk_available(why);
}

cuda_model* cuda_model_init(const strata_model* m, std::string* err) {
    if (!cuda_model_supported(m, err)) return nullptr;
    const model_hparams& hp = m->hp;
    auto* c = new cuda_model();
    err->clear();
    std::unordered_map<const uint8_t*, dev_weight> seen;
    bool ok = upload_weight(c, m->tok_embd, &seen, &c->tok_embd, err) && upload_weight(c, m->output, &seen, &c->output, err);
    c->layers.resize(size_t(hp.n_layer));
    int64_t max_rows_cols = c->output.n_rows * c->output.n_cols;
    for (int32_t il = 0; ok && il < hp.n_layer; ++il) {
        const layer_weights& l = m->layers[size_t(il)];
        dev_layer& d = c->layers[size_t(il)];
        const weight_view* src[7] = {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down};
        dev_weight* dst[7] = {&d.wq, &d.wk, &d.wv, &d.wo, &d.w_gate, &d.w_up, &d.w_down};
        for (int i = 0; ok && i < 7; ++i) {
            ok = upload_weight(c, *src[i], &seen, dst[i], err);
            max_rows_cols = std::max(max_rows_cols, dst[i]->n_rows * dst[i]->n_cols);
        }
        d.attn_norm = upload_vec(c, l.attn_norm, err, "norms");
        d.ffn_norm = upload_vec(c, l.ffn_norm, err, "norms");
        d.bq = upload_vec(c, l.bq, err, "biases");
        d.bk = upload_vec(c, l.bk, err, "biases");
        d.bv = upload_vec(c, l.bv, err, "biases");
        d.q_norm = upload_vec(c, l.q_norm, err, "norms");
        d.k_norm = upload_vec(c, l.k_norm, err, "norms");
        d.attn_post_norm = upload_vec(c, l.attn_post_norm, err, "norms");
        d.ffn_post_norm = upload_vec(c, l.ffn_post_norm, err, "norms");
        ok = ok && err->empty();
    }
    c->output_norm = upload_vec(c, m->output_norm, err, "norms");
    c->inv_freq = upload_vec(c, m->rope_inv_freq, err, "RoPE");
    c->inv_freq_swa = upload_vec(c, m->rope_inv_freq_swa, err, "RoPE");
    c->inv_freq_long = upload_vec(c, m->rope_inv_freq_long, err, "RoPE");
    const size_t nb = size_t(m->n_batch), E = size_t(hp.n_embd), nq = size_t(hp.n_embd_q());
    const size_t nkv = size_t(hp.n_embd_kv()), nff = size_t(hp.n_ff);
    c->n_batch = m->n_batch;
    ok = ok && err->empty() && (c->x = dev_alloc<float>(c, nb * E, err, "activations")) &&
         (c->xn = dev_alloc<float>(c, nb * std::max(E, nq), err, "activations")) &&
         (c->q = dev_alloc<float>(c, nb * nq, err, "activations")) && (c->k = dev_alloc<float>(c, nb * nkv, err, "activations")) &&
         (c->v = dev_alloc<float>(c, nb * nkv, err, "activations")) && (c->att = dev_alloc<float>(c, nb * nq, err, "activations")) &&
         (c->tmp = dev_alloc<float>(c, nb * E, err, "activations")) && (c->gate = dev_alloc<float>(c, nb * nff, err, "activations")) &&
         (c->up = dev_alloc<float>(c, nb * nff, err, "activations")) &&
         (c->logits = dev_alloc<float>(c, nb * size_t(hp.n_vocab), err, "logits")) &&
         (c->d_tokens = dev_alloc<int32_t>(c, nb, err, "tables")) && (c->d_tiles = dev_alloc<int32_t>(c, nb + 1, err, "tables")) &&
         (c->d_out_rows = dev_alloc<int32_t>(c, nb, err, "tables")) && (c->d_hidden_rows = dev_alloc<int32_t>(c, nb, err, "tables")) &&
         (c->d_entries = dev_alloc<cuk_entry>(c, nb, err, "tables"));
    // attention partials: room for 4 splits of a full batch, or CUDA_ATT_MAX_SPLIT of a decode step's entries
    c->att_scratch_floats = std::max(cuk_attn_scratch_floats(int(nb), hp.n_head, hp.head_dim, 4),
                                     cuk_attn_scratch_floats(CUDA_DECODE_ENTRIES, hp.n_head, hp.head_dim, CUDA_ATT_MAX_SPLIT));
    ok = ok && (c->att_scratch = dev_alloc<float>(c, c->att_scratch_floats, err, "attention"));
    if (ok && m->n_batch > CUDA_GEMV_MAX_ENTRIES) {  // the tensor-core path's operands
        ok = (c->a_bf16 = dev_alloc<uint16_t>(c, nb * std::max({E, nq, nff}), err, "bf16 activations")) &&
             (c->w_bf16 = dev_alloc<uint16_t>(c, size_t(max_rows_cols), err, "bf16 weights"));
    }
    const std::string dev_err = cuk_error();
    if (ok && !dev_err.empty()) *err = "CUDA: " + dev_err;
    if (!ok || !err->empty()) {
        if (err->empty()) *err = "CUDA: the model could not be placed on the device";
        cuda_model_free(c);
        return nullptr;
    }
    c->sms = cuk_device_sms();
    const char* t = std::getenv("STRATA_PF_TIMING");
    c->timing = t && t[0] == '1';
    return c;
}

void cuda_model_free(cuda_model* c) {
    if (!c) return;
    for (void* p : c->allocs) cuk_free(p);
    for (cuk_event* e : c->events) cuk_event_free(e);
    delete c;
}

size_t cuda_model_weight_bytes(const cuda_model* c) { return c ? c->weight_bytes : 0; }

std::string cuda_device_name() { return cuk_available(nullptr) ? cuk_device_name() : ""; }

namespace {

void* kv_alloc(size_t n) {
    void* p = cuk_alloc(n);
    if (p) {
        cuk_zero(p, n);
        cuk_sync();
    }
    return p;
}
void kv_free(void* p) { cuk_free(p); }
void kv_copy(void* dst, const void* src, size_t n) { cuk_copy(dst, src, n); }
const kv_mem CUDA_KV_MEM = {kv_alloc, kv_free, kv_copy};

// The per-call tables: entries (pos, seq, long RoPE), attention tiles, each (layer, sequence)'s cache view,
// and the rows whose logits / hidden states are wanted. Returns false (+ *err) when a cache is not the device's.
bool upload_tables(strata_model* m, const eval_batch& b, int32_t* n_tiles, int32_t* n_out, int32_t* n_hidden,
                   int32_t span[2], std::string* err) {
    cuda_model* c = m->cuda;
    const model_hparams& hp = m->hp;
    const int32_t n = b.n;
    c->h_entries.resize(size_t(n));
    for (int32_t i = 0; i < n; ++i) {
        const kv_cache* kv = b.kvs[b.seq[i]];
        if (kv->mem != &CUDA_KV_MEM || kv->type != KV_TYPE_F16) {
            *err = "CUDA backend: a cache that is not an f16 device cache";
            return false;
        }
        c->h_entries[size_t(i)] = cuk_entry{b.pos[i], b.seq[i],
                                            !m->rope_inv_freq_long.empty() && kv->n_ctx > hp.rope.n_ctx_orig ? 1 : 0};
    }
    const int per_tile = cuk_attn_tile_entries(hp.n_head / hp.n_head_kv);
    c->h_tiles.clear();
    span[0] = span[1] = 0;  // longest run of positions a tile reads: full layers, window layers
    for (int32_t i = 0; i < n; ++i) {
        if (i == 0 || b.seq[i] != b.seq[i - 1] || i - c->h_tiles.back() >= per_tile) c->h_tiles.push_back(i);
    }
    *n_tiles = int32_t(c->h_tiles.size());
    c->h_tiles.push_back(n);
    for (int32_t t = 0; t < *n_tiles; ++t) {
        const int32_t p0 = b.pos[c->h_tiles[size_t(t)]], p1 = b.pos[c->h_tiles[size_t(t) + 1] - 1];
        span[0] = std::max(span[0], p1 + 1);
        span[1] = std::max(span[1], p1 + 1 - cm::attn_first(p0, hp.n_swa));
    }
    if (c->kv_seq_cap < b.n_seq) {  // grows once to the most sequences seen (at least 32: slots, a prompt read, prefix copies)
        c->kv_seq_cap = std::max(b.n_seq, 32);
        std::string aerr;
        c->d_kvs = dev_alloc<cuk_kv_seq>(c, size_t(hp.n_layer) * size_t(c->kv_seq_cap), &aerr, "cache tables");
        if (!c->d_kvs) {
            *err = aerr;
            c->kv_seq_cap = 0;
            return false;
        }
    }
    c->h_kvs.resize(size_t(hp.n_layer) * size_t(b.n_seq));
    for (int32_t l = 0; l < hp.n_layer; ++l) {
        for (int32_t s = 0; s < b.n_seq; ++s) {
            const kv_cache* kv = b.kvs[s];
            cuk_kv_seq& d = c->h_kvs[size_t(l) * size_t(b.n_seq) + size_t(s)];
            d = cuk_kv_seq{};
            if (!kv) continue;
            d.k = kv->k + kv->layer_off[size_t(l)];
            d.v = kv->v + kv->layer_off[size_t(l)];
            d.head_stride = int64_t(kv->layer_cells[size_t(l)]) * int64_t(kv->head_bytes);
            d.n_ring = kv_is_ring(kv, l) ? kv->n_ring : 0;
            d.n_swa = m->layers[size_t(l)].swa ? hp.n_swa : 0;
        }
    }
    c->h_rows.clear();
    for (int32_t i = 0; i < n; ++i) {
        if (b.want_logits[i]) c->h_rows.push_back(i);
    }
    *n_out = int32_t(c->h_rows.size());
    for (int32_t i = 0; i < n && b.want_hidden && b.hidden; ++i) {
        if (b.want_hidden[i]) c->h_rows.push_back(i);
    }
    *n_hidden = int32_t(c->h_rows.size()) - *n_out;
    cuk_copy(c->d_tokens, b.token, size_t(n) * sizeof(int32_t));
    cuk_copy(c->d_entries, c->h_entries.data(), size_t(n) * sizeof(cuk_entry));
    cuk_copy(c->d_tiles, c->h_tiles.data(), c->h_tiles.size() * sizeof(int32_t));
    cuk_copy(c->d_kvs, c->h_kvs.data(), c->h_kvs.size() * sizeof(cuk_kv_seq));
    if (*n_out) cuk_copy(c->d_out_rows, c->h_rows.data(), size_t(*n_out) * sizeof(int32_t));
    if (*n_hidden) cuk_copy(c->d_hidden_rows, c->h_rows.data() + *n_out, size_t(*n_hidden) * sizeof(int32_t));
    return true;
}

// Position splits for a layer whose tiles read at most `span` positions: enough blocks for the GPU, within the
// partials' scratch.
int attn_splits(const cuda_model* c, const model_hparams& hp, int32_t n, int32_t n_tiles, int32_t span) {
    const int group = hp.n_head / hp.n_head_kv;
    const int64_t blocks = int64_t(n_tiles) * hp.n_head_kv * (group / cuk_attn_heads_per_block(group));
    const int64_t want = int64_t(CUDA_ATT_BLOCKS_PER_SM) * c->sms;
    int64_t split = blocks >= want ? 1 : (want + blocks - 1) / blocks;
    split = std::min<int64_t>({split, CUDA_ATT_MAX_SPLIT, std::max<int64_t>(1, span / 64)});
    while (split > 1 && cuk_attn_scratch_floats(n, hp.n_head, hp.head_dim, int(split)) > c->att_scratch_floats) --split;
    return int(split);
}

// One decoder layer (engine/model.cpp's loop body) over n entries.
void layer_forward(strata_model* m, int32_t il, int32_t n, int32_t n_seq, int32_t n_tiles, const int32_t span[2]) {
    cuda_model* c = m->cuda;
    const model_hparams& hp = m->hp;
    const dev_layer& l = c->layers[size_t(il)];
    const bool swa = m->layers[size_t(il)].swa;
    const int E = hp.n_embd, nq = hp.n_embd_q(), nkv = hp.n_embd_kv(), hd = hp.head_dim;
    timer_mark(c, CP_NORMS, il);
    cuk_rmsnorm(c->x, E, l.attn_norm, c->xn, E, n, E, hp.rms_eps);
    timer_mark(c, CP_QKV, il);
    const dev_weight* qkv[3] = {&l.wq, &l.wk, &l.wv};
    float* qkv_out[3] = {c->q, c->k, c->v};
    mm_shared(c, qkv, qkv_out, 3, c->xn, n);
    timer_mark(c, CP_NORMS, il);
    if (l.bq) {
        cuk_add_bias(c->q, l.bq, n, nq);
        cuk_add_bias(c->k, l.bk, n, nkv);
        cuk_add_bias(c->v, l.bv, n, nkv);
    }
    if (l.q_norm) {
        cuk_rmsnorm(c->q, hd, l.q_norm, c->q, hd, int64_t(n) * hp.n_head, hd, hp.rms_eps);
        cuk_rmsnorm(c->k, hd, l.k_norm, c->k, hd, int64_t(n) * hp.n_head_kv, hd, hp.rms_eps);
    }
    const float* inv = swa ? c->inv_freq_swa : c->inv_freq;
    const float msc = swa ? hp.rope_mscale_swa : hp.rope_mscale;
    const float* inv_long = swa ? nullptr : c->inv_freq_long;
    cuk_rope(c->q, n, hp.n_head, hd, hp.n_rot, hp.rope_neox, c->d_entries, inv, inv_long, msc);
    cuk_rope(c->k, n, hp.n_head_kv, hd, hp.n_rot, hp.rope_neox, c->d_entries, inv, inv_long, msc);
    const cuk_kv_seq* kvs = c->d_kvs + size_t(il) * size_t(n_seq);
    cuk_kv_write(c->k, c->v, n, c->d_entries, kvs, hp.n_head_kv, hd);
    timer_mark(c, CP_ATTENTION, il);
    const int32_t sp = swa && hp.n_swa > 0 ? span[1] : span[0];
    const float scale = hp.attn_scale > 0.0f ? hp.attn_scale : 1.0f / std::sqrt(float(hd));
    cuk_attention(c->q, c->att, n, c->d_entries, c->d_tiles, n_tiles, kvs, hp.n_head, hp.n_head_kv, hd, scale,
                  attn_splits(c, hp, n, n_tiles, sp), sp, c->att_scratch);
    timer_mark(c, CP_WO, il);
    mm(c, l.wo, c->att, n, c->tmp);
    timer_mark(c, CP_NORMS, il);
    if (l.attn_post_norm) cuk_rmsnorm(c->tmp, E, l.attn_post_norm, c->tmp, E, n, E, hp.rms_eps);
    cuk_add(c->x, c->tmp, int64_t(n) * E);
    cuk_rmsnorm(c->x, E, l.ffn_norm, c->xn, E, n, E, hp.rms_eps);
    timer_mark(c, CP_FFN, il);
    const dev_weight* gu[2] = {&l.w_gate, &l.w_up};
    float* gu_out[2] = {c->gate, c->up};
    mm_shared(c, gu, gu_out, 2, c->xn, n);
    timer_mark(c, CP_NORMS, il);
    cuk_glu(c->gate, c->up, int64_t(n) * hp.n_ff, hp.ffn_gelu);
    timer_mark(c, CP_FFN, il);
    mm(c, l.w_down, c->gate, n, c->tmp);
    timer_mark(c, CP_NORMS, il);
    if (l.ffn_post_norm) cuk_rmsnorm(c->tmp, E, l.ffn_post_norm, c->tmp, E, n, E, hp.rms_eps);
    cuk_add(c->x, c->tmp, int64_t(n) * E);
}

}  // namespace

const kv_mem* cuda_kv_mem() { return &CUDA_KV_MEM; }

int cuda_model_eval(strata_model* m, const eval_batch& b, float* logits, std::string* err) {
    cuda_model* c = m->cuda;
    const model_hparams& hp = m->hp;
    const int32_t n = b.n, E = hp.n_embd;
    std::string local;
    if (!err) err = &local;
    c->marks.clear();
    c->mark_layer.clear();
    timer_mark(c, CP_UPLOAD, -1);
    int32_t n_tiles = 0, n_out = 0, n_hidden = 0, span[2] = {0, 0};
    if (!upload_tables(m, b, &n_tiles, &n_out, &n_hidden, span, err)) return -1;
    timer_mark(c, CP_EMBED, -1);
    cuk_get_rows(c->tok_embd.type, c->tok_embd.data, c->tok_embd.row_bytes, E, c->d_tokens, n,
                 hp.embd_scale > 0.0f ? hp.embd_scale : 1.0f, c->x);
    for (int32_t il = 0; il < hp.n_layer; ++il) layer_forward(m, il, n, b.n_seq, n_tiles, span);
    timer_mark(c, CP_NORMS, -1);
    if (n_hidden > 0) {  // embeddings: the final-normed rows, as the head would read them
        cuk_gather_rows(c->x, E, c->d_hidden_rows, n_hidden, c->tmp);
        cuk_rmsnorm(c->tmp, E, c->output_norm, c->tmp, E, n_hidden, E, hp.rms_eps);
    }
    if (n_out > 0 && logits) {
        cuk_gather_rows(c->x, E, c->d_out_rows, n_out, c->xn);
        cuk_rmsnorm(c->xn, E, c->output_norm, c->xn, E, n_out, E, hp.rms_eps);
        timer_mark(c, CP_HEAD, -1);
        mm(c, c->output, c->xn, n_out, c->logits);
        if (hp.logit_softcap > 0.0f) cuk_softcap(c->logits, int64_t(n_out) * hp.n_vocab, hp.logit_softcap);
    }
    timer_mark(c, CP_DOWNLOAD, -1);
    if (n_out > 0 && logits) cuk_copy(logits, c->logits, size_t(n_out) * size_t(hp.n_vocab) * sizeof(float));
    if (n_hidden > 0) cuk_copy(b.hidden, c->tmp, size_t(n_hidden) * size_t(E) * sizeof(float));
    timer_mark(c, CP_DOWNLOAD + 1, -1);  // the end of the timeline (a phase outside the table)
    cuk_sync();
    const std::string dev_err = cuk_error();
    if (!dev_err.empty()) {
        *err = "CUDA: " + dev_err;
        return -1;
    }
    if (c->timing && n > 1) timer_print(c, n, hp.n_layer);
    return 0;
}

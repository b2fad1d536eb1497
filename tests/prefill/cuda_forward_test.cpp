// tests/prefill/cuda_forward_test.cpp — the CUDA backend's forward (prefill/cuda_forward.cpp), its device caches
// (engine/kv_cache.h kv_mem) and model.cpp's backend switch, run on the CPU: this file defines every function of
// prefill/cuda_kernels.h over host memory with the kernels' own per-thread math (prefill/cuda_math.h: the GEMV's
// lanes and shuffle tree, bf16 operands for the tensor-core path, the attention's tiles, splits and combine), so
// the linker takes these instead of the library's CUDA (or no-CUDA) file. What the device adds (launch shapes,
// shared memory, WMMA) is tests/prefill/cuda_kernels_test.cpp's, on a GPU.
// On the default model, or STRATA_TEST_MODEL (tests/prefill/test_cuda_forward_archs.py runs it on tiny random
// llama / qwen2 / qwen3 / gemma3 files: biases, QK-norm, NeoX RoPE, post-norms, GELU, windows), SKIP without
// one, against the CPU engine:
//  - a 100-token prompt in chunks of 32 (the GEMM path) and 12 greedy steps (the GEMV path): the same tokens,
//    except after a near-tie of the CPU's top two logits; logits within 5 % of their spread;
//  - a batch mixing two sequences' decode steps gives each what it gets alone;
//  - a prefix copied from one device cache to another (kv_cache_copy) continues as the original does;
//  - SAVE / RESTORE rows (kv_cache_read_rows / write_rows) round-trip through a device cache unchanged;
//  - embeddings' hidden rows (want_hidden) point where the CPU's do (cosine > 0.999);
//  - --kv q8_0 caches are refused on the device.
// The CPU side runs with 16-bit activations (--act-bits 16) on every kernel set: AVX2's default 8-bit blocks
// move a hidden row of the default model to cosine 0.97, which would fail the test on AVX2-only hosts.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/model.h"
#include "prefill/cuda_kernels.h"
#include "prefill/cuda_math.h"
#include "tests/engine/model_test_util.h"
#include "tests/engine/test_check.h"

// ---- prefill/cuda_kernels.h on the host -----------------------------------------------------------------

namespace {
constexpr int EMU_ATT_ROWS = 32;  // cuda_attention.cuh's ATT_ROWS
constexpr int EMU_SMS = 4;        // few "multiprocessors", so that decode steps split their positions
int g_allocs = 0;                 // live allocations (all freed at the end)

float warp_tree(float* v) {  // the shuffle tree's order: v[i] += v[i ^ o], o = 16 .. 1
    for (int o = 16; o > 0; o /= 2) {
        float w[32];
        for (int i = 0; i < 32; ++i) w[i] = v[i] + v[i ^ o];
        std::memcpy(v, w, sizeof w);
    }
    return v[0];
}
}  // namespace

struct cuk_event {
    int unused;
};

bool cuk_available(std::string*) { return true; }
std::string cuk_device_name() { return "host emulation"; }
int cuk_device_sms() { return EMU_SMS; }
size_t cuk_device_free_bytes() { return size_t(1) << 34; }
void* cuk_alloc(size_t n) {
    ++g_allocs;
    return std::calloc(1, n == 0 ? 1 : n);
}
void cuk_free(void* p) {
    if (p) --g_allocs;
    std::free(p);
}
void cuk_zero(void* p, size_t n) { std::memset(p, 0, n); }
void cuk_copy(void* dst, const void* src, size_t n) { std::memcpy(dst, src, n); }
void cuk_sync() {}
std::string cuk_error() { return ""; }
cuk_event* cuk_event_new() { return new cuk_event{0}; }
void cuk_event_free(cuk_event* e) { delete e; }
void cuk_event_record(cuk_event*) {}
float cuk_event_ms(const cuk_event*, const cuk_event*) { return 0.0f; }

void cuk_get_rows(uint32_t type, const void* w, size_t row_bytes, int64_t n_cols, const int32_t* ids, int n,
                  float scale, float* y) {
    for (int e = 0; e < n; ++e) {
        const uint8_t* row = static_cast<const uint8_t*>(w) + int64_t(ids[e]) * int64_t(row_bytes);
        for (int64_t s = 0; s < n_cols / 32; ++s) {
            float v[32];
            cm::dequant32(type, row, s, v);
            for (int j = 0; j < 32; ++j) y[e * n_cols + s * 32 + j] = scale != 1.0f ? v[j] * scale : v[j];
        }
    }
}

void cuk_gemv(uint32_t type, const void* w, size_t row_bytes, int64_t n_rows, int64_t n_cols, const float* x,
              int64_t x_stride, int n_tok, float* y, int64_t y_stride) {
    for (int64_t r = 0; r < n_rows; ++r) {
        float part[CUK_GEMV_MAX_TOK][32] = {};
        for (int lane = 0; lane < 32; ++lane) {
            float acc[CUK_GEMV_MAX_TOK] = {};
            cm::gemv_lane(type, static_cast<const uint8_t*>(w) + r * int64_t(row_bytes), n_cols, lane, 32, x, x_stride,
                          n_tok, acc);
            for (int t = 0; t < n_tok; ++t) part[t][lane] = acc[t];
        }
        for (int t = 0; t < n_tok; ++t) y[t * y_stride + r] = warp_tree(part[t]);
    }
}

void cuk_dequant_bf16(uint32_t type, const void* w, size_t row_bytes, int64_t n_rows, int64_t n_cols, uint16_t* out) {
    for (int64_t r = 0; r < n_rows; ++r) {
        for (int64_t s = 0; s < n_cols / 32; ++s) {
            float v[32];
            cm::dequant32(type, static_cast<const uint8_t*>(w) + r * int64_t(row_bytes), s, v);
            for (int j = 0; j < 32; ++j) out[r * n_cols + s * 32 + j] = cm::float_to_bf16(v[j]);
        }
    }
}

void cuk_to_bf16(const float* x, int64_t n, uint16_t* y) {
    for (int64_t i = 0; i < n; ++i) y[i] = cm::float_to_bf16(x[i]);
}

void cuk_gemm_bf16(const uint16_t* a, const uint16_t* b, float* c, int64_t m, int64_t n, int64_t k) {
    std::vector<float> af(static_cast<size_t>(m * k)), bf(static_cast<size_t>(k));
    for (size_t i = 0; i < af.size(); ++i) af[i] = cm::bf16_to_float(a[i]);
    for (int64_t j = 0; j < n; ++j) {
        for (int64_t p = 0; p < k; ++p) bf[size_t(p)] = cm::bf16_to_float(b[j * k + p]);
        for (int64_t i = 0; i < m; ++i) {  // 8 partial sums (the tensor cores' order is not the CPU's either)
            const float* ar = af.data() + i * k;
            float s[8] = {};
            for (int64_t p = 0; p < k; p += 8) {
                for (int q = 0; q < 8; ++q) s[q] += ar[p + q] * bf[size_t(p + q)];
            }
            c[i * n + j] = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
        }
    }
}

void cuk_rmsnorm(const float* x, int64_t x_stride, const float* w, float* y, int64_t y_stride, int64_t n_rows, int n,
                 float eps) {
    for (int64_t r = 0; r < n_rows; ++r) {
        double ss = 0.0;
        for (int i = 0; i < n; ++i) ss += double(x[r * x_stride + i]) * double(x[r * x_stride + i]);
        const float scale = static_cast<float>(1.0 / std::sqrt(ss / n + double(eps)));
        for (int i = 0; i < n; ++i) y[r * y_stride + i] = x[r * x_stride + i] * scale * w[i];
    }
}

void cuk_gather_rows(const float* x, int64_t width, const int32_t* rows, int64_t n_rows, float* y) {
    for (int64_t i = 0; i < n_rows; ++i) std::memcpy(y + i * width, x + int64_t(rows[i]) * width, size_t(width) * 4);
}
void cuk_add(float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}
void cuk_add_bias(float* x, const float* b, int64_t n_rows, int n) {
    for (int64_t i = 0; i < n_rows * n; ++i) x[i] += b[i % n];
}
void cuk_scale(float* x, int64_t n, float s) {
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
}
void cuk_softcap(float* x, int64_t n, float c) {
    for (int64_t i = 0; i < n; ++i) x[i] = c * std::tanh(x[i] / c);
}
void cuk_glu(float* g, const float* u, int64_t n, bool gelu) {
    for (int64_t i = 0; i < n; ++i) g[i] = (gelu ? cm::gelu_tanh(g[i]) : cm::silu(g[i])) * u[i];
}

void cuk_rope(float* x, int n, int n_heads, int head_dim, int n_rot, bool neox, const cuk_entry* entries,
              const float* inv_freq, const float* inv_freq_long, float mscale) {
    for (int e = 0; e < n; ++e) {
        const float* inv = entries[e].long_rope && inv_freq_long ? inv_freq_long : inv_freq;
        for (int i = 0; i < n_rot / 2; ++i) {
            const float theta = static_cast<float>(entries[e].pos) * inv[i];
            const float c = std::cos(theta) * mscale, s = std::sin(theta) * mscale;
            int a, b;
            cm::rope_pair_index(i, n_rot, neox, &a, &b);
            for (int h = 0; h < n_heads; ++h) {
                float* v = x + (int64_t(e) * n_heads + h) * head_dim;
                cm::rope_pair(&v[a], &v[b], c, s);
            }
        }
    }
}

void cuk_kv_write(const float* k, const float* v, int n, const cuk_entry* entries, const cuk_kv_seq* kvs, int n_head_kv,
                  int hd) {
    for (int e = 0; e < n; ++e) {
        const cuk_kv_seq kv = kvs[entries[e].seq];
        const int32_t pos = entries[e].pos;
        for (int h = 0; h < n_head_kv; ++h) {
            for (int d = 0; d < hd; ++d) {
                const int64_t off = h * kv.head_stride + (cm::kv_cell(pos, kv.n_ring) * hd + d) * 2;
                const uint16_t kh = cm::float_to_half(k[(int64_t(e) * n_head_kv + h) * hd + d]);
                const uint16_t vh = cm::float_to_half(v[(int64_t(e) * n_head_kv + h) * hd + d]);
                std::memcpy(kv.k + off, &kh, 2);
                std::memcpy(kv.v + off, &vh, 2);
                if (kv.n_ring > 0 && pos >= kv.n_ring && pos % kv.n_ring < kv.n_swa - 1) {
                    std::memcpy(kv.k + off + int64_t(kv.n_ring) * hd * 2, &kh, 2);
                    std::memcpy(kv.v + off + int64_t(kv.n_ring) * hd * 2, &vh, 2);
                }
            }
        }
    }
}

int cuk_attn_heads_per_block(int group) {
    int hps = std::min(group, EMU_ATT_ROWS);
    while (group % hps != 0) --hps;
    return hps;
}
int cuk_attn_tile_entries(int group) { return EMU_ATT_ROWS / cuk_attn_heads_per_block(group); }
size_t cuk_attn_scratch_floats(int n, int n_head, int hd, int n_split) {
    return size_t(n_split) * size_t(n) * size_t(n_head) * size_t(hd + 2);
}

// per tile and split, the block's position range (cuda_attention.cuh), each row through cm::attn_chunk_scale
// in chunks of 32, partials into scratch, then cm::attn_combine
void cuk_attention(const float* q, float* out, int n, const cuk_entry* entries, const int32_t* tiles, int n_tiles,
                   const cuk_kv_seq* kvs, int n_head, int n_head_kv, int hd, float scale, int n_split, int32_t max_span,
                   float* scratch) {
    const int group = n_head / n_head_kv;
    n_split = std::max(1, n_split);
    const int32_t per = (max_span + n_split - 1) / n_split;
    const int32_t split_len = std::max(32, (per + 31) / 32 * 32);
    const int64_t stride = int64_t(n) * n_head * (hd + 2);
    std::vector<float> kf(static_cast<size_t>(hd)), vf(static_cast<size_t>(hd));
    for (int t = 0; t < n_tiles; ++t) {
        const int e0 = tiles[t], e1 = tiles[t + 1];
        const cuk_kv_seq kv = kvs[entries[e0].seq];
        const int32_t lo = cm::attn_first(entries[e0].pos, kv.n_swa), hi = entries[e1 - 1].pos;
        for (int z = 0; z < n_split; ++z) {
            const int32_t pb = lo + z * split_len, pe = std::min(hi + 1, pb + split_len);
            for (int e = e0; e < e1; ++e) {
                const int32_t first = cm::attn_first(entries[e].pos, kv.n_swa), last = entries[e].pos;
                for (int h = 0; h < n_head; ++h) {
                    const int g = h / group;
                    const float* qr = q + (int64_t(e) * n_head + h) * hd;
                    float* part = scratch + z * stride + (int64_t(e) * n_head + h) * (hd + 2);
                    cm::attn_state st = cm::attn_init();
                    std::vector<float> acc(size_t(hd), 0.0f);
                    for (int32_t c0 = pb; c0 < pe; c0 += 32) {
                        if (c0 > last || c0 + 32 <= first) continue;
                        float s[32];
                        for (int j = 0; j < 32; ++j) {
                            const int32_t p = c0 + j;
                            s[j] = -3.0e38f;
                            if (p < pe && p >= first && p <= last) {
                                const uint8_t* kr = kv.k + g * kv.head_stride + cm::kv_cell(p, kv.n_ring) * hd * 2;
                                float dot = 0.0f;
                                for (int d = 0; d < hd; ++d) dot += qr[d] * cm::half_to_float(cm::rd16(kr + 2 * d));
                                s[j] = dot * scale;
                            }
                        }
                        const float corr = cm::attn_chunk_scale(&st, s, 32);
                        for (int d = 0; d < hd; ++d) acc[size_t(d)] *= corr;
                        for (int j = 0; j < 32; ++j) {
                            if (s[j] == 0.0f) continue;
                            const uint8_t* vr = kv.v + g * kv.head_stride + cm::kv_cell(c0 + j, kv.n_ring) * hd * 2;
                            for (int d = 0; d < hd; ++d) acc[size_t(d)] += s[j] * cm::half_to_float(cm::rd16(vr + 2 * d));
                        }
                    }
                    std::memcpy(part, acc.data(), size_t(hd) * 4);
                    part[hd] = st.m;
                    part[hd + 1] = st.l;
                }
            }
        }
    }
    std::vector<float> m(static_cast<size_t>(n_split)), l(static_cast<size_t>(n_split)), acc(static_cast<size_t>(n_split) * static_cast<size_t>(hd));
    for (int e = 0; e < n; ++e) {
        for (int h = 0; h < n_head; ++h) {
            for (int z = 0; z < n_split; ++z) {
                const float* part = scratch + z * stride + (int64_t(e) * n_head + h) * (hd + 2);
                std::memcpy(acc.data() + size_t(z) * size_t(hd), part, size_t(hd) * 4);
                m[size_t(z)] = part[hd];
                l[size_t(z)] = part[hd + 1];
            }
            cm::attn_combine(m.data(), l.data(), acc.data(), hd, n_split, hd, out + (int64_t(e) * n_head + h) * hd);
        }
    }
}

// ---- the tests ------------------------------------------------------------------------------------------

namespace {

// A 100-token prompt in chunks of 32 (above the GEMV's 16 entries): a model with 16-position windows (the
// tiny gemma3 of tests/prefill/test_cuda_forward_archs.py) keeps rings of 47 cells, which this wraps twice.
constexpr int TEST_PROMPT = 100;
constexpr int TEST_BATCH = 32;

int argmax(const float* x, int n) { return int(std::max_element(x, x + n) - x); }

// top-1 minus top-2 of x
float top_margin(const float* x, int n) {
    float a = -3e38f, b = -3e38f;
    for (int i = 0; i < n; ++i) {
        if (x[i] > a) {
            b = a;
            a = x[i];
        } else if (x[i] > b) {
            b = x[i];
        }
    }
    return a - b;
}

// max |a - b| over the spread (max - min) of a
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
    const auto [lo, hi] = std::minmax_element(a.begin(), a.end());
    double worst = 0.0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::fabs(a[i] - b[i])));
    return worst / double(*hi - *lo);
}

// Greedy continuation of `prompt` for n_steps on both models; the tokens must agree until a step where the
// CPU's top two logits are within `tie` of each other (the GPU's bf16 products may then pick the other).
void test_greedy(strata_model* cpu, strata_model* gpu, int n_vocab) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < TEST_PROMPT; ++i) prompt.push_back(int32_t(1 + (i * 7919) % (n_vocab - 1)));
    kv_cache* kc = kv_cache_init(cpu, 256, KV_TYPE_F16);
    kv_cache* kg = kv_cache_init(gpu, 256, KV_TYPE_F16);
    CHECK(kg && kg->mem != nullptr, "the CUDA model's cache is a device cache");
    std::vector<float> lc(static_cast<size_t>(n_vocab)), lg(static_cast<size_t>(n_vocab));
    std::string err;
    for (int p = 0; p < TEST_PROMPT; p += TEST_BATCH) {  // chunks of the batch limit: the GEMM path
        const int n = std::min(TEST_BATCH, TEST_PROMPT - p);
        CHECK(model_eval_seq(cpu, kc, prompt.data() + p, n, p, lc.data(), &err) == 0, "cpu: %s", err.c_str());
        CHECK(model_eval_seq(gpu, kg, prompt.data() + p, n, p, lg.data(), &err) == 0, "gpu: %s", err.c_str());
    }
    CHECK(rel_diff(lc, lg) < 0.05, "prompt logits differ by %.3g of their spread", rel_diff(lc, lg));
    int32_t pos = int32_t(prompt.size()), agree = 0;
    for (int step = 0; step < 12; ++step) {
        const int tc = argmax(lc.data(), n_vocab), tg = argmax(lg.data(), n_vocab);
        if (tc != tg) {
            CHECK(top_margin(lc.data(), n_vocab) < 0.1f, "step %d: token %d on the CPU, %d on the GPU, margin %.3f",
                  step, tc, tg, top_margin(lc.data(), n_vocab));
            break;
        }
        ++agree;
        CHECK(model_eval_seq(cpu, kc, &tc, 1, pos, lc.data(), &err) == 0, "cpu step: %s", err.c_str());
        CHECK(model_eval_seq(gpu, kg, &tg, 1, pos, lg.data(), &err) == 0, "gpu step: %s", err.c_str());
        ++pos;
        CHECK(rel_diff(lc, lg) < 0.05, "step %d logits differ by %.3g of their spread", step, rel_diff(lc, lg));
    }
    std::printf("greedy: %d of 12 steps equal\n", agree);
    kv_cache_free(kc);
    kv_cache_free(kg);
}

// Two sequences' decode entries in one batch get what each gets alone; a copied prefix continues as the
// original; rows round-trip through SAVE / RESTORE.
void test_batch_copy_rows(strata_model* gpu, int n_vocab) {
    const int32_t a_tok[5] = {11, 22, 33, 44, 55}, b_tok[3] = {66, 77, 88};
    kv_cache* ka = kv_cache_init(gpu, 64, KV_TYPE_F16);
    kv_cache* kb = kv_cache_init(gpu, 64, KV_TYPE_F16);
    std::vector<float> la(static_cast<size_t>(n_vocab)), lb(static_cast<size_t>(n_vocab)), both(2 * size_t(n_vocab));
    std::string err;
    model_eval_seq(gpu, ka, a_tok, 4, 0, la.data(), &err);
    model_eval_seq(gpu, kb, b_tok, 2, 0, lb.data(), &err);
    kv_cache* ka2 = kv_cache_init(gpu, 64, KV_TYPE_F16);
    kv_cache_copy(ka2, ka, 4);  // the prefix, before either continues
    // batch: a's token 4 at pos 4, b's token 2 at pos 2
    const int32_t tok[2] = {a_tok[4], b_tok[2]}, pos[2] = {4, 2}, seq[2] = {0, 1};
    const uint8_t want[2] = {1, 1};
    kv_cache* kvs[2] = {ka, kb};
    eval_batch bt;
    bt.n = 2;
    bt.token = tok;
    bt.pos = pos;
    bt.seq = seq;
    bt.want_logits = want;
    bt.kvs = kvs;
    bt.n_seq = 2;
    CHECK(model_eval(gpu, bt, both.data(), &err) == 0, "batch: %s", err.c_str());
    std::vector<float> alone(static_cast<size_t>(n_vocab));
    model_eval_seq(gpu, ka2, &a_tok[4], 1, 4, alone.data(), &err);
    CHECK(std::equal(alone.begin(), alone.end(), both.begin()), "a's entry in the batch differs from a copied prefix alone");
    kv_cache* kb2 = kv_cache_init(gpu, 64, KV_TYPE_F16);
    const size_t rb = kv_cache_row_bytes(kb);
    std::vector<uint8_t> rows(rb * 3), again(rb * 3);
    for (int32_t l = 0; l < model_get_info(gpu).n_layer; ++l) {
        for (int is_v = 0; is_v < 2; ++is_v) {
            kv_cache_read_rows(kb, l, is_v != 0, 3, rows.data());
            kv_cache_write_rows(kb2, l, is_v != 0, 3, rows.data());
            kv_cache_read_rows(kb2, l, is_v != 0, 3, again.data());
            CHECK(rows == again, "layer %d %s rows did not round-trip", l, is_v ? "V" : "K");
        }
    }
    std::vector<float> lb2(static_cast<size_t>(n_vocab));
    model_eval_seq(gpu, kb2, &a_tok[0], 1, 3, lb2.data(), &err);
    model_eval_seq(gpu, kb, &a_tok[0], 1, 3, lb.data(), &err);
    CHECK(lb == lb2, "a restored cache continues differently from the original");
    CHECK(kv_cache_init(gpu, 64, KV_TYPE_Q8_0) == nullptr, "a q8_0 device cache is refused");
    for (kv_cache* kv : {ka, kb, ka2, kb2}) kv_cache_free(kv);
}

// Embeddings (want_hidden): the final-normed rows of entries 1 and 4 of a 5-token read, GPU against CPU, by
// cosine similarity (the bf16 / float orders move each row a little, never its direction).
void test_hidden(strata_model* cpu, strata_model* gpu) {
    const int32_t E = model_get_info(cpu).n_embd;
    const int32_t tok[5] = {5, 6, 7, 8, 9}, pos[5] = {0, 1, 2, 3, 4}, seq[5] = {0, 0, 0, 0, 0};
    const uint8_t want_logits[5] = {0, 0, 0, 0, 0}, want_hidden[5] = {0, 1, 0, 0, 1};
    std::vector<float> hc(2 * static_cast<size_t>(E)), hg(2 * static_cast<size_t>(E));
    for (strata_model* m : {cpu, gpu}) {
        kv_cache* kv = kv_cache_init(m, 16, KV_TYPE_F16);
        kv_cache* kvs[1] = {kv};
        eval_batch b;
        b.n = 5;
        b.token = tok;
        b.pos = pos;
        b.seq = seq;
        b.want_logits = want_logits;
        b.kvs = kvs;
        b.n_seq = 1;
        b.want_hidden = want_hidden;
        b.hidden = (m == cpu ? hc : hg).data();
        std::string err;
        CHECK(model_eval(m, b, nullptr, &err) == 0, "hidden: %s", err.c_str());
        kv_cache_free(kv);
    }
    for (int r = 0; r < 2; ++r) {
        double dot = 0.0, nc = 0.0, ng = 0.0;
        for (int32_t j = 0; j < E; ++j) {
            const double a = hc[size_t(r * E + j)], g = hg[size_t(r * E + j)];
            dot += a * g;
            nc += a * a;
            ng += g * g;
        }
        const double cosine = dot / std::sqrt(nc * ng);
        CHECK(cosine > 0.999, "hidden row %d: cosine %.5f between GPU and CPU", r, cosine);
    }
}

}  // namespace

int main() {
    const std::string path = test_model_path();
    if (path.empty()) {
        std::printf("SKIP: no model (set STRATA_TEST_MODEL)\n");
        return TEST_SKIP_EXIT;
    }
    model_params p;
    p.path = path;
    p.n_threads = 2;
    p.n_batch = TEST_BATCH;
    p.act_bits = 16;  // the CPU reference is the exact mode on every set (AVX2's default of 8 bits is not)
    std::string err;
    strata_model* cpu = model_load(p, &err);
    p.backend = "cuda";
    strata_model* gpu = model_load(p, &err);
    if (!cpu || !gpu) {
        std::fprintf(stderr, "FAIL: load: %s\n", err.c_str());
        return 1;
    }
    CHECK(model_get_info(gpu).backend == "cuda" && model_get_info(cpu).backend == "cpu", "backends as asked");
    const int n_vocab = model_get_info(cpu).n_vocab;
    test_greedy(cpu, gpu, n_vocab);
    test_batch_copy_rows(gpu, n_vocab);
    test_hidden(cpu, gpu);
    model_free(cpu);
    model_free(gpu);
    CHECK(g_allocs == 0, "%d device allocations left after model_free", g_allocs);
    if (g_failures) std::fprintf(stderr, "cuda_forward_test: %d failures\n", g_failures);
    else std::printf("cuda_forward_test: ok\n");
    return g_failures ? 1 : 0;
}

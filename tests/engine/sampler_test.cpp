// tests/engine/sampler_test.cpp — the sampler's later stages (typical_p, top_n_sigma, XTC, Mirostat 1 and 2,
// DRY) against reference computations written here from the methods' definitions, in double, on the same
// logits: the kept candidates and their renormalised probabilities (what lp_post reports), the drawn token for
// the same uniform number, and mirostat's mu from token to token. Also: each stage left at its "off" value
// changes nothing (the token and the kept set equal those of a run without the field).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "sampler.h"
#include "test_check.h"

namespace {

std::mt19937 g_rng(77);

std::vector<float> random_logits(int n, float spread) {
    std::normal_distribution<float> nd(0.0f, spread);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = nd(g_rng);
    return v;
}

struct kept {
    std::map<int, double> p;  // id -> renormalised probability
};

kept kept_of(const sampler_scratch& s) {
    kept k;
    for (size_t i = 0; i < s.n_kept; ++i) k.p[s.cand[i].second] = double(s.prob[i]) / s.kept_sum;
    return k;
}

// softmax(logits / T) over ids, as (id, p) best first (ties: lower id first)
std::vector<std::pair<int, double>> softmax_sorted(const std::vector<float>& logits, const std::vector<int>& ids, double t) {
    std::vector<std::pair<int, double>> v;
    double mx = -INFINITY;
    for (int id : ids) mx = std::max(mx, double(logits[size_t(id)]));
    double sum = 0;
    for (int id : ids) {
        const double e = std::exp((double(logits[size_t(id)]) - mx) / t);
        v.emplace_back(id, e);
        sum += e;
    }
    for (auto& [id, p] : v) p /= sum;
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second != b.second ? a.second > b.second : a.first < b.first; });
    return v;
}

std::vector<int> all_ids(int n) {
    std::vector<int> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[size_t(i)] = i;
    return v;
}

// the token a draw with uniform u takes over (id, p) in that order
int draw_ref(const std::vector<std::pair<int, double>>& d, double u) {
    double total = 0;
    for (const auto& [id, p] : d) total += p;
    double acc = 0;
    for (const auto& [id, p] : d) {
        acc += p / total;
        if (u < acc) return id;
    }
    return d.back().first;
}

void check_same(const kept& got, const std::vector<std::pair<int, double>>& want, const char* what) {
    double total = 0;
    for (const auto& [id, p] : want) total += p;
    CHECK(got.p.size() == want.size(), "%s: kept %zu candidates, reference %zu", what, got.p.size(), want.size());
    for (const auto& [id, p] : want) {
        const auto it = got.p.find(id);
        CHECK(it != got.p.end() && std::fabs(it->second - p / total) < 1e-6, "%s: id %d p %g vs %g", what, id,
              it == got.p.end() ? -1.0 : it->second, p / total);
    }
}

sample_status run(const sampler_params& sp, const std::vector<float>& logits, const std::vector<int32_t>& hist,
                  int64_t pos, sampler_scratch* s, int32_t* tok) {
    return sampler_sample(sp, logits.data(), int32_t(logits.size()), hist.data(), int32_t(hist.size()), pos, sp.seed, s, tok);
}

void test_typical() {
    for (int rep = 0; rep < 20; ++rep) {
        const int n = 300;
        const std::vector<float> logits = random_logits(n, 1.0f + 0.2f * float(rep));
        sampler_params sp;
        sp.temperature = 0.8f;
        sp.top_k = 0;
        sp.typical_p = 0.3f + 0.03f * float(rep);
        sp.seed = uint64_t(rep);
        sampler_scratch s;
        int32_t tok = -1;
        CHECK(run(sp, logits, {}, 5, &s, &tok) == SAMPLE_OK, "typical: sample failed");
        // reference: entropy, candidates by |-ln p - H|, shortest prefix whose mass exceeds typical_p
        const auto d = softmax_sorted(logits, all_ids(n), 0.8);
        double h = 0;
        for (const auto& [id, p] : d) h -= p * std::log(p);
        std::vector<std::pair<double, size_t>> by;
        for (size_t i = 0; i < d.size(); ++i) by.emplace_back(std::fabs(-std::log(d[i].second) - h), i);
        std::stable_sort(by.begin(), by.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        std::set<size_t> keep;
        double acc = 0;
        for (const auto& [dist, i] : by) {
            keep.insert(i);
            acc += d[i].second;
            if (acc > sp.typical_p) break;
        }
        std::vector<std::pair<int, double>> want;
        for (size_t i = 0; i < d.size(); ++i) {
            if (keep.count(i)) want.push_back(d[i]);
        }
        check_same(kept_of(s), want, "typical_p");
        CHECK(tok == draw_ref(want, sampler_uniform(sp.seed, 5)), "typical_p: drew %d", tok);
    }
}

void test_top_n_sigma() {
    for (int rep = 0; rep < 20; ++rep) {
        const int n = 500;
        const std::vector<float> logits = random_logits(n, 2.0f);
        sampler_params sp;
        sp.temperature = 1.3f;
        sp.top_k = 0;
        sp.top_n_sigma = 0.5f + 0.25f * float(rep % 8);
        sp.seed = 100 + uint64_t(rep);
        sampler_scratch s;
        int32_t tok = -1;
        run(sp, logits, {}, 9, &s, &tok);
        double mean = 0, mx = -INFINITY;
        for (float x : logits) {
            mean += x;
            mx = std::max(mx, double(x));
        }
        mean /= n;
        double var = 0;
        for (float x : logits) var += (x - mean) * (x - mean);
        const double cut = mx - double(sp.top_n_sigma) * std::sqrt(var / n);
        std::vector<int> ids;
        for (int i = 0; i < n; ++i) {
            if (logits[size_t(i)] >= cut) ids.push_back(i);
        }
        const auto want = softmax_sorted(logits, ids, 1.3);
        check_same(kept_of(s), want, "top_n_sigma");
        CHECK(tok == draw_ref(want, sampler_uniform(sp.seed, 9)), "top_n_sigma: drew %d", tok);
    }
}

void test_xtc() {
    int fired = 0, spared = 0;
    for (int rep = 0; rep < 40; ++rep) {
        const int n = 50;
        std::vector<float> logits = random_logits(n, 1.0f);
        logits[3] = 4.0f, logits[7] = 3.8f, logits[11] = 3.5f;  // a few likely tokens above the threshold
        sampler_params sp;
        sp.temperature = 1.0f;
        sp.top_k = 0;
        sp.xtc_probability = 0.5f;
        sp.xtc_threshold = 0.1f;
        sp.seed = 900 + uint64_t(rep);
        sampler_scratch s;
        int32_t tok = -1;
        run(sp, logits, {}, 3, &s, &tok);
        auto want = softmax_sorted(logits, all_ids(n), 1.0);
        if (sampler_uniform_xtc(sp.seed, 3) < 0.5) {
            size_t above = 0;
            while (above < want.size() && want[above].second >= 0.1) ++above;
            if (above >= 2) want.erase(want.begin(), want.begin() + long(above - 1));
            ++fired;
        } else {
            ++spared;
        }
        check_same(kept_of(s), want, "xtc");
        CHECK(tok == draw_ref(want, sampler_uniform(sp.seed, 3)), "xtc: drew %d", tok);
    }
    CHECK(fired > 5 && spared > 5, "xtc: the coin fired %d times of 40", fired);
}

// Mirostat over a run of tokens: the state carries mu from one draw to the next, as the reference's does.
void test_mirostat(int version) {
    sampler_params sp;
    sp.temperature = 1.0f;
    sp.mirostat = version;
    sp.mirostat_tau = 3.0f;
    sp.mirostat_eta = 0.2f;
    sp.seed = 4242;
    sampler_state state;
    sampler_scratch s;
    s.state = &state;
    double mu = 2.0 * 3.0;
    const int n = 400;
    for (int step = 0; step < 30; ++step) {
        const std::vector<float> logits = random_logits(n, 2.5f);
        int32_t tok = -1;
        run(sp, logits, {}, step, &s, &tok);
        auto d = softmax_sorted(logits, all_ids(n), 1.0);
        size_t k = 0;
        if (version == 2) {
            while (k < d.size() && -std::log2(d[k].second) <= mu) ++k;
            k = std::max<size_t>(k, 1);
        } else {
            double num = 0, den = 0;
            for (size_t i = 0; i + 1 < std::min<size_t>(d.size(), 100); ++i) {
                const double t = std::log(double(i + 2) / double(i + 1)), b = std::log(d[i].second / d[i + 1].second);
                num += t * b;
                den += t * t;
            }
            const double sh = num / den, eps = sh - 1;
            const double kk = std::pow(eps * std::pow(2.0, mu) / (1 - std::pow(double(n), -eps)), 1 / sh);
            k = std::clamp<size_t>(size_t(std::max(kk, 1.0)), 1, d.size());
        }
        d.resize(k);
        check_same(kept_of(s), d, version == 2 ? "mirostat 2" : "mirostat 1");
        const int want = draw_ref(d, sampler_uniform(sp.seed, step));
        CHECK(tok == want, "mirostat %d step %d: drew %d, reference %d", version, step, tok, want);
        double total = 0, pt = 0;
        for (const auto& [id, p] : d) {
            total += p;
            if (id == want) pt = p;
        }
        mu -= 0.2 * (-std::log2(pt / total) - 3.0);
        CHECK(std::fabs(state.mirostat_mu - mu) < 1e-6, "mirostat %d step %d: mu %g vs %g", version, step, state.mirostat_mu, mu);
    }
}

// DRY's run lengths by brute force: for each candidate t and length m, does the last m tokens' run stand
// earlier, followed by t, with no breaker in the run or as t?
void test_dry_lengths() {
    std::uniform_int_distribution<int> tok(0, 5);
    for (int rep = 0; rep < 200; ++rep) {
        const int n_vocab = 6;
        std::vector<int32_t> h(size_t(5 + rep % 40));
        for (int32_t& t : h) t = tok(g_rng);
        sampler_params sp;
        sp.dry_multiplier = 1.0f;
        sp.dry_penalty_last_n = rep % 3 == 0 ? -1 : 10 + rep % 20;
        if (rep % 2) sp.dry_breakers = {5};
        const int from = sp.dry_penalty_last_n < 0 ? 0 : std::max(0, int(h.size()) - sp.dry_penalty_last_n);
        const std::vector<int32_t> w(h.begin() + from, h.end());
        const int n = int(w.size());
        auto brk = [&](int id) { return std::find(sp.dry_breakers.begin(), sp.dry_breakers.end(), id) != sp.dry_breakers.end(); };
        std::vector<int32_t> got(size_t(n_vocab), 0);
        sampler_dry_lengths(sp, h.data(), int32_t(h.size()), n_vocab, got.data());
        for (int t = 0; t < n_vocab; ++t) {
            int best = 0;
            for (int m = 1; m < n && !brk(t); ++m) {
                bool run_ok = true;
                for (int q = n - m; q < n; ++q) run_ok = run_ok && !brk(w[size_t(q)]);
                if (!run_ok) break;
                for (int end = m - 1; end + 1 < n; ++end) {  // an earlier run w[end-m+1 .. end], followed by t
                    bool eq = w[size_t(end + 1)] == t;
                    for (int q = 0; eq && q < m; ++q) eq = w[size_t(end - q)] == w[size_t(n - 1 - q)];
                    if (eq) best = m;
                }
            }
            CHECK(got[size_t(t)] == std::min(best, 64), "dry rep %d token %d: run %d, brute force %d", rep, t, got[size_t(t)], best);
        }
    }
}

// DRY in the sampler: the repeat's next token loses multiplier * base^(n - allowed), so greedy picks another.
void test_dry_penalty() {
    const std::vector<int32_t> h = {1, 2, 3, 4, 9, 1, 2, 3};  // "1 2 3" again: 4 would extend a run of 3
    std::vector<float> logits(12, 0.0f);
    logits[4] = 2.0f, logits[6] = 1.5f;
    sampler_params sp;
    sp.temperature = 0.0f;
    int32_t tok = -1;
    sampler_scratch s;
    run(sp, logits, h, 8, &s, &tok);
    CHECK(tok == 4, "without DRY greedy takes 4, took %d", tok);
    sp.dry_multiplier = 0.8f, sp.dry_base = 1.75f, sp.dry_allowed_length = 2;
    run(sp, logits, h, 8, &s, &tok);  // penalty 0.8 * 1.75^(3 - 2) = 1.4: 2.0 - 1.4 = 0.6 < 1.5
    CHECK(tok == 6, "with DRY greedy takes 6, took %d", tok);
    sp.dry_breakers = {3};            // the run would end in a breaker: no penalty
    run(sp, logits, h, 8, &s, &tok);
    CHECK(tok == 4, "a breaker ends the run: greedy takes 4, took %d", tok);
    sp.dry_breakers = {};
    sp.dry_allowed_length = 4;        // a run of 3 is allowed
    run(sp, logits, h, 8, &s, &tok);
    CHECK(tok == 4, "allowed length 4: greedy takes 4, took %d", tok);
}

// every new field at its off value gives the same token and kept set as the fields' absence
void test_off_is_off() {
    for (int rep = 0; rep < 10; ++rep) {
        const std::vector<float> logits = random_logits(200, 1.5f);
        sampler_params a;
        a.temperature = 0.9f, a.top_k = 40, a.top_p = 0.9f, a.min_p = 0.05f, a.seed = 7 + uint64_t(rep);
        sampler_params b = a;
        b.typical_p = 1.0f, b.top_n_sigma = -1.0f, b.xtc_probability = 0.0f, b.mirostat = 0, b.dry_multiplier = 0.0f;
        sampler_scratch sa, sb;
        int32_t ta = -1, tb = -1;
        run(a, logits, {1, 2, 1, 2}, 4, &sa, &ta);
        run(b, logits, {1, 2, 1, 2}, 4, &sb, &tb);
        CHECK(ta == tb && kept_of(sa).p == kept_of(sb).p, "off values changed the draw");
    }
}

}  // namespace

int main() {
    test_typical();
    test_top_n_sigma();
    test_xtc();
    test_mirostat(2);
    test_mirostat(1);
    test_dry_lengths();
    test_dry_penalty();
    test_off_is_off();
    if (g_failures) {
        std::fprintf(stderr, "%d failures\n", g_failures);
        return 1;
    }
    std::printf("PASS\n");
    return 0;
}

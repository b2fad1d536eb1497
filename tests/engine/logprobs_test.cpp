// tests/engine/logprobs_test.cpp — host test (no model) of engine/logprobs.cpp and the `logprobs=` key:
// values equal a double log-softmax of (logits + bias), the top K are the K best (ties: lower id), a -inf bias
// gives -inf, and the T/BT suffix is exactly what docs/PROTOCOL.md shows.
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "logprobs.h"
#include "protocol.h"
#include "test_check.h"

namespace {

constexpr int32_t N_VOCAB = 5000;

std::vector<double> reference(const std::vector<float>& z) {
    double top = -INFINITY;
    for (float v : z) top = std::max(top, static_cast<double>(v));
    double sum = 0.0;
    for (float v : z) sum += std::exp(static_cast<double>(v) - top);
    std::vector<double> out;
    for (float v : z) out.push_back(static_cast<double>(v) - top - std::log(sum));
    return out;
}

void test_values_and_top() {
    std::mt19937 rng(7);
    std::normal_distribution<float> d(0.0f, 4.0f);
    std::vector<float> logits(N_VOCAB);
    for (float& v : logits) v = d(rng);
    logits[17] = logits[18] = 30.0f;  // a tie at the top: the lower id first
    sampler_params p;
    p.logit_bias = {{3, 5.0f}, {17, 0.0f}, {99, -std::numeric_limits<float>::infinity()}};
    std::vector<float> z = logits;
    z[3] += 5.0f;
    const std::vector<double> ref = reference(z);
    std::vector<float> work;
    token_logprobs r;
    logprobs_compute(p, logits.data(), N_VOCAB, 3, 20, &work, &r);
    CHECK(std::fabs(r.logprob - ref[3]) < 1e-5, "token 3: %f vs %f", r.logprob, ref[3]);
    CHECK(r.top.size() == 20, "top size %zu", r.top.size());
    CHECK(r.top[0].first == 17 && r.top[1].first == 18, "tie order %d %d", r.top[0].first, r.top[1].first);
    for (size_t j = 0; j < r.top.size(); ++j) {
        const int32_t id = r.top[j].first;
        CHECK(std::fabs(r.top[j].second - ref[static_cast<size_t>(id)]) < 1e-5, "top %zu value", j);
        if (j > 0) CHECK(r.top[j].second <= r.top[j - 1].second, "top %zu not sorted", j);
    }
    // nothing outside the top is better than its last entry
    int32_t better = 0;
    for (int32_t i = 0; i < N_VOCAB; ++i) better += ref[static_cast<size_t>(i)] > r.top.back().second + 1e-9;
    CHECK(better == 19, "%d tokens better than the 20th", better);
    logprobs_compute(p, logits.data(), N_VOCAB, 99, 0, &work, &r);
    CHECK(r.logprob == -INFINITY && r.top.empty(), "-inf bias: %f, %zu top", r.logprob, r.top.size());
}

void test_suffix_and_key() {
    std::vector<float> logits = {0.0f, std::log(3.0f), -INFINITY, 0.0f};  // p = 1/5, 3/5, 0, 1/5
    sampler_params p;
    std::vector<float> work;
    CHECK(logprobs_suffix(p, logits.data(), 4, 1, &work).empty(), "off: no suffix");
    p.n_logprobs = 0;
    CHECK(logprobs_suffix(p, logits.data(), 4, 1, &work) == " lp=-0.510826", "k=0: %s",
          logprobs_suffix(p, logits.data(), 4, 1, &work).c_str());
    p.n_logprobs = 3;
    const std::string s = logprobs_suffix(p, logits.data(), 4, 2, &work);
    CHECK(s == " lp=-inf top=1:-0.510826,0:-1.609438,3:-1.609438", "k=3: %s", s.c_str());
    command c;
    CHECK(protocol_parse("BGEN 0 4 logprobs=20 1,2", 100, &c) && c.sampling.n_logprobs == 20, "logprobs=20");
    CHECK(protocol_parse("BGEN 0 4 logprobs=0 1,2", 100, &c) && c.sampling.n_logprobs == 0, "logprobs=0");
    CHECK(protocol_parse("BGEN 0 4 1,2", 100, &c) && c.sampling.n_logprobs == -1, "absent: off");
    for (const char* bad : {"BGEN 0 4 logprobs=21 1", "BGEN 0 4 logprobs=-1 1", "BGEN 0 4 logprobs=x 1"}) {
        CHECK(!protocol_parse(bad, 100, &c) && c.error.find("logprobs") != std::string::npos, "%s", bad);
    }
}

// lp_post=1: the draw's own distribution (top_k 2 at temperature 1 keeps tokens 1 and 0|3: p 3/4, 1/4)
void test_post_sampling() {
    std::vector<float> logits = {0.0f, std::log(3.0f), -50.0f, -1.0f};  // the sampler refuses non-finite logits
    sampler_params p;
    p.temperature = 1.0f;
    p.top_k = 2;
    p.n_logprobs = 3;
    p.lp_post = true;
    sampler_scratch s;
    int32_t tok = -1;
    CHECK(sampler_sample(p, logits.data(), 4, nullptr, 0, 0, 7, &s, &tok) == SAMPLE_OK && s.n_kept == 2, "kept %zu",
          s.n_kept);
    std::vector<float> work;
    const std::string line = logprobs_line(p, logits.data(), 4, tok, s, &work);
    const std::string want = tok == 1 ? " lp=-0.287682 top=1:-0.287682,0:-1.386294"
                                      : " lp=-1.386294 top=1:-0.287682,0:-1.386294";
    CHECK(line == want, "post: %s (token %d)", line.c_str(), tok);
    p.temperature = 0.0f;  // greedy: all the mass on the token
    CHECK(sampler_sample(p, logits.data(), 4, nullptr, 0, 0, 7, &s, &tok) == SAMPLE_OK && tok == 1, "greedy");
    CHECK(logprobs_line(p, logits.data(), 4, tok, s, &work) == " lp=0.000000 top=1:0.000000", "greedy post");
    p.lp_post = false;  // the model's distribution (the default)
    CHECK(logprobs_line(p, logits.data(), 4, 1, s, &work) == logprobs_suffix(p, logits.data(), 4, 1, &work), "pre");
    command c;
    CHECK(protocol_parse("BGEN 0 4 logprobs=2 lp_post=1 1,2", 100, &c) && c.sampling.lp_post, "lp_post=1");
    CHECK(!protocol_parse("BGEN 0 4 lp_post=2 1,2", 100, &c), "lp_post=2 refused");
}

}  // namespace

int main() {
    test_values_and_top();
    test_suffix_and_key();
    test_post_sampling();
    if (g_failures) std::fprintf(stderr, "%d failure(s)\n", g_failures);
    return g_failures ? 1 : 0;
}

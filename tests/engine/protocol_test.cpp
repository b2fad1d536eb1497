// tests/engine/protocol_test.cpp — host test (no model) of the line parser (engine/protocol.cpp) and the
// sampler (engine/sampler.cpp): every refused line gets a reason, keys parse to their values, and sampling is
// a pure function of (params, logits, history, seed, position).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "protocol.h"
#include "sampler.h"

namespace {

int g_failures = 0;
void check(bool ok, const char* what, int line) {
    if (!ok) {
        std::fprintf(stderr, "FAIL line %d: %s\n", line, what);
        ++g_failures;
    }
}
#define CHECK(x) check((x), #x, __LINE__)

constexpr int32_t N_VOCAB = 1000;

bool parses(const std::string& line, command* c) { return protocol_parse(line, N_VOCAB, c); }

void test_parse_ok() {
    command c;
    CHECK(parses("BGEN 0 16 temperature=0.7 top_p=0.95 top_k=40 min_p=0.05 seed=3 logit_bias=5:-inf,7:2.5 ckpt=0 "
                 "penalty_repeat=1.1 penalty_last_n=32 unknown=1 1,2,999\r", &c));
    CHECK(c.kind == CMD_BGEN && c.slot == 0 && c.max_new == 16);
    CHECK(c.ids == (std::vector<int32_t>{1, 2, 999}));
    CHECK(std::fabs(c.sampling.temperature - 0.7f) < 1e-6f && c.sampling.top_k == 40 && c.sampling.has_seed &&
          c.sampling.seed == 3 && !c.ckpt && c.sampling.penalty_last_n == 32);
    CHECK(c.sampling.logit_bias.size() == 2 && std::isinf(c.sampling.logit_bias[0].second));
    CHECK(parses("BGEN 3 2 5", &c) && c.kind == CMD_BGEN && c.slot == 3 && c.ids.size() == 1);
    CHECK(parses("BSTOP 1", &c) && c.kind == CMD_BSTOP && c.slot == 1);
    CHECK(parses("BSAVE 1 /tmp/a b", &c) && c.kind == CMD_BSAVE && c.slot == 1 && c.path == "/tmp/a b");
    CHECK(parses("VRAM 700", &c) && c.vram_mib == 700);
    CHECK(parses("", &c) && c.kind == CMD_NONE);
    CHECK(parses("QUIT", &c) && c.kind == CMD_QUIT);
    CHECK(parses("BEMB 2 7", &c) && c.kind == CMD_BEMB && c.slot == 2 && c.ids == (std::vector<int32_t>{7}));
}

void test_parse_refused() {
    const char* bad[] = {"BGEN 0", "BGEN 0 4", "BGEN 0 0 1", "BGEN 0 -1 1", "BGEN 0 4 1,1000", "BGEN 0 4 1,,2",
                         "BGEN 0 4 ,1", "BGEN 0 4 1,", "BGEN 0 4 a", "BGEN 0 4 temperature=x 1",
                         "BGEN 0 4 temperature=nan 1", "BGEN 0 4 top_p=2 1", "BGEN 0 4 top_k=-1 1",
                         "BGEN 0 4 seed=-2 1", "BGEN 0 4 logit_bias=1 1", "BGEN 0 4 logit_bias=5000:1 1",
                         "BGEN 0 4 ckpt=2 1", "BGEN 0 4 loose 1", "BGEN 0 4 =3 1", "BGEN 0 4 temperature=1",
                         "BGEN x 4 1", "BSTOP", "BSTOP -1", "BYIELD 1", "BSAVE", "BRESTORE 0   ", "VRAM x", "WHAT",
                         "bgen 0 4 1", "BGEN 0 4 12345678901 1", "BGEN 0 99999999999999999999 1",
                         // retired with the solo session (one path: --batch 1 is one slot)
                         "GEN 4 1", "STOP", "EMB 1", "SAVE /tmp/a", "RESTORE /tmp/a",
                         "BEMB 1", "BEMB x 1", "BEMB 0 temperature=1 1", "BEMB 0 1,1000", "BEMB 0 4 1", "bemb 0 1"};
    for (const char* line : bad) {
        command c;
        const bool ok = parses(line, &c);
        if (ok || c.error.empty()) std::fprintf(stderr, "accepted: %s\n", line);
        CHECK(!ok && !c.error.empty());
    }
}

void test_message() {
    std::string s = protocol_message("a\nb\tc");
    CHECK(s == "a b c");
    std::string long_utf8;
    for (int i = 0; i < 400; ++i) long_utf8 += "\xc3\xa9";  // é, 2 bytes each
    s = protocol_message(long_utf8);
    CHECK(s.size() <= PROTOCOL_MESSAGE_MAX_BYTES && s.size() % 2 == 0);
    CHECK(protocol_fixed1(12.345) == "12.3" && protocol_fixed1(-1) == "0.0");
}

std::vector<float> random_logits(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 3.0f);
    std::vector<float> l(N_VOCAB);
    for (auto& x : l) x = d(rng);
    return l;
}

void test_sampler() {
    sampler_scratch s;
    const std::vector<float> l = random_logits(1);
    int32_t best = 0;
    for (int32_t i = 1; i < N_VOCAB; ++i) if (l[i] > l[best]) best = i;
    sampler_params greedy;
    int32_t t = -1;
    CHECK(sampler_sample(greedy, l.data(), N_VOCAB, nullptr, 0, 0, 0, &s, &t) == SAMPLE_OK && t == best);
    // a bias makes a token the greedy choice; -inf bans the best
    greedy.logit_bias = {{7, 100.0f}};
    sampler_sample(greedy, l.data(), N_VOCAB, nullptr, 0, 0, 0, &s, &t);
    CHECK(t == 7);
    greedy.logit_bias = {{best, -std::numeric_limits<float>::infinity()}};
    sampler_sample(greedy, l.data(), N_VOCAB, nullptr, 0, 0, 0, &s, &t);
    CHECK(t != best);
    // a presence penalty pushes a token that is in the history down
    sampler_params pen;
    pen.penalty_present = 1000.0f;
    const int32_t hist[] = {best};
    sampler_sample(pen, l.data(), N_VOCAB, hist, 1, 1, 0, &s, &t);
    CHECK(t != best);
    // seeded sampling: same (seed, pos) same token; over many positions, several distinct tokens; top_k 1 = greedy
    sampler_params hot;
    hot.temperature = 1.5f;
    hot.top_k = 0;
    int32_t a = -1, b = -1;
    sampler_sample(hot, l.data(), N_VOCAB, nullptr, 0, 5, 42, &s, &a);
    sampler_sample(hot, l.data(), N_VOCAB, nullptr, 0, 5, 42, &s, &b);
    CHECK(a == b);
    std::vector<int32_t> seen;
    for (int64_t pos = 0; pos < 64; ++pos) {
        sampler_sample(hot, l.data(), N_VOCAB, nullptr, 0, pos, 42, &s, &a);
        if (std::find(seen.begin(), seen.end(), a) == seen.end()) seen.push_back(a);
    }
    CHECK(seen.size() > 3);
    hot.top_k = 1;
    sampler_sample(hot, l.data(), N_VOCAB, nullptr, 0, 9, 42, &s, &a);
    CHECK(a == best);
    // top_p tiny and min_p 1 keep only the best
    hot.top_k = 0;
    hot.top_p = 1e-6f;
    sampler_sample(hot, l.data(), N_VOCAB, nullptr, 0, 9, 42, &s, &a);
    CHECK(a == best);
    hot.top_p = 1.0f;
    hot.min_p = 1.0f;
    sampler_sample(hot, l.data(), N_VOCAB, nullptr, 0, 9, 42, &s, &a);
    CHECK(a == best);
    // nonfinite logits: no token
    std::vector<float> nan_l = l;
    nan_l[3] = std::nanf("");
    CHECK(sampler_sample(greedy, nan_l.data(), N_VOCAB, nullptr, 0, 0, 0, &s, &t) == SAMPLE_NONFINITE);
    std::vector<float> inf_l = l;  // in the tail past the greedy scan's lanes (N_VOCAB % 16 != 0)
    inf_l[N_VOCAB - 1] = std::numeric_limits<float>::infinity();
    CHECK(sampler_sample(greedy, inf_l.data(), N_VOCAB, nullptr, 0, 0, 0, &s, &t) == SAMPLE_NONFINITE);
    // the maximum held only by a biased id (bias 0): that id; a -inf bias on it: the runner-up
    greedy.logit_bias = {{best, 0.0f}};
    CHECK(sampler_sample(greedy, l.data(), N_VOCAB, nullptr, 0, 0, 0, &s, &t) == SAMPLE_OK && t == best);
    greedy.logit_bias = {{best, -std::numeric_limits<float>::infinity()}};
    int32_t second = best == 0 ? 1 : 0;
    for (int32_t i = 0; i < N_VOCAB; ++i) if (i != best && l[i] > l[second]) second = i;
    CHECK(sampler_sample(greedy, l.data(), N_VOCAB, nullptr, 0, 0, 0, &s, &t) == SAMPLE_OK && t == second);
    greedy.logit_bias.clear();
    // -0 early and +0 in a later chunk of the scan are equal logits: the lower id
    std::vector<float> zeros(N_VOCAB, -1.0f);
    zeros[5] = -0.0f;
    zeros[600] = 0.0f;
    CHECK(sampler_sample(greedy, zeros.data(), N_VOCAB, nullptr, 0, 0, 0, &s, &t) == SAMPLE_OK && t == 5);
    // greedy without a mask takes the one-pass path; an all-allowing mask takes the general one: the same
    // token over logits with ties and biases (repeated ids, -inf, +large, out of range)
    std::vector<uint32_t> all((N_VOCAB + 31) / 32, 0xFFFFFFFFu);
    uint64_t rng = 12345;
    auto next = [&]() { rng = rng * 6364136223846793005ull + 1442695040888963407ull; return uint32_t(rng >> 33); };
    for (int trial = 0; trial < 400; ++trial) {
        std::vector<float> tl(N_VOCAB);
        for (float& v : tl) v = float(int(next() % 9)) * 0.5f;  // many ties
        sampler_params g;
        for (int k = 0; k < int(next() % 5); ++k) {
            const int32_t id = int32_t(next() % (N_VOCAB + 2)) - 1;
            const float bias = next() % 4 == 0 ? -std::numeric_limits<float>::infinity() : float(int(next() % 7) - 3) * 0.5f;
            g.logit_bias.push_back({id, bias});
        }
        int32_t fast = -1, general = -1;
        const sample_status a1 = sampler_sample(g, tl.data(), N_VOCAB, nullptr, 0, 0, 0, &s, &fast);
        const sample_status a2 = sampler_sample_masked(g, tl.data(), N_VOCAB, nullptr, 0, 0, 0, all.data(), &s, &general);
        CHECK(a1 == a2 && fast == general);
    }
    // the uniform draw is in [0, 1)
    for (int64_t pos = 0; pos < 1000; ++pos) {
        const double u = sampler_uniform(7, pos);
        CHECK(u >= 0.0 && u < 1.0);
    }
}

}  // namespace

int main() {
    test_parse_ok();
    test_parse_refused();
    test_message();
    test_sampler();
    if (g_failures) {
        std::fprintf(stderr, "%d failure(s)\n", g_failures);
        return 1;
    }
    std::printf("protocol_test: ok\n");
    return 0;
}

// engine/logprobs.cpp — see logprobs.h for the contract.
#include "logprobs.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace {

// Better first: higher log-prob, then the lower id (the sampler's own tie rule).
bool entry_better(float va, int32_t ia, float vb, int32_t ib) { return va != vb ? va > vb : ia < ib; }

void append_value(std::string* s, float v) {
    if (v == -INFINITY) {
        s->append("-inf");
        return;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6f", static_cast<double>(v));
    s->append(buf);
}

}  // namespace

void logprobs_compute(const sampler_params& p, const float* logits, int32_t n_vocab, int32_t token, int32_t k,
                      std::vector<float>* work, token_logprobs* out) {
    const float* z = logits;
    if (!p.logit_bias.empty()) {
        work->assign(logits, logits + n_vocab);
        for (const auto& [id, bias] : p.logit_bias) {
            if (id >= 0 && id < n_vocab) (*work)[static_cast<size_t>(id)] += bias;
        }
        z = work->data();
    }
    float top = -INFINITY;
    for (int32_t i = 0; i < n_vocab; ++i) top = std::max(top, z[i]);
    double sum = 0.0;
    if (top != -INFINITY) {
        for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(z[i] - top));
    }
    const double log_norm = top == -INFINITY ? 0.0 : static_cast<double>(top) + std::log(sum);
    auto lp = [&](int32_t i) {
        return z[i] == -INFINITY ? -INFINITY : static_cast<float>(static_cast<double>(z[i]) - log_norm);
    };
    out->logprob = token >= 0 && token < n_vocab ? lp(token) : -INFINITY;
    // top k: a sorted array of at most k (id, logit), best first
    out->top.clear();
    k = std::clamp<int32_t>(k, 0, std::min(LOGPROBS_TOP_MAX, n_vocab));
    for (int32_t i = 0; i < n_vocab && k > 0; ++i) {
        const float v = z[i];
        if (v == -INFINITY) continue;
        if (static_cast<int32_t>(out->top.size()) == k && !entry_better(v, i, out->top.back().second, out->top.back().first)) {
            continue;
        }
        auto at = out->top.end();
        while (at != out->top.begin() && entry_better(v, i, (at - 1)->second, (at - 1)->first)) --at;
        out->top.insert(at, {i, v});
        if (static_cast<int32_t>(out->top.size()) > k) out->top.pop_back();
    }
    for (auto& e : out->top) e.second = lp(e.first);
}

std::string logprobs_suffix(const sampler_params& p, const float* logits, int32_t n_vocab, int32_t token,
                            std::vector<float>* work) {
    if (p.n_logprobs < 0) return std::string();
    token_logprobs r;
    logprobs_compute(p, logits, n_vocab, token, p.n_logprobs, work, &r);
    std::string s = " lp=";
    append_value(&s, r.logprob);
    for (size_t j = 0; j < r.top.size(); ++j) {
        s.append(j == 0 ? " top=" : ",");
        s.append(std::to_string(r.top[j].first));
        s.push_back(':');
        append_value(&s, r.top[j].second);
    }
    return s;
}

// engine/sampler.cpp — see sampler.h for the contract.
#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>

namespace {

uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Best first; equal logits keep the lower id first so the order never depends on the sort's internals.
bool cand_better(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    if (a.first != b.first) return a.first > b.first;
    return a.second < b.second;
}

bool penalties_on(const sampler_params& p) {
    return p.penalty_repeat != 1.0f || p.penalty_freq != 0.0f || p.penalty_present != 0.0f;
}

void apply_penalties(const sampler_params& p, const int32_t* history, int32_t n_history, int32_t n_vocab,
                     float* work) {
    if (!penalties_on(p) || p.penalty_last_n == 0 || n_history <= 0) return;
    const int32_t n_look = p.penalty_last_n < 0 ? n_history : std::min(n_history, p.penalty_last_n);
    std::unordered_map<int32_t, int32_t> counts;
    counts.reserve(static_cast<size_t>(n_look) * 2);
    for (int32_t i = n_history - n_look; i < n_history; ++i) {
        const int32_t id = history[i];
        if (id >= 0 && id < n_vocab) counts[id] += 1;
    }
    for (const auto& [id, count] : counts) {
        float& l = work[id];
        if (p.penalty_repeat != 1.0f) l = l > 0.0f ? l / p.penalty_repeat : l * p.penalty_repeat;
        l -= static_cast<float>(count) * p.penalty_freq + p.penalty_present;
    }
}

// Logits per chunk of max_finite's scan: the first chunk holding the maximum is where the argmax search starts.
constexpr int32_t GREEDY_CHUNK = 512;

// A float's bits as an int32 that orders as the float does (-0 just below +0, at -1); its own inverse.
inline int32_t float_key(int32_t bits) { return bits ^ ((bits >> 31) & 0x7FFFFFFF); }

// The largest of logits[0, n) and the start of the first chunk of GREEDY_CHUNK holding it; false when one
// is not finite. Integer compares on the bits, branch-free per element, so the inner loop vectorises: a
// 262,144-entry vocabulary (Gemma 3) took ~190 us per token in a scalar argmax with a bias check per id.
bool max_finite(const float* logits, int32_t n, float* max_out, int32_t* chunk_out) {
    int32_t kmax = INT32_MIN, chunk = 0;
    uint32_t bad = 0;
    for (int32_t c = 0; c < n; c += GREEDY_CHUNK) {
        const int32_t e = n - c < GREEDY_CHUNK ? n : c + GREEDY_CHUNK;
        int32_t km = INT32_MIN;
        for (int32_t i = c; i < e; ++i) {
            uint32_t u;
            std::memcpy(&u, logits + i, 4);
            bad |= (~u & 0x7F800000u) == 0;  // exponent all ones: an infinity or a NaN
            int32_t key = float_key(int32_t(u));
            key = key == -1 ? 0 : key;  // -0 as +0: equal logits, so the first chunk holding either wins
            km = key > km ? key : km;
        }
        if (km > kmax) {
            kmax = km;
            chunk = c;
        }
    }
    const int32_t bits = float_key(kmax);
    std::memcpy(max_out, &bits, 4);
    *chunk_out = chunk;
    return bad == 0;
}

// Greedy without a mask or penalties, with no copy: the argmax over the ids without a bias, then each biased
// id with its summed bias. Candidates compare as the general path's scan does (higher value, on a tie the
// lower id; NaN never wins), so the token is the same. The argmax: the logits' maximum (max_finite), then
// the first unbiased id holding it from the first chunk that holds it; only when biased ids alone hold it,
// a scan that skips them.
sample_status greedy_direct(const sampler_params& p, const float* logits, int32_t n_vocab, int32_t* token_out) {
    auto biased = [&](int32_t id) {
        for (const auto& [b_id, bias] : p.logit_bias) {
            if (b_id == id) return true;
        }
        return false;
    };
    float top = 0.0f;
    int32_t top_chunk = 0;
    if (!max_finite(logits, n_vocab, &top, &top_chunk)) return SAMPLE_NONFINITE;
    int32_t best = -1;
    float best_v = 0.0f;
    for (int32_t i = top_chunk; i < n_vocab; ++i) {
        if (logits[i] == top && !biased(i)) {
            best = i;
            best_v = top;
            break;
        }
    }
    const bool top_biased = best < 0;
    for (int32_t i = 0; top_biased && i < n_vocab; ++i) {
        const float v = logits[i];
        if ((best < 0 || v > best_v) && !biased(i)) {
            best = i;
            best_v = v;
        }
    }
    for (const auto& [id, unused] : p.logit_bias) {
        if (id < 0 || id >= n_vocab) continue;
        float v = logits[id];
        for (const auto& [b_id, bias] : p.logit_bias) v += b_id == id ? bias : 0.0f;
        if (std::isnan(v)) continue;
        if (best < 0 || v > best_v || (v == best_v && id < best)) {
            best = id;
            best_v = v;
        }
    }
    if (best < 0) return SAMPLE_NONFINITE;
    *token_out = best;
    return SAMPLE_OK;
}

bool dry_on(const sampler_params& p) { return p.dry_multiplier > 0.0f && p.dry_penalty_last_n != 0; }

// Longest run DRY follows: past it base^(n - allowed) only grows a penalty that already bans the token.
constexpr int32_t DRY_MAX_RUN = 64;
constexpr double DRY_MAX_PENALTY = 1e30;   // float range: the penalised logit stays finite

void apply_dry(const sampler_params& p, const int32_t* history, int32_t n_history, int32_t n_vocab, float* work,
               sampler_scratch* s) {
    if (!dry_on(p) || n_history < 2) return;
    s->dry_len.assign(static_cast<size_t>(n_vocab), 0);
    sampler_dry_lengths(p, history, n_history, n_vocab, s->dry_len.data());
    for (int32_t t = 0; t < n_vocab; ++t) {
        const int32_t n = s->dry_len[static_cast<size_t>(t)];
        if (n < p.dry_allowed_length || n == 0) continue;
        const double pen = std::min(DRY_MAX_PENALTY, static_cast<double>(p.dry_multiplier) *
                                                         std::pow(static_cast<double>(p.dry_base), n - p.dry_allowed_length));
        work[t] = static_cast<float>(static_cast<double>(work[t]) - pen);
    }
}

// top_n_sigma over the candidates (finite logits): keep those >= max - n * stddev (population stddev, in
// double). Scale-free, so it is the same before or after the temperature.
void apply_top_n_sigma(const sampler_params& p, std::vector<std::pair<float, int32_t>>* cand) {
    if (p.top_n_sigma <= 0.0f || cand->size() < 2) return;
    double mx = -INFINITY, sum = 0.0;
    for (const auto& c : *cand) {
        mx = std::max(mx, static_cast<double>(c.first));
        sum += c.first;
    }
    const double mean = sum / static_cast<double>(cand->size());
    double var = 0.0;
    for (const auto& c : *cand) var += (c.first - mean) * (c.first - mean);
    const double cut = mx - static_cast<double>(p.top_n_sigma) * std::sqrt(var / static_cast<double>(cand->size()));
    cand->erase(std::remove_if(cand->begin(), cand->end(), [&](const auto& c) { return c.first < cut; }), cand->end());
}

// Keeps the candidates whose flag is set, in their order, at the front of cand and prob; returns their count
// and *sum the kept probabilities' sum.
size_t keep_flagged(sampler_scratch* s, size_t n_keep, const std::vector<char>& keep, double* sum) {
    size_t k = 0;
    *sum = 0.0;
    for (size_t i = 0; i < n_keep; ++i) {
        if (!keep[i]) continue;
        s->cand[k] = s->cand[i];
        s->prob[k] = s->prob[i];
        *sum += s->prob[k];
        ++k;
    }
    return k;
}

// typical_p over the kept candidates (probabilities prob[i] / sum): entropy H = -sum p ln p; candidates by
// |-ln p - H| ascending, ties by their order; the shortest such prefix whose mass exceeds typical_p is kept
// (at least one), the kept ones staying in best-first order.
size_t apply_typical(const sampler_params& p, sampler_scratch* s, size_t n_keep, double* sum) {
    if (p.typical_p >= 1.0f || n_keep < 2) return n_keep;
    double ent = 0.0;
    for (size_t i = 0; i < n_keep; ++i) {
        const double q = s->prob[i] / *sum;
        if (q > 0.0) ent -= q * std::log(q);
    }
    s->order.clear();
    for (size_t i = 0; i < n_keep; ++i) {
        const double q = s->prob[i] / *sum;
        s->order.emplace_back(q > 0.0 ? std::fabs(-std::log(q) - ent) : INFINITY, i);
    }
    std::stable_sort(s->order.begin(), s->order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<char> keep(n_keep, 0);
    double acc = 0.0;
    for (const auto& [unused, i] : s->order) {
        keep[i] = 1;
        acc += s->prob[i] / *sum;
        if (acc > p.typical_p) break;
    }
    return keep_flagged(s, n_keep, keep, sum);
}

// XTC: with chance xtc_probability (the coin at (seed, pos)), the candidates at probability >= xtc_threshold,
// when there are two or more, all go but the least probable of them.
size_t apply_xtc(const sampler_params& p, sampler_scratch* s, size_t n_keep, double* sum, uint64_t seed, int64_t pos) {
    if (p.xtc_probability <= 0.0f || p.xtc_threshold > 0.5f || n_keep < 2) return n_keep;
    if (sampler_uniform_xtc(seed, pos) >= p.xtc_probability) return n_keep;
    size_t above = 0;
    while (above < n_keep && s->prob[above] / *sum >= p.xtc_threshold) ++above;
    if (above < 2) return n_keep;
    std::vector<char> keep(n_keep, 1);
    for (size_t i = 0; i + 1 < above; ++i) keep[i] = 0;
    return keep_flagged(s, n_keep, keep, sum);
}

// Mirostat over all candidates, sorted best first with their temperature-softmax probabilities: truncation by
// mu (v2: surprise -log2 p <= mu, at least one kept; v1: the top k of the Zipf estimate over the best
// MIROSTAT_M), then the draw and mu's update from the drawn token's surprise in the truncated distribution.
constexpr size_t MIROSTAT_M = 100;  // tokens the Zipf exponent is estimated from (the Mirostat paper's m)

size_t mirostat_truncate(const sampler_params& p, sampler_scratch* s, size_t n_keep, double sum, int32_t n_vocab,
                         double mu) {
    if (p.mirostat == 2) {
        size_t k = 0;
        while (k < n_keep && -std::log2(s->prob[k] / sum) <= mu) ++k;
        return std::max<size_t>(k, 1);
    }
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i + 1 < std::min(n_keep, MIROSTAT_M); ++i) {
        const double t = std::log(static_cast<double>(i + 2) / static_cast<double>(i + 1));
        const double b = std::log(static_cast<double>(s->prob[i]) / static_cast<double>(s->prob[i + 1]));
        num += t * b;
        den += t * t;
    }
    if (den <= 0.0 || !std::isfinite(num)) return 1;
    const double s_hat = num / den, eps = s_hat - 1.0;
    const double k = std::pow(eps * std::pow(2.0, mu) / (1.0 - std::pow(static_cast<double>(n_vocab), -eps)), 1.0 / s_hat);
    if (!std::isfinite(k)) return n_keep;
    return std::clamp<size_t>(static_cast<size_t>(std::max(k, 1.0)), 1, n_keep);
}

// The draw over cand[0, n_keep) with weights prob (sum their total), recorded for lp_post (logprobs.h).
sample_status draw(sampler_scratch* s, size_t n_keep, double sum, uint64_t seed, int64_t pos, int32_t* token_out) {
    s->n_kept = n_keep;
    s->kept_sum = sum;
    const double u = sampler_uniform(seed, pos) * sum;
    double acc = 0.0;
    for (size_t i = 0; i < n_keep; ++i) {
        acc += s->prob[i];
        if (u < acc) {
            *token_out = s->cand[i].second;
            return SAMPLE_OK;
        }
    }
    *token_out = s->cand[n_keep - 1].second;
    return SAMPLE_OK;
}

sample_status mirostat_draw(const sampler_params& p, sampler_scratch* s, size_t n_keep, double sum, int32_t n_vocab,
                            uint64_t seed, int64_t pos, int32_t* token_out) {
    sampler_state fresh;
    sampler_state* st = s->state ? s->state : &fresh;
    if (!st->mirostat_started) {
        st->mirostat_started = true;
        st->mirostat_mu = 2.0 * static_cast<double>(p.mirostat_tau);
    }
    const size_t k = mirostat_truncate(p, s, n_keep, sum, n_vocab, st->mirostat_mu);
    double kept = 0.0;
    for (size_t i = 0; i < k; ++i) kept += s->prob[i];
    const sample_status r = draw(s, k, kept, seed, pos, token_out);
    size_t at = 0;
    while (at + 1 < k && s->cand[at].second != *token_out) ++at;
    const double surprise = -std::log2(static_cast<double>(s->prob[at]) / kept);
    st->mirostat_mu -= static_cast<double>(p.mirostat_eta) * (surprise - static_cast<double>(p.mirostat_tau));
    return r;
}

}  // namespace

double sampler_uniform(uint64_t seed, int64_t pos) {
    const uint64_t r = splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(pos) * 0xd1b54a32d192ed03ull);
    return static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);  // 53 bits -> [0, 1)
}

double sampler_uniform_xtc(uint64_t seed, int64_t pos) {
    return sampler_uniform(seed ^ 0x5854432d636f696eull, pos);  // "XTC-coin": another stream of the same counter
}

void sampler_dry_lengths(const sampler_params& p, const int32_t* history, int32_t n_history, int32_t n_vocab,
                         int32_t* len) {
    const int32_t from = p.dry_penalty_last_n < 0 ? 0 : std::max(0, n_history - p.dry_penalty_last_n);
    const int32_t* h = history + from;
    const int32_t n = n_history - from;
    auto breaker = [&](int32_t id) {
        return std::find(p.dry_breakers.begin(), p.dry_breakers.end(), id) != p.dry_breakers.end();
    };
    if (n < 2 || breaker(h[n - 1])) return;
    // each earlier position j whose follower h[j + 1] is inside the window: how far h[.. j] matches the end
    for (int32_t j = n - 2; j >= 0; --j) {
        const int32_t next = h[j + 1];
        if (next < 0 || next >= n_vocab || breaker(next)) continue;
        int32_t m = 0;
        while (m < DRY_MAX_RUN && j - m >= 0 && h[j - m] == h[n - 1 - m] && !breaker(h[j - m])) ++m;
        len[next] = std::max(len[next], m);
    }
}

sample_status sampler_sample(const sampler_params& p, const float* logits, int32_t n_vocab,
                             const int32_t* history, int32_t n_history, int64_t pos, uint64_t seed,
                             sampler_scratch* s, int32_t* token_out) {
    return sampler_sample_masked(p, logits, n_vocab, history, n_history, pos, seed, nullptr, s, token_out);
}

sample_status sampler_sample_masked(const sampler_params& p, const float* logits, int32_t n_vocab,
                                    const int32_t* history, int32_t n_history, int64_t pos, uint64_t seed,
                                    const uint32_t* allow, sampler_scratch* s, int32_t* token_out) {
    s->n_kept = 0;  // greedy unless a draw below says otherwise
    if (p.temperature <= 0.0f && allow == nullptr && !penalties_on(p) && !dry_on(p)) {
        return greedy_direct(p, logits, n_vocab, token_out);
    }
    for (int32_t i = 0; i < n_vocab; ++i) {
        if (!std::isfinite(logits[i])) return SAMPLE_NONFINITE;
    }
    s->work.assign(logits, logits + n_vocab);
    float* work = s->work.data();
    if (allow != nullptr) {
        bool any = false;
        for (int32_t i = 0; i < n_vocab; ++i) {
            if ((allow[i >> 5] >> (i & 31)) & 1u) any = true;
            else work[i] = -INFINITY;
        }
        if (!any) return SAMPLE_NO_TOKEN;
    }
    for (const auto& [id, bias] : p.logit_bias) {
        if (id >= 0 && id < n_vocab) work[id] += bias;
    }
    apply_penalties(p, history, n_history, n_vocab, work);
    apply_dry(p, history, n_history, n_vocab, work, s);

    if (p.temperature <= 0.0f) {
        int32_t best = -1;
        for (int32_t i = 0; i < n_vocab; ++i) {
            if (std::isnan(work[i])) continue;
            if (best < 0 || work[i] > work[best]) best = i;
        }
        if (best < 0) return SAMPLE_NONFINITE;
        if (allow != nullptr && work[best] == -INFINITY) return SAMPLE_NO_TOKEN;
        *token_out = best;
        return SAMPLE_OK;
    }

    // candidates: finite logits only (a bias of -inf bans a token)
    s->cand.clear();
    for (int32_t i = 0; i < n_vocab; ++i) {
        if (std::isfinite(work[i])) s->cand.emplace_back(work[i], i);
    }
    if (s->cand.empty()) return allow != nullptr ? SAMPLE_NO_TOKEN : SAMPLE_NONFINITE;
    apply_top_n_sigma(p, &s->cand);
    size_t n_keep = s->cand.size();
    const bool miro = p.mirostat == 1 || p.mirostat == 2;
    if (!miro && p.top_k > 0 && static_cast<size_t>(p.top_k) < n_keep) {
        n_keep = static_cast<size_t>(p.top_k);
        std::partial_sort(s->cand.begin(), s->cand.begin() + static_cast<std::ptrdiff_t>(n_keep), s->cand.end(),
                          cand_better);
        s->cand.resize(n_keep);
    } else {
        std::sort(s->cand.begin(), s->cand.end(), cand_better);
    }

    // softmax with temperature, in double so that the sums do not depend on float rounding order surprises
    const double inv_t = 1.0 / static_cast<double>(p.temperature);
    const double top = s->cand[0].first;
    s->prob.resize(n_keep);
    double sum = 0.0;
    for (size_t i = 0; i < n_keep; ++i) {
        const double e = std::exp((static_cast<double>(s->cand[i].first) - top) * inv_t);
        s->prob[i] = static_cast<float>(e);
        sum += e;
    }
    if (miro) return mirostat_draw(p, s, n_keep, sum, n_vocab, seed, pos, token_out);
    n_keep = apply_typical(p, s, n_keep, &sum);
    // min_p: drop candidates below min_p times the best one's probability (the best kept one's prob[0])
    if (p.min_p > 0.0f) {
        size_t k = 1;
        while (k < n_keep && s->prob[k] >= p.min_p * s->prob[0]) ++k;
        sum = 0.0;
        for (size_t i = 0; i < k; ++i) sum += s->prob[i];
        n_keep = k;
    }
    // top_p: the smallest best-first prefix whose mass reaches top_p
    if (p.top_p < 1.0f) {
        double acc = 0.0;
        size_t k = 0;
        while (k < n_keep) {
            acc += s->prob[k] / sum;
            ++k;
            if (acc >= p.top_p) break;
        }
        sum = 0.0;
        for (size_t i = 0; i < k; ++i) sum += s->prob[i];
        n_keep = k;
    }
    n_keep = apply_xtc(p, s, n_keep, &sum, seed, pos);
    return draw(s, n_keep, sum, seed, pos, token_out);
}

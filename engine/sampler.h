// engine/sampler.h — picks the next token from one row of logits.
//
// Contract:
//  - Pure: the same (params, logits, history, seed, pos) always gives the same token, whatever thread count
//    the model ran with, whichever slot the sequence lives in, and whatever other sequences do.
//  - The random draw is counter based: one uniform number per (seed, pos), pos being the position the new
//    token will take. A request that is moved (between slots) draws the same
//    numbers it would have drawn without moving.
//  - Order of the stages: the grammar's allow mask (sampler_sample_masked), logit_bias, penalties over the last
//    penalty_last_n tokens of the sequence, DRY, then greedy (temperature <= 0), or top_n_sigma -> top_k ->
//    temperature softmax -> typical_p -> min_p -> top_p -> XTC -> draw; with mirostat (1 or 2) instead:
//    top_n_sigma -> temperature softmax -> mirostat's truncation -> draw (top_k, typical_p, min_p, top_p and XTC
//    are not used, as llama.cpp's mirostat chains are temperature + mirostat alone). Every stage after the
//    softmax works on the kept candidates' renormalised probabilities.
//  - State: mirostat's mu is the one value that carries from one token to the next. It lives in the request's
//    sampler_state (sampler_scratch::state, set by the caller before each draw; the caller keeps one per
//    request, so a request's draws see only its own history). The XTC coin is a second counter-based draw per
//    (seed, pos), independent of the token draw.
//  - Knows nothing of the protocol text (engine/protocol.cpp parses the keys into sampler_params).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

struct sampler_params {
    float temperature = 0.0f;        // <= 0: greedy
    int32_t top_k = 20;              // <= 0 or >= n_vocab: off (the reference engine's default is 20)
    float top_p = 1.0f;              // 1: off
    float min_p = 0.0f;              // 0: off
    float penalty_repeat = 1.0f;     // 1: off; > 1 pushes repeated tokens down
    float penalty_freq = 0.0f;       // subtracted once per occurrence
    float penalty_present = 0.0f;    // subtracted once if present
    int32_t penalty_last_n = 64;     // how many of the sequence's last tokens the penalties look at
    bool has_seed = false;
    uint64_t seed = 0;
    std::vector<std::pair<int32_t, float>> logit_bias;  // (id, bias) added before everything else
    int32_t n_logprobs = -1;         // logprobs=K: report each sampled token's log-prob and the top K
                                     // (engine/logprobs.h); -1 = off, 0..LOGPROBS_TOP_MAX
    bool lp_post = false;            // lp_post=1: those from the distribution the draw used (logprobs.h)
    // typical_p: keep the tokens whose surprise -ln p is closest to the distribution's entropy, smallest set
    // whose mass passes typical_p (Meister et al.'s locally typical sampling); 1: off
    float typical_p = 1.0f;
    float top_n_sigma = 0.0f;        // > 0: keep logits >= max - top_n_sigma * stddev of the candidates; <= 0: off
    float xtc_probability = 0.0f;    // XTC: with this chance per token, drop every candidate at p >= xtc_threshold
    float xtc_threshold = 0.1f;      //   but the least probable of them (only when >= 2 pass); > 0.5: off
    int32_t mirostat = 0;            // 0 off; 1: Mirostat (k from the Zipf estimate); 2: Mirostat 2.0
    float mirostat_tau = 5.0f;       // target surprise in bits
    float mirostat_eta = 0.1f;       // learning rate of mu
    // DRY ("don't repeat yourself"): a token that would extend a repeat of the sequence's own earlier tokens by
    // a run of n >= dry_allowed_length loses dry_multiplier * dry_base^(n - dry_allowed_length) of its logit;
    // the run never crosses a dry_breakers token; dry_penalty_last_n: how far back (-1: the whole sequence)
    float dry_multiplier = 0.0f;     // 0: off
    float dry_base = 1.75f;
    int32_t dry_allowed_length = 2;
    int32_t dry_penalty_last_n = -1;
    std::vector<int32_t> dry_breakers;  // token ids (the server maps llama.cpp's breaker strings to ids)
};

// A request's own state across its tokens (see "State" above): one per request, never shared.
struct sampler_state {
    bool mirostat_started = false;
    double mirostat_mu = 0.0;        // 2 * tau at the first mirostat draw, then mu -= eta * (surprise - tau)
};

// Reused buffers so that sampling does not allocate per token.
struct sampler_scratch {
    std::vector<float> work;                    // (n_vocab) biased, penalised logits
    std::vector<std::pair<float, int32_t>> cand;// candidates (logit, id), sorted best first
    std::vector<float> prob;                    // candidate probabilities
    // the last draw's distribution: cand[0, n_kept) with prob[i] / kept_sum (after top_k, temperature, min_p,
    // top_p); n_kept 0 = the last pick was greedy (all mass on the token)
    size_t n_kept = 0;
    double kept_sum = 0.0;
    sampler_state* state = nullptr;             // the request being sampled (set by the caller before a draw)
    std::vector<int32_t> dry_len;               // (n_vocab) DRY: the longest repeat each token would extend
    std::vector<std::pair<double, size_t>> order;  // typical_p: (|surprise - entropy|, candidate index)
};

enum sample_status : int32_t {
    SAMPLE_OK = 0,
    SAMPLE_NONFINITE = 1,   // the logits held a NaN or an infinity: no token
    SAMPLE_NO_TOKEN = 2,    // the allow mask left no token
};

// Picks a token. history/n_history: the sequence so far (prompt + generated), for the penalties.
// pos: the position the new token takes (the counter of the draw). seed: the request's seed.
sample_status sampler_sample(const sampler_params& params, const float* logits, int32_t n_vocab,
                             const int32_t* history, int32_t n_history, int64_t pos, uint64_t seed,
                             sampler_scratch* scratch, int32_t* token_out);

// The same with an allow mask (bit i of allow[i / 32] set = token i may be picked; nullptr = all): a
// disallowed token is as if its logit_bias were -inf, applied first.
sample_status sampler_sample_masked(const sampler_params& params, const float* logits, int32_t n_vocab,
                                    const int32_t* history, int32_t n_history, int64_t pos, uint64_t seed,
                                    const uint32_t* allow, sampler_scratch* scratch, int32_t* token_out);

// The uniform number in [0, 1) that sampling at (seed, pos) draws.
double sampler_uniform(uint64_t seed, int64_t pos);

// The XTC coin at (seed, pos): a second uniform number in [0, 1), independent of sampler_uniform's.
double sampler_uniform_xtc(uint64_t seed, int64_t pos);

// DRY's run lengths: len[t] = the longest n such that the last n tokens of history[from, n_history) (from =
// n_history - dry_penalty_last_n, or 0) also stand earlier, immediately followed by t, with no breaker inside
// the run or as t; 0 where none. For tests and the sampler alike.
void sampler_dry_lengths(const sampler_params& p, const int32_t* history, int32_t n_history, int32_t n_vocab,
                         int32_t* len);

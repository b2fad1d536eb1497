// engine/sampler.h — picks the next token from one row of logits.
//
// Contract:
//  - Pure: the same (params, logits, history, seed, pos) always gives the same token, whatever thread count
//    the model ran with, whichever slot the sequence lives in, and whatever other sequences do.
//  - The random draw is counter based: one uniform number per (seed, pos), pos being the position the new
//    token will take. A request that is moved (promoted to a slot, yielded, sent back solo) draws the same
//    numbers it would have drawn without moving.
//  - Order of the stages: the grammar's allow mask (sampler_sample_masked), logit_bias, penalties over the last penalty_last_n tokens of the sequence, then
//    greedy (temperature <= 0) or top_k -> temperature softmax -> min_p -> top_p -> draw.
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

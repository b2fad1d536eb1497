// engine/logprobs.h — the log-probabilities a request asks for with `logprobs=K` (docs/PROTOCOL.md).
//
// Contract:
//  - The distribution is the model's own over the whole vocabulary, after logit_bias and before everything
//    else the sampler does: before the repetition/frequency/presence penalties, the grammar's mask,
//    temperature, top_k, min_p and top_p. So at temperature 0 without penalties or a grammar the sampled
//    token is the top entry.
//  - log p(i) = z_i - log(sum_j exp(z_j)), z = logits + bias (exponentials in float, summed in double:
//    within 1e-5 of a double log-softmax); a token whose bias is -inf has log-prob -inf (written "-inf");
//    non-finite logits never reach here (the sampler refused them).
//  - Cost: nothing when the request did not ask; when it did, one pass over n_vocab for the maximum, one for
//    the sum of exponentials and one for the top K (a sorted array of at most K entries), per sampled token.
//  - Pure; the scratch vector is the caller's so that nothing allocates per token once warm.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sampler.h"

// The most alternatives a request may ask for (OpenAI's top_logprobs bound).
constexpr int32_t LOGPROBS_TOP_MAX = 20;

struct token_logprobs {
    float logprob = 0.0f;                             // the sampled token's
    std::vector<std::pair<int32_t, float>> top;       // (id, log-prob), best first, ties by lower id
};

// Computes the sampled token's log-prob and the top k (k <= LOGPROBS_TOP_MAX) from one row of logits.
void logprobs_compute(const sampler_params& params, const float* logits, int32_t n_vocab, int32_t token,
                      int32_t k, std::vector<float>* work, token_logprobs* out);

// The words a BT line carries after the token id when the request asked: " lp=<f> top=<id>:<f>,..."
// (" lp=<f>" alone when k is 0); "" when params.n_logprobs < 0.
std::string logprobs_suffix(const sampler_params& params, const float* logits, int32_t n_vocab, int32_t token,
                            std::vector<float>* work);

// The same words for `lp_post=1` (llama-server's post_sampling_probs): the log of each probability in the
// distribution the token was drawn from, as the sampler left it in `s` (its kept candidates after penalties,
// the grammar's mask, top_k, temperature, min_p and top_p, renormalised): the top K of the kept ones only
// (fewer when fewer were kept); a greedy pick is the token alone at 0 (probability 1).
std::string logprobs_post_suffix(const sampler_params& params, const sampler_scratch& s, int32_t token);

// What a BT line of the token carries: logprobs_post_suffix when params.lp_post, else logprobs_suffix.
std::string logprobs_line(const sampler_params& params, const float* logits, int32_t n_vocab, int32_t token,
                          const sampler_scratch& s, std::vector<float>* work);

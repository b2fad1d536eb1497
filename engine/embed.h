// engine/embed.h — embeddings (EMB / BEMB, docs/PROTOCOL.md "Embeddings"): the prompt is read like any other
// (no token is sampled) and its vector is the mean, over every prompt token, of the final-normed hidden state
// (rmsnorm(x) * output_norm: the rows the output head reads), L2-normalised. This is llama.cpp's
// `--pooling mean` with its default `--embd-normalize 2`.
//
// Contract:
//  - The mean is over all n prompt tokens, so an embedding reads every position itself (no prefix reuse: the
//    hidden states of reused positions would be missing). What it writes into a cache is ordinary K/V of
//    those tokens, valid for later reuse.
//  - Sums are kept in double, so the order chunks arrive in (step budgets, chunk sizes) changes the result by
//    float rounding of the final division only.
//  - On the line the vector is `<n_embd> <base64>`: base64 (RFC 4648, padded) of the n_embd float32 values,
//    little-endian, exactly the bytes OpenAI's `encoding_format: base64` carries.
//  - Pure math and text: no protocol state, no stdout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model.h"

struct embed_pool {
    std::vector<double> sum;  // (n_embd) sum of the hidden rows added so far
    int32_t n = 0;            // rows added

    void reset(int32_t n_embd);
    // Adds n_rows rows of n_embd floats (row-major).
    void add(const float* rows, int32_t n_rows, int32_t n_embd);
    // The pooled, L2-normalised vector as `<n_embd> <base64>`; "" when it is not finite or all zero.
    std::string payload() const;
};

// base64 of n little-endian float32 values.
std::string embed_base64(const float* v, size_t n);

// Evaluates tokens[0, len) of one sequence at positions pos.. into kv (no logits) and adds their final-normed
// hidden rows to *pool. `hidden` is scratch, resized here. Returns model_eval's result (0, or -1 with *err).
int embed_eval_chunk(strata_model* model, kv_cache* kv, const int32_t* tokens, int32_t len, int32_t pos,
                     std::vector<float>* hidden, embed_pool* pool, std::string* err);

// engine/drafting.h — drafting (speculative decoding): proposing the next few tokens cheaply, verifying them
// in one multi-token model step, keeping the longest agreeing prefix plus the model's own next token.
//
// Contract:
//  - Two proposers. Prompt lookup: the last n tokens (n = DRAFT_NGRAM_MAX down to DRAFT_NGRAM_MIN) are looked
//    up in the sequence so far (prompt and output), most recent earlier occurrence first, and the tokens that
//    followed it are proposed. A draft model (--draft-model FILE: a second GGUF with the same vocabulary, its
//    own KV cache per sequence) proposes its greedy continuation.
//  - Verification (draft_verify) samples every position with the request's own sampler, in order, and stops
//    at the first token that differs from the draft: that token is the model's own next one. Both proposers
//    are deterministic (q is a point mass on the proposal), so this is the standard speculative acceptance
//    rule (accept d with probability min(1, p(d)/q(d)) = p(d); on a rejection the token drawn comes from p
//    with d removed, renormalised) and the output follows p exactly. The draw of every position is the
//    sampler's counter-based one (seed, position), so a seeded request gives the same tokens with drafting
//    on and off, and greedy output is identical token for token.
//  - Grammars: a constrained request drafts with its mask applied: every verified position is sampled
//    through grammar_sample (mask first, then the matcher is fed the token), so a draft the grammar forbids
//    is simply never accepted, and the matcher only ever sees emitted tokens.
//  - Rollback: a rejected draft's K/V rows lie past the accepted prefix; the caller truncates its seq_state
//    (session.h: positions past tokens.size() are garbage), so prefix reuse, checkpoints and the conversation
//    cache see only accepted tokens.
//  - draft_ctl adapts k to the acceptance: it grows while every draft is accepted, falls to the accepted
//    length after a rejection, and after DRAFT_MISSES_TO_PAUSE verifications in a row that accepted nothing it
//    pauses drafting for a number of tokens that doubles each time (DRAFT_PAUSE_MIN..DRAFT_PAUSE_MAX), so on
//    text that does not repeat drafting costs almost nothing.
//  - Single-threaded: only the serve loop calls in.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "grammar.h"
#include "model.h"
#include "sampler.h"
#include "session.h"

// Most tokens proposed in one step. 8: a rewrite's runs of copied text are long, but each extra position
// is evaluated even when the first one is rejected; 8 keeps a step's batch small next to the slots' budget.
constexpr int32_t DRAFT_K_MAX = 8;
// k of a request's first proposal.
constexpr int32_t DRAFT_K_START = 4;
// Lookup n-gram lengths: the longest match first; below 2 tokens a match is mostly chance.
constexpr int32_t DRAFT_NGRAM_MAX = 4;
constexpr int32_t DRAFT_NGRAM_MIN = 2;
// Verifications in a row that accepted nothing before drafting pauses, and the pause in tokens.
constexpr int32_t DRAFT_MISSES_TO_PAUSE = 2;
constexpr int32_t DRAFT_PAUSE_MIN = 16;
constexpr int32_t DRAFT_PAUSE_MAX = 256;

enum drafting_mode : int32_t {
    DRAFTING_OFF = 0,
    DRAFTING_LOOKUP,  // prompt lookup only
    DRAFTING_MODEL,   // the draft model only
    DRAFTING_AUTO,    // prompt lookup where it finds a match, else the draft model when there is one
};

// "off", "lookup", "model", "auto" -> mode; false for anything else.
bool drafting_mode_parse(const std::string& text, drafting_mode* out);
const char* drafting_mode_name(drafting_mode mode);

// Prompt lookup over hist[0, n_hist): appends k proposed tokens to *out (0 when nothing matches); returns
// how many. A match near the end continues itself periodically (a repeated run keeps being proposed).
int32_t draft_lookup(const int32_t* hist, int32_t n_hist, int32_t k, std::vector<int32_t>* out);

// The adaptive k of one request.
struct draft_ctl {
    int32_t k = DRAFT_K_START;
    int32_t pause = 0;               // tokens left with drafting paused
    int32_t pause_next = DRAFT_PAUSE_MIN;
    int32_t misses = 0;              // verifications in a row that accepted nothing
    int64_t offered = 0;             // draft tokens verified (DONE's drafts_off)
    int64_t accepted = 0;            // draft tokens accepted (DONE's drafts_acc)
    int64_t steps = 0;               // verifications that carried a draft (DONE's drafts_n=)

    // k for the next step (0 while paused).
    int32_t want() const { return pause > 0 ? 0 : k; }
    // One verification: `off` tokens proposed, `acc` of them accepted.
    void record(int32_t off, int32_t acc);
    // Tokens emitted without a draft (counts the pause down).
    void advance(int32_t n_tokens);
};

// A loaded draft model and its scratch. Each sequence keeps its own draft seq_state (its KV cache holds
// exactly its tokens, as for the target).
struct draft_model {
    strata_model* model = nullptr;
    int32_t n_ctx = 0;
    kv_type type = KV_TYPE_F16;
    int32_t n_batch = 0;
    std::vector<float> logits;       // (n_vocab)
};

// Loads `path` as a draft for `target_path`: refused (nullptr + *err, one line) when the file cannot be
// loaded or its vocabulary differs from the target's (size or any token's text).
std::unique_ptr<draft_model> draft_model_load(const std::string& path, const std::string& target_path,
                                              int32_t n_target_vocab, int32_t n_threads, int32_t n_ctx,
                                              kv_type type, int32_t n_batch, std::string* err);
void draft_model_free(draft_model* dm);

// Brings dseq in line with hist[0, n_hist) (keeps the common start, reads the rest) and appends the draft
// model's greedy continuation of up to k tokens to *out. Returns how many (0 on a failure of the draft model,
// which then drops dseq's tokens).
int32_t draft_model_propose(draft_model* dm, seq_state* dseq, const int32_t* hist, int32_t n_hist, int32_t k,
                            std::vector<int32_t>* out);

// Proposes drafts for a sequence whose history (prompt, generated, the pending token last) is hist.
// dseq: this sequence's draft-model state (nullptr: no draft model). Returns the count appended to *out.
int32_t draft_propose(drafting_mode mode, draft_model* dm, seq_state* dseq, const int32_t* hist,
                      int32_t n_hist, int32_t k, std::vector<int32_t>* out);

// Verification of one sequence's step. logits: (n_drafts + 1, n_vocab), row j the logits after the pending
// token and drafts[0, j). hist: the sequence with the pending token and every draft appended (so row j's
// history is hist[0, n_base + j), its draw position n_base + j). emit(token) is called for each token kept,
// in order; it returns false to stop (end of the request). Stops after the first token that differs from
// the draft, after the token past the last draft, on emit's false, or on a sampler status other than OK
// (returned; the tokens before it were emitted). *n_emitted counts the emit calls, *n_accepted the emitted
// tokens equal to their draft.
sample_status draft_verify(grammar_matcher* gm, const sampler_params& sp, uint64_t seed, const float* logits,
                           int32_t n_vocab, const int32_t* hist, int32_t n_base, const int32_t* drafts,
                           int32_t n_drafts, sampler_scratch* scratch, const std::function<bool(int32_t)>& emit,
                           int32_t* n_emitted, int32_t* n_accepted);

// engine/slots.h — batch slots (`--batch N`): up to 8 requests that read and decode together.
//
// Contract:
//  - Each slot owns its KV cache, its tokens, its sampling parameters and seed; nothing of one slot reaches
//    another (BPP/BT/BDONE lines always name the slot whose sequence produced them).
//  - A slot is IDLE, READING (its prompt is read in the step loop, chunk by chunk) or DECODING.
//  - slot_table::step runs one step: one model_eval batch under a token budget (--step-tokens): one entry
//    for every decoding slot first, then prompt chunks of the reading slots, shortest remaining first, so a
//    short prompt admitted during a long read gets its first token in the next step while the long read goes
//    on. One pass over the weights for all of it; each entry is computed from its own sequence alone.
//  - A BSTOP acts at the next step in either phase (BDONE <slot> ... cancel).
//  - A slot holds its prompt and every generated token except `pending` (the last one sampled, not yet fed).
//    When it finishes it is idle and keeps that conversation (prefix reuse, its turn checkpoint), so "the
//    slot holds prompt + generated minus the last" holds after BDONE too; a read that was cancelled holds
//    what it read.
//  - An embedding slot (BEMB, engine/embed.h) reads like any other and is scheduled with the reads; its
//    entries ask for hidden rows instead of logits; when its read ends it writes BVEC and BDONE (generated 0)
//    and holds its prompt, like a request that ended at once.
//  - Acceptance (prefix reuse into the slot, the BACC line) is the serve loop's: it calls accept().
//  - One slot (`--batch 1`, the server's `--parallel 1`): nothing can be admitted beside a read, so the read
//    goes in --chunk pieces on the boundaries of prefill/chunking.hpp (set_read_chunk) instead of sharing
//    the --step-tokens budget with other slots' first tokens.
//  - Timing (STRATA_PF_TIMING=1: prefill/pf_timer.h; STRATA_STEP_TIMING: engine/cpu/step_timer.h): a request
//    admitted while no other slot is busy is timed (time_admission): its prompt read gives one `pf timing:`
//    and one `prefill timing:` line when the read ends, its decode one `step timing:` line at BDONE. An
//    admission while a timed request runs abandons that timing (its figures would mix two requests), so
//    with one slot every request is timed and with more the lone ones are.
//  - Drafting (engine/drafting.h): before a step, propose() gives each decoding slot that drafts up to k
//    proposed tokens; its entries are then the pending token and its drafts (all wanting logits), and
//    after_eval keeps the agreeing prefix plus the model's own next token, truncating the slot's tokens past
//    it (rollback). A slot's drafts never change its tokens: greedy and seeded output equal drafting off.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "embed.h"
#include "drafting.h"
#include "grammar.h"
#include "model.h"
#include "prefill/pf_timer.h"
#include "sampler.h"
#include "session.h"

class stdin_reader;

constexpr int32_t SLOTS_MAX = 8;

enum slot_phase : int32_t {
    SLOT_IDLE = 0,
    SLOT_READING,
    SLOT_DECODING,
};

struct slot {
    seq_state st;                 // kv is allocated at first use
    slot_phase phase = SLOT_IDLE;
    int64_t seq = 0;              // number of the BGEN that admitted it (for BSTOP staleness)
    // the read
    std::vector<int32_t> prompt;  // (n_prompt) the request's ids
    int32_t reused = 0;           // positions taken from a cache at acceptance
    int32_t n_read = 0;           // prompt tokens evaluated by this request
    int32_t ckpt = 0;             // turn checkpoint of the prompt
    double prompt_ms = 0.0;       // acceptance to first token (or to the end of the read)
    std::chrono::steady_clock::time_point t_acc;  // accepted
    // decoding
    int32_t pending = -1;         // sampled, not yet fed
    int32_t generated = 0;        // tokens produced, the first one included
    int32_t max_new = 0;
    sampler_params sampling;
    sampler_state sstate;         // the request's own sampler state (mirostat's mu), new at admission
    uint64_t seed = 0;
    std::shared_ptr<grammar_matcher> gm;  // the request's grammar (grammar=), or nullptr
    bool drafting = false;        // this request drafts (engine mode not off, no draft=0)
    bool close_now = false;       // BCLOSE: the grammar's shortest completion from the next token on
    draft_ctl dctl;               // its adaptive k and counts
    std::vector<int32_t> drafts;  // this step's proposed tokens (entries after the pending one)
    seq_state dseq;               // the draft model's copy of this slot's sequence (--draft-model)
    std::chrono::steady_clock::time_point t0;  // first token (decoding started)
    // an embedding (BEMB): read only, every chunk's hidden rows pooled; BVEC then BDONE when the read ends
    bool embed = false;
    embed_pool pool;
};

class slot_table {
public:
    slot_table(strata_model* model, int32_t n_slots, int32_t n_ctx, kv_type type);
    ~slot_table();
    slot_table(const slot_table&) = delete;
    slot_table& operator=(const slot_table&) = delete;

    int32_t size() const { return static_cast<int32_t>(slots_.size()); }
    slot& at(int32_t i) { return slots_[static_cast<size_t>(i)]; }
    // Whether any slot reads or decodes / decodes.
    bool any_busy() const;
    bool any_decoding() const;
    // Allocates the slot's KV cache when it has none yet. Returns false when that failed.
    bool ensure_kv(int32_t i);
    // Idle slots' states (for prefix reuse), skipping `except` (-1 = none).
    void idle_states(int32_t except, std::vector<const seq_state*>* out) const;
    // Every slot's state, busy ones too, skipping `except`: a BGEN's prefix reuse between two steps, when a
    // busy slot's kv holds exactly its tokens (several choices of one prompt reuse the first one's read).
    void reuse_states(int32_t except, std::vector<const seq_state*>* out) const;
    // Slot i (its state already holding the reused prefix) starts reading `prompt` from position `reused`.
    void accept(int32_t i, int64_t seq, const std::vector<int32_t>& prompt, int32_t reused, int32_t ckpt,
                int32_t max_new, const sampler_params& sp, uint64_t seed,
                std::shared_ptr<grammar_matcher> gm = nullptr, bool draft = true);
    // A one-slot engine's read chunk (--chunk; 0, the default: reads share the --step-tokens budget).
    void set_read_chunk(int32_t chunk) { read_chunk_ = chunk; }
    // Slot i is being admitted (before its prefix lookup): it is timed when no other slot is busy, and a
    // timed request that runs is no longer timed when it is (see the contract).
    void time_admission(int32_t i);
    // The engine's drafting (--drafting, --draft-model); off until set.
    void set_drafting(drafting_mode mode, draft_model* dm);
    // Proposes this step's drafts for the decoding rows, at most max_total tokens over all of them.
    void propose(const std::vector<int32_t>& rows, int32_t max_total);
    // Slot i (its state emptied) starts reading an embedding's prompt from position 0 (engine/embed.h).
    void accept_embed(int32_t i, int64_t seq, const std::vector<int32_t>& prompt);
    // One step (see the contract). Writes BPP/BT/BDONE lines. Returns false (with *err) only when the model
    // refused the batch, in which case every slot in it was ended with BDONE ... nonfinite.
    bool step(const stdin_reader& reader, const std::vector<int32_t>& eos_ids, int32_t step_tokens,
              std::string* err);
    // The parts of a decode step (step() runs them around its one evaluation):
    // collect ends the slots whose BSTOP arrived and lists the decoding ones (the batch's rows, in slot order);
    void collect(const stdin_reader& reader, std::vector<int32_t>* rows);
    // append adds each row's entries (its pending token at its next position, then its drafts; sequence
    // seq_base + k), all wanting logits;
    void append(const std::vector<int32_t>& rows, int32_t seq_base, std::vector<int32_t>* token,
                std::vector<int32_t>* pos, std::vector<int32_t>* seq, std::vector<kv_cache*>* kvs) const;
    // after_eval keeps each row's tokens from its logits (one n_vocab row per entry, in entry order);
    void after_eval(const std::vector<int32_t>& rows, const float* logits, const std::vector<int32_t>& eos_ids);
    // fail ends every row with BDONE ... nonfinite, dropping what its cache held.
    void fail(const std::vector<int32_t>& rows);
    // Drops every idle slot's cached conversation (a nonfinite result may have poisoned them).
    void clear_idle();

private:
    struct chunk_plan {
        int32_t slot;
        int32_t pos;
        int32_t len;
    };
    void finish(int32_t i, const char* why);
    void plan_reads(int32_t budget);
    void after_read(const chunk_plan& c, const float* logits, const std::vector<int32_t>& eos_ids);
    void first_token(int32_t i, const float* logits, const std::vector<int32_t>& eos_ids);
    void embed_done(int32_t i);
    void verify_row(int32_t i, const float* logits, const std::vector<int32_t>& eos_ids);
    bool ended_by_sampler(int32_t i, sample_status st);
    void timed_read_end(int32_t i);

    strata_model* model_;
    int32_t n_vocab_;
    int32_t n_ctx_;
    kv_type type_;
    drafting_mode drafting_ = DRAFTING_OFF;
    draft_model* draft_ = nullptr;
    std::vector<slot> slots_;
    std::vector<float> logits_;   // (rows + finishing reads, n_vocab)
    sampler_scratch scratch_;
    std::vector<float> lp_work_;  // (n_vocab) biased logits of a logprobs= request (engine/logprobs.h)
    std::vector<int32_t> rows_, token_, pos_, seq_;  // step's batch (reused)
    std::vector<chunk_plan> reads_;                  // step's prompt chunks, shortest remaining first
    std::vector<uint8_t> want_;
    std::vector<uint8_t> want_hidden_;               // step's embedding entries
    std::vector<float> hidden_;                      // (embedding entries, n_embd)
    std::vector<kv_cache*> kvs_;
    int32_t read_chunk_ = 0;                         // set_read_chunk
    pf_timer timer_;                                 // the timed request's prompt read (STRATA_PF_TIMING)
    int32_t timed_ = -1;                             // the timed slot (-1: none); the only busy one while set
};

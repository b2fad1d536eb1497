// engine/slots.h — batch slots (`--batch N`): up to 8 sequences that decode together.
//
// Contract:
//  - Each slot owns its KV cache, its tokens, its sampling parameters and seed; nothing of one slot reaches
//    another (BT/BDONE lines always name the slot whose sequence produced them).
//  - slot_table::step runs one decode step for every busy slot: one model_eval call with one entry per busy
//    slot (one pass over the weights for all of them), then each slot samples its own next token.
//  - A busy slot holds its prompt and every generated token except `pending` (the last one sampled, not yet
//    fed). When it finishes it is idle and keeps that conversation (prefix reuse, its turn checkpoint), so
//    "the slot holds prompt + generated minus the last" holds after BDONE too.
//  - Admission (reading a prompt into a slot) is the serve loop's: it fills the slot and calls slot_begin.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "model.h"
#include "sampler.h"
#include "session.h"

class stdin_reader;

constexpr int32_t SLOTS_MAX = 8;

struct slot {
    seq_state st;                 // kv is allocated at first use
    bool busy = false;            // decoding
    int64_t seq = 0;              // number of the BGEN that admitted it (for BSTOP staleness)
    int32_t pending = -1;         // sampled, not yet fed
    int32_t generated = 0;        // tokens produced, the admission's first one included
    int32_t max_new = 0;
    sampler_params sampling;
    uint64_t seed = 0;
    std::chrono::steady_clock::time_point t0;  // decoding started (after BADM)
};

class slot_table {
public:
    slot_table(strata_model* model, int32_t n_slots, int32_t n_ctx, kv_type type);
    ~slot_table();
    slot_table(const slot_table&) = delete;
    slot_table& operator=(const slot_table&) = delete;

    int32_t size() const { return static_cast<int32_t>(slots_.size()); }
    slot& at(int32_t i) { return slots_[static_cast<size_t>(i)]; }
    bool any_busy() const;
    // Allocates the slot's KV cache when it has none yet. Returns false when that failed.
    bool ensure_kv(int32_t i);
    // Idle slots' states (for prefix reuse), skipping `except` (-1 = none).
    void idle_states(int32_t except, std::vector<const seq_state*>* out) const;
    // Starts decoding in slot i after its admission's first token.
    void begin(int32_t i, int64_t seq, int32_t first_token, int32_t max_new, const sampler_params& sp,
               uint64_t seed);
    // One decode step of every busy slot. Writes BT/BDONE lines. Returns false (with *err) only when the model
    // refused the batch, in which case every busy slot was ended with BDONE ... nonfinite.
    bool step(const stdin_reader& reader, const std::vector<int32_t>& eos_ids, std::string* err);
    // The parts of step, for a caller that evaluates the slots' entries inside a larger batch (a prompt
    // chunk and the decode step in one pass over the weights):
    // collect ends the slots whose BSTOP arrived and lists the busy ones (the batch's rows, in slot order);
    void collect(const stdin_reader& reader, std::vector<int32_t>* rows);
    // append adds one entry per row (its pending token at its next position, sequence seq_base + k);
    void append(const std::vector<int32_t>& rows, int32_t seq_base, std::vector<int32_t>* token,
                std::vector<int32_t>* pos, std::vector<int32_t>* seq, std::vector<kv_cache*>* kvs) const;
    // after_eval samples each row's next token from its logits (rows.size() x n_vocab, in row order);
    void after_eval(const std::vector<int32_t>& rows, const float* logits, const std::vector<int32_t>& eos_ids);
    // fail ends every row with BDONE ... nonfinite, dropping what its cache held.
    void fail(const std::vector<int32_t>& rows);
    // Drops every slot's cached conversation (a nonfinite result may have poisoned them).
    void clear_idle();

private:
    void finish(int32_t i, const char* why);

    strata_model* model_;
    int32_t n_vocab_;
    int32_t n_ctx_;
    kv_type type_;
    std::vector<slot> slots_;
    std::vector<float> logits_;   // (n_busy, n_vocab)
    sampler_scratch scratch_;
    std::vector<int32_t> rows_, token_, pos_, seq_;  // step's batch (reused)
    std::vector<uint8_t> want_;
    std::vector<kv_cache*> kvs_;
};

// engine/session.h — what the engine remembers between requests: sequences (token ids + the KV cache that
// holds them), prefix reuse across them, turn checkpoints, the conversation cache of parked sessions in RAM,
// and BSAVE/BRESTORE of a slot's state to a file.
//
// Contract:
//  - A seq_state's kv holds exactly positions [0, tokens.size()); positions past that are garbage and are
//    overwritten by the next read, so "truncate to L" is tokens.resize(L).
//  - Reuse: a prompt of n tokens may reuse at most n-1 positions (the last prompt token is always read, so
//    that its logits exist), and a source only at a point its window-layer rings still hold the window of
//    (kv_cache_can_resume; else it offers none and the prompt is read from position 0). The best source is whichever state shares the longest start with the prompt:
//    the target itself, a parked conversation, or another slot.
//  - Turn checkpoint: ckpt_len marks the end of a sequence's settled history (up to and including the last
//    --turn-token of its prompt). A new prompt that diverges before it is another conversation: the old one is
//    parked (copied into the conversation cache) before it is overwritten. One that diverges after it is the
//    same chat's next turn and reuses everything up to the divergence.
//  - The conversation cache keeps at most `slots` parked sequences (and at most `budget_bytes` of KV when
//    that is > 0), least recently used first out. A parked entry that is a prefix of a newer one, or an
//    older turn of the same conversation (the newer one shares its history up to its checkpoint), is dropped
//    as superseded; one whose start only was reused stays parked. Events go to stderr as
//    "conversation cache: ..." lines.
//  - Single-threaded: only the serve loop calls in.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model.h"

struct seq_state {
    kv_cache* kv = nullptr;         // (n_layer, n_ctx, n_embd_kv) K and V, owned
    std::vector<int32_t> tokens;    // the ids whose K/V the cache holds, positions [0, size)
    int32_t ckpt_len = 0;           // settled history: [0, ckpt_len) ends at the last turn token; 0 = none
};

struct parked_seq {
    seq_state st;                   // kv sized to its tokens
    size_t bytes = 0;               // kv_cache_bytes of its tokens
    uint64_t last_used = 0;         // LRU clock
};

// Where a request's reused prefix comes from.
struct reuse_source {
    enum kind_t { NONE, SELF, PARKED, OTHER } kind = NONE;
    int32_t n_reuse = 0;            // positions reused (<= prompt size - 1)
    int32_t parked_index = -1;      // PARKED: index into the cache
    const seq_state* other = nullptr;  // OTHER: the live session or an idle slot
};

int32_t session_common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);
// [0, ckpt) ends at the last turn_token of the prompt (inclusive); 0 when there is none or turn_token < 0.
int32_t session_turn_checkpoint(const std::vector<int32_t>& prompt, int32_t turn_token);

class conversation_cache {
public:
    conversation_cache(strata_model* model, kv_type type, int32_t max_slots, size_t budget_bytes);
    ~conversation_cache();
    conversation_cache(const conversation_cache&) = delete;
    conversation_cache& operator=(const conversation_cache&) = delete;

    // Copies st into the cache (when it is worth keeping). Returns whether it was parked.
    bool park(const seq_state& st);
    // The longest start the prompt shares with a parked entry: (index, length); (-1, 0) when none.
    std::pair<int32_t, int32_t> best_match(const std::vector<int32_t>& prompt) const;
    const parked_seq& entry(int32_t index) const { return entries_[static_cast<size_t>(index)]; }
    // Removes entry `index` and hands it (and its kv) to the caller (it is becoming live somewhere).
    parked_seq release(int32_t index);
    // Puts a released entry back (when only its start was reused), evicting to fit.
    void put_back(parked_seq&& e);
    // Drops everything (a nonfinite result may have poisoned what it came from).
    void clear();
    int32_t size() const { return static_cast<int32_t>(entries_.size()); }
    size_t bytes() const;
    int32_t max_slots() const { return max_slots_; }

private:
    void evict_to_fit(size_t incoming_bytes);
    std::string summary() const;

    strata_model* model_;
    kv_type type_;
    int32_t max_slots_;
    size_t budget_bytes_;           // 0: no byte limit
    std::vector<parked_seq> entries_;
    uint64_t clock_ = 0;
    uint64_t evictions_ = 0;
};

// Picks the best source of reuse for `prompt` into `target` among target itself, the cache and `others`
// (the live session, idle slots; may include target, which is skipped).
reuse_source session_find_reuse(const seq_state& target, const std::vector<int32_t>& prompt,
                                const conversation_cache* cache, const std::vector<const seq_state*>& others);

// Makes target hold the first src.n_reuse tokens of prompt, copying K/V from the source when it is not target
// itself. Parks target's old conversation first when the prompt diverges before its checkpoint.
// Returns the positions reused.
int32_t session_apply_reuse(seq_state* target, const std::vector<int32_t>& prompt, const reuse_source& src,
                            conversation_cache* cache);

// SAVE/RESTORE. File layout (little endian): magic "STRATASE", u32 version, u32 kv_type, u32 n_layer,
// u32 n_vocab, u64 row_bytes, u32 n_tokens, u32 ckpt_len, u32 window_lo, u32 reserved, i32 tokens[n_tokens],
// then for each layer its K rows and its V rows (row_bytes * n_tokens each; a window layer's rows before
// window_lo are zeros), then u64 FNV-1a of everything before it.
struct session_io_result {
    bool ok = false;
    std::string kind;        // SERR kind: invalid storage memory io
    bool published = false;  // a new file was already in place
    std::string reason;
    uint64_t bytes = 0;
    int32_t n_tokens = 0;
};
using session_progress = std::function<void(uint64_t done, uint64_t total)>;
session_io_result session_save(const strata_model* model, const seq_state& st, kv_type type,
                               const std::string& path, const session_progress& progress);
session_io_result session_restore(const strata_model* model, seq_state* st, kv_type type,
                                  const std::string& path, const session_progress& progress);

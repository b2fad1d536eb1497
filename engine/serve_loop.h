// engine/serve_loop.h — the command loop of `strata-engine --serve` (docs/PROTOCOL.md).
//
// Contract:
//  - Runs on the main thread after INFO/READY; the only writer of stdout. Takes lines from the stdin_reader
//    in order and runs them; while batch slots read or decode it takes the queued commands (at most
//    COMMANDS_PER_STEP) and then runs one slot step (slots.h: decode entries first, then prompt chunks,
//    shortest remaining first, under --step-tokens; one slot reads in --chunk pieces). A BGEN is accepted at
//    once (BACC) and read in the steps. Every request runs in a slot: one path (`--batch 1` is one slot).
//  - Every refused line is answered `ERR <reason>` and the loop goes on; nothing in a line can end it except
//    QUIT (or EOF on stdin). Returns the process exit code (0).
//  - Owns the conversation cache and the slots; knows the model only through model.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "drafting.h"
#include "grammar.h"
#include "model.h"

// --step-tokens default: measured (tools/bench_serving.py), see docs/PROTOCOL.md.
constexpr int64_t STEP_TOKENS_DEFAULT = 64;

struct engine_config {
    int32_t n_ctx = 0;               // --max-context, resolved
    int32_t n_slots = 1;             // --batch / --slots (1..8)
    int32_t chunk = 512;             // --chunk: a one-slot engine's prompt tokens per model_eval call
    int32_t step_tokens = STEP_TOKENS_DEFAULT;       // --step-tokens: tokens one slot step evaluates (decode entries + chunks)
    int32_t turn_token = -1;         // --turn-token (-1: no turn checkpoints)
    std::vector<int32_t> eos_ids;    // --eos-ids
    kv_type kv = KV_TYPE_F16;        // --kv
    int32_t conv_slots = 4;          // --conversation-cache-slots
    int64_t conv_mib = 0;            // --conversation-cache-mib (0: no byte limit)
    int32_t prompt_cache_every = 16384;  // --prompt-cache-every (accepted; the KV prefix makes it moot here)
    bool has_seed = false;           // --seed: the seed of requests that bring none
    uint64_t seed = 0;
    const grammar_vocab* vocab = nullptr;  // token bytes for grammar= (nullptr: grammars are refused)
    drafting_mode drafting = DRAFTING_OFF;  // --drafting (engine/drafting.h)
    draft_model* draft = nullptr;    // --draft-model, loaded (nullptr: none)
};

// Runs until QUIT/EOF. stdin_fd is read on a thread of its own.
int serve_loop_run(strata_model* model, const engine_config& config, int stdin_fd);

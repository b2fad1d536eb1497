// engine/serve_loop.h — the command loop of `strata-engine --serve` (docs/PROTOCOL.md).
//
// Contract:
//  - Runs on the main thread after INFO/READY; the only writer of stdout. Takes lines from the stdin_reader
//    in order and runs them; while batch slots decode it alternates one queued command with one decode step,
//    and a prompt read (solo or admission) runs decode steps of the busy slots between its chunks.
//  - Every refused line is answered `ERR <reason>` and the loop goes on; nothing in a line can end it except
//    QUIT (or EOF on stdin). Returns the process exit code (0).
//  - Owns the live solo session, the conversation cache and the slots; knows the model only through model.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model.h"

struct engine_config {
    int32_t n_ctx = 0;               // --max-context, resolved
    int32_t n_slots = 0;             // --batch / --slots (0 = solo only)
    int32_t n_groups = 1;            // --batch-groups, resolved
    int32_t chunk = 512;             // --chunk: prompt tokens per model_eval call
    int32_t turn_token = -1;         // --turn-token (-1: no turn checkpoints)
    std::vector<int32_t> eos_ids;    // --eos-ids
    kv_type kv = KV_TYPE_F16;        // --kv
    int32_t conv_slots = 4;          // --conversation-cache-slots
    int64_t conv_mib = 0;            // --conversation-cache-mib (0: no byte limit)
    int32_t prompt_cache_every = 16384;  // --prompt-cache-every (accepted; the KV prefix makes it moot here)
    bool has_seed = false;           // --seed: the seed of requests that bring none
    uint64_t seed = 0;
};

// Runs until QUIT/EOF. stdin_fd is read on a thread of its own.
int serve_loop_run(strata_model* model, const engine_config& config, int stdin_fd);

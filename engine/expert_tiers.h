// engine/expert_tiers.h — experts kept in RAM where they fit, the rest read from the mapped file (engine/moe.h).
//
// A MoE model's experts are most of its bytes (Qwen3-30B-A3B: 29 of 30 GiB at Q8_0) and a step uses few of
// them (8 of 128 per layer). When the experts' packed copies would exceed the RAM budget asked
// (`--experts-ram-mib`, model_params.experts_ram_bytes), only `n_slots` experts get a packed copy, in one
// pool of n_slots slots of `expert_bytes` (gate, up and down of one expert in the row-group layout, each part
// 64-byte aligned); every other expert runs on the row kernels straight from the mapped file, whose pages the
// kernel reads back from the page cache or the disk on demand (their resident pages were released after
// packing, as for every packed weight). Results are the same either way: the row-group and row kernels give
// the same bits (tests/engine/kernels_test.cpp), so the split changes only speed.
//
// Which experts: each forward step counts, per expert, whether it was used (`uses`) and whether its read came
// from the RAM tier (`hits`) or the file (`misses`). Every RETIER_STEPS steps the n_slots most used experts
// (ties: the one already resident, then the lower id) take the slots: an expert that enters is packed from the
// mapping into the slot of one that leaves (`swaps`), then every count is halved so that the choice follows
// what the recent steps used. This runs on the thread that calls model_eval, between layers, when no worker
// reads a weight: the views' `packed` pointers change only there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

struct strata_model;

struct expert_tiers {
    bool active = false;               // the budget is below the experts' packed size: tiers in use
    size_t budget_bytes = 0;           // the RAM the resident experts may take
    size_t expert_bytes = 0;           // one slot: packed gate + up + down of one expert
    size_t all_bytes = 0;              // every expert packed (what would not fit)
    int32_t n_slots = 0;               // experts resident at once
    uint8_t* pool = nullptr;           // (n_slots, expert_bytes), weight_alloc'd
    std::vector<int32_t> slot_of;      // (n_layer * n_expert) the expert's slot, -1 = read from the file
    std::vector<int32_t> owner;        // (n_slots) the expert id (layer * n_expert + e) in the slot, -1 = none
    std::vector<uint32_t> uses;        // (n_layer * n_expert) steps that used the expert, halved at each re-tiering
    uint64_t hits = 0;                 // expert reads (one per used expert per layer per step) from RAM
    uint64_t misses = 0;               // ... from the mapped file
    uint64_t swaps = 0;                // experts packed into a slot after the start
    int32_t steps = 0;                 // forward steps since the last re-tiering
};

constexpr int32_t EXPERT_RETIER_STEPS = 32;  // steps between re-tierings: a few prompts' chunks or a sentence

// Sets up the tiers when the experts' packed bytes exceed budget_bytes and every expert has a row-group layout
// (else returns false and the caller packs the experts as it packs every weight). Packs the first experts
// (layers in turn) into the slots. act_bits as pack_weights' (8: the 8-bit layout where the type has one).
bool expert_tiers_init(strata_model* m, size_t budget_bytes);
// Counts one step's use of expert e of layer il (called by moe_ffn for each used expert).
void expert_tiers_count(strata_model* m, int32_t il, int32_t e);
// At the start of a forward step's first MoE layer: re-tiers every EXPERT_RETIER_STEPS steps.
void expert_tiers_step(strata_model* m);
void expert_tiers_free(expert_tiers* t);

// engine/expert_tiers.cpp — experts in RAM where they fit, the rest from the mapped file (expert_tiers.h).
#include "expert_tiers.h"

#include <algorithm>
#include <cstdlib>

#include "cpu/kernels_act8.h"
#include "model_impl.h"

namespace {

constexpr size_t TIER_ALIGN = 64;  // each packed part starts 64-byte aligned, as weight_pack wants

size_t aligned(size_t n) { return (n + TIER_ALIGN - 1) / TIER_ALIGN * TIER_ALIGN; }

// The three views of expert id (layer * n_expert + e).
void expert_parts(strata_model* m, int32_t id, weight_view* parts[3]) {
    layer_weights& l = m->layers[size_t(id / m->hp.n_expert)];
    const size_t e = size_t(id % m->hp.n_expert);
    parts[0] = &l.exp_gate[e];
    parts[1] = &l.exp_up[e];
    parts[2] = &l.exp_down[e];
}

bool packable(const strata_model* m, const weight_view& w) {
    if (!kernels_uses_q16(w.type) || weight_packed_bytes(w.type, w.n_cols, w.n_rows) == 0) return false;
    return w.packed8 ? group8_fn(w.type) != nullptr : group_fn(*m->ks, w.type) != nullptr;
}

// Packs expert id into slot (its parts' packed pointers then point there).
void put(strata_model* m, int32_t id, int32_t slot) {
    expert_tiers& t = m->tiers;
    weight_view* parts[3];
    expert_parts(m, id, parts);
    uint8_t* at = t.pool + size_t(slot) * t.expert_bytes;
    for (weight_view* w : parts) {
        if (w->packed8) weight_pack8(*w, at);
        else weight_pack(*w, at);
        w->packed = at;
        at += aligned(weight_packed_bytes(w->type, w->n_cols, w->n_rows));
    }
    t.owner[size_t(slot)] = id;
    t.slot_of[size_t(id)] = slot;
}

// Expert id leaves its slot: it is read from the mapping again.
void evict(strata_model* m, int32_t id) {
    weight_view* parts[3];
    expert_parts(m, id, parts);
    for (weight_view* w : parts) w->packed = nullptr;
    m->tiers.slot_of[size_t(id)] = -1;
}

}  // namespace

bool expert_tiers_init(strata_model* m, size_t budget_bytes) {
    expert_tiers& t = m->tiers;
    const model_hparams& hp = m->hp;
    if (hp.n_expert <= 0) return false;
    const int32_t n_ids = hp.n_layer * hp.n_expert;
    size_t one = 0;
    for (int32_t id = 0; id < n_ids; ++id) {
        weight_view* parts[3];
        expert_parts(m, id, parts);
        size_t bytes = 0;
        for (weight_view* w : parts) {
            if (!packable(m, *w)) return false;  // no row kernel or no packed layout: experts are packed as before
            bytes += aligned(weight_packed_bytes(w->type, w->n_cols, w->n_rows));
        }
        if (id > 0 && bytes != one) return false;  // slots assume one size (every expert of a model has it)
        one = bytes;
    }
    t.all_bytes = one * size_t(n_ids);
    if (t.all_bytes <= budget_bytes) return false;  // everything fits: no tiers
    t.active = true;
    t.budget_bytes = budget_bytes;
    t.expert_bytes = one;
    t.n_slots = int32_t(std::min<size_t>(budget_bytes / one, size_t(n_ids)));
    t.slot_of.assign(size_t(n_ids), -1);
    t.owner.assign(size_t(t.n_slots), -1);
    t.uses.assign(size_t(n_ids), 0);
    t.pool = t.n_slots > 0 ? weight_alloc(size_t(t.n_slots) * one) : nullptr;
    if (!t.pool) t.n_slots = 0;  // no memory even for the budget: every expert from the file
    t.owner.resize(size_t(t.n_slots), -1);
    // at first the layers take the slots in turn, each its lowest experts
    for (int32_t s = 0; s < t.n_slots; ++s) put(m, (s % hp.n_layer) * hp.n_expert + s / hp.n_layer, s);
    return true;
}

void expert_tiers_count(strata_model* m, int32_t il, int32_t e) {
    expert_tiers& t = m->tiers;
    const size_t id = size_t(il) * size_t(m->hp.n_expert) + size_t(e);
    ++t.uses[id];
    if (t.slot_of[id] >= 0) ++t.hits;
    else ++t.misses;
}

void expert_tiers_step(strata_model* m) {
    expert_tiers& t = m->tiers;
    if (++t.steps < EXPERT_RETIER_STEPS) return;
    t.steps = 0;
    if (t.n_slots == 0) return;
    const int32_t n_ids = int32_t(t.uses.size());
    std::vector<int32_t> order(static_cast<size_t>(n_ids));
    for (int32_t i = 0; i < n_ids; ++i) order[size_t(i)] = i;
    // the most used first; a tie keeps the resident one (no swap for nothing), then the lower id
    std::partial_sort(order.begin(), order.begin() + t.n_slots, order.end(), [&t](int32_t a, int32_t b) {
        if (t.uses[size_t(a)] != t.uses[size_t(b)]) return t.uses[size_t(a)] > t.uses[size_t(b)];
        const bool ra = t.slot_of[size_t(a)] >= 0, rb = t.slot_of[size_t(b)] >= 0;
        if (ra != rb) return ra;
        return a < b;
    });
    std::vector<uint8_t> wanted(static_cast<size_t>(n_ids), 0);
    for (int32_t k = 0; k < t.n_slots; ++k) wanted[size_t(order[size_t(k)])] = 1;
    int32_t free_slot = 0;
    for (int32_t k = 0; k < t.n_slots; ++k) {
        const int32_t id = order[size_t(k)];
        if (t.slot_of[size_t(id)] >= 0) continue;
        while (t.owner[size_t(free_slot)] >= 0 && wanted[size_t(t.owner[size_t(free_slot)])]) ++free_slot;
        if (t.owner[size_t(free_slot)] >= 0) evict(m, t.owner[size_t(free_slot)]);
        put(m, id, free_slot);
        ++t.swaps;
    }
    for (uint32_t& u : t.uses) u >>= 1;
}

void expert_tiers_free(expert_tiers* t) {
    std::free(t->pool);
    t->pool = nullptr;
}

// prefill/timer_marks.hpp — the mark rule of PfTimer as pure functions (no clock, no I/O), so that a host
// test can check it exactly.
//
// A timeline is a list of marks (phase, t_ns). A phase runs from its mark until the next mark (or the end
// of the timeline). The rule: a mark in the phase that is already running is not recorded — the phase simply
// goes on — so the totals are the same as if it had been recorded, with fewer records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pf {

struct timer_mark {
    int32_t phase = 0;
    int64_t t_ns = 0;
};

// Adds a mark for `phase` at t_ns, unless `phase` is already running. Returns whether it was recorded.
// Marks must come in time order (t_ns not below the last mark's).
inline bool timer_marks_add(std::vector<timer_mark>& marks, int32_t phase, int64_t t_ns) {
    if (!marks.empty() && marks.back().phase == phase) return false;
    marks.push_back(timer_mark{phase, t_ns});
    return true;
}

// Time spent in each phase: totals[p] += the span of each mark of phase p, the last one ending at t_end_ns.
// Phases outside [0, n_phase) are not counted (use one for "idle").
inline void timer_marks_totals(const std::vector<timer_mark>& marks, int64_t t_end_ns, int64_t* totals,
                               int32_t n_phase) {
    for (int32_t p = 0; p < n_phase; ++p) totals[p] = 0;
    for (size_t i = 0; i < marks.size(); ++i) {
        const int64_t end = i + 1 < marks.size() ? marks[i + 1].t_ns : t_end_ns;
        const int32_t p = marks[i].phase;
        if (p >= 0 && p < n_phase && end > marks[i].t_ns) totals[p] += end - marks[i].t_ns;
    }
}

}  // namespace pf

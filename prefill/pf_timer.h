// prefill/pf_timer.h — PfTimer: the per-phase timer of one prompt read.
//
// The prompt path marks the phase it enters (pf_timer::mark); the timer keeps the marks by the rule in
// prefill/timer_marks.hpp (a mark in the phase already running is not recorded) and, at finish(), prints the
// per-phase totals of the request on stderr as one line when STRATA_PF_TIMING=1 is set:
//   pf timing: tokens=N total_ms=T read=.. dequant=.. attention=.. ffn=.. sample=.. ... records=R
// With the variable unset, mark() is a branch and nothing is recorded.
// Phases the protocol side marks: PF_PHASE_LOOKUP (finding and copying a reusable prefix), PF_PHASE_READ (the
// model evaluating a chunk; other slots' decode steps ride in the chunk's batch, so their time is READ's too),
// PF_PHASE_SLOTS (left for a separate step; nothing marks it now), PF_PHASE_SAMPLE,
// PF_PHASE_EMIT (protocol lines). The model math may mark its own phases (dequant, attention, ffn) inside READ.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "timer_marks.hpp"

enum pf_phase : int32_t {
    PF_PHASE_IDLE = -1,   // not counted
    PF_PHASE_LOOKUP = 0,
    PF_PHASE_READ,
    PF_PHASE_DEQUANT,
    PF_PHASE_ATTENTION,
    PF_PHASE_FFN,
    PF_PHASE_SLOTS,
    PF_PHASE_SAMPLE,
    PF_PHASE_EMIT,
    PF_PHASE_COUNT,
};

const char* pf_phase_name(int32_t phase);

class pf_timer {
public:
    pf_timer();  // reads STRATA_PF_TIMING
    bool enabled() const { return enabled_; }
    void begin();                    // a new request: forget the last one's marks
    void mark(int32_t phase);        // enter `phase` now
    // Ends the timeline, fills totals_ns (PF_PHASE_COUNT entries) and prints the stderr line when enabled.
    void finish(int32_t n_tokens);
    const int64_t* totals_ns() const { return totals_; }
    size_t n_records() const { return marks_.size(); }

private:
    bool enabled_ = false;
    int64_t t0_ns_ = 0;
    std::vector<pf::timer_mark> marks_;
    int64_t totals_[PF_PHASE_COUNT] = {};
};

// prefill/pf_timer.cpp — see pf_timer.h.
#include "pf_timer.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {
int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}
}  // namespace

const char* pf_phase_name(int32_t phase) {
    static const char* names[PF_PHASE_COUNT] = {"lookup", "read", "dequant", "attention",
                                                "ffn",    "slots", "sample", "emit"};
    return phase >= 0 && phase < PF_PHASE_COUNT ? names[phase] : "idle";
}

pf_timer::pf_timer() {
    const char* v = std::getenv("STRATA_PF_TIMING");
    enabled_ = v != nullptr && std::strcmp(v, "1") == 0;
}

void pf_timer::begin() {
    marks_.clear();
    t0_ns_ = now_ns();
    for (auto& t : totals_) t = 0;
}

void pf_timer::mark(int32_t phase) {
    if (!enabled_) return;
    pf::timer_marks_add(marks_, phase, now_ns());
}

void pf_timer::finish(int32_t n_tokens) {
    if (!enabled_) return;
    const int64_t end = now_ns();
    pf::timer_marks_totals(marks_, end, totals_, PF_PHASE_COUNT);
    std::string line = "pf timing: tokens=" + std::to_string(n_tokens);
    char buf[64];
    std::snprintf(buf, sizeof buf, " total_ms=%.3f", static_cast<double>(end - t0_ns_) / 1e6);
    line += buf;
    for (int32_t p = 0; p < PF_PHASE_COUNT; ++p) {
        std::snprintf(buf, sizeof buf, " %s=%.3f", pf_phase_name(p), static_cast<double>(totals_[p]) / 1e6);
        line += buf;
    }
    line += " records=" + std::to_string(marks_.size());
    std::fprintf(stderr, "%s\n", line.c_str());
}

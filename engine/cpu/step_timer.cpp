// engine/cpu/step_timer.cpp — see step_timer.h.
#include "step_timer.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

// STRATA_STEP_TIMING=cpu: the marking thread's CPU time (a syscall per mark, ~0.2-0.5 us; other processes'
// load on a shared machine adds wall time but not this), else the steady clock
bool g_cpu_clock = false;

int64_t now_ns() {
    if (g_cpu_clock) {
        timespec ts;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
    }
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

step_timer_state g_step_timer = [] {
    step_timer_state s;
    const char* v = std::getenv("STRATA_STEP_TIMING");
    g_cpu_clock = v != nullptr && std::strcmp(v, "cpu") == 0;
    s.on = v != nullptr && (std::strcmp(v, "1") == 0 || g_cpu_clock);
    return s;
}();

int32_t step_mark_on(int32_t phase) {
    step_timer_state& s = g_step_timer;
    const int64_t t = now_ns();
    const int32_t prev = s.cur;
    if (prev >= 0 && prev < STEP_PHASE_COUNT) {
        s.totals_ns[prev] += t - s.t_ns;
        ++s.n_closed[prev];
    }
    s.cur = phase;
    s.t_ns = t;
    return prev;
}

int32_t step_phase_of(ggml_type type) {
    switch (type) {
    case GGML_TYPE_Q4_0: return STEP_MM_Q4_0;
    case GGML_TYPE_Q4_1: return STEP_MM_Q4_1;
    case GGML_TYPE_Q8_0: return STEP_MM_Q8_0;
    case GGML_TYPE_Q5_0: return STEP_MM_Q5_0;
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K: case GGML_TYPE_Q5_1: case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_IQ4_XS:
        return STEP_MM_KQUANT;
    default: return STEP_MM_FLOAT;
    }
}

const char* step_phase_name(int32_t phase) {
    static const char* names[STEP_PHASE_COUNT] = {"mm_q4_0",   "mm_q4_1", "mm_q8_0", "mm_q5_0",  "mm_kquant", "mm_float",
                                                  "lm_head",   "quantize", "attention", "norms",   "wait",
                                                  "sample",    "emit",    "other"};
    return phase >= 0 && phase < STEP_PHASE_COUNT ? names[phase] : "?";
}

// What one clock read costs (ns), measured once: the mean of 256 back-to-back reads.
int64_t clock_read_ns() {
    static const int64_t cost = [] {
        constexpr int N_READS = 256;
        const int64_t t0 = now_ns();
        int64_t t = t0;
        for (int i = 0; i < N_READS; ++i) t = now_ns();
        return (t - t0) / N_READS;
    }();
    return cost;
}

void step_timer_begin() {
    step_timer_state& s = g_step_timer;
    if (!s.on) return;
    if (g_cpu_clock) clock_read_ns();
    for (int64_t& t : s.totals_ns) t = 0;
    for (int64_t& n : s.n_closed) n = 0;
    s.n_jobs = 0;
    s.cur = STEP_OTHER;
    s.t0_ns = s.t_ns = now_ns();
}

int64_t step_timer_finish(int64_t n_steps, const char* what) {
    step_timer_state& s = g_step_timer;
    if (!s.on) return 0;
    step_mark_on(STEP_OTHER);
    int64_t total = s.t_ns - s.t0_ns;
    if (g_cpu_clock) {  // each interval holds one clock read's cost: take it out (header comment)
        total = 0;
        for (int32_t p = 0; p < STEP_PHASE_COUNT; ++p) {
            s.totals_ns[p] = std::max<int64_t>(0, s.totals_ns[p] - s.n_closed[p] * clock_read_ns());
            total += s.totals_ns[p];
        }
    }
    std::string line = std::string(what) + " timing: steps=" + std::to_string(n_steps) +
                       (g_cpu_clock ? " clock=cpu" : " clock=wall");
    char buf[64];
    std::snprintf(buf, sizeof buf, " total_ms=%.3f jobs=%lld", double(total) / 1e6, static_cast<long long>(s.n_jobs));
    line += buf;
    for (int32_t p = 0; p < STEP_PHASE_COUNT; ++p) {
        std::snprintf(buf, sizeof buf, " %s=%.3f", step_phase_name(p), double(s.totals_ns[p]) / 1e6);
        line += buf;
    }
    if (g_cpu_clock) {
        std::snprintf(buf, sizeof buf, " read_us=%.3f", double(clock_read_ns()) / 1e3);
        line += buf;
    }
    std::fprintf(stderr, "%s\n", line.c_str());
    return total;
}

// engine/cpu/step_timer.h — where the time of a decode step goes: phase marks in the model, the kernels' driver,
// the thread pool and the slots' decode steps (PfTimer's rule, prefill/pf_timer.h, for decode).
//
// Contract:
//  - Opt-in: STRATA_STEP_TIMING=1 in the engine's environment (wall clock), or STRATA_STEP_TIMING=cpu (the
//    marking thread's CPU time: what a shared machine disturbs least; spinning at the pool's barrier counts,
//    sleeping does not). Off, step_mark is one load and a branch of a flag that never changes after start.
//  - Only the thread that owns the model marks (the single caller of threadpool_run); worker threads never
//    do. A phase runs from its mark to the next; its time is added to the phase's total at the next mark.
//  - step_mark returns the phase that was running, so that a nested part (quantising the activations, the
//    caller waiting at the pool's barrier) can mark itself and put the outer phase back.
//  - step_timer_begin starts a request's decode; step_timer_finish(n_steps) prints one stderr line:
//      step timing: steps=N clock=wall|cpu total_ms=T jobs=J mm_q4_0=.. mm_q4_1=.. ... emit=.. other=..
//    With clock=cpu the line ends with read_us=R: a CPU-time clock read is a system call (~1.6 us in this
//    project's VM, ~600 per SmolLM2 step), and R (measured at the first begin) times the intervals each phase
//    added is taken out of its total; the total is the sum of the phases.
//    (ms summed over the steps; jobs = pool runs, i.e. fork/join barriers, over the steps).
//    A timed request's prompt read (engine/slots.h) is printed the same way as `prefill timing: steps=<tokens
//    read> ...`.
#pragma once

#include <cstdint>

#include "quants.h"

enum step_phase : int32_t {
    STEP_MM_Q4_0 = 0,   // matmuls by weight type: the caller thread's own share of the rows
    STEP_MM_Q4_1,
    STEP_MM_Q8_0,
    STEP_MM_Q5_0,       // Q5_0 kept 5-bit in its row-group layout (engine/cpu/kernels_group_q5_0.h); widened: Q8_0
    STEP_MM_KQUANT,     // Q4_K, Q5_K, Q6_K and Q5_1, Q2_K, Q3_K, IQ4_XS (engine/cpu/kernels_kq.h)
    STEP_MM_FLOAT,      // F32 / F16 / BF16 and the float path of the other types
    STEP_LM_HEAD,       // the output matrix (n_vocab rows), whatever its type
    STEP_QUANTIZE,      // activations to 16-bit (or 8-bit) blocks before a matmul
    STEP_ATTENTION,
    STEP_NORMS,         // RMS norms, RoPE, K/V rows into the cache, SwiGLU, residual adds, embedding row
    STEP_WAIT,          // the caller at the pool's barrier: waking the workers and waiting for the slowest
    STEP_SAMPLE,        // the sampler over the n_vocab logits
    STEP_EMIT,          // the protocol line ("T id")
    STEP_OTHER,         // the decode loop itself
    STEP_PHASE_COUNT,
};

struct step_timer_state {
    bool on = false;          // set once at start from STRATA_STEP_TIMING
    int32_t cur = STEP_OTHER;
    int64_t t_ns = 0;         // when cur began
    int64_t t0_ns = 0;        // step_timer_begin
    int64_t n_jobs = 0;       // threadpool_run calls since step_timer_begin
    int64_t totals_ns[STEP_PHASE_COUNT] = {};
    int64_t n_closed[STEP_PHASE_COUNT] = {};  // intervals added to each total (each holds one clock read's cost)
};

extern step_timer_state g_step_timer;

int32_t step_mark_on(int32_t phase);

// Enters `phase`; returns the phase that was running (STEP_OTHER when timing is off).
inline int32_t step_mark(int32_t phase) { return g_step_timer.on ? step_mark_on(phase) : STEP_OTHER; }
inline void step_count_job() {
    if (g_step_timer.on) ++g_step_timer.n_jobs;
}
// The matmul phase of a weight type.
int32_t step_phase_of(ggml_type type);
const char* step_phase_name(int32_t phase);
void step_timer_begin();
// Prints the stderr line (when on) for n_steps decode steps; returns the total time in ns (0 when off).
// what: the line's first word ("step"; "prefill" for a prompt read, steps = its tokens).
int64_t step_timer_finish(int64_t n_steps, const char* what = "step");

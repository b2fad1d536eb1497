// engine/cpu/threadpool.cpp — spin-then-wait worker pool (contract in threadpool.h).
#include "threadpool.h"

#include "step_timer.h"

#include <sched.h>

#include <atomic>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define STRATA_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define STRATA_PAUSE() __asm__ __volatile__("yield")  // AArch64's spin-wait hint (a no-op where it has no use)
#else
#define STRATA_PAUSE() ((void)0)
#endif

namespace {
// Waiting for the next job (or for the workers to finish): first POOL_SPIN_ITERS pause loops (a few us: the
// gap between the jobs of one decode step), then POOL_YIELD_ITERS sched_yield rounds (a core shared with
// another busy process lets the thread we wait for run instead of burning our slice), then sleep on the
// atomic (futex).
constexpr int POOL_SPIN_ITERS = 2000;
constexpr int POOL_YIELD_ITERS = 200;

template <typename A, typename V>
V spin_then_wait(const A& atom, V old) {
    V v = atom.load(std::memory_order_acquire);
    for (int i = 0; v == old && i < POOL_SPIN_ITERS; ++i) {
        STRATA_PAUSE();
        v = atom.load(std::memory_order_acquire);
    }
    for (int i = 0; v == old && i < POOL_YIELD_ITERS; ++i) {
        sched_yield();
        v = atom.load(std::memory_order_acquire);
    }
    while (v == old) {
        atom.wait(old, std::memory_order_acquire);
        v = atom.load(std::memory_order_acquire);
    }
    return v;
}
}  // namespace

struct threadpool {
    int n_threads = 1;
    std::vector<std::thread> workers;
    // job: written by the caller before bumping `generation`, read by workers after seeing the bump
    threadpool_fn fn = nullptr;
    void* ctx = nullptr;
    int64_t n_items = 0;
    std::atomic<uint32_t> generation{0};  // bumped once per job (and once to stop)
    std::atomic<int> pending{0};          // workers still running the current job
    std::atomic<bool> stop{false};
};

static void run_range(threadpool* pool, int k) {
    const int64_t n = pool->n_items, t = pool->n_threads;
    const int64_t i0 = n * k / t, i1 = n * (k + 1) / t;
    if (i1 > i0) pool->fn(pool->ctx, i0, i1, k);
}

static void worker_main(threadpool* pool, int k) {
    uint32_t seen = 0;
    for (;;) {
        seen = spin_then_wait(pool->generation, seen);
        if (pool->stop.load(std::memory_order_acquire)) return;
        run_range(pool, k);
        if (pool->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) pool->pending.notify_one();
    }
}

threadpool* threadpool_init(int n_threads) {
    auto* pool = new threadpool();
    pool->n_threads = n_threads < 1 ? 1 : n_threads;
    for (int k = 1; k < pool->n_threads; ++k) pool->workers.emplace_back(worker_main, pool, k);
    return pool;
}

void threadpool_free(threadpool* pool) {
    if (!pool) return;
    pool->stop.store(true, std::memory_order_release);
    pool->generation.fetch_add(1, std::memory_order_acq_rel);
    pool->generation.notify_all();
    for (std::thread& t : pool->workers) t.join();
    delete pool;
}

int threadpool_n_threads(const threadpool* pool) { return pool->n_threads; }

void threadpool_run(threadpool* pool, int64_t n_items, threadpool_fn fn, void* ctx) {
    if (pool->n_threads == 1 || n_items <= 1) {
        if (n_items > 0) fn(ctx, 0, n_items, 0);
        return;
    }
    step_count_job();
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_items = n_items;
    pool->pending.store(pool->n_threads - 1, std::memory_order_relaxed);
    pool->generation.fetch_add(1, std::memory_order_acq_rel);
    pool->generation.notify_all();
    run_range(pool, 0);
    const int32_t outer = step_mark(STEP_WAIT);
    for (int left = pool->pending.load(std::memory_order_acquire); left != 0;) {
        left = spin_then_wait(pool->pending, left);
    }
    step_mark(outer);
}

int threadpool_physical_cores() {
    // count distinct (physical id, core id) pairs; fall back to the logical count
    std::ifstream in("/proc/cpuinfo");
    std::set<std::pair<std::string, std::string>> cores;
    std::string line, phys = "0";
    while (std::getline(in, line)) {
        const auto colon = line.find(':');
        if (colon == std::string::npos) continue;
        std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
        const std::string val = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
        if (key == "physical id") phys = val;
        if (key == "core id") cores.insert({phys, val});
    }
    if (!cores.empty()) return static_cast<int>(cores.size());
    const unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : static_cast<int>(n);
}

// engine/cpu/threadpool.h — a fixed pool of worker threads for the model math.
//
// Contract:
//  - threadpool_run(pool, n_items, fn, ctx) calls fn(ctx, i0, i1, thread) for a static split of [0, n_items)
//    into n_threads contiguous ranges (range k = [k*n/T, (k+1)*n/T)), the caller's thread doing range 0,
//    and returns when every range is done. The split depends only on n_items and n_threads, and callers
//    make each item's result independent of which thread computes it, so results never depend on
//    n_threads.
//  - Single caller: only the thread that owns the model calls threadpool_run.
//  - Workers spin briefly on the job counter (a decode step issues hundreds of small jobs; a futex wake
//    per job would dominate), then sleep on it with std::atomic::wait.
#pragma once

#include <cstdint>

struct threadpool;
using threadpool_fn = void (*)(void* ctx, int64_t i0, int64_t i1, int thread);

threadpool* threadpool_init(int n_threads);
void threadpool_free(threadpool* pool);
int threadpool_n_threads(const threadpool* pool);
void threadpool_run(threadpool* pool, int64_t n_items, threadpool_fn fn, void* ctx);
// Physical cores of this machine (hyper-threads of one core counted once), at least 1.
int threadpool_physical_cores();

// tests/engine/test_sets.h — which kernel sets a kernel test covers, asked of the CPU, never assumed.
//
// Contract: `TEST --set NAME` (how CTest runs the kernel tests: one entry per set, `kernels_test[avx2]` ...)
// covers the scalar reference and the set NAME, and makes NAME kernels_get()'s choice too (STRATA_KERNELS,
// set before the first kernels_get()), so the paths that dispatch through kernels_get() run on NAME as well.
// When NAME is not compiled in on this platform, or this CPU cannot run it, the test prints the reason and
// exits TEST_SKIP_EXIT (CTest "Skipped"): no test executes an instruction the host lacks. Without --set:
// every set compiled in that this CPU can run. The scalar set is always first.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu/kernels.h"

inline constexpr int TEST_SETS_SKIP_EXIT = 77;  // CTest's SKIP_RETURN_CODE for these tests (CMakeLists.txt)

inline std::vector<const kernel_set*> test_sets_from_args(int argc, char** argv) {
    const char* name = nullptr;
    for (int i = 1; i + 1 < argc; ++i) {
        if (std::strcmp(argv[i], "--set") == 0) name = argv[i + 1];
    }
    std::vector<const kernel_set*> out = {&kernels_scalar()};
    const std::vector<const kernel_set*> compiled = kernels_compiled();
    if (!name) {
        for (const kernel_set* ks : compiled) {
            if (ks != &kernels_scalar() && !kernels_cpu_lacks(*ks)) out.insert(out.begin() + 1, ks);
        }
        return out;
    }
    const kernel_set* want = nullptr;
    for (const kernel_set* ks : compiled) {
        if (std::strcmp(ks->name, name) == 0) want = ks;
    }
    if (!want) {
        std::printf("SKIP: kernel set %s is not compiled in on this platform\n", name);
        std::exit(TEST_SETS_SKIP_EXIT);
    }
    if (const char* lacks = kernels_cpu_lacks(*want)) {
        std::printf("SKIP: this CPU cannot run kernel set %s (it lacks %s)\n", name, lacks);
        std::exit(TEST_SETS_SKIP_EXIT);
    }
    setenv("STRATA_KERNELS", name, 1);
    if (std::strcmp(kernels_get().name, name) != 0) {
        std::fprintf(stderr, "FAIL: STRATA_KERNELS=%s dispatched to %s\n", name, kernels_get().name);
        std::exit(1);
    }
    if (want != &kernels_scalar()) out.push_back(want);
    return out;
}

// tests/engine/test_check.h — the failure counter and CHECK(cond, fmt, ...) shared by the C++ host tests.
// A failed CHECK prints "FAIL file:line: <message>" on stderr and counts; the test's main() exits 1 when
// g_failures is not 0 at the end (every check runs, so one run lists every failure).
#pragma once

#include <cstdio>

inline int g_failures = 0;

#define CHECK(cond, ...)                                              \
    do {                                                              \
        if (!(cond)) {                                                \
            std::fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            std::fprintf(stderr, __VA_ARGS__);                        \
            std::fprintf(stderr, "\n");                               \
            ++g_failures;                                             \
        }                                                             \
    } while (0)

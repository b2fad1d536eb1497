// tests/prefill/timer_marks_test.cpp — the PfTimer mark rule (prefill/timer_marks.hpp) and the chunk plan
// (prefill/chunking.hpp): a mark in the phase already running is not recorded, the totals are what they would
// be if it were, and chunks end on multiples of the chunk size whatever the read starts from.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "prefill/chunking.hpp"
#include "prefill/timer_marks.hpp"

namespace {

int g_failures = 0;

void check(bool ok, const char* what, int line) {
    if (!ok) {
        std::fprintf(stderr, "FAIL line %d: %s\n", line, what);
        ++g_failures;
    }
}
#define CHECK(x) check((x), #x, __LINE__)

// Totals computed the naive way: every mark recorded, repeats included.
void naive_totals(const std::vector<pf::timer_mark>& all, int64_t end, int64_t* totals, int32_t n_phase) {
    for (int32_t p = 0; p < n_phase; ++p) totals[p] = 0;
    for (size_t i = 0; i < all.size(); ++i) {
        const int64_t e = i + 1 < all.size() ? all[i + 1].t_ns : end;
        if (all[i].phase >= 0 && all[i].phase < n_phase) totals[all[i].phase] += e - all[i].t_ns;
    }
}

void test_repeat_not_recorded() {
    std::vector<pf::timer_mark> marks;
    CHECK(pf::timer_marks_add(marks, 1, 0));
    CHECK(!pf::timer_marks_add(marks, 1, 10));  // already running
    CHECK(!pf::timer_marks_add(marks, 1, 20));
    CHECK(pf::timer_marks_add(marks, 2, 30));
    CHECK(pf::timer_marks_add(marks, 1, 50));
    CHECK(marks.size() == 3);
    int64_t totals[3];
    pf::timer_marks_totals(marks, 80, totals, 3);
    CHECK(totals[0] == 0);
    CHECK(totals[1] == 30 + 30);
    CHECK(totals[2] == 20);
}

void test_idle_phase_not_counted() {
    std::vector<pf::timer_mark> marks;
    pf::timer_marks_add(marks, 0, 0);
    pf::timer_marks_add(marks, -1, 5);  // idle
    pf::timer_marks_add(marks, 0, 15);
    int64_t totals[1];
    pf::timer_marks_totals(marks, 20, totals, 1);
    CHECK(totals[0] == 5 + 5);
}

void test_empty() {
    std::vector<pf::timer_mark> marks;
    int64_t totals[2] = {7, 7};
    pf::timer_marks_totals(marks, 100, totals, 2);
    CHECK(totals[0] == 0 && totals[1] == 0);
}

// Random timelines: the rule keeps the totals of recording everything, with no two neighbours alike.
void test_random_same_totals() {
    std::mt19937 rng(12345);
    for (int round = 0; round < 2000; ++round) {
        std::vector<pf::timer_mark> all, kept;
        int64_t t = 0;
        const int n = static_cast<int>(rng() % 40);
        for (int i = 0; i < n; ++i) {
            t += static_cast<int64_t>(rng() % 1000);
            const int32_t phase = static_cast<int32_t>(rng() % 4) - 1;  // -1..2
            all.push_back({phase, t});
            pf::timer_marks_add(kept, phase, t);
        }
        const int64_t end = t + static_cast<int64_t>(rng() % 1000);
        int64_t a[3], b[3];
        naive_totals(all, end, a, 3);
        pf::timer_marks_totals(kept, end, b, 3);
        for (int p = 0; p < 3; ++p) CHECK(a[p] == b[p]);
        CHECK(kept.size() <= all.size());
        for (size_t i = 1; i < kept.size(); ++i) CHECK(kept[i].phase != kept[i - 1].phase);
    }
}

void test_chunks() {
    // from 0: full chunks, then the tail
    CHECK(pf::chunk_next_len(0, 1200, 512) == 512);
    CHECK(pf::chunk_next_len(512, 1200, 512) == 512);
    CHECK(pf::chunk_next_len(1024, 1200, 512) == 176);
    // a read that resumes at 700 first finishes the chunk that 700 falls in
    CHECK(pf::chunk_next_len(700, 1200, 512) == 324);
    CHECK(pf::chunk_next_len(1023, 1024, 512) == 1);
    CHECK(pf::chunk_next_len(5, 6, 1) == 1);
    // every plan covers [reached, total) exactly, with boundaries on multiples of the chunk
    for (int32_t chunk : {1, 3, 64, 512}) {
        for (int32_t start : {0, 1, 63, 64, 65, 600}) {
            const int32_t total = 1000;
            if (start >= total) continue;
            int32_t pos = start;
            while (pos < total) {
                const int32_t len = pf::chunk_next_len(pos, total, chunk);
                CHECK(len >= 1 && len <= chunk);
                pos += len;
                CHECK(pos == total || pos % chunk == 0);
            }
            CHECK(pos == total);
        }
    }
}

}  // namespace

int main() {
    test_repeat_not_recorded();
    test_idle_phase_not_counted();
    test_empty();
    test_random_same_totals();
    test_chunks();
    if (g_failures) {
        std::fprintf(stderr, "%d failure(s)\n", g_failures);
        return 1;
    }
    std::printf("timer_marks_test: ok\n");
    return 0;
}

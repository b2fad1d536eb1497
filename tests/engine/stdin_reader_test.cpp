// tests/engine/stdin_reader_test.cpp — host test of the stdin reader's ordering rules (engine/stdin_reader.cpp),
// with the schedules forced through a pipe: a BSTOP written right after a BGEN stops it even though the loop has
// not taken the BGEN yet; a BSTOP written before a BGEN is stale for it (BYIELD, GEN and STOP, retired, are
// ordinary lines the loop refuses); immediate commands are not queued; an over-long line becomes one error entry; EOF queues QUIT.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>

#include "stdin_reader.h"

namespace {

int g_failures = 0;
void check(bool ok, const char* what, int line) {
    if (!ok) {
        std::fprintf(stderr, "FAIL line %d: %s\n", line, what);
        ++g_failures;
    }
}
#define CHECK(x) check((x), #x, __LINE__)

constexpr int32_t POP_TIMEOUT_MS = 5000;

void write_str(int fd, const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
        const ssize_t w = ::write(fd, s.data() + off, s.size() - off);
        if (w <= 0) return;
        off += static_cast<size_t>(w);
    }
}

void test_ordering() {
    int fds[2];
    CHECK(::pipe(fds) == 0);
    stdin_reader r(fds[0], 2);
    r.start();
    // all written before the loop takes anything
    write_str(fds[1], "BSTOP 0\nBGEN 0 4 1,2\nBSTOP 0\nBGEN 1 4 3\nBSTOP 1\nBYIELD 0\nSTOP\nGEN 4 5\nVRAM\n"
                      "BSTOP 5\n");
    stdin_line a, b, y, s, g0, c, d;
    CHECK(r.pop(&a, POP_TIMEOUT_MS) && a.text == "BGEN 0 4 1,2" && a.seq == 1);
    CHECK(r.pop(&b, POP_TIMEOUT_MS) && b.text == "BGEN 1 4 3" && b.seq == 2);
    CHECK(r.pop(&y, POP_TIMEOUT_MS) && y.text == "BYIELD 0");
    CHECK(r.pop(&s, POP_TIMEOUT_MS) && s.text == "STOP");         // retired: the loop answers ERR
    CHECK(r.pop(&g0, POP_TIMEOUT_MS) && g0.text == "GEN 4 5" && g0.seq == 2);  // retired: no request number
    CHECK(r.pop(&c, POP_TIMEOUT_MS) && c.text == "VRAM");
    CHECK(r.pop(&d, POP_TIMEOUT_MS) && d.text == "BSTOP 5");  // out of range: left to the loop's ERR
    CHECK(r.slot_stop_requested(0, 1) && !r.slot_stop_requested(0, 2));  // the BSTOP 0 after BGEN 1, not before
    CHECK(r.slot_stop_requested(1, 2) && !r.slot_stop_requested(1, 3));
    // an over-long line is one error entry; the next line is intact
    std::string big(STDIN_LINE_MAX_BYTES + 100, '1');
    std::thread writer([&] {
        write_str(fds[1], "BGEN 0 2 " + big + "\nQUIT\n");
        ::close(fds[1]);
    });
    stdin_line e, f, g;
    CHECK(r.pop(&e, POP_TIMEOUT_MS) && e.too_long && e.text.empty());
    CHECK(r.pop(&f, POP_TIMEOUT_MS) && f.text == "QUIT" && !f.eof);
    CHECK(r.pop(&g, POP_TIMEOUT_MS) && g.eof && g.text == "QUIT");
    writer.join();
    stdin_line none;
    CHECK(!r.pop(&none, 50));
    ::close(fds[0]);
}

}  // namespace

int main() {
    test_ordering();
    if (g_failures) {
        std::fprintf(stderr, "%d failure(s)\n", g_failures);
        return 1;
    }
    std::printf("stdin_reader_test: ok\n");
    return 0;
}

// tests/engine/stdin_reader_test.cpp — host test of the stdin reader's ordering rules (engine/stdin_reader.cpp),
// with the schedules forced through a pipe: a STOP written right after a GEN stops it even though the loop has
// not taken the GEN yet; a STOP written before a GEN is stale for it; BSTOP is stamped the same way (BYIELD, retired, is an ordinary line the loop refuses);
// immediate commands are not queued; an over-long line becomes one error entry; EOF queues QUIT.
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
    write_str(fds[1], "STOP\nGEN 4 1,2\nSTOP\nGEN 4 3\nBSTOP 1\nBYIELD 0\nVRAM\nBSTOP 5\n");
    stdin_line a, b, y, c, d;
    CHECK(r.pop(&a, POP_TIMEOUT_MS) && a.text == "GEN 4 1,2" && a.seq == 1);
    CHECK(r.pop(&b, POP_TIMEOUT_MS) && b.text == "GEN 4 3" && b.seq == 2);
    CHECK(r.pop(&y, POP_TIMEOUT_MS) && y.text == "BYIELD 0");
    CHECK(r.pop(&c, POP_TIMEOUT_MS) && c.text == "VRAM");
    CHECK(r.pop(&d, POP_TIMEOUT_MS) && d.text == "BSTOP 5");  // out of range: left to the loop's ERR
    CHECK(r.stop_requested(1));   // the STOP after GEN 1
    CHECK(!r.stop_requested(2));  // nothing after GEN 2 asked it to stop
    CHECK(r.slot_stop_requested(1, 2) && !r.slot_stop_requested(1, 3) && !r.slot_stop_requested(0, 1));
    // an over-long line is one error entry; the next line is intact
    std::string big(STDIN_LINE_MAX_BYTES + 100, '1');
    std::thread writer([&] {
        write_str(fds[1], "GEN 2 " + big + "\nQUIT\n");
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

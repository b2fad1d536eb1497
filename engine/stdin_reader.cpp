// engine/stdin_reader.cpp — see stdin_reader.h for the contract.
#include "stdin_reader.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>

#include "protocol.h"

namespace {
constexpr size_t READ_BLOCK_BYTES = 64 * 1024;
}

stdin_reader::stdin_reader(int fd, int32_t n_slots) : fd_(fd), n_slots_(n_slots) {
    for (auto& s : bstop_seq_) s.store(0);
}

stdin_reader::~stdin_reader() {
    // The thread blocks in read(); the process exits through main() returning, so it is detached there.
    if (thread_.joinable()) thread_.detach();
}

void stdin_reader::start() { thread_ = std::thread([this] { run(); }); }

void stdin_reader::push(stdin_line&& item) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(std::move(item));
    }
    cv_.notify_all();
}

bool stdin_reader::pop(stdin_line* out, int32_t timeout_ms) {
    std::unique_lock<std::mutex> lock(mu_);
    // a zero timeout (the step loop's look between slot steps) only looks: waiting on the condition with a
    // deadline already past would still cost a futex call every step
    if (timeout_ms <= 0 ? queue_.empty()
                        : !cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [this] { return !queue_.empty(); })) {
        return false;
    }
    *out = std::move(queue_.front());
    queue_.pop_front();
    return true;
}

bool stdin_reader::has_queued() {
    std::lock_guard<std::mutex> lock(mu_);
    return !queue_.empty();
}

bool stdin_reader::slot_stop_requested(int32_t slot, int64_t seq) const {
    if (slot < 0 || slot >= STDIN_SLOTS_MAX) return false;
    return bstop_seq_[slot].load(std::memory_order_acquire) >= seq;
}

void stdin_reader::handle_line(std::string&& line, bool too_long) {
    stdin_line item;
    item.too_long = too_long;
    if (too_long) {
        item.seq = req_seq_.load();
        push(std::move(item));
        return;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // The immediate commands are recognised here without a full parse (they are short).
    if (line.size() < 64) {
        command cmd;
        if (protocol_parse(line, 1, &cmd)) {
            const int64_t stamp = req_seq_.load();
            if (cmd.kind == CMD_BSTOP && cmd.slot < n_slots_) {
                bstop_seq_[cmd.slot].store(stamp, std::memory_order_release);
                return;
            }
        }
    }
    // BGEN/BEMB open a new request number (a cheap prefix test: the loop does the real parse).
    const bool is_request = line.compare(0, 5, "BGEN ") == 0 || line.compare(0, 5, "BEMB ") == 0;
    item.seq = is_request ? req_seq_.load() + 1 : req_seq_.load();
    if (is_request) req_seq_.store(item.seq, std::memory_order_release);
    item.text = std::move(line);
    push(std::move(item));
}

void stdin_reader::run() {
    std::vector<char> block(READ_BLOCK_BYTES);
    std::string line;
    bool dropping = false;  // inside a line over the limit: skip to its '\n'
    for (;;) {
        const ssize_t got = ::read(fd_, block.data(), block.size());
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        size_t start = 0;
        for (size_t i = 0; i < static_cast<size_t>(got); ++i) {
            if (block[i] != '\n') continue;
            if (!dropping) {
                line.append(block.data() + start, i - start);
                if (line.size() > STDIN_LINE_MAX_BYTES) {
                    handle_line(std::string(), true);
                } else {
                    handle_line(std::move(line), false);
                }
            } else {
                handle_line(std::string(), true);
                dropping = false;
            }
            line.clear();
            start = i + 1;
        }
        if (!dropping) {
            line.append(block.data() + start, static_cast<size_t>(got) - start);
            if (line.size() > STDIN_LINE_MAX_BYTES) {
                dropping = true;
                line.clear();
                line.shrink_to_fit();
            }
        }
    }
    if (!dropping && !line.empty()) handle_line(std::move(line), false);  // a last line without '\n'
    stdin_line quit;
    quit.text = "QUIT";
    quit.eof = true;
    quit.seq = req_seq_.load();
    push(std::move(quit));
}

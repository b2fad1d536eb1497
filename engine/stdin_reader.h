// engine/stdin_reader.h — reads the engine's stdin on its own thread.
//
// Contract:
//  - BSTOP <slot> acts at once, while a request runs: the reader records it in an atomic that the serve loop
//    polls at every slot step. Every other line is queued, in order, for the loop to run between two steps.
//  - Staleness: each queued BGEN/BEMB gets a sequence number (1, 2, ...). A BSTOP is stamped with the number
//    of the last BGEN/BEMB read before it, and applies to a slot's request only when that stamp is at least
//    the request's own number. So a BSTOP written after a request ended never stops the next one, and a BSTOP
//    written right after a BGEN (before the loop took that BGEN) still stops it.
//  - A line over STDIN_LINE_MAX_BYTES is dropped whole (up to its '\n') and queued as an error entry, which
//    the loop answers with ERR; the engine keeps running. EOF queues a QUIT.
//  - One reader per process; it never writes to stdout (the loop is stdout's only writer).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

// 4 MiB: the longest line the contract allows (a 1M-token prompt of 3-character ids fits).
constexpr size_t STDIN_LINE_MAX_BYTES = 4u << 20;
// The most slots the protocol knows (the reader keeps one BSTOP stamp per slot).
constexpr int32_t STDIN_SLOTS_MAX = 8;

struct stdin_line {
    std::string text;
    int64_t seq = 0;        // GEN/BGEN: this request's number; otherwise the last request number before it
    bool too_long = false;  // the line was over the limit and dropped (text is empty)
    bool eof = false;       // stdin ended (text is "QUIT")
};

class stdin_reader {
public:
    // fd: the file descriptor to read (0). n_slots: slots the engine runs, for BSTOP range checks.
    stdin_reader(int fd, int32_t n_slots);
    ~stdin_reader();
    void start();

    // Waits up to timeout_ms for the next queued line. Returns false on timeout.
    bool pop(stdin_line* out, int32_t timeout_ms);
    bool has_queued();

    // Whether the request numbered `seq` was asked to stop / its slot asked to stop.
    bool slot_stop_requested(int32_t slot, int64_t seq) const;

private:
    void run();
    void handle_line(std::string&& line, bool too_long);
    void push(stdin_line&& item);

    int fd_;
    int32_t n_slots_;
    std::thread thread_;

    std::mutex mu_;                    // guards queue_
    std::condition_variable cv_;       // signalled on every push
    std::deque<stdin_line> queue_;

    std::atomic<int64_t> req_seq_{0};  // number of the last GEN/BGEN read (written by the reader thread only)
    std::atomic<int64_t> bstop_seq_[STDIN_SLOTS_MAX];  // stamp of the last BSTOP per slot
};

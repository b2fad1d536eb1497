// engine/serve_loop.cpp — see serve_loop.h for the contract.
#include "serve_loop.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>

#include "grammar.h"
#include "protocol.h"
#include "sampler.h"
#include "session.h"
#include "slots.h"
#include "stdin_reader.h"

namespace {

using clock_type = std::chrono::steady_clock;

// The server keeps the same margin (CTX_SLACK): a request needs n + max_new + 8 <= context.
constexpr int32_t CTX_SLACK_TOKENS = 8;
// How long the loop blocks on an empty queue when no slot is busy (any line wakes it at once).
constexpr int32_t IDLE_WAIT_MS = 1000;
// Commands taken between two slot steps at most (BGEN acceptances are short; a flood cannot stall the slots).
constexpr int32_t COMMANDS_PER_STEP = 16;
// BSAVE/BRESTORE progress: one SESSION line per this many bytes at most.
constexpr uint64_t SESSION_LINE_BYTES = 16u << 20;

double ms_between(clock_type::time_point a, clock_type::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

void err_line(const std::string& why) { protocol_write_line("ERR " + protocol_message(why)); }

class serve_loop {
public:
    serve_loop(strata_model* model, const engine_config& cfg, int stdin_fd)
        : model_(model), info_(model_get_info(model)), cfg_(cfg),
          reader_(stdin_fd, cfg.n_slots),
          cache_(model, cfg.kv, cfg.conv_slots, static_cast<size_t>(cfg.conv_mib) << 20),
          slots_(model, cfg.n_slots, cfg.n_ctx, cfg.kv),
          rng_(std::random_device{}()) {
        slots_.set_drafting(cfg.drafting, cfg.draft);
        if (cfg.n_slots == 1) slots_.set_read_chunk(cfg.chunk);  // nothing is admitted beside its read (slots.h)
    }

    int run();

private:
    bool handle(const stdin_line& line);  // false: QUIT
    void run_bgen(const command& cmd, int64_t seq);
    void run_bemb(const command& cmd, int64_t seq);
    bool check_slot(const char* verb, int32_t s);
    void run_session_file(const command& cmd);
    void run_vram();
    std::string experts_line() const;
    void run_berase(int32_t slot);
    void run_bclose(int32_t slot);
    bool check_request(const command& cmd);
    uint64_t request_seed(const sampler_params& sp);
    bool start_grammar(const command& cmd, std::shared_ptr<grammar_matcher>* out);
    void slot_steps();

    strata_model* model_;
    const model_info& info_;
    engine_config cfg_;
    stdin_reader reader_;
    conversation_cache cache_;
    slot_table slots_;
    grammar_cache grammars_;       // recent requests' grammars (grammar= key)
    std::mt19937_64 rng_;          // seeds of requests that bring none (when --seed is absent)
};

int serve_loop::run() {
    reader_.start();
    for (;;) {
        stdin_line line;
        if (slots_.any_busy()) {
            // the queued commands first (an admission is accepted at once), then one step of the slots
            for (int32_t k = 0; k < COMMANDS_PER_STEP && reader_.pop(&line, 0); ++k) {
                if (!handle(line)) return 0;
            }
            slot_steps();
            protocol_flush_tokens_due();
        } else {
            protocol_flush_tokens();  // nothing is held while the engine waits
            if (reader_.pop(&line, IDLE_WAIT_MS) && !handle(line)) return 0;
        }
    }
}

void serve_loop::slot_steps() {
    std::string err;
    if (!slots_.step(reader_, cfg_.eos_ids, cfg_.step_tokens, &err)) {
        std::fprintf(stderr, "strata: batch step refused by the model: %s\n", err.c_str());
    }
}

bool serve_loop::handle(const stdin_line& line) {
    if (line.eof) return false;
    if (line.too_long) {
        err_line("line over " + std::to_string(STDIN_LINE_MAX_BYTES >> 20) + " MiB (dropped)");
        return true;
    }
    command cmd;
    if (!protocol_parse(line.text, info_.n_vocab, &cmd)) {
        err_line(cmd.error);
        return true;
    }
    switch (cmd.kind) {
        case CMD_NONE: return true;
        case CMD_QUIT: return false;
        case CMD_BGEN: run_bgen(cmd, line.seq); return true;
        case CMD_BEMB: run_bemb(cmd, line.seq); return true;
        case CMD_BSAVE:
        case CMD_BRESTORE: run_session_file(cmd); return true;
        case CMD_BERASE: run_berase(cmd.slot); return true;
        case CMD_BCLOSE: run_bclose(cmd.slot); return true;
        case CMD_VRAM: run_vram(); return true;
        case CMD_PING: protocol_write_line("PONG " + std::to_string(cmd.ping)); return true;
        case CMD_BSTOP:
            // the reader acts on valid slots itself; only an out-of-range slot reaches the loop
            err_line("BSTOP: no slot " + std::to_string(cmd.slot) + " (batch slots: " + std::to_string(cfg_.n_slots) + ")");
            return true;
    }
    return true;
}

bool serve_loop::check_request(const command& cmd) {
    const int64_t n = static_cast<int64_t>(cmd.ids.size());
    if (n == 0) {
        err_line("empty prompt");
        return false;
    }
    if (n + cmd.max_new + CTX_SLACK_TOKENS > cfg_.n_ctx) {
        err_line("context: " + std::to_string(n) + " prompt + " + std::to_string(cmd.max_new) + " max_new + " +
                 std::to_string(CTX_SLACK_TOKENS) + " > " + std::to_string(cfg_.n_ctx));
        return false;
    }
    return true;
}

uint64_t serve_loop::request_seed(const sampler_params& sp) {
    if (sp.has_seed) return sp.seed;
    if (cfg_.has_seed) return cfg_.seed;
    return rng_();
}

// The request's grammar matcher (nullptr without grammar=). False (ERR written) when the grammar is refused.
bool serve_loop::start_grammar(const command& cmd, std::shared_ptr<grammar_matcher>* out) {
    out->reset();
    if (cmd.grammar.empty()) return true;
    std::string err;
    *out = grammars_.start(cmd.grammar, cfg_.vocab, &err);
    if (*out) {  // the reply must be able to end as a whole sentence within max_new (grammar.h, close_tokens)
        const int32_t need = (*out)->close_tokens();
        if (need > cmd.max_new) {
            err = need == GRAM_CLOSE_NEVER ? "grammar: its shortest reply cannot be written in this vocabulary"
                                           : "grammar: its shortest reply takes " + std::to_string(need) +
                                                 " tokens, above max_new " + std::to_string(cmd.max_new) +
                                                 ": raise the request's token limit";
            out->reset();
        }
    }
    if (!*out) err_line(err);
    return *out != nullptr;
}

// Whether slot s can take an admission (ERR written when not).
bool serve_loop::check_slot(const char* verb, int32_t s) {
    const std::string v = verb;
    if (s >= cfg_.n_slots) {
        err_line(v + ": no slot " + std::to_string(s) + " (batch slots: " + std::to_string(cfg_.n_slots) + ")");
        return false;
    }
    if (slots_.at(s).phase != SLOT_IDLE) {
        err_line(v + ": slot " + std::to_string(s) + " is busy");
        return false;
    }
    return true;
}

// An admission: checked, its prefix reused into the slot and accepted at once (BACC); the read goes on in
// the slots' steps.
void serve_loop::run_bgen(const command& cmd, int64_t seq) {
    const int32_t s = cmd.slot;
    if (!check_slot("BGEN", s)) return;
    if (!check_request(cmd)) return;
    std::shared_ptr<grammar_matcher> gm;
    if (!start_grammar(cmd, &gm)) return;
    if (!slots_.ensure_kv(s)) {
        err_line("BGEN: cannot allocate the KV cache of slot " + std::to_string(s));
        return;
    }
    slots_.time_admission(s);
    seq_state* target = &slots_.at(s).st;
    std::vector<const seq_state*> others;
    slots_.reuse_states(s, &others);  // busy slots too: between steps their kv holds exactly their tokens
    const reuse_source src = session_find_reuse(*target, cmd.ids, &cache_, others);
    const int32_t reused = session_apply_reuse(target, cmd.ids, src, &cache_);
    const int32_t ckpt = cmd.ckpt ? session_turn_checkpoint(cmd.ids, cfg_.turn_token) : 0;
    slots_.accept(s, seq, cmd.ids, reused, ckpt, cmd.max_new, cmd.sampling, request_seed(cmd.sampling), std::move(gm),
                  cmd.draft);
    protocol_write_line("BACC " + std::to_string(s) + " " + std::to_string(reused));
}

// An embedding in a slot: accepted at once (BACC <slot> 0: it reads every position itself), read in the
// slots' steps; the slot's previous conversation is parked first when it is one (session_apply_reuse).
void serve_loop::run_bemb(const command& cmd, int64_t seq) {
    const int32_t s = cmd.slot;
    if (!check_slot("BEMB", s) || !check_request(cmd)) return;
    if (!slots_.ensure_kv(s)) {
        err_line("BEMB: cannot allocate the KV cache of slot " + std::to_string(s));
        return;
    }
    slots_.time_admission(s);
    session_apply_reuse(&slots_.at(s).st, cmd.ids, reuse_source{}, &cache_);
    slots_.accept_embed(s, seq, cmd.ids);
    protocol_write_line("BACC " + std::to_string(s) + " 0");
}

void serve_loop::run_session_file(const command& cmd) {
    const clock_type::time_point t0 = clock_type::now();
    uint64_t last_line = 0;
    auto progress = [&](uint64_t done, uint64_t total) {
        if (done < total && done - last_line < SESSION_LINE_BYTES) return;
        last_line = done;
        protocol_write_line("SESSION " + std::to_string(done) + " " + std::to_string(total));
    };
    const bool save = cmd.kind == CMD_BSAVE;
    const char* verb = save ? "BSAVE" : "BRESTORE";
    if (!check_slot(verb, cmd.slot)) return;
    if (!slots_.ensure_kv(cmd.slot)) {
        err_line(std::string(verb) + ": cannot allocate the KV cache of slot " + std::to_string(cmd.slot));
        return;
    }
    seq_state* st = &slots_.at(cmd.slot).st;
    const session_io_result r = save ? session_save(model_, *st, cfg_.kv, cmd.path, progress)
                                     : session_restore(model_, st, cfg_.kv, cmd.path, progress);
    if (!r.ok) {
        protocol_write_line("SERR " + r.kind + (r.published ? " 1 " : " 0 ") + protocol_message(r.reason));
        return;
    }
    protocol_write_line(std::string(save ? "SAVED " : "RESTORED ") + std::to_string(r.n_tokens) + " " +
                        std::to_string(r.bytes) + " " + protocol_fixed1(ms_between(t0, clock_type::now())));
}

// BERASE: an idle slot forgets its tokens (its KV positions are garbage from then on, as the contract has it).
void serve_loop::run_berase(int32_t slot) {
    if (!check_slot("BERASE", slot)) return;
    seq_state& st = slots_.at(slot).st;
    const size_t n = st.tokens.size();
    st.tokens.clear();
    st.ckpt_len = 0;
    protocol_write_line("ERASED " + std::to_string(slot) + " " + std::to_string(n));
}

// BCLOSE: a decoding slot with a grammar ends with its shortest completion (the server's loop guard uses it so
// that a reply it stops still parses); finish `length`. No request or no grammar: ERR.
void serve_loop::run_bclose(int32_t i) {
    if (i < 0 || i >= cfg_.n_slots) {
        err_line("BCLOSE: no slot " + std::to_string(i) + " (batch slots: " + std::to_string(cfg_.n_slots) + ")");
        return;
    }
    slot& s = slots_.at(i);
    if (s.phase == SLOT_IDLE || !s.gm) {
        err_line("BCLOSE: slot " + std::to_string(i) + (s.phase == SLOT_IDLE ? " is idle" : " has no grammar"));
        return;
    }
    s.close_now = true;
}

void serve_loop::run_vram() {
    // The CPU engine has no device memory: it answers with its RAM figures.
    long total_kib = -1, avail_kib = -1, rss_kib = -1;
    std::ifstream mem("/proc/meminfo");
    std::string key;
    long value = 0;
    std::string unit;
    while (mem >> key >> value >> unit) {
        if (key == "MemTotal:") total_kib = value;
        if (key == "MemAvailable:") avail_kib = value;
    }
    std::ifstream status("/proc/self/status");
    std::string word;
    while (status >> word) {
        if (word == "VmRSS:") {
            status >> rss_kib;
            break;
        }
    }
    protocol_write_line("VRAM backend=cpu ram_total_mib=" + std::to_string(total_kib / 1024) +
                        " ram_free_mib=" + std::to_string(avail_kib / 1024) + " rss_mib=" + std::to_string(rss_kib / 1024) +
                        " conversation_cache_parked=" + std::to_string(cache_.size()) +
                        " conversation_cache_bytes=" + std::to_string(cache_.bytes()) + experts_line());
}

}  // namespace

// The expert tiers' figures for the VRAM answer (engine/expert_tiers.h); empty for a dense model.
std::string serve_loop::experts_line() const {
    const expert_figures f = model_expert_figures(model_);
    if (f.total == 0) return "";
    return " experts_total=" + std::to_string(f.total) + " experts_resident=" + std::to_string(f.resident) +
           " experts_hits=" + std::to_string(f.hits) + " experts_misses=" + std::to_string(f.misses) +
           " experts_swaps=" + std::to_string(f.swaps);
}

int serve_loop_run(strata_model* model, const engine_config& config, int stdin_fd) {
    auto loop = std::make_unique<serve_loop>(model, config, stdin_fd);
    return loop->run();
}

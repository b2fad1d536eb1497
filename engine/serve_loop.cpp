// engine/serve_loop.cpp — see serve_loop.h for the contract.
#include "serve_loop.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <random>

#include "prefill/chunking.hpp"
#include "embed.h"
#include "grammar.h"
#include "logprobs.h"
#include "prefill/pf_timer.h"
#include "protocol.h"
#include "sampler.h"
#include "cpu/step_timer.h"
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
// SAVE/RESTORE progress: one SESSION line per this many bytes at most.
constexpr uint64_t SESSION_LINE_BYTES = 16u << 20;

double ms_between(clock_type::time_point a, clock_type::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

void err_line(const std::string& why) { protocol_write_line("ERR " + protocol_message(why)); }

enum read_end : int32_t {
    READ_DONE = 0,   // the prompt is read; first token sampled
    READ_CANCEL,     // STOP
    READ_NONFINITE,  // the last logits were not finite
    READ_FAILED,     // the model refused (ERR written)
    READ_NO_TOKEN,   // the request's grammar allows no token (DONE ... stop)
};

const char* read_finish(read_end end) {
    return end == READ_NONFINITE ? "nonfinite" : end == READ_NO_TOKEN ? "stop" : "cancel";
}

struct read_result {
    read_end end = READ_DONE;
    int32_t reused = 0;
    int32_t read = 0;          // prompt tokens evaluated by this request
    int32_t first = -1;        // first generated token (READ_DONE)
    double prompt_ms = 0.0;
};

class serve_loop {
public:
    serve_loop(strata_model* model, const engine_config& cfg, int stdin_fd)
        : model_(model), info_(model_get_info(model)), cfg_(cfg),
          reader_(stdin_fd, cfg.n_slots),
          cache_(model, cfg.kv, cfg.conv_slots, static_cast<size_t>(cfg.conv_mib) << 20),
          slots_(model, cfg.n_slots, cfg.n_ctx, cfg.kv),
          rng_(std::random_device{}()) {
        if (cfg.n_slots == 0) live_.kv = kv_cache_init(model, cfg.n_ctx, cfg.kv);  // with slots: at its first use
        logits_.resize(static_cast<size_t>(info_.n_vocab));
        slots_.set_drafting(cfg.drafting, cfg.draft);
        if (cfg.n_slots == 1) slots_.set_read_chunk(cfg.chunk);  // nothing is admitted beside its read (slots.h)
    }
    ~serve_loop() {
        if (live_.kv) kv_cache_free(live_.kv);
        if (draft_live_.kv) kv_cache_free(draft_live_.kv);
    }

    int run();

private:
    bool handle(const stdin_line& line);  // false: QUIT
    void run_gen(const command& cmd, int64_t seq);
    void run_bgen(const command& cmd, int64_t seq);
    void run_emb(const command& cmd, int64_t seq);
    void run_bemb(const command& cmd, int64_t seq);
    bool check_slot(const char* verb, int32_t s);
    bool ensure_live();
    void run_session_file(const command& cmd);
    void run_vram();
    std::string experts_line() const;
    void run_berase(int32_t slot);
    void run_bclose(int32_t slot);
    bool check_request(const command& cmd);
    uint64_t request_seed(const sampler_params& sp);
    read_result read_prompt(const command& cmd, int64_t seq, clock_type::time_point t0, grammar_matcher* gm);
    bool start_grammar(const command& cmd, std::shared_ptr<grammar_matcher>* out);
    void slot_steps();
    int eval_with_slots(kv_cache* kv, const int32_t* toks, int32_t len, int32_t pos, int32_t n_want, std::string* err);
    const char* decode_solo(const command& cmd, int64_t seq, grammar_matcher* gm, int32_t first, int32_t* generated,
                            draft_ctl* dctl);
    bool decode_step(const command& cmd, grammar_matcher* gm, draft_ctl* dctl,
                     const std::function<bool(int32_t, int32_t, const float*)>& emit, int32_t* tok, const char** finish);
    void drop_poisoned(seq_state* st);
    std::string done_line(int32_t generated, int32_t n_prompt, double prompt_ms, double decode_ms,
                          const char* finish, int32_t reused, int32_t read, const draft_ctl* dctl) const;

    strata_model* model_;
    const model_info& info_;
    engine_config cfg_;
    stdin_reader reader_;
    conversation_cache cache_;
    slot_table slots_;
    seq_state live_;               // the solo session
    seq_state draft_live_;         // the draft model's copy of the solo session (--draft-model)
    std::vector<int32_t> drafts_;  // the solo step's proposed tokens
    std::vector<float> logits_;    // (n_vocab) the last prompt token's logits, or the last decode step's
    sampler_scratch scratch_;
    sampler_state solo_state_;  // the running solo request's sampler state (mirostat's mu); new per GEN
    std::vector<float> lp_work_;   // (n_vocab) biased logits of a logprobs= request (engine/logprobs.h)
    pf_timer timer_;
    grammar_cache grammars_;       // recent requests' grammars (grammar= key)
    std::mt19937_64 rng_;          // seeds of requests that bring none (when --seed is absent)
    // eval_with_slots' batch (reused: no allocation per step once warm)
    std::vector<int32_t> mix_rows_, mix_token_, mix_pos_, mix_seq_;
    std::vector<uint8_t> mix_want_;
    std::vector<kv_cache*> mix_kvs_;
    std::vector<float> mix_logits_;
};

int serve_loop::run() {
    if (cfg_.n_slots == 0 && live_.kv == nullptr) {
        std::fprintf(stderr, "strata: cannot allocate the KV cache for %d positions\n", cfg_.n_ctx);
        return 1;
    }
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

// Evaluates len tokens of the solo sequence at pos (the last one's logits into logits_). When slots decode, their
// step rides in the same batch: one pass over the weights for the chunk (or the solo token) and every slot's
// next token, each entry computed from its own data alone, so the results are those of two separate calls.
// A batch the model refuses is retried as the sequence alone and then the slots' own step, so a refusal
// reads as it did before (ERR for the sequence, BDONE ... nonfinite for the slots).
int serve_loop::eval_with_slots(kv_cache* kv, const int32_t* toks, int32_t len, int32_t pos, int32_t n_want,
                                std::string* err) {
    const size_t nv = static_cast<size_t>(info_.n_vocab);
    if (slots_.any_decoding()) slots_.collect(reader_, &mix_rows_);
    else mix_rows_.clear();
    if (mix_rows_.empty() && n_want == 1) return model_eval_seq(model_, kv, toks, len, pos, logits_.data(), err);
    slots_.propose(mix_rows_, SLOTS_MAX * DRAFT_K_MAX);
    mix_token_.assign(toks, toks + len);
    mix_pos_.clear();
    for (int32_t i = 0; i < len; ++i) mix_pos_.push_back(pos + i);
    mix_seq_.assign(static_cast<size_t>(len), 0);
    mix_kvs_.assign(1, kv);
    slots_.append(mix_rows_, 1, &mix_token_, &mix_pos_, &mix_seq_, &mix_kvs_);
    mix_want_.assign(mix_token_.size(), 1);
    std::fill(mix_want_.begin(), mix_want_.begin() + (len - n_want), 0);
    eval_batch b;
    b.n = static_cast<int32_t>(mix_token_.size());
    b.token = mix_token_.data();
    b.pos = mix_pos_.data();
    b.seq = mix_seq_.data();
    b.want_logits = mix_want_.data();
    b.kvs = mix_kvs_.data();
    b.n_seq = static_cast<int32_t>(mix_kvs_.size());
    const size_t n_out = static_cast<size_t>(n_want) + (mix_token_.size() - static_cast<size_t>(len));
    mix_logits_.resize(n_out * nv);
    if (model_eval(model_, b, mix_logits_.data(), err) != 0) {
        if (mix_rows_.empty()) return -1;
        slots_.fail(mix_rows_);  // then the sequence alone, so a refusal reads as the sequence's own
        return eval_with_slots(kv, toks, len, pos, n_want, err);
    }
    logits_.assign(mix_logits_.begin(), mix_logits_.begin() + static_cast<std::ptrdiff_t>(size_t(n_want) * nv));
    slots_.after_eval(mix_rows_, mix_logits_.data() + size_t(n_want) * nv, cfg_.eos_ids);
    return 0;
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
        case CMD_GEN:
        case CMD_EMB:
        case CMD_SAVE:
        case CMD_RESTORE:
            if (!ensure_live()) return true;
            break;
        default: break;
    }
    switch (cmd.kind) {
        case CMD_GEN: run_gen(cmd, line.seq); return true;
        case CMD_BGEN: run_bgen(cmd, line.seq); return true;
        case CMD_EMB: run_emb(cmd, line.seq); return true;
        case CMD_BEMB: run_bemb(cmd, line.seq); return true;
        case CMD_SAVE:
        case CMD_RESTORE:
        case CMD_BSAVE:
        case CMD_BRESTORE: run_session_file(cmd); return true;
        case CMD_BERASE: run_berase(cmd.slot); return true;
        case CMD_BCLOSE: run_bclose(cmd.slot); return true;
        case CMD_VRAM: run_vram(); return true;
        case CMD_PING: protocol_write_line("PONG " + std::to_string(cmd.ping)); return true;
        case CMD_STOP: return true;  // stale: the reader acts on STOP itself
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

std::string serve_loop::done_line(int32_t generated, int32_t n_prompt, double prompt_ms, double decode_ms,
                                  const char* finish, int32_t reused, int32_t read, const draft_ctl* dctl) const {
    // generated prompt prompt_ms decode_ms finish drafts_acc drafts_off reused hits lookups ram_blobs
    // file_blobs file_mb prompt_read offloaded; the CPU engine measures no experts or file reads, and no
    // drafts when drafting is off (engine or request).
    const std::string drafts =
        dctl ? std::to_string(dctl->accepted) + " " + std::to_string(dctl->offered) : std::string("- -");
    return "DONE " + std::to_string(generated) + " " + std::to_string(n_prompt) + " " + protocol_fixed1(prompt_ms) +
           " " + protocol_fixed1(decode_ms) + " " + finish + " " + drafts + " " + std::to_string(reused) + " - - - - - " +
           std::to_string(read) + " - chunk=" + std::to_string(cfg_.chunk) +
           (dctl ? " drafts_n=" + std::to_string(dctl->steps) : std::string()) + expert_words(model_);
}

void serve_loop::drop_poisoned(seq_state* st) {
    st->tokens.clear();
    st->ckpt_len = 0;
    cache_.clear();
    slots_.clear_idle();
}

// Reads cmd.ids into the solo session (reusing what it can), chunk by chunk, and samples the first token.
// Decoding slots ride in the chunks' batches; reading slots wait (the server sends GEN only to a solo engine).
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

read_result serve_loop::read_prompt(const command& cmd, int64_t seq, clock_type::time_point t0,
                                    grammar_matcher* gm) {
    read_result r;
    seq_state* target = &live_;
    const std::vector<int32_t>& prompt = cmd.ids;
    const int32_t n = static_cast<int32_t>(prompt.size());
    timer_.begin();
    timer_.mark(PF_PHASE_LOOKUP);
    step_timer_begin();
    std::vector<const seq_state*> others;
    slots_.idle_states(-1, &others);
    const reuse_source src = session_find_reuse(*target, prompt, &cache_, others);
    r.reused = session_apply_reuse(target, prompt, src, &cache_);
    protocol_write_line("RESUME " + std::to_string(r.reused));
    const int32_t ckpt = cmd.ckpt ? session_turn_checkpoint(prompt, cfg_.turn_token) : 0;

    int32_t pos = r.reused;
    const clock_type::time_point t_read = clock_type::now();
    while (pos < n) {
        const int32_t len = pf::chunk_next_len(pos, n, cfg_.chunk);
        timer_.mark(PF_PHASE_READ);
        std::string err;
        if (eval_with_slots(target->kv, prompt.data() + pos, len, pos, 1, &err) != 0) {
            target->tokens.resize(static_cast<size_t>(pos));
            err_line("model: " + err);
            r.end = READ_FAILED;
            timer_.finish(r.read);
            return r;
        }
        target->tokens.insert(target->tokens.end(), prompt.begin() + pos, prompt.begin() + pos + len);
        pos += len;
        r.read += len;
        timer_.mark(PF_PHASE_EMIT);
        const clock_type::time_point now = clock_type::now();
        const double read_s = std::max(1e-9, ms_between(t_read, now) / 1000.0);
        protocol_write_line("PP " + std::to_string(pos) + " " + std::to_string(n) + " " +
                            protocol_fixed1(ms_between(t0, now)) + " " + protocol_fixed1(r.read / read_s));
        if (pos >= n) break;
        if (reader_.stop_requested(seq)) {
            r.end = READ_CANCEL;
            break;
        }
    }
    target->ckpt_len = std::min<int32_t>(ckpt, static_cast<int32_t>(target->tokens.size()));
    if (r.end == READ_DONE) {
        timer_.mark(PF_PHASE_SAMPLE);
        const uint64_t seed = request_seed(cmd.sampling);
        if (gm) gm->set_budget(cmd.max_new);  // the reply always parses (grammar.h, set_budget)
        const sample_status st =
            grammar_sample(gm, cmd.sampling, logits_.data(), info_.n_vocab, prompt.data(), n, n, seed, &scratch_, &r.first);
        r.end = st == SAMPLE_OK ? READ_DONE : st == SAMPLE_NO_TOKEN ? READ_NO_TOKEN : READ_NONFINITE;
    }
    r.prompt_ms = ms_between(t0, clock_type::now());
    timer_.finish(r.read);
    step_timer_finish(r.read, "prefill");
    return r;
}

void serve_loop::run_gen(const command& cmd_in, int64_t seq) {
    if (!check_request(cmd_in)) return;
    std::shared_ptr<grammar_matcher> gm;
    if (!start_grammar(cmd_in, &gm)) return;
    const clock_type::time_point t0 = clock_type::now();
    command cmd = cmd_in;
    cmd.sampling.has_seed = true;
    cmd.sampling.seed = request_seed(cmd_in.sampling);  // one seed for the whole request
    solo_state_ = sampler_state{};
    scratch_.state = &solo_state_;
    const int32_t n = static_cast<int32_t>(cmd.ids.size());
    const bool drafting = cfg_.drafting != DRAFTING_OFF && cmd.draft;
    draft_ctl dctl;
    read_result r = read_prompt(cmd, seq, t0, gm.get());
    if (r.end == READ_FAILED) return;
    if (r.end != READ_DONE) {
        if (r.end == READ_NONFINITE) drop_poisoned(&live_);
        protocol_write_line(done_line(0, n, r.prompt_ms, 0.0, read_finish(r.end), r.reused, r.read,
                                      drafting ? &dctl : nullptr));
        return;
    }
    const clock_type::time_point t_dec = clock_type::now();
    int32_t generated = 0;
    step_timer_begin();
    const char* finish = decode_solo(cmd, seq, gm.get(), r.first, &generated, drafting ? &dctl : nullptr);
    const double decode_ms = ms_between(t_dec, clock_type::now());
    step_timer_finish(generated - 1);  // the evaluated steps: the first token came with the prompt
    protocol_write_line(done_line(generated, n, r.prompt_ms, decode_ms, finish, r.reused, r.read,
                                  drafting ? &dctl : nullptr));
    std::fprintf(stderr, "strata: GEN prompt=%d reused=%d read=%d generated=%d finish=%s prompt_ms=%.1f decode_tok_s=%.1f"
                 " drafts=%lld/%lld\n", n, r.reused, r.read, generated, finish, r.prompt_ms,
                 generated > 1 ? (generated - 1) * 1000.0 / std::max(1e-6, decode_ms) : 0.0,
                 static_cast<long long>(dctl.accepted), static_cast<long long>(dctl.offered));
}

// The solo request's decode: emits `first`, then one step at a time (the pending token and its drafts in one
// evaluation) until a stop. Returns the finish reason. dctl: the request's drafting (nullptr: none).
const char* serve_loop::decode_solo(const command& cmd, int64_t seq, grammar_matcher* gm, int32_t first,
                                    int32_t* generated, draft_ctl* dctl) {
    const char* finish = "length";
    // T line (with the log-probs when asked, from `row`: the logits row tok was sampled from) and the stop
    // rules of one token; `held`: the tokens the session holds before it. False ends it.
    auto emit = [&](int32_t tok, int32_t held, const float* row) {
        step_mark(STEP_EMIT);
        protocol_write_line("T " + std::to_string(tok) +
                            logprobs_line(cmd.sampling, row, info_.n_vocab, tok, scratch_, &lp_work_));
        step_mark(STEP_OTHER);
        *generated += 1;
        if (std::find(cfg_.eos_ids.begin(), cfg_.eos_ids.end(), tok) != cfg_.eos_ids.end()) {
            finish = gm && gm->closing() ? "length" : "stop";  // closed early by the budget: still the cap's end
            return false;
        }
        return *generated < cmd.max_new && held + 1 < cfg_.n_ctx;  // else "length"
    };
    int32_t tok = first;
    // logits_ holds the prompt's last row, which `first` was sampled from
    if (!emit(tok, static_cast<int32_t>(live_.tokens.size()), logits_.data())) return finish;
    for (;;) {
        if (reader_.stop_requested(seq)) return "cancel";
        if (!decode_step(cmd, gm, dctl, emit, &tok, &finish)) return finish;
    }
}

// One decode step of the solo session: feeds the pending *tok (and the drafts proposed after it), then emits
// the tokens kept (draft_verify). The session then holds every kept token but the last, which becomes *tok.
// False when the request ends (finish set).
bool serve_loop::decode_step(const command& cmd, grammar_matcher* gm, draft_ctl* dctl,
                             const std::function<bool(int32_t, int32_t, const float*)>& emit, int32_t* tok, const char** finish) {
    const int32_t p = static_cast<int32_t>(live_.tokens.size());
    live_.tokens.push_back(*tok);
    drafts_.clear();
    const int32_t generated_now = p + 1 - static_cast<int32_t>(cmd.ids.size());
    if (dctl != nullptr) {
        // no draft past the reply's cap or the context
        const int32_t room = std::min(cmd.max_new - generated_now - 1, cfg_.n_ctx - p - 2);
        const int32_t k = std::min(dctl->want(), room);
        draft_propose(cfg_.drafting, cfg_.draft, &draft_live_, live_.tokens.data(), p + 1, k, &drafts_);
    }
    live_.tokens.insert(live_.tokens.end(), drafts_.begin(), drafts_.end());
    const int32_t n_drafts = static_cast<int32_t>(drafts_.size());
    std::string err;
    if (eval_with_slots(live_.kv, live_.tokens.data() + p, n_drafts + 1, p, n_drafts + 1, &err) != 0) {
        std::fprintf(stderr, "strata: decode refused by the model: %s\n", err.c_str());
        drop_poisoned(&live_);
        *finish = "nonfinite";
        return false;
    }
    bool go = true;
    int32_t n_kept = 0;
    auto emit_kept = [&](int32_t t) {
        *tok = t;
        // the kept token n_kept was sampled from row n_kept (the pending token's, then each draft's)
        const float* row = logits_.data() + static_cast<size_t>(n_kept) * static_cast<size_t>(info_.n_vocab);
        return go = emit(t, p + 1 + n_kept++, row);
    };
    int32_t n_emitted = 0, n_accepted = 0;
    step_mark(STEP_SAMPLE);
    if (gm) gm->set_budget(cmd.max_new - generated_now - n_drafts);  // the last draft's position, to be safe
    const sample_status st = draft_verify(gm, cmd.sampling, cmd.sampling.seed, logits_.data(), info_.n_vocab,
                                          live_.tokens.data(), p + 1, drafts_.data(), n_drafts, &scratch_,
                                          emit_kept, &n_emitted, &n_accepted);
    step_mark(STEP_OTHER);
    if (dctl != nullptr) {
        dctl->record(n_drafts, n_accepted);
        if (n_drafts == 0) dctl->advance(n_emitted);
    }
    // rollback: the pending token and the kept tokens but the last (positions past them were drafts rejected)
    if (st == SAMPLE_NO_TOKEN) {
        live_.tokens.resize(static_cast<size_t>(p + 1 + n_emitted));  // every kept token was fed
        *finish = gm && gm->closing() ? "length" : "stop";  // the grammar allows nothing more (closed: the budget)
        return false;
    }
    live_.tokens.resize(static_cast<size_t>(p + n_emitted));
    if (st != SAMPLE_OK) {
        drop_poisoned(&live_);
        *finish = "nonfinite";
        return false;
    }
    return go;
}

// The solo session's KV cache, allocated at the first solo command of an engine with slots (ERR when not).
bool serve_loop::ensure_live() {
    if (live_.kv == nullptr) live_.kv = kv_cache_init(model_, cfg_.n_ctx, cfg_.kv);
    if (live_.kv == nullptr) err_line("cannot allocate the KV cache of the solo session");
    return live_.kv != nullptr;
}

// Whether slot s can take an admission (ERR written when not).
bool serve_loop::check_slot(const char* verb, int32_t s) {
    const std::string v = verb;
    if (cfg_.n_slots <= 0) {
        err_line(v + ": no batch slots (start the engine with --batch N)");
        return false;
    }
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
    std::vector<const seq_state*> others{&live_};
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

// A solo embedding: RESUME 0, PP per chunk, VEC <n_embd> <base64>, DONE (generated 0). The solo session is
// read from position 0 (its previous conversation parked first) and holds the prompt afterwards. Slots wait.
void serve_loop::run_emb(const command& cmd, int64_t seq) {
    if (!check_request(cmd)) return;
    const clock_type::time_point t0 = clock_type::now();
    const int32_t n = static_cast<int32_t>(cmd.ids.size());
    session_apply_reuse(&live_, cmd.ids, reuse_source{}, &cache_);
    protocol_write_line("RESUME 0");
    embed_pool pool;
    pool.reset(info_.n_embd);
    std::vector<float> hidden;
    const char* finish = "stop";
    int32_t pos = 0;
    while (pos < n) {
        const int32_t len = pf::chunk_next_len(pos, n, cfg_.chunk);
        std::string err;
        if (embed_eval_chunk(model_, live_.kv, cmd.ids.data() + pos, len, pos, &hidden, &pool, &err) != 0) {
            err_line("model: " + err);
            return;
        }
        live_.tokens.insert(live_.tokens.end(), cmd.ids.begin() + pos, cmd.ids.begin() + pos + len);
        pos += len;
        const double ms = ms_between(t0, clock_type::now());
        protocol_write_line("PP " + std::to_string(pos) + " " + std::to_string(n) + " " + protocol_fixed1(ms) + " " +
                            protocol_fixed1(pos / std::max(1e-9, ms / 1000.0)));
        if (pos < n && reader_.stop_requested(seq)) {
            finish = "cancel";
            break;
        }
    }
    if (pos == n) {
        const std::string payload = pool.payload();
        if (payload.empty()) {
            drop_poisoned(&live_);
            finish = "nonfinite";
        } else {
            protocol_write_line("VEC " + payload);
        }
    }
    protocol_write_line(done_line(0, n, ms_between(t0, clock_type::now()), 0.0, finish, 0, pos, nullptr));
}

void serve_loop::run_session_file(const command& cmd) {
    const clock_type::time_point t0 = clock_type::now();
    uint64_t last_line = 0;
    auto progress = [&](uint64_t done, uint64_t total) {
        if (done < total && done - last_line < SESSION_LINE_BYTES) return;
        last_line = done;
        protocol_write_line("SESSION " + std::to_string(done) + " " + std::to_string(total));
    };
    const bool save = cmd.kind == CMD_SAVE || cmd.kind == CMD_BSAVE;
    seq_state* st = &live_;
    if (cmd.kind == CMD_BSAVE || cmd.kind == CMD_BRESTORE) {  // an idle slot's state, not the solo session's
        const char* verb = save ? "BSAVE" : "BRESTORE";
        if (!check_slot(verb, cmd.slot)) return;
        if (!slots_.ensure_kv(cmd.slot)) {
            err_line(std::string(verb) + ": cannot allocate the KV cache of slot " + std::to_string(cmd.slot));
            return;
        }
        st = &slots_.at(cmd.slot).st;
    }
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

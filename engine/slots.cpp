// engine/slots.cpp — see slots.h for the contract.
#include "slots.h"

#include <algorithm>
#include <cstdio>

#include "logprobs.h"
#include "prefill/chunking.hpp"
#include "protocol.h"
#include "cpu/step_timer.h"
#include "stdin_reader.h"

namespace {
using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}
}  // namespace

slot_table::slot_table(strata_model* model, int32_t n_slots, int32_t n_ctx, kv_type type)
    : model_(model), n_vocab_(model_get_info(model).n_vocab), n_ctx_(n_ctx), type_(type),
      slots_(static_cast<size_t>(std::clamp(n_slots, 0, SLOTS_MAX))) {}

slot_table::~slot_table() {
    for (auto& s : slots_) {
        if (s.st.kv) kv_cache_free(s.st.kv);
        if (s.dseq.kv) kv_cache_free(s.dseq.kv);
    }
}

void slot_table::set_drafting(drafting_mode mode, draft_model* dm) {
    drafting_ = mode;
    draft_ = dm;
}

void slot_table::time_admission(int32_t i) {
    if (any_busy()) {
        timed_ = -1;  // a second request: the timed one's figures would hold both
        return;
    }
    timed_ = i;
    timer_.begin();
    timer_.mark(PF_PHASE_LOOKUP);
    step_timer_begin();
}

// The timed slot's read has ended (its first token is sampled, or it ended while reading): the read's lines.
void slot_table::timed_read_end(int32_t i) {
    if (i != timed_) return;
    timer_.finish(at(i).n_read);
    step_timer_finish(at(i).n_read, "prefill");
}

bool slot_table::any_busy() const {
    return std::any_of(slots_.begin(), slots_.end(), [](const slot& s) { return s.phase != SLOT_IDLE; });
}

bool slot_table::any_decoding() const {
    return std::any_of(slots_.begin(), slots_.end(), [](const slot& s) { return s.phase == SLOT_DECODING; });
}

bool slot_table::ensure_kv(int32_t i) {
    slot& s = at(i);
    if (s.st.kv == nullptr) s.st.kv = kv_cache_init(model_, n_ctx_, type_);
    return s.st.kv != nullptr;
}

void slot_table::idle_states(int32_t except, std::vector<const seq_state*>* out) const {
    for (size_t i = 0; i < slots_.size(); ++i) {
        const slot& s = slots_[i];
        if (static_cast<int32_t>(i) == except || s.phase != SLOT_IDLE || s.st.kv == nullptr) continue;
        out->push_back(&s.st);
    }
}

void slot_table::reuse_states(int32_t except, std::vector<const seq_state*>* out) const {
    for (size_t i = 0; i < slots_.size(); ++i) {
        const slot& s = slots_[i];
        if (static_cast<int32_t>(i) != except && s.st.kv != nullptr && !s.st.tokens.empty()) out->push_back(&s.st);
    }
}

void slot_table::accept(int32_t i, int64_t seq, const std::vector<int32_t>& prompt, int32_t reused,
                        int32_t ckpt, int32_t max_new, const sampler_params& sp, uint64_t seed,
                        std::shared_ptr<grammar_matcher> gm, bool draft) {
    slot& s = at(i);
    s.phase = SLOT_READING;
    s.seq = seq;
    s.prompt = prompt;
    s.reused = reused;
    s.n_read = 0;
    s.ckpt = ckpt;
    s.prompt_ms = 0.0;
    s.t_acc = clock_type::now();
    s.pending = -1;
    s.generated = 0;
    s.max_new = max_new;
    s.sampling = sp;
    s.sstate = sampler_state{};
    s.seed = seed;
    s.gm = std::move(gm);
    s.drafting = draft && drafting_ != DRAFTING_OFF;
    s.close_now = false;
    s.dctl = draft_ctl{};
    s.drafts.clear();
    s.embed = false;
}

void slot_table::accept_embed(int32_t i, int64_t seq, const std::vector<int32_t>& prompt) {
    accept(i, seq, prompt, 0, 0, 0, sampler_params{}, 0, nullptr, false);
    slot& s = at(i);
    s.embed = true;
    s.pool.reset(model_get_info(model_).n_embd);
}

void slot_table::finish(int32_t i, const char* why) {
    slot& s = at(i);
    const bool decoded = s.phase == SLOT_DECODING;
    if (!decoded) s.prompt_ms = ms_since(s.t_acc);
    if (i == timed_) {
        if (decoded) step_timer_finish(s.generated - 1);  // the evaluated steps: the first token came with the read
        else timed_read_end(i);
        timed_ = -1;
    }
    s.st.ckpt_len = std::min<int32_t>(s.ckpt, static_cast<int32_t>(s.st.tokens.size()));
    // BDONE <slot> <generated> <finish> <decode_ms> <prompt> <prompt_ms> <reused> <prompt_read>[ drafts_acc=
    // drafts_off=] (the drafts only when the request drafted)
    const std::string drafts = s.drafting ? " drafts_acc=" + std::to_string(s.dctl.accepted) +
                                                " drafts_off=" + std::to_string(s.dctl.offered) +
                                                " drafts_n=" + std::to_string(s.dctl.steps)
                                          : std::string();
    protocol_write_line("BDONE " + std::to_string(i) + " " + std::to_string(s.generated) + " " + why + " " +
                        protocol_fixed1(decoded ? ms_since(s.t0) : 0.0) + " " + std::to_string(s.prompt.size()) +
                        " " + protocol_fixed1(s.prompt_ms) + " " + std::to_string(s.reused) + " " +
                        std::to_string(s.n_read) + drafts + expert_words(model_));
    const double decode_ms = decoded ? ms_since(s.t0) : 0.0;
    std::fprintf(stderr, "strata: BDONE slot=%d prompt=%zu reused=%d read=%d generated=%d finish=%s prompt_ms=%.1f"
                 " decode_tok_s=%.1f drafts=%lld/%lld\n", i, s.prompt.size(), s.reused, s.n_read, s.generated, why,
                 s.prompt_ms, s.generated > 1 ? (s.generated - 1) * 1000.0 / std::max(1e-6, decode_ms) : 0.0,
                 static_cast<long long>(s.dctl.accepted), static_cast<long long>(s.dctl.offered));
    s.phase = SLOT_IDLE;
    s.pending = -1;
    s.drafts.clear();
    s.gm.reset();
    s.embed = false;
    s.pool.sum.clear();
    s.prompt.clear();
    s.prompt.shrink_to_fit();
}

void slot_table::clear_idle() {
    for (auto& s : slots_) {
        if (s.phase == SLOT_IDLE) {
            s.st.tokens.clear();
            s.st.ckpt_len = 0;
        }
    }
}

void slot_table::collect(const stdin_reader& reader, std::vector<int32_t>* rows) {
    rows->clear();
    for (int32_t i = 0; i < size(); ++i) {
        slot& s = at(i);
        if (s.phase == SLOT_IDLE) continue;
        if (reader.slot_stop_requested(i, s.seq)) {
            finish(i, "cancel");
            continue;
        }
        if (s.phase == SLOT_DECODING) rows->push_back(i);
    }
}

void slot_table::append(const std::vector<int32_t>& rows, int32_t seq_base, std::vector<int32_t>* token,
                        std::vector<int32_t>* pos, std::vector<int32_t>* seq, std::vector<kv_cache*>* kvs) const {
    for (size_t k = 0; k < rows.size(); ++k) {
        const slot& s = slots_[static_cast<size_t>(rows[k])];
        const int32_t p = static_cast<int32_t>(s.st.tokens.size());
        for (int32_t j = 0; j <= static_cast<int32_t>(s.drafts.size()); ++j) {
            token->push_back(j == 0 ? s.pending : s.drafts[static_cast<size_t>(j - 1)]);
            pos->push_back(p + j);
            seq->push_back(seq_base + static_cast<int32_t>(k));
        }
        kvs->push_back(s.st.kv);
    }
}

void slot_table::propose(const std::vector<int32_t>& rows, int32_t max_total) {
    for (int32_t i : rows) {
        slot& s = at(i);
        s.drafts.clear();
        if (!s.drafting || max_total <= 0) continue;
        // no draft past the reply's cap or the context
        const int32_t p = static_cast<int32_t>(s.st.tokens.size());
        const int32_t room = std::min({s.max_new - s.generated - 1, n_ctx_ - p - 2, max_total});
        const int32_t k = std::min(s.dctl.want(), room);
        if (k <= 0) continue;
        s.st.tokens.push_back(s.pending);  // the history the proposal continues
        draft_propose(drafting_, draft_, &s.dseq, s.st.tokens.data(), p + 1, k, &s.drafts);
        s.st.tokens.pop_back();
        max_total -= static_cast<int32_t>(s.drafts.size());
    }
}

void slot_table::fail(const std::vector<int32_t>& rows) {
    for (int32_t i : rows) {
        at(i).st.tokens.clear();
        at(i).ckpt = 0;
        finish(i, "nonfinite");
    }
}

// The reading slots' chunks for this step: shortest remaining first (ties: lower slot), each as much as the
// budget left allows.
void slot_table::plan_reads(int32_t budget) {
    reads_.clear();
    for (int32_t i = 0; i < size(); ++i) {
        const slot& s = at(i);
        if (s.phase != SLOT_READING) continue;
        const int32_t pos = static_cast<int32_t>(s.st.tokens.size());
        const int32_t n = static_cast<int32_t>(s.prompt.size());
        reads_.push_back({i, pos, read_chunk_ > 0 ? pf::chunk_next_len(pos, n, read_chunk_) : n - pos});
    }
    std::sort(reads_.begin(), reads_.end(), [](const chunk_plan& a, const chunk_plan& b) {
        return a.len != b.len ? a.len < b.len : a.slot < b.slot;
    });
    size_t k = 0;
    for (; k < reads_.size() && budget > 0; ++k) {
        reads_[k].len = std::min(reads_[k].len, budget);
        budget -= reads_[k].len;
    }
    reads_.resize(k);
}

bool slot_table::step(const stdin_reader& reader, const std::vector<int32_t>& eos_ids, int32_t step_tokens,
                      std::string* err) {
    collect(reader, &rows_);
    // drafts take at most half of what the decode entries leave of the budget (the reads keep the rest)
    propose(rows_, (step_tokens - static_cast<int32_t>(rows_.size())) / 2);
    int32_t n_decode = 0;
    for (int32_t i : rows_) n_decode += 1 + static_cast<int32_t>(at(i).drafts.size());
    plan_reads(read_chunk_ > 0 ? read_chunk_ : std::max<int32_t>(1, step_tokens - n_decode));
    if (rows_.empty() && reads_.empty()) return true;
    const bool timed_read = timed_ >= 0 && at(timed_).phase == SLOT_READING;
    if (!reads_.empty()) protocol_flush_tokens();  // a step with prompt chunks is long: held tokens go first
    token_.clear();
    pos_.clear();
    seq_.clear();
    kvs_.clear();
    append(rows_, 0, &token_, &pos_, &seq_, &kvs_);
    want_.assign(token_.size(), 1);
    want_hidden_.assign(token_.size(), 0);
    size_t n_hidden = 0;
    for (const chunk_plan& c : reads_) {
        const slot& s = at(c.slot);
        const int32_t sq = static_cast<int32_t>(kvs_.size());
        for (int32_t j = 0; j < c.len; ++j) {
            token_.push_back(s.prompt[static_cast<size_t>(c.pos + j)]);
            pos_.push_back(c.pos + j);
            seq_.push_back(sq);
            want_.push_back(0);
            want_hidden_.push_back(s.embed ? 1 : 0);
        }
        if (s.embed) n_hidden += static_cast<size_t>(c.len);
        else if (c.pos + c.len == static_cast<int32_t>(s.prompt.size())) want_.back() = 1;  // its first token
        kvs_.push_back(s.st.kv);
    }
    const size_t n_want = static_cast<size_t>(std::count(want_.begin(), want_.end(), 1));
    eval_batch batch;
    batch.n = static_cast<int32_t>(token_.size());
    batch.token = token_.data();
    batch.pos = pos_.data();
    batch.seq = seq_.data();
    batch.want_logits = want_.data();
    batch.kvs = kvs_.data();
    batch.n_seq = static_cast<int32_t>(kvs_.size());
    if (n_hidden > 0) {
        hidden_.resize(n_hidden * static_cast<size_t>(model_get_info(model_).n_embd));
        batch.want_hidden = want_hidden_.data();
        batch.hidden = hidden_.data();
    }
    logits_.resize(n_want * static_cast<size_t>(n_vocab_));
    if (timed_read) timer_.mark(PF_PHASE_READ);
    if (model_eval(model_, batch, logits_.data(), err) != 0) {
        fail(rows_);
        rows_.clear();
        for (const chunk_plan& c : reads_) rows_.push_back(c.slot);
        fail(rows_);
        return false;
    }
    after_eval(rows_, logits_.data(), eos_ids);
    const float* next = logits_.data() + static_cast<size_t>(n_decode) * static_cast<size_t>(n_vocab_);
    const int32_t E = model_get_info(model_).n_embd;
    const float* rows = hidden_.data();
    for (const chunk_plan& c : reads_) {
        slot& s = at(c.slot);
        const bool last = c.pos + c.len == static_cast<int32_t>(s.prompt.size());
        if (s.embed) {
            s.pool.add(rows, c.len, E);
            rows += static_cast<size_t>(c.len) * static_cast<size_t>(E);
        }
        after_read(c, next, eos_ids);
        if (last && !s.embed) next += n_vocab_;
    }
    return true;
}

void slot_table::after_read(const chunk_plan& c, const float* logits, const std::vector<int32_t>& eos_ids) {
    slot& s = at(c.slot);
    const int32_t n = static_cast<int32_t>(s.prompt.size());
    s.st.tokens.insert(s.st.tokens.end(), s.prompt.begin() + c.pos, s.prompt.begin() + c.pos + c.len);
    s.n_read += c.len;
    if (c.slot == timed_) timer_.mark(PF_PHASE_EMIT);
    const double ms = ms_since(s.t_acc);
    const double read_s = std::max(1e-9, ms / 1000.0);
    protocol_write_line("BPP " + std::to_string(c.slot) + " " + std::to_string(c.pos + c.len) + " " +
                        std::to_string(n) + " " + protocol_fixed1(ms) + " " + protocol_fixed1(s.n_read / read_s));
    if (c.pos + c.len != n) return;
    if (s.embed) embed_done(c.slot);
    else first_token(c.slot, logits, eos_ids);
}

// The embedding's read has ended: its vector (BVEC <slot> <n_embd> <base64>), then BDONE with 0 generated.
void slot_table::embed_done(int32_t i) {
    slot& s = at(i);
    const std::string payload = s.pool.payload();
    if (payload.empty()) {
        s.st.tokens.clear();  // what this slot's cache holds may be poisoned
        finish(i, "nonfinite");
        return;
    }
    protocol_write_line("BVEC " + std::to_string(i) + " " + payload);
    finish(i, "stop");
}

// A sampler status other than OK ends the slot's request: the grammar allowed no token (stop), or the logits
// were not finite (what the slot's cache holds may be poisoned: dropped). True when it ended.
bool slot_table::ended_by_sampler(int32_t i, sample_status st) {
    if (st == SAMPLE_OK) return false;
    if (st == SAMPLE_NO_TOKEN) {  // after a closing completion (end-of-turn banned, say): the cut is the budget's
        finish(i, at(i).gm && at(i).gm->closing() ? "length" : "stop");
        return true;
    }
    at(i).st.tokens.clear();
    at(i).ckpt = 0;
    finish(i, "nonfinite");
    return true;
}

void slot_table::first_token(int32_t i, const float* logits, const std::vector<int32_t>& eos_ids) {
    slot& s = at(i);
    const int32_t n = static_cast<int32_t>(s.st.tokens.size());
    int32_t tok = -1;
    if (i == timed_) timer_.mark(PF_PHASE_SAMPLE);
    scratch_.state = &s.sstate;
    if (s.gm) s.gm->set_budget(s.close_now ? 0 : s.max_new);  // the reply always parses (grammar.h, set_budget)
    const sample_status st =
        grammar_sample(s.gm.get(), s.sampling, logits, n_vocab_, s.st.tokens.data(), n, n, s.seed, &scratch_, &tok);
    if (ended_by_sampler(i, st)) return;
    if (i == timed_) {  // the read's lines; the decode is timed from here to BDONE
        timed_read_end(i);
        step_timer_begin();
    }
    s.prompt_ms = ms_since(s.t_acc);
    s.t0 = clock_type::now();
    s.phase = SLOT_DECODING;
    s.generated = 1;
    step_mark(STEP_EMIT);
    protocol_write_line("BT " + std::to_string(i) + " " + std::to_string(tok) +
                        logprobs_line(s.sampling, logits, n_vocab_, tok, scratch_, &lp_work_));
    step_mark(STEP_OTHER);
    if (std::find(eos_ids.begin(), eos_ids.end(), tok) != eos_ids.end()) {
        finish(i, s.gm && s.gm->closing() ? "length" : "stop");
    } else if (s.max_new <= 1 || n + 1 >= n_ctx_) {
        finish(i, "length");
    } else {
        s.pending = tok;
    }
}

void slot_table::after_eval(const std::vector<int32_t>& rows, const float* logits, const std::vector<int32_t>& eos_ids) {
    for (int32_t i : rows) {
        const size_t n_entries = 1 + at(i).drafts.size();
        verify_row(i, logits, eos_ids);
        logits += n_entries * static_cast<size_t>(n_vocab_);
    }
}

// One decoding slot after its entries were evaluated: the tokens kept (draft_verify), BT lines, the stop
// rules, then the rollback: the slot holds its pending token and the kept tokens but the last, which is the
// new pending one.
void slot_table::verify_row(int32_t i, const float* logits, const std::vector<int32_t>& eos_ids) {
    slot& s = at(i);
    const int32_t p = static_cast<int32_t>(s.st.tokens.size());
    s.st.tokens.push_back(s.pending);
    s.st.tokens.insert(s.st.tokens.end(), s.drafts.begin(), s.drafts.end());
    const char* why = nullptr;
    int32_t n_kept = 0;
    auto emit = [&](int32_t tok) {
        // the kept token n_kept was sampled from row n_kept (the pending token's, then each draft's)
        const float* row = logits + static_cast<size_t>(n_kept) * static_cast<size_t>(n_vocab_);
        const int32_t was = step_mark(STEP_EMIT);
        protocol_write_token_line("BT " + std::to_string(i) + " " + std::to_string(tok) +
                                  logprobs_line(s.sampling, row, n_vocab_, tok, scratch_, &lp_work_));
        step_mark(was);
        s.generated += 1;
        s.pending = tok;
        const int32_t held = p + 1 + n_kept++;  // the tokens the slot holds before this one
        if (std::find(eos_ids.begin(), eos_ids.end(), tok) != eos_ids.end()) why = s.gm && s.gm->closing() ? "length" : "stop";
        else if (s.generated >= s.max_new || held + 1 >= n_ctx_) why = "length";
        return why == nullptr;
    };
    const int32_t n_drafts = static_cast<int32_t>(s.drafts.size());
    int32_t n_emitted = 0, n_accepted = 0;
    scratch_.state = &s.sstate;
    if (s.gm) s.gm->set_budget(s.close_now ? 0 : s.max_new - s.generated - n_drafts);  // the last draft's, to be safe
    step_mark(STEP_SAMPLE);
    const sample_status st = draft_verify(s.gm.get(), s.sampling, s.seed, logits, n_vocab_, s.st.tokens.data(), p + 1,
                                          s.drafts.data(), n_drafts, &scratch_, emit, &n_emitted, &n_accepted);
    step_mark(STEP_OTHER);
    s.drafts.clear();
    if (s.drafting) {
        s.dctl.record(n_drafts, n_accepted);
        if (n_drafts == 0) s.dctl.advance(n_emitted);
    }
    if (st == SAMPLE_NO_TOKEN) s.st.tokens.resize(static_cast<size_t>(p + 1 + n_emitted));  // every kept token was fed
    if (ended_by_sampler(i, st)) return;
    s.st.tokens.resize(static_cast<size_t>(p + n_emitted));
    if (why != nullptr) finish(i, why);
}

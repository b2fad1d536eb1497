// engine/slots.cpp — see slots.h for the contract.
#include "slots.h"

#include <algorithm>

#include "protocol.h"
#include "stdin_reader.h"

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

slot_table::slot_table(strata_model* model, int32_t n_slots, int32_t n_ctx, kv_type type)
    : model_(model), n_vocab_(model_get_info(model).n_vocab), n_ctx_(n_ctx), type_(type),
      slots_(static_cast<size_t>(std::clamp(n_slots, 0, SLOTS_MAX))) {}

slot_table::~slot_table() {
    for (auto& s : slots_) {
        if (s.st.kv) kv_cache_free(s.st.kv);
    }
}

bool slot_table::any_busy() const {
    return std::any_of(slots_.begin(), slots_.end(), [](const slot& s) { return s.busy; });
}

bool slot_table::ensure_kv(int32_t i) {
    slot& s = at(i);
    if (s.st.kv == nullptr) s.st.kv = kv_cache_init(model_, n_ctx_, type_);
    return s.st.kv != nullptr;
}

void slot_table::idle_states(int32_t except, std::vector<const seq_state*>* out) const {
    for (size_t i = 0; i < slots_.size(); ++i) {
        if (static_cast<int32_t>(i) == except || slots_[i].busy || slots_[i].st.kv == nullptr) continue;
        out->push_back(&slots_[i].st);
    }
}

void slot_table::begin(int32_t i, int64_t seq, int32_t first_token, int32_t max_new, const sampler_params& sp,
                       uint64_t seed) {
    slot& s = at(i);
    s.busy = true;
    s.seq = seq;
    s.pending = first_token;
    s.generated = 1;
    s.max_new = max_new;
    s.sampling = sp;
    s.seed = seed;
    s.t0 = std::chrono::steady_clock::now();
}

void slot_table::finish(int32_t i, const char* why) {
    slot& s = at(i);
    protocol_write_line("BDONE " + std::to_string(i) + " " + std::to_string(s.generated) + " " + why + " " +
                        protocol_fixed1(ms_since(s.t0)));
    s.busy = false;
    s.pending = -1;
}

void slot_table::clear_idle() {
    for (auto& s : slots_) {
        if (!s.busy) {
            s.st.tokens.clear();
            s.st.ckpt_len = 0;
        }
    }
}

void slot_table::collect(const stdin_reader& reader, std::vector<int32_t>* rows) {
    rows->clear();
    for (int32_t i = 0; i < size(); ++i) {
        slot& s = at(i);
        if (!s.busy) continue;
        if (reader.slot_stop_requested(i, s.seq)) {
            finish(i, "cancel");
            continue;
        }
        rows->push_back(i);
    }
}

void slot_table::append(const std::vector<int32_t>& rows, int32_t seq_base, std::vector<int32_t>* token,
                        std::vector<int32_t>* pos, std::vector<int32_t>* seq, std::vector<kv_cache*>* kvs) const {
    for (size_t k = 0; k < rows.size(); ++k) {
        const slot& s = slots_[static_cast<size_t>(rows[k])];
        token->push_back(s.pending);
        pos->push_back(static_cast<int32_t>(s.st.tokens.size()));
        seq->push_back(seq_base + static_cast<int32_t>(k));
        kvs->push_back(s.st.kv);
    }
}

void slot_table::fail(const std::vector<int32_t>& rows) {
    for (int32_t i : rows) {
        at(i).st.tokens.clear();
        at(i).st.ckpt_len = 0;
        finish(i, "nonfinite");
    }
}

bool slot_table::step(const stdin_reader& reader, const std::vector<int32_t>& eos_ids, std::string* err) {
    collect(reader, &rows_);
    if (rows_.empty()) return true;
    const int32_t n = static_cast<int32_t>(rows_.size());
    token_.clear();
    pos_.clear();
    seq_.clear();
    kvs_.clear();
    append(rows_, 0, &token_, &pos_, &seq_, &kvs_);
    want_.assign(static_cast<size_t>(n), 1);
    eval_batch batch;
    batch.n = n;
    batch.token = token_.data();
    batch.pos = pos_.data();
    batch.seq = seq_.data();
    batch.want_logits = want_.data();
    batch.kvs = kvs_.data();
    batch.n_seq = n;
    logits_.resize(static_cast<size_t>(n) * static_cast<size_t>(n_vocab_));
    if (model_eval(model_, batch, logits_.data(), err) != 0) {
        fail(rows_);
        return false;
    }
    after_eval(rows_, logits_.data(), eos_ids);
    return true;
}

void slot_table::after_eval(const std::vector<int32_t>& rows, const float* logits, const std::vector<int32_t>& eos_ids) {
    for (size_t k = 0; k < rows.size(); ++k) {
        const int32_t i = rows[k];
        slot& s = at(i);
        s.st.tokens.push_back(s.pending);
        int32_t tok = -1;
        const sample_status st = sampler_sample(s.sampling, logits + k * static_cast<size_t>(n_vocab_), n_vocab_,
                                                s.st.tokens.data(), static_cast<int32_t>(s.st.tokens.size()),
                                                static_cast<int64_t>(s.st.tokens.size()), s.seed, &scratch_, &tok);
        if (st != SAMPLE_OK) {
            s.st.tokens.clear();  // what this slot's cache holds may be poisoned
            s.st.ckpt_len = 0;
            finish(i, "nonfinite");
            continue;
        }
        protocol_write_line("BT " + std::to_string(i) + " " + std::to_string(tok));
        s.generated += 1;
        if (std::find(eos_ids.begin(), eos_ids.end(), tok) != eos_ids.end()) {
            finish(i, "stop");
        } else if (s.generated >= s.max_new || static_cast<int32_t>(s.st.tokens.size()) + 1 >= n_ctx_) {
            finish(i, "length");
        } else {
            s.pending = tok;
        }
    }
}

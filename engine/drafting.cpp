// engine/drafting.cpp — see drafting.h for the contract.
#include "drafting.h"

#include <algorithm>
#include <cstdio>

#include "gguf.h"

bool drafting_mode_parse(const std::string& text, drafting_mode* out) {
    if (text == "off") *out = DRAFTING_OFF;
    else if (text == "lookup") *out = DRAFTING_LOOKUP;
    else if (text == "model") *out = DRAFTING_MODEL;
    else if (text == "auto") *out = DRAFTING_AUTO;
    else return false;
    return true;
}

const char* drafting_mode_name(drafting_mode mode) {
    switch (mode) {
        case DRAFTING_OFF: return "off";
        case DRAFTING_LOOKUP: return "lookup";
        case DRAFTING_MODEL: return "model";
        case DRAFTING_AUTO: return "auto";
    }
    return "off";
}

// The most recent earlier occurrence of the last n tokens, scanning backwards; the proposal is the k tokens
// that followed it. Longer n-grams first: they predict better.
int32_t draft_lookup(const int32_t* hist, int32_t n_hist, int32_t k, std::vector<int32_t>* out) {
    if (k <= 0) return 0;
    for (int32_t n = DRAFT_NGRAM_MAX; n >= DRAFT_NGRAM_MIN; --n) {
        if (n_hist <= n) continue;
        const int32_t* tail = hist + n_hist - n;
        // candidate start s: hist[s, s + n) == tail, s + n < n_hist (something follows it)
        for (int32_t s = n_hist - n - 1; s >= 0; --s) {
            if (hist[s + n - 1] != tail[n - 1] || !std::equal(tail, tail + n - 1, hist + s)) continue;
            // the continuation; where it runs into the end, the proposal continues itself (a repeating
            // run: what follows "a b c a b" is "c a b c ...")
            const int32_t from = s + n;
            const size_t base = out->size();
            for (int32_t i = 0; i < k; ++i) {
                const int32_t at = from + i;
                out->push_back(at < n_hist ? hist[at] : (*out)[base + static_cast<size_t>(at - n_hist)]);
            }
            return k;
        }
    }
    return 0;
}

void draft_ctl::record(int32_t off, int32_t acc) {
    if (off <= 0) return;
    ++steps;
    offered += off;
    accepted += acc;
    if (acc == 0) {
        k = std::max(1, k / 2);
        if (++misses >= DRAFT_MISSES_TO_PAUSE) {
            pause = pause_next;
            pause_next = std::min(DRAFT_PAUSE_MAX, pause_next * 2);
            misses = 0;
        }
        return;
    }
    misses = 0;
    pause_next = DRAFT_PAUSE_MIN;
    k = acc == off ? std::min(DRAFT_K_MAX, k * 2) : std::max(1, acc + 1);
}

void draft_ctl::advance(int32_t n_tokens) {
    pause = std::max(0, pause - n_tokens);
}

namespace {

// The vocabularies of two GGUFs agree when both have the same token texts in the same order.
bool vocab_equal(const std::string& a_path, const std::string& b_path, std::string* why) {
    std::string err;
    gguf_file* a = gguf_open(a_path, &err);
    if (!a) {
        *why = err;
        return false;
    }
    gguf_file* b = gguf_open(b_path, &err);
    if (!b) {
        gguf_close(a);
        *why = err;
        return false;
    }
    const gguf_value* ta = gguf_find(a, "tokenizer.ggml.tokens");
    const gguf_value* tb = gguf_find(b, "tokenizer.ggml.tokens");
    bool ok = true;
    if (!ta || !tb) {
        *why = "no tokenizer.ggml.tokens in " + std::string(!ta ? "the model" : "the draft model");
        ok = false;
    } else if (ta->strs.size() != tb->strs.size()) {
        *why = "vocabulary of " + std::to_string(tb->strs.size()) + " tokens, the model's has " +
               std::to_string(ta->strs.size());
        ok = false;
    } else {
        for (size_t i = 0; i < ta->strs.size(); ++i) {
            if (ta->strs[i] == tb->strs[i]) continue;
            *why = "token " + std::to_string(i) + " is '" + gguf_printable(tb->strs[i]) + "', the model's is '" +
                   gguf_printable(ta->strs[i]) + "'";
            ok = false;
            break;
        }
    }
    gguf_close(a);
    gguf_close(b);
    return ok;
}

}  // namespace

std::unique_ptr<draft_model> draft_model_load(const std::string& path, const std::string& target_path,
                                              int32_t n_target_vocab, int32_t n_threads, int32_t n_ctx,
                                              kv_type type, int32_t n_batch, std::string* err) {
    std::string why;
    if (!vocab_equal(target_path, path, &why)) {
        *err = "--draft-model " + path + ": not the model's vocabulary: " + why;
        return nullptr;
    }
    model_params mp;
    mp.path = path;
    mp.n_threads = n_threads;
    mp.n_batch = n_batch;
    strata_model* m = model_load(mp, &why);
    if (!m) {
        *err = "--draft-model " + path + ": " + why;
        return nullptr;
    }
    if (model_get_info(m).n_vocab != n_target_vocab) {
        *err = "--draft-model " + path + ": n_vocab " + std::to_string(model_get_info(m).n_vocab) +
               ", the model's is " + std::to_string(n_target_vocab);
        model_free(m);
        return nullptr;
    }
    auto dm = std::make_unique<draft_model>();
    dm->model = m;
    dm->n_ctx = std::min(n_ctx, model_get_info(m).n_ctx_train > 0 ? model_get_info(m).n_ctx_train : n_ctx);
    dm->type = type;
    dm->n_batch = n_batch;
    dm->logits.resize(static_cast<size_t>(n_target_vocab));
    return dm;
}

void draft_model_free(draft_model* dm) {
    if (dm && dm->model) model_free(dm->model);
    if (dm) dm->model = nullptr;
}

namespace {

int32_t argmax(const float* x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; ++i) {
        if (x[i] > x[best]) best = i;
    }
    return best;
}

}  // namespace

int32_t draft_model_propose(draft_model* dm, seq_state* dseq, const int32_t* hist, int32_t n_hist, int32_t k,
                            std::vector<int32_t>* out) {
    if (!dm || k <= 0 || n_hist <= 0) return 0;
    k = std::min(k, dm->n_ctx - n_hist);
    if (k <= 0) return 0;
    if (!dseq->kv) dseq->kv = kv_cache_init(dm->model, dm->n_ctx, dm->type);
    if (!dseq->kv) return 0;
    const std::vector<int32_t> h(hist, hist + n_hist);
    const int32_t keep = std::min(session_common_prefix(dseq->tokens, h), n_hist - 1);  // the last is read
    dseq->tokens.resize(static_cast<size_t>(keep));
    const int32_t n_vocab = model_get_info(dm->model).n_vocab;
    std::string err;
    auto fail = [&]() {
        std::fprintf(stderr, "strata: draft model refused a step: %s\n", err.c_str());
        dseq->tokens.clear();
        return 0;
    };
    for (int32_t pos = keep; pos < n_hist;) {
        const int32_t len = std::min(dm->n_batch, n_hist - pos);
        if (model_eval_seq(dm->model, dseq->kv, hist + pos, len, pos, dm->logits.data(), &err) != 0) return fail();
        dseq->tokens.insert(dseq->tokens.end(), hist + pos, hist + pos + len);
        pos += len;
    }
    int32_t n = 0;
    for (;;) {
        const int32_t tok = argmax(dm->logits.data(), n_vocab);
        out->push_back(tok);
        if (++n >= k) break;
        const int32_t pos = static_cast<int32_t>(dseq->tokens.size());
        if (model_eval_seq(dm->model, dseq->kv, &tok, 1, pos, dm->logits.data(), &err) != 0) {
            out->resize(out->size() - static_cast<size_t>(n));
            return fail();
        }
        dseq->tokens.push_back(tok);
    }
    return n;
}

int32_t draft_propose(drafting_mode mode, draft_model* dm, seq_state* dseq, const int32_t* hist,
                      int32_t n_hist, int32_t k, std::vector<int32_t>* out) {
    if (k <= 0 || mode == DRAFTING_OFF) return 0;
    if (mode == DRAFTING_LOOKUP || mode == DRAFTING_AUTO) {
        const int32_t n = draft_lookup(hist, n_hist, k, out);
        if (n > 0 || mode == DRAFTING_LOOKUP) return n;
    }
    if (!dm || !dseq) return 0;
    return draft_model_propose(dm, dseq, hist, n_hist, k, out);
}

sample_status draft_verify(grammar_matcher* gm, const sampler_params& sp, uint64_t seed, const float* logits,
                           int32_t n_vocab, const int32_t* hist, int32_t n_base, const int32_t* drafts,
                           int32_t n_drafts, sampler_scratch* scratch, const std::function<bool(int32_t)>& emit,
                           int32_t* n_emitted, int32_t* n_accepted) {
    *n_emitted = 0;
    *n_accepted = 0;
    for (int32_t j = 0; j <= n_drafts; ++j) {
        int32_t tok = -1;
        const int32_t n = n_base + j;
        const sample_status st = grammar_sample(gm, sp, logits + static_cast<size_t>(j) * static_cast<size_t>(n_vocab),
                                                n_vocab, hist, n, n, seed, scratch, &tok);
        if (st != SAMPLE_OK) return st;
        *n_emitted += 1;
        const bool agrees = j < n_drafts && tok == drafts[j];
        if (agrees) *n_accepted += 1;
        if (!emit(tok) || !agrees) break;
    }
    return SAMPLE_OK;
}

// engine/grammar.cpp — the matcher, the token trie and the mask (see grammar.h for the contract).
#include "grammar.h"

#include <cstring>

#include "gguf.h"
#include "grammar_impl.h"

namespace {

// Grammars kept by grammar_cache (a request with one of them skips the parse and the masks already made).
constexpr size_t GRAMMAR_CACHE_MAX = 8;
// Walk states kept per grammar before the tables start over (each costs a 1 KiB transition row).
constexpr size_t WALK_STATES_MAX = 1u << 16;
// Masks kept per grammar before the cache starts over (a mask is n_vocab / 8 bytes: 6 KiB for 49152 tokens).
constexpr size_t MASK_CACHE_BYTES = 16u << 20;
// GGUF token types (llama.cpp's enum): control and unused tokens never reach the trie.
constexpr int64_t TOKEN_TYPE_CONTROL = 3;
constexpr int64_t TOKEN_TYPE_UNUSED = 5;

int32_t intern(grammar* g, int32_t pos, int32_t parent) {
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent);
    auto it = g->node_ids.find(key);
    if (it != g->node_ids.end()) return it->second;
    const int32_t id = static_cast<int32_t>(g->nodes.size());
    g->nodes.push_back({pos, parent});
    g->node_ids.emplace(key, id);
    return id;
}

// Adds to out every stack reached from "at pos, then parent" without consuming a character: their tops are
// character elements, or the empty stack (id 0) where the whole grammar may end.
void expand(grammar* g, int32_t pos, int32_t parent, std::vector<int32_t>* out) {
    const gram_elem e = g->flat[static_cast<size_t>(pos)];
    if (e.kind == GRAM_CHARS) {
        out->push_back(intern(g, pos, parent));
    } else if (e.kind == GRAM_END) {
        if (parent < 0) {
            out->push_back(0);
        } else {
            const gram_node p = g->nodes[static_cast<size_t>(parent)];
            expand(g, p.pos, p.parent, out);
        }
    } else {
        const int32_t cont = pos + 1;  // a call in tail position returns straight to parent
        const int32_t below = g->flat[static_cast<size_t>(cont)].kind == GRAM_END ? parent : intern(g, cont, parent);
        for (int32_t start : g->rule_alts[static_cast<size_t>(e.arg)]) expand(g, start, below, out);
    }
}

void sort_unique(std::vector<int32_t>* v) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
}

bool class_overlaps(const std::vector<gram_range>& cls, uint32_t lo, uint32_t hi) {
    // first range whose hi >= lo
    auto it = std::lower_bound(cls.begin(), cls.end(), lo, [](const gram_range& r, uint32_t v) { return r.hi < v; });
    return it != cls.end() && it->lo <= hi;
}

const std::vector<gram_range>& top_class(const grammar* g, int32_t node) {
    const gram_elem e = g->flat[static_cast<size_t>(g->nodes[static_cast<size_t>(node)].pos)];
    return g->classes[static_cast<size_t>(e.arg)];
}

// The stacks after one code point.
void advance(grammar* g, const int32_t* set, size_t n, uint32_t cp, std::vector<int32_t>* out) {
    out->clear();
    for (size_t k = 0; k < n; ++k) {
        const int32_t id = set[k];
        if (id == 0 || !class_overlaps(top_class(g, id), cp, cp)) continue;
        const gram_node node = g->nodes[static_cast<size_t>(id)];
        expand(g, node.pos + 1, node.parent, out);
    }
    if (out->size() > 1) sort_unique(out);
}

// Some stack accepts a character in [lo, hi] (the characters a partial UTF-8 sequence may still become).
bool any_overlaps(const grammar* g, const int32_t* set, size_t n, uint32_t lo, uint32_t hi) {
    for (size_t k = 0; k < n; ++k) {
        if (set[k] != 0 && class_overlaps(top_class(g, set[k]), lo, hi)) return true;
    }
    return false;
}

// The matcher's state as the byte walk sees it: the live stacks (a view) and a partial character.
struct walk_state {
    const int32_t* set = nullptr;
    size_t n = 0;
    uint32_t partial = 0;
    int32_t need = 0;
};

// One byte on from `in`. Stacks that change are written to buf and `out` points there. False: no stack
// survives (or the bytes are not UTF-8).
bool step_byte(grammar* g, const walk_state& in, uint8_t b, std::vector<int32_t>* buf, walk_state* out) {
    uint32_t cp = 0;
    if (in.need == 0) {
        if (b < 0x80) {
            cp = b;
        } else {
            int32_t need = 0;
            uint32_t bits = 0;
            if (b >= 0xC2 && b <= 0xDF) need = 1, bits = b & 0x1Fu;
            else if ((b & 0xF0) == 0xE0) need = 2, bits = b & 0x0Fu;
            else if (b >= 0xF0 && b <= 0xF4) need = 3, bits = b & 0x07u;
            else return false;
            uint32_t lo = bits << (6 * need), hi = lo | ((1u << (6 * need)) - 1);
            // only shortest forms of scalar values: no overlong 3/4-byte forms, no surrogates, <= U+10FFFF
            if (need == 2) lo = std::max(lo, 0x800u), hi = b == 0xED ? 0xD7FFu : hi;
            if (need == 3) lo = std::max(lo, 0x10000u), hi = std::min(hi, 0x10FFFFu);
            if (!any_overlaps(g, in.set, in.n, lo, hi)) return false;
            *out = {in.set, in.n, bits, need};
            return true;
        }
    } else {
        if ((b & 0xC0) != 0x80) return false;
        // the first continuation byte decides the forms the lead byte alone cannot (Unicode table 3-7)
        if (in.need == 2 && in.partial < 16 && ((in.partial == 0 && b < 0xA0) || (in.partial == 0xD && b >= 0xA0))) {
            return false;  // E0 80..9F (overlong), ED A0..BF (surrogates)
        }
        if (in.need == 3 && ((in.partial == 0 && b < 0x90) || (in.partial == 4 && b >= 0x90))) {
            return false;  // F0 80..8F (overlong), F4 90..BF (beyond U+10FFFF)
        }
        const uint32_t bits = (in.partial << 6) | (b & 0x3Fu);
        const int32_t need = in.need - 1;
        if (need > 0) {
            const uint32_t lo = bits << (6 * need), hi = lo | ((1u << (6 * need)) - 1);
            if (!any_overlaps(g, in.set, in.n, lo, hi)) return false;
            *out = {in.set, in.n, bits, need};
            return true;
        }
        cp = bits;
    }
    advance(g, in.set, in.n, cp, buf);
    if (buf->empty()) return false;
    *out = {buf->data(), buf->size(), 0, 0};
    return true;
}

int32_t intern_set(grammar* g, const int32_t* set, size_t n) {
    std::string key(reinterpret_cast<const char*>(set), 4 * n);
    auto it = g->set_ids.find(key);
    if (it != g->set_ids.end()) return it->second;
    const int32_t id = static_cast<int32_t>(g->sets.size());
    g->sets.emplace_back(set, set + n);
    g->set_ids.emplace(std::move(key), id);
    return id;
}

int32_t intern_state(grammar* g, int32_t set_id, uint32_t partial, int32_t need) {
    const uint64_t key = (static_cast<uint64_t>(set_id) << 32) | (static_cast<uint64_t>(partial) << 2) |
                         static_cast<uint64_t>(need);
    auto it = g->state_ids.find(key);
    if (it != g->state_ids.end()) return it->second;
    const int32_t id = static_cast<int32_t>(g->st_set.size());
    g->st_set.push_back(set_id);
    g->st_partial.push_back(partial);
    g->st_need.push_back(need);
    g->st_close.push_back(-2);
    g->trans.resize(g->trans.size() + 256, -2);
    g->state_ids.emplace(key, id);
    return id;
}

// The state after byte b from state sid (-1: dead), computed once and then read from the table.
int32_t next_state(grammar* g, int32_t sid, uint8_t b) {
    const size_t at = static_cast<size_t>(sid) * 256 + b;
    if (g->trans[at] != -2) return g->trans[at];
    const std::vector<int32_t> from = g->sets[static_cast<size_t>(g->st_set[static_cast<size_t>(sid)])];
    const walk_state in{from.data(), from.size(), g->st_partial[static_cast<size_t>(sid)],
                        g->st_need[static_cast<size_t>(sid)]};
    walk_state out;
    int32_t next = -1;
    if (step_byte(g, in, b, &g->scratch, &out)) {
        next = intern_state(g, out.set == from.data() ? g->st_set[static_cast<size_t>(sid)] : intern_set(g, out.set, out.n),
                            out.partial, out.need);
    }
    g->trans[at] = next;
    return next;
}

// Marks every token below trie node t whose bytes keep some stack alive from state sid.
void walk(grammar* g, const grammar_vocab& v, int32_t t, int32_t sid, uint32_t* mask) {
    for (int32_t e = v.child_begin[static_cast<size_t>(t)]; e < v.child_begin[static_cast<size_t>(t) + 1]; ++e) {
        const int32_t next = next_state(g, sid, v.child_byte[static_cast<size_t>(e)]);
        if (next < 0) continue;
        const int32_t c = v.child_node[static_cast<size_t>(e)];
        for (int32_t k = v.tok_begin[static_cast<size_t>(c)]; k < v.tok_begin[static_cast<size_t>(c) + 1]; ++k) {
            const int32_t id = v.tok_list[static_cast<size_t>(k)];
            mask[id >> 5] |= 1u << (id & 31);
        }
        if (v.child_begin[static_cast<size_t>(c)] < v.child_begin[static_cast<size_t>(c) + 1]) walk(g, v, c, next, mask);
    }
}

// GPT-2's byte-level BPE writes byte b as one code point: printable Latin-1 bytes as themselves, the rest as
// U+0100 + their rank among the non-printable ones.
std::vector<int32_t> gpt2_unicode_to_byte() {
    std::vector<int32_t> map(512, -1);
    int32_t extra = 0;
    for (int32_t b = 0; b < 256; ++b) {
        const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        map[static_cast<size_t>(printable ? b : 256 + extra++)] = b;
    }
    return map;
}

// A token's text from the file -> its bytes; false when it cannot be read that way.
bool token_bytes(std::string_view text, bool gpt2, const std::vector<int32_t>& byte_of, std::string* out) {
    out->clear();
    if (!gpt2) {  // SentencePiece: <0xXX> byte tokens, U+2581 for a space, the rest as written
        if (text.size() == 6 && text.substr(0, 3) == "<0x" && text[5] == '>') {
            out->push_back(static_cast<char>(std::stoi(std::string(text.substr(3, 2)), nullptr, 16)));
            return true;
        }
        for (size_t i = 0; i < text.size(); ++i) {
            if (text.compare(i, 3, "\xE2\x96\x81") == 0) {
                out->push_back(' ');
                i += 2;
            } else {
                out->push_back(text[i]);
            }
        }
        return true;
    }
    for (size_t i = 0; i < text.size();) {
        const uint8_t c = static_cast<uint8_t>(text[i]);
        uint32_t cp = c;
        size_t n = 1;
        if (c >= 0xC0 && c < 0xE0 && i + 1 < text.size()) {
            cp = ((c & 0x1Fu) << 6) | (static_cast<uint8_t>(text[i + 1]) & 0x3Fu);
            n = 2;
        } else if (c >= 0x80) {
            return false;
        }
        if (cp >= byte_of.size() || byte_of[cp] < 0) return false;
        out->push_back(static_cast<char>(byte_of[cp]));
        i += n;
    }
    return true;
}

}  // namespace

int32_t gram_state_of(grammar* g, const std::vector<int32_t>& set, uint32_t partial, int32_t need) {
    return intern_state(g, intern_set(g, set.data(), set.size()), partial, need);
}

int32_t gram_next_state(grammar* g, int32_t sid, uint8_t b) { return next_state(g, sid, b); }

std::unique_ptr<grammar_vocab> grammar_vocab_init(const std::vector<std::string>& bytes,
                                                  const std::vector<uint8_t>& usable,
                                                  const std::vector<int32_t>& eos_ids) {
    auto v = std::make_unique<grammar_vocab>();
    v->n_vocab = static_cast<int32_t>(bytes.size());
    v->eos_ids = eos_ids;
    v->bytes.resize(bytes.size());
    // build with per-node child lists, then flatten into CSR
    std::vector<std::vector<std::pair<uint8_t, int32_t>>> kids(1);
    std::vector<std::vector<int32_t>> toks(1);
    for (size_t id = 0; id < bytes.size(); ++id) {
        const bool eos = std::find(eos_ids.begin(), eos_ids.end(), static_cast<int32_t>(id)) != eos_ids.end();
        if (eos || !usable[id] || bytes[id].empty()) continue;
        v->bytes[id] = bytes[id];
        v->max_len = std::max<int32_t>(v->max_len, static_cast<int32_t>(bytes[id].size()));
        int32_t node = 0;
        for (char ch : bytes[id]) {
            const uint8_t b = static_cast<uint8_t>(ch);
            int32_t next = -1;
            for (const auto& [kb, kn] : kids[static_cast<size_t>(node)]) {
                if (kb == b) next = kn;
            }
            if (next < 0) {
                next = static_cast<int32_t>(kids.size());
                kids[static_cast<size_t>(node)].emplace_back(b, next);
                kids.emplace_back();
                toks.emplace_back();
            }
            node = next;
        }
        toks[static_cast<size_t>(node)].push_back(static_cast<int32_t>(id));
    }
    // CSR in depth-first order (a walk then reads the arrays front to back), children sorted by byte
    const size_t n_nodes = kids.size();
    std::vector<int32_t> order, renum(n_nodes, -1), stack{0};
    order.reserve(n_nodes);
    while (!stack.empty()) {
        const int32_t n = stack.back();
        stack.pop_back();
        renum[static_cast<size_t>(n)] = static_cast<int32_t>(order.size());
        order.push_back(n);
        std::sort(kids[static_cast<size_t>(n)].begin(), kids[static_cast<size_t>(n)].end());
        for (auto it = kids[static_cast<size_t>(n)].rbegin(); it != kids[static_cast<size_t>(n)].rend(); ++it) {
            stack.push_back(it->second);
        }
    }
    v->child_begin.assign(n_nodes + 1, 0);
    v->tok_begin.assign(n_nodes + 1, 0);
    for (size_t i = 0; i < n_nodes; ++i) {
        const size_t old = static_cast<size_t>(order[i]);
        v->child_begin[i + 1] = v->child_begin[i] + static_cast<int32_t>(kids[old].size());
        v->tok_begin[i + 1] = v->tok_begin[i] + static_cast<int32_t>(toks[old].size());
        for (const auto& [b, n] : kids[old]) {
            v->child_byte.push_back(b);
            v->child_node.push_back(renum[static_cast<size_t>(n)]);
        }
        v->tok_list.insert(v->tok_list.end(), toks[old].begin(), toks[old].end());
    }
    return v;
}

std::unique_ptr<grammar_vocab> grammar_vocab_from_gguf(const gguf_file* f, int32_t n_vocab,
                                                       const std::vector<int32_t>& eos_ids, std::string* err) {
    const gguf_value* toks = gguf_find(f, "tokenizer.ggml.tokens");
    if (!toks || toks->type != GGUF_TYPE_ARRAY || toks->arr_type != GGUF_TYPE_STRING) {
        *err = "no tokenizer.ggml.tokens";
        return nullptr;
    }
    const gguf_value* model = gguf_find(f, "tokenizer.ggml.model");
    const bool gpt2 = !(model && model->type == GGUF_TYPE_STRING && model->str == "llama");
    const gguf_value* types = gguf_find(f, "tokenizer.ggml.token_type");
    const bool typed = types && types->type == GGUF_TYPE_ARRAY && types->arr_type == GGUF_TYPE_INT32 &&
                       types->arr_n == toks->strs.size();
    const std::vector<int32_t> byte_of = gpt2_unicode_to_byte();
    std::vector<std::string> bytes(static_cast<size_t>(n_vocab));
    std::vector<uint8_t> usable(static_cast<size_t>(n_vocab), 0);
    for (size_t i = 0; i < bytes.size() && i < toks->strs.size(); ++i) {
        int32_t type = 1;
        if (typed) std::memcpy(&type, types->arr_data + 4 * i, 4);
        if (type == TOKEN_TYPE_CONTROL || type == TOKEN_TYPE_UNUSED) continue;
        // user-defined tokens are stored as their text, not in the byte-level alphabet
        if (type == 4) bytes[i] = std::string(toks->strs[i]), usable[i] = 1;
        else usable[i] = token_bytes(toks->strs[i], gpt2, byte_of, &bytes[i]) ? 1 : 0;
    }
    return grammar_vocab_init(bytes, usable, eos_ids);
}

grammar_matcher::grammar_matcher(std::shared_ptr<grammar> g, const grammar_vocab* vocab)
    : g_(std::move(g)), vocab_(vocab) {
    for (int32_t start : g_->rule_alts[static_cast<size_t>(g_->root)]) expand(g_.get(), start, -1, &set_);
    sort_unique(&set_);
}

bool grammar_matcher::can_end() const { return need_ == 0 && !set_.empty() && set_[0] == 0; }

// The matcher's walk state; the state tables start over when they grew past WALK_STATES_MAX (ids are
// only held during one call).
int32_t grammar_matcher::state_id() {
    if (g_->st_set.size() > WALK_STATES_MAX) {
        g_->sets.clear(), g_->set_ids.clear(), g_->st_set.clear(), g_->st_partial.clear(), g_->st_need.clear();
        g_->state_ids.clear(), g_->trans.clear(), g_->st_close.clear();
    }
    return intern_state(g_.get(), intern_set(g_.get(), set_.data(), set_.size()), partial_, need_);
}

const uint32_t* grammar_matcher::mask() {
    if (budget_ >= 0) {
        if (const uint32_t* m = budget_mask()) return m;
    }
    std::string key(8 + 4 * set_.size(), '\0');
    std::memcpy(key.data(), &partial_, 4);
    std::memcpy(key.data() + 4, &need_, 4);
    if (!set_.empty()) std::memcpy(key.data() + 8, set_.data(), 4 * set_.size());
    auto it = g_->masks.find(key);
    if (it != g_->masks.end()) return it->second.data();
    const size_t words = (static_cast<size_t>(vocab_->n_vocab) + 31) / 32;
    if (g_->mask_bytes + 4 * words > MASK_CACHE_BYTES) {
        g_->masks.clear();
        g_->mask_bytes = 0;
    }
    std::vector<uint32_t> m(words, 0);
    walk(g_.get(), *vocab_, 0, state_id(), m.data());
    if (can_end()) {
        for (int32_t id : vocab_->eos_ids) {
            if (id >= 0 && id < vocab_->n_vocab) m[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
        }
    }
    g_->mask_bytes += 4 * words;
    return g_->masks.emplace(std::move(key), std::move(m)).first->second.data();
}

bool grammar_matcher::accept_bytes(const std::string& text) {
    int32_t sid = state_id();
    for (char ch : text) {
        sid = next_state(g_.get(), sid, static_cast<uint8_t>(ch));
        if (sid < 0) return false;
    }
    set_ = g_->sets[static_cast<size_t>(g_->st_set[static_cast<size_t>(sid)])];
    partial_ = g_->st_partial[static_cast<size_t>(sid)];
    need_ = g_->st_need[static_cast<size_t>(sid)];
    return true;
}

bool grammar_matcher::accept(int32_t id) {
    if (id < 0 || id >= vocab_->n_vocab) return false;
    if (std::find(vocab_->eos_ids.begin(), vocab_->eos_ids.end(), id) != vocab_->eos_ids.end()) return can_end();
    const std::string& b = vocab_->bytes[static_cast<size_t>(id)];
    return !b.empty() && accept_bytes(b);
}

sample_status grammar_sample(grammar_matcher* gm, const sampler_params& params, const float* logits, int32_t n_vocab,
                             const int32_t* history, int32_t n_history, int64_t pos, uint64_t seed,
                             sampler_scratch* scratch, int32_t* token_out) {
    const uint32_t* allow = gm ? gm->mask() : nullptr;
    const sample_status st =
        sampler_sample_masked(params, logits, n_vocab, history, n_history, pos, seed, allow, scratch, token_out);
    if (st == SAMPLE_OK && gm && !gm->accept(*token_out)) return SAMPLE_NO_TOKEN;  // cannot happen: mask == accept
    return st;
}

std::shared_ptr<grammar_matcher> grammar_cache::start(const std::string& text, const grammar_vocab* vocab,
                                                      std::string* err) {
    if (vocab == nullptr) {
        *err = "grammar: this model's vocabulary cannot be read as bytes";
        return nullptr;
    }
    std::shared_ptr<grammar> g;
    for (size_t i = 0; i < recent_.size(); ++i) {
        if (recent_[i].first == text) {
            g = recent_[i].second;
            recent_.erase(recent_.begin() + static_cast<std::ptrdiff_t>(i));
            break;
        }
    }
    if (!g) g = grammar_parse(text, err);
    if (!g) return nullptr;
    recent_.emplace_back(text, g);
    if (recent_.size() > GRAMMAR_CACHE_MAX) recent_.erase(recent_.begin());
    return std::make_shared<grammar_matcher>(g, vocab);
}

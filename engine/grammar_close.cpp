// engine/grammar_close.cpp — output that always parses: the shortest completion of a grammar state and the
// budget mask (contract in grammar.h: close_bytes, close_text, set_budget).
//
// The shortest completion of one stack is exact: each alternative's remainder from an element costs the
// fewest bytes it can derive (a character class: its smallest code point's UTF-8 length; a rule: its cheapest
// alternative), found by a fixed point over the rules (grammars have no left recursion, so a cheapest
// derivation is finite wherever one exists), and a stack costs the sum over its frames. The live stacks are
// alternatives of one another, so the state's completion is the cheapest stack's. A character begun but not
// finished first takes its missing continuation bytes.
#include <algorithm>
#include <cstring>

#include "grammar.h"
#include "grammar_impl.h"

namespace {

int32_t utf8_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void put_utf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
        out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

// The smallest code point of a class that is a Unicode scalar value (no surrogates); false when none.
bool class_min(const std::vector<gram_range>& cls, uint32_t lo, uint32_t hi, uint32_t* out) {
    for (const gram_range& r : cls) {
        uint32_t a = std::max(r.lo, lo);
        const uint32_t b = std::min(r.hi, hi);
        if (a >= 0xD800 && a <= 0xDFFF) a = 0xE000;
        if (a <= b) {
            *out = a;
            return true;
        }
    }
    return false;
}

void close_tables(grammar* g) {
    if (g->rest_bytes.size() == g->flat.size()) return;
    g->rest_bytes.assign(g->flat.size(), GRAM_CLOSE_NEVER);
    g->rule_bytes.assign(g->rule_alts.size(), GRAM_CLOSE_NEVER);
    std::vector<int32_t> char_bytes(g->classes.size(), GRAM_CLOSE_NEVER);
    for (size_t c = 0; c < g->classes.size(); ++c) {
        uint32_t cp = 0;
        if (class_min(g->classes[c], 0, 0x10FFFF, &cp)) char_bytes[c] = utf8_len(cp);
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t pos = g->flat.size(); pos-- > 0;) {  // an alternative's later elements first
            const gram_elem e = g->flat[pos];
            int32_t v = 0;
            if (e.kind != GRAM_END) {
                const int32_t here = e.kind == GRAM_CHARS ? char_bytes[static_cast<size_t>(e.arg)]
                                                          : g->rule_bytes[static_cast<size_t>(e.arg)];
                v = std::min(GRAM_CLOSE_NEVER, here + g->rest_bytes[pos + 1]);
            }
            if (v < g->rest_bytes[pos]) g->rest_bytes[pos] = v, changed = true;
        }
        for (size_t r = 0; r < g->rule_alts.size(); ++r) {
            for (int32_t start : g->rule_alts[r]) {
                const int32_t v = g->rest_bytes[static_cast<size_t>(start)];
                if (v < g->rule_bytes[r]) g->rule_bytes[r] = v, changed = true;
            }
        }
    }
}

// Bytes to finish the frames below a stack's top: each parent's continuation.
int32_t below_bytes(const grammar* g, int32_t parent) {
    int64_t sum = 0;
    for (int32_t id = parent; id >= 0; id = g->nodes[static_cast<size_t>(id)].parent) {
        sum += g->rest_bytes[static_cast<size_t>(g->nodes[static_cast<size_t>(id)].pos)];
    }
    return static_cast<int32_t>(std::min<int64_t>(sum, GRAM_CLOSE_NEVER));
}

// Cost of stack id (0 = the empty stack: 0), and with a partial character (need > 0, bits `partial`) the
// cost after the character's missing bytes; *cp_out the character that costs least (need > 0).
int32_t stack_bytes(const grammar* g, int32_t id, uint32_t partial, int32_t need, uint32_t* cp_out) {
    if (id == 0) return need > 0 ? GRAM_CLOSE_NEVER : 0;
    const gram_node n = g->nodes[static_cast<size_t>(id)];
    if (need == 0) return std::min(GRAM_CLOSE_NEVER, g->rest_bytes[static_cast<size_t>(n.pos)] + below_bytes(g, n.parent));
    const uint32_t lo = partial << (6 * need), hi = lo | ((1u << (6 * need)) - 1);
    uint32_t cp = 0;
    if (!class_min(g->classes[static_cast<size_t>(g->flat[static_cast<size_t>(n.pos)].arg)], lo, hi, &cp)) {
        return GRAM_CLOSE_NEVER;
    }
    if (cp_out) *cp_out = cp;
    return std::min(GRAM_CLOSE_NEVER, need + g->rest_bytes[static_cast<size_t>(n.pos) + 1] + below_bytes(g, n.parent));
}

int32_t state_close(grammar* g, int32_t sid) {
    int32_t& cached = g->st_close[static_cast<size_t>(sid)];
    if (cached != -2) return cached;
    close_tables(g);
    const std::vector<int32_t>& set = g->sets[static_cast<size_t>(g->st_set[static_cast<size_t>(sid)])];
    int32_t best = GRAM_CLOSE_NEVER;
    for (int32_t id : set) {
        best = std::min(best, stack_bytes(g, id, g->st_partial[static_cast<size_t>(sid)], g->st_need[static_cast<size_t>(sid)], nullptr));
    }
    return cached = best;
}

// The shortest bytes that finish the alternative from flat[pos] to its end.
void emit_rest(const grammar* g, int32_t pos, std::string* out) {
    for (;; ++pos) {
        const gram_elem e = g->flat[static_cast<size_t>(pos)];
        if (e.kind == GRAM_END) return;
        if (e.kind == GRAM_CHARS) {
            uint32_t cp = 0;
            class_min(g->classes[static_cast<size_t>(e.arg)], 0, 0x10FFFF, &cp);
            put_utf8(cp, out);
        } else {
            int32_t best = -1;
            for (int32_t start : g->rule_alts[static_cast<size_t>(e.arg)]) {
                if (best < 0 || g->rest_bytes[static_cast<size_t>(start)] < g->rest_bytes[static_cast<size_t>(best)]) best = start;
            }
            emit_rest(g, best, out);
        }
    }
}

// Marks the tokens below trie node t whose bytes, from state sid, leave a completion of at most `room` bytes.
void walk_room(grammar* g, const grammar_vocab& v, int32_t t, int32_t sid, int32_t room, uint32_t* mask) {
    for (int32_t e = v.child_begin[static_cast<size_t>(t)]; e < v.child_begin[static_cast<size_t>(t) + 1]; ++e) {
        const int32_t next = gram_next_state(g, sid, v.child_byte[static_cast<size_t>(e)]);
        if (next < 0) continue;
        const int32_t c = v.child_node[static_cast<size_t>(e)];
        if (v.tok_begin[static_cast<size_t>(c)] < v.tok_begin[static_cast<size_t>(c) + 1] && state_close(g, next) <= room) {
            for (int32_t k = v.tok_begin[static_cast<size_t>(c)]; k < v.tok_begin[static_cast<size_t>(c) + 1]; ++k) {
                const int32_t id = v.tok_list[static_cast<size_t>(k)];
                mask[id >> 5] |= 1u << (id & 31);
            }
        }
        if (v.child_begin[static_cast<size_t>(c)] < v.child_begin[static_cast<size_t>(c) + 1]) walk_room(g, v, c, next, room, mask);
    }
}

}  // namespace

int32_t grammar_matcher::close_bytes() { return state_close(g_.get(), state_id()); }

std::string grammar_matcher::close_text() {
    std::string out;
    grammar* g = g_.get();
    close_tables(g);
    int32_t best = -1, best_bytes = GRAM_CLOSE_NEVER;
    uint32_t best_cp = 0;
    for (int32_t id : set_) {
        uint32_t cp = 0;
        const int32_t b = stack_bytes(g, id, partial_, need_, &cp);
        if (b < best_bytes) best = id, best_bytes = b, best_cp = cp;
    }
    if (best <= 0) return out;  // the output may end now, or no completion exists
    const gram_node n = g->nodes[static_cast<size_t>(best)];
    if (need_ > 0) {  // the missing continuation bytes of the character begun
        std::string whole;
        put_utf8(best_cp, &whole);
        out.append(whole, whole.size() - static_cast<size_t>(need_), std::string::npos);
    } else {
        uint32_t cp = 0;
        class_min(g->classes[static_cast<size_t>(g->flat[static_cast<size_t>(n.pos)].arg)], 0, 0x10FFFF, &cp);
        put_utf8(cp, &out);
    }
    emit_rest(g, n.pos + 1, &out);
    for (int32_t id = n.parent; id >= 0; id = g->nodes[static_cast<size_t>(id)].parent) {
        emit_rest(g, g->nodes[static_cast<size_t>(id)].pos, &out);
    }
    return out;
}

int32_t grammar_matcher::close_tokens() {
    const std::string text = close_text();
    int32_t n_tokens = 0;
    for (size_t i = 0; i < text.size(); ++n_tokens) {  // greedy: the longest token that starts text[i..]
        int32_t node = 0;
        size_t taken = 0;
        for (size_t j = i; j < text.size(); ++j) {
            int32_t next = -1;
            for (int32_t e = vocab_->child_begin[static_cast<size_t>(node)]; e < vocab_->child_begin[static_cast<size_t>(node) + 1]; ++e) {
                if (vocab_->child_byte[static_cast<size_t>(e)] == static_cast<uint8_t>(text[j])) next = vocab_->child_node[static_cast<size_t>(e)];
            }
            if (next < 0) break;
            node = next;
            if (vocab_->tok_begin[static_cast<size_t>(node)] < vocab_->tok_begin[static_cast<size_t>(node) + 1]) taken = j + 1 - i;
        }
        if (taken == 0) return GRAM_CLOSE_NEVER;
        i += taken;
    }
    return n_tokens;
}

const uint32_t* grammar_matcher::budget_mask() {
    const int32_t sid = state_id();
    const int32_t need = state_close(g_.get(), sid);
    if (need == GRAM_CLOSE_NEVER || budget_ > need + GRAM_CLOSE_WINDOW_BYTES) return nullptr;
    const size_t words = (static_cast<size_t>(vocab_->n_vocab) + 31) / 32;
    budget_mask_.assign(words, 0);
    uint32_t* m = budget_mask_.data();
    auto allow = [&](int32_t id) { m[static_cast<size_t>(id) >> 5] |= 1u << (id & 31); };
    const bool may_end = can_end();
    if (need >= budget_) {  // closing: the longest token that starts the shortest completion
        closing_ = true;
        const std::string text = close_text();
        int32_t node = 0, found = -1;
        for (size_t i = 0; i < text.size(); ++i) {
            int32_t next = -1;
            for (int32_t e = vocab_->child_begin[static_cast<size_t>(node)]; e < vocab_->child_begin[static_cast<size_t>(node) + 1]; ++e) {
                if (vocab_->child_byte[static_cast<size_t>(e)] == static_cast<uint8_t>(text[i])) next = vocab_->child_node[static_cast<size_t>(e)];
            }
            if (next < 0) break;
            node = next;
            if (vocab_->tok_begin[static_cast<size_t>(node)] < vocab_->tok_begin[static_cast<size_t>(node) + 1]) {
                found = vocab_->tok_list[static_cast<size_t>(vocab_->tok_begin[static_cast<size_t>(node)])];
            }
        }
        if (found >= 0) allow(found);
        else if (may_end) for (int32_t id : vocab_->eos_ids) allow(id);
        return m;  // all zero when neither: the sampler ends the request (no token)
    }
    walk_room(g_.get(), *vocab_, 0, sid, budget_ - 1, m);
    if (may_end) {
        for (int32_t id : vocab_->eos_ids) {
            if (id >= 0 && id < vocab_->n_vocab) allow(id);
        }
    }
    return m;
}

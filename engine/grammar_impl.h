// engine/grammar_impl.h — the grammar's tables, shared by grammar_parse.cpp and grammar.cpp (and the tests).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

enum gram_kind : uint8_t {
    GRAM_END = 0,    // end of an alternative
    GRAM_CHARS = 1,  // one code point from classes[arg]
    GRAM_RULE = 2,   // rule arg
};

struct gram_elem {
    gram_kind kind = GRAM_END;
    int32_t arg = 0;
};

struct gram_range {
    uint32_t lo = 0;
    uint32_t hi = 0;  // inclusive
};

// Sorted, merged ranges.
std::vector<gram_range> gram_normalise(std::vector<gram_range> r);
// [0, U+10FFFF] minus r (r normalised).
std::vector<gram_range> gram_complement(const std::vector<gram_range>& r);

// A stack of the pushdown matcher, interned: (pos, parent) -> id. pos indexes flat and points at a GRAM_CHARS
// element (a stack top) or, below the top, at the continuation of a rule call. Id 0 is the empty stack.
struct gram_node {
    int32_t pos = -1;
    int32_t parent = -1;  // id of the stack below, -1 for none
};

struct grammar {
    std::vector<gram_elem> flat;                   // every alternative's elements, each closed by GRAM_END
    std::vector<std::vector<int32_t>> rule_alts;   // rule -> start positions in flat
    std::vector<std::vector<gram_range>> classes;  // character classes (normalised)
    int32_t root = 0;
    // interned stacks: grows as the matchers meet new ones (shared by every request of this grammar)
    std::vector<gram_node> nodes{gram_node{}};
    std::unordered_map<uint64_t, int32_t> node_ids;
    // walk states: the live stacks (interned as a set id) plus a partial UTF-8 character, and their byte
    // transitions, so a trie walk costs one table read per edge once a state has been met
    std::vector<std::vector<int32_t>> sets;                 // set id -> sorted stack ids
    std::unordered_map<std::string, int32_t> set_ids;
    std::vector<int32_t> st_set;                            // state id -> set id
    std::vector<uint32_t> st_partial;                       // state id -> partial character bits
    std::vector<int32_t> st_need;                           // state id -> continuation bytes still to come
    std::unordered_map<uint64_t, int32_t> state_ids;
    std::vector<int32_t> trans;                             // (n_states, 256): -2 not yet known, -1 dead
    std::vector<int32_t> scratch;                           // step_byte's output buffer
    // masks already computed: key = (partial char state, live stack ids) -> (n_vocab + 31) / 32 words
    std::unordered_map<std::string, std::vector<uint32_t>> masks;
    size_t mask_bytes = 0;
    // shortest completions (engine/grammar_close.cpp): rest_bytes[pos] = fewest bytes that finish the
    // alternative from flat[pos] to its GRAM_END (GRAM_CLOSE_NEVER: no finite derivation); rule_bytes[r] = its
    // shortest alternative's; st_close[state id] = fewest bytes after which the output may end (-2 unknown)
    std::vector<int32_t> rest_bytes;
    std::vector<int32_t> rule_bytes;
    std::vector<int32_t> st_close;
};

// The walk state id of (set of stacks, partial character) and its byte transitions (grammar.cpp), for the
// shortest-completion code that walks the token trie as mask() does.
int32_t gram_state_of(grammar* g, const std::vector<int32_t>& set, uint32_t partial, int32_t need);
int32_t gram_next_state(grammar* g, int32_t sid, uint8_t b);

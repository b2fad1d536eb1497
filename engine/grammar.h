// engine/grammar.h — grammar-constrained sampling: a GBNF grammar applied as a token mask at each step.
//
// Contract:
//  - grammar_parse reads a GBNF grammar (llama.cpp's notation: `name ::= alternatives`, "literals" with
//    \n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH escapes, [classes] with ranges and ^, `.`, ( groups ), postfix
//    * + ? {m} {m,} {m,n}, # comments) whose start rule is `root`. Undefined rules, left recursion and
//    malformed text are refused with one line in *err; nothing here aborts.
//  - The grammar works on Unicode code points; the matcher works on bytes: a token is allowed only if its
//    bytes keep the output a valid prefix of the grammar, through multi-byte UTF-8 characters split across
//    tokens (a partial character is allowed while some character the grammar accepts starts with it) and
//    tokens that span several grammar elements. End-of-turn (the eos ids) is allowed only where the grammar
//    may end and no character is left half written. Control tokens are never allowed.
//  - Speed: the vocabulary's token bytes are a trie built once per engine (grammar_vocab); a mask is one
//    walk of that trie, pruned at the first byte that leaves the grammar, and masks are cached per grammar
//    state (a JSON string's body, a number's digits and whitespace runs come back to the same state), so
//    most steps cost one hash lookup.
//  - A pushdown matcher with shared, interned stacks (like llama.cpp's grammar stacks, with tail calls
//    folded so loops do not grow the stack). One grammar object may serve several requests at once (its
//    interned stacks and mask cache are shared); everything is single-threaded (the serve loop's thread).
//  - Knows nothing of the protocol; the serve loop parses `grammar=` and drives a matcher per request.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sampler.h"

struct gguf_file;
struct grammar;  // parsed rules + interned stacks + the mask cache

// The vocabulary as bytes: a token trie over every token the grammar may allow.
struct grammar_vocab {
    int32_t n_vocab = 0;
    std::vector<int32_t> eos_ids;           // end-of-turn tokens: allowed only where the grammar may end
    // the trie in CSR form; node 0 is the root (the empty prefix)
    std::vector<int32_t> child_begin;       // (n_nodes + 1) children of node i: [child_begin[i], child_begin[i+1])
    std::vector<uint8_t> child_byte;        // (n_edges) the byte on that edge
    std::vector<int32_t> child_node;        // (n_edges) the child node
    std::vector<int32_t> tok_begin;         // (n_nodes + 1) tokens whose bytes end at node i
    std::vector<int32_t> tok_list;          // token ids, grouped by node
    std::vector<std::string> bytes;         // (n_vocab) each token's bytes ("" for tokens never allowed)
    int32_t max_len = 0;                    // longest token, in bytes
};

// Builds the trie from each token's bytes; usable[i] == 0 leaves token i out (control tokens, empty ones).
std::unique_ptr<grammar_vocab> grammar_vocab_init(const std::vector<std::string>& bytes,
                                                  const std::vector<uint8_t>& usable,
                                                  const std::vector<int32_t>& eos_ids);
// Reads tokenizer.ggml.tokens / token_type / model from a GGUF: byte-level BPE ("gpt2": the GPT-2 byte to
// unicode table) or SentencePiece ("llama": U+2581 is a space, <0xXX> is a byte). Control and unused tokens
// are left out. nullptr + *err when the file has no usable vocabulary.
std::unique_ptr<grammar_vocab> grammar_vocab_from_gguf(const gguf_file* f, int32_t n_vocab,
                                                       const std::vector<int32_t>& eos_ids, std::string* err);

// Parses GBNF text; nullptr + *err (one line) when it is malformed.
std::shared_ptr<grammar> grammar_parse(const std::string& text, std::string* err);

// One request's position in a grammar.
class grammar_matcher {
public:
    grammar_matcher(std::shared_ptr<grammar> g, const grammar_vocab* vocab);
    // Bit i of the mask (word i / 32, bit i % 32) is set when token i is allowed now. Valid until the next
    // accept(). Eos ids are set only where the grammar may end.
    const uint32_t* mask();
    // Feeds a sampled token. Returns false (state unchanged) when the token is not allowed.
    bool accept(int32_t id);
    // True when the output so far is a complete sentence of the grammar.
    bool can_end() const;
    // True when a byte string keeps the output a valid prefix (for tests and the server's checks).
    bool accept_bytes(const std::string& text);

    // Output that always parses (engine/grammar_close.cpp). close_bytes(): the fewest bytes after which the
    // output may end (0: it may end now; GRAM_CLOSE_NEVER: it cannot). close_text(): those bytes (the
    // shortest completion: the smallest character of each class, each rule's shortest alternative).
    int32_t close_bytes();
    std::string close_text();
    // The tokens close_text() takes when written as the budget writes it (the longest token that starts the
    // rest, each step); GRAM_CLOSE_NEVER when some byte of it has no token. A budget below this cannot end
    // the reply as a whole sentence even when it binds from the first token (the engine refuses such a request).
    int32_t close_tokens();
    // The reply may take at most `tokens_left` more tokens (the token about to be sampled included; -1: no
    // limit). mask() then keeps the output closable within that budget: when the shortest completion's bytes
    // reach the budget, the one token allowed is the longest token that starts the completion (the end-of-turn
    // token once the output may end): "closing"; when they come within GRAM_CLOSE_WINDOW_BYTES of it, only
    // tokens after which the completion still fits (every byte has a token, so bytes bound tokens). Costs a trie
    // walk per step inside the window, nothing outside it. The token budget counts from the caller's budget.
    void set_budget(int32_t tokens_left) { budget_ = tokens_left; }
    // mask() has forced the shortest completion at some step since the budget was set (the reply was cut).
    bool closing() const { return closing_; }

private:
    int32_t state_id();
    const uint32_t* budget_mask();  // nullptr: the budget does not bind now (use the cached mask)

    std::shared_ptr<grammar> g_;
    const grammar_vocab* vocab_;
    std::vector<int32_t> set_;   // sorted ids of the live stacks (0 = the empty stack: the grammar may end)
    uint32_t partial_ = 0;       // bits of a UTF-8 character begun but not finished
    int32_t need_ = 0;           // its continuation bytes still to come
    int32_t budget_ = -1;        // tokens the reply may still take (set_budget); -1: none
    bool closing_ = false;       // a closing mask was returned (see closing())
    std::vector<uint32_t> budget_mask_;  // (n_vocab + 31) / 32 words: this matcher's own, never cached
};

constexpr int32_t GRAM_CLOSE_NEVER = 1 << 29;  // close_bytes() when no completion exists
// How near the budget (in bytes of the shortest completion) tokens start to be checked one by one: a JSON
// token rarely grows the completion by more than a few bytes; past the window the check would cost a trie
// walk per step for nothing.
constexpr int32_t GRAM_CLOSE_WINDOW_BYTES = 64;

// Samples under the matcher's mask and feeds the token to it (gm nullptr: plain sampler_sample).
// SAMPLE_NO_TOKEN when the grammar allows no token at all.
sample_status grammar_sample(grammar_matcher* gm, const sampler_params& params, const float* logits, int32_t n_vocab,
                             const int32_t* history, int32_t n_history, int64_t pos, uint64_t seed,
                             sampler_scratch* scratch, int32_t* token_out);

// Recent requests' grammars by their text, so a repeated grammar is parsed once and keeps its mask cache.
class grammar_cache {
public:
    // The matcher of a new request; nullptr + *err when the text is refused.
    std::shared_ptr<grammar_matcher> start(const std::string& text, const grammar_vocab* vocab, std::string* err);

private:
    std::vector<std::pair<std::string, std::shared_ptr<grammar>>> recent_;  // most recent last
};

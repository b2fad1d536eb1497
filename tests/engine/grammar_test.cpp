// tests/engine/grammar_test.cpp — host test (no model) of engine/grammar.*: the GBNF parser's refusals, and
// the token mask over a small hand-made vocabulary: tokens that span several grammar elements, multi-byte
// UTF-8 characters split across tokens, end-of-turn only where the grammar may end, and the mask agreeing
// with feeding each token's bytes one by one in every state a walk meets.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "grammar.h"
#include "test_check.h"

namespace {

// id -> bytes; the last id is the end-of-turn token, id 1 a control token (never allowed).
const std::vector<std::string> TOKENS = {
    "{", "<|ctl|>", "\"", "\":", "\",\"", "a", "ab", "b", "\xC3\xA9", "\xC3", "\xA9",   // 0..10
    "\xE6\x97\xA5", "\xE6\x97", "\xA5", ", ", " ", "1", "12", "12}", "}", "[", "]",    // 11..21
    ",", "x", "xx", "\xCE", "\xCF", "\xD0", "\xB1", "\x89", "{\"", "\xA9\xC3", "",      // 22..32
    "\xE0", "\x81", "\xE0\x81\xB8", "\xC1\xB8", "\xF0\x80\x81\xB8", "\xED", "\xED\xA0\x80",  // 33..39
};
const int32_t EOS = static_cast<int32_t>(TOKENS.size());

std::unique_ptr<grammar_vocab> make_vocab() {
    std::vector<std::string> bytes = TOKENS;
    bytes.push_back("<eos>");
    std::vector<uint8_t> usable(bytes.size(), 1);
    usable[1] = 0;
    return grammar_vocab_init(bytes, usable, {EOS});
}

std::shared_ptr<grammar> parse(const std::string& text) {
    std::string err;
    auto g = grammar_parse(text, &err);
    if (!g) std::fprintf(stderr, "parse failed: %s\n   for: %s\n", err.c_str(), text.c_str());
    return g;
}

bool allowed(grammar_matcher* m, int32_t id) { return (m->mask()[id >> 5] >> (id & 31)) & 1u; }

std::vector<int32_t> allowed_ids(grammar_matcher* m, int32_t n) {
    std::vector<int32_t> out;
    for (int32_t i = 0; i < n; ++i) {
        if (allowed(m, i)) out.push_back(i);
    }
    return out;
}

std::string ids_text(const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t i : ids) s += std::to_string(i) + " ";
    return s;
}

// In the matcher's current state, the mask equals "this token's bytes can be fed" for every token.
void check_mask_consistent(grammar_matcher* m, int32_t n_vocab, const char* where) {
    for (int32_t id = 0; id < n_vocab; ++id) {
        grammar_matcher copy = *m;
        const bool feed = id == EOS ? copy.can_end() : copy.accept(id);
        CHECK(feed == allowed(m, id), "%s: token %d mask %d but feeding %d", where, id, allowed(m, id), feed);
    }
}

void test_parse_refusals() {
    std::string err;
    CHECK(!grammar_parse("start ::= \"a\"", &err) && err.find("root") != std::string::npos, "no root: %s", err.c_str());
    CHECK(!grammar_parse("root ::= x", &err) && err.find("'x'") != std::string::npos, "undefined: %s", err.c_str());
    CHECK(!grammar_parse("root ::= root \"a\" | \"b\"", &err) && err.find("left recursive") != std::string::npos,
          "left recursion: %s", err.c_str());
    CHECK(!grammar_parse("root ::= e \"a\"\ne ::= \"\" | root", &err) && err.find("left recursive") != std::string::npos,
          "left recursion through a nullable rule: %s", err.c_str());
    CHECK(!grammar_parse("root ::= \"abc", &err), "unterminated literal accepted");
    CHECK(!grammar_parse("root ::= [a-", &err), "unterminated class accepted");
    CHECK(!grammar_parse("root ::= \"a\"{3,1}", &err), "reversed repetition accepted");
    CHECK(!grammar_parse("root ::= \"a\"\nroot ::= \"b\"", &err), "rule defined twice accepted");
    CHECK(grammar_parse("# a comment\nroot ::= ( \"a\" |\n  \"b\" )* tail # trailing\ntail ::= [^\\x00-\\x1f]?\n", &err) != nullptr,
          "valid grammar refused: %s", err.c_str());
    CHECK(grammar_parse("root ::= a \"x\"\na ::= \"y\" | \nb ::= \"z\"\n", &err) != nullptr,
          "an empty last alternative before the next rule refused: %s", err.c_str());
    CHECK(!grammar_parse("root ::= \"a\" )", &err), "a stray ')' accepted");
}

void test_tokens_span_elements() {
    auto v = make_vocab();
    auto g = parse("root ::= \"{\" ws \"\\\"a\\\":\" ws num \"}\"\nws ::= \" \"?\nnum ::= [0-9]+");
    grammar_matcher m(g, v.get());
    CHECK(allowed_ids(&m, EOS + 1) == (std::vector<int32_t>{0, 30}), "start: %s", ids_text(allowed_ids(&m, EOS + 1)).c_str());
    check_mask_consistent(&m, EOS + 1, "start");
    CHECK(m.accept(30), "'{\"' spans the brace and the key's quote");
    CHECK(!m.accept(2), "a second quote is not allowed");
    CHECK(m.accept(5), "a");
    CHECK(m.accept(3), "'\":' spans the key's closing quote and the colon");
    check_mask_consistent(&m, EOS + 1, "after key");
    CHECK(allowed_ids(&m, EOS + 1) == (std::vector<int32_t>{15, 16, 17, 18}),
          "after the colon: a space, digits, or '12}' (digits then the close): got %s",
          ids_text(allowed_ids(&m, EOS + 1)).c_str());
    CHECK(m.accept(16), "1");
    CHECK(allowed(&m, 18), "'12}' spans the number and the close");
    CHECK(m.accept(18), "12}");
    CHECK(allowed_ids(&m, EOS + 1) == (std::vector<int32_t>{EOS}), "complete: only end-of-turn, got %s",
          ids_text(allowed_ids(&m, EOS + 1)).c_str());
}

void test_multibyte() {
    auto v = make_vocab();
    auto g = parse("root ::= \"\xC3\xA9\"+ | \"\xE6\x97\xA5\"");  // é+ | 日
    grammar_matcher m(g, v.get());
    check_mask_consistent(&m, EOS + 1, "multibyte start");
    CHECK(allowed(&m, 8) && allowed(&m, 9) && allowed(&m, 11) && allowed(&m, 12), "whole and partial starts");
    CHECK(!allowed(&m, 10) && !allowed(&m, 13) && !allowed(&m, 31), "a continuation byte cannot start");
    CHECK(!allowed(&m, EOS), "nothing read: no end");
    CHECK(m.accept(9), "\\xC3 (half of é)");
    CHECK(!allowed(&m, EOS), "half a character: no end");
    CHECK(allowed_ids(&m, EOS + 1) == (std::vector<int32_t>{10, 31}), "after \\xC3: %s", ids_text(allowed_ids(&m, EOS + 1)).c_str());
    CHECK(m.accept(31), "'\\xA9\\xC3' ends é and starts the next one");
    CHECK(!m.can_end(), "again half a character");
    CHECK(m.accept(10), "\\xA9");
    CHECK(m.can_end() && allowed(&m, EOS), "é é: may end");
    grammar_matcher k(g, v.get());
    CHECK(k.accept(12) && allowed_ids(&k, EOS + 1) == (std::vector<int32_t>{13}), "日 split 2+1");
    CHECK(k.accept(13) && allowed_ids(&k, EOS + 1) == (std::vector<int32_t>{EOS}), "日 then end");
    // a class range over two-byte characters: α-ω is CE B1 .. CF 89
    auto greek = parse("root ::= [\\u03B1-\\u03C9]");
    grammar_matcher r(greek, v.get());
    CHECK(allowed(&r, 25) && allowed(&r, 26) && !allowed(&r, 27), "leading bytes that can still become α-ω");
    CHECK(r.accept(26) && allowed(&r, 29) && !allowed(&r, 28), "CF 89 (ω) yes, CF B1 no");
    grammar_matcher r2(greek, v.get());
    CHECK(r2.accept(25) && allowed(&r2, 28) && !allowed(&r2, 29), "CE B1 (α) yes, CE 89 no");
    // a negated class admits any character but the listed ones, multi-byte included
    auto neg = parse("root ::= [^\"]*");
    grammar_matcher n(neg, v.get());
    CHECK(allowed(&n, 11) && allowed(&n, 12) && !allowed(&n, 2) && !allowed(&n, 3) && allowed(&n, EOS), "[^\"]*");
    check_mask_consistent(&n, EOS + 1, "negated class");
}

void test_overlong_and_surrogate_forms() {
    // 'x' is U+0078; E0 81 B8, C1 B8 and F0 80 81 B8 are overlong spellings of it that decode to the same
    // value: none may pass, and neither may a lead byte whose every completion is out of the grammar
    auto v = make_vocab();
    auto g = parse("root ::= \"x\" | [\\u00E9-\\u00E9]");
    grammar_matcher m(g, v.get());
    CHECK(allowed(&m, 23) && !allowed(&m, 33) && !allowed(&m, 35) && !allowed(&m, 36) && !allowed(&m, 37),
          "overlong forms of x: %s", ids_text(allowed_ids(&m, EOS + 1)).c_str());
    check_mask_consistent(&m, EOS + 1, "overlong");
    // any character: E0 may start one (E0 A0..BF), but E0 81 may not; ED A0 80 is a surrogate
    auto any = parse("root ::= [^\"]");
    grammar_matcher a(any, v.get());
    CHECK(allowed(&a, 33) && !allowed(&a, 35) && allowed(&a, 38) && !allowed(&a, 39), "E0 / ED forms: %s",
          ids_text(allowed_ids(&a, EOS + 1)).c_str());
    CHECK(a.accept(33) && !allowed(&a, 34), "E0 then 81 (overlong) refused");
    check_mask_consistent(&a, EOS + 1, "after E0");
}

void test_end_of_turn() {
    auto v = make_vocab();
    auto g = parse("root ::= \"x\"{2,3}");
    grammar_matcher m(g, v.get());
    CHECK(!allowed(&m, EOS) && allowed(&m, 23) && allowed(&m, 24), "start");
    CHECK(m.accept(23) && !allowed(&m, EOS), "one x: no end");
    CHECK(!m.accept(EOS), "end refused while incomplete");
    CHECK(m.accept(23) && allowed(&m, EOS) && allowed(&m, 23) && !allowed(&m, 24), "two: end or one more x");
    CHECK(m.accept(23) && allowed_ids(&m, EOS + 1) == (std::vector<int32_t>{EOS}), "three: end only");
    CHECK(m.accept(EOS), "end accepted where the grammar ends");
    CHECK(!allowed(&m, 1), "control token");
}

void test_nesting() {
    auto v = make_vocab();
    auto g = parse("root ::= arr\narr ::= \"[\" ( arr ( \",\" arr )* )? \"]\"");
    grammar_matcher m(g, v.get());
    const int32_t seq[] = {20, 20, 21, 22, 20, 20, 21, 21, 21};  // [[],[[]]]
    for (int32_t t : seq) {
        CHECK(!allowed(&m, EOS), "open brackets: no end");
        check_mask_consistent(&m, EOS + 1, "nesting");
        CHECK(m.accept(t), "token %d", t);
    }
    CHECK(m.can_end() && allowed_ids(&m, EOS + 1) == (std::vector<int32_t>{EOS}), "balanced: end only");
}

void test_string_loop_state_repeats() {
    // a string body comes back to the same state after each character, so the mask cache serves it
    auto v = make_vocab();
    auto g = parse("root ::= \"\\\"\" ( [^\"\\\\] | \"\\\\\" [\"\\\\n] )* \"\\\"\"");
    grammar_matcher m(g, v.get());
    CHECK(m.accept(2), "open quote");
    const uint32_t* first = m.mask();
    CHECK(m.accept(6) && m.accept(11), "ab 日");
    CHECK(m.mask() == first, "the same cached mask after more string characters");
    CHECK(allowed(&m, 2) && !allowed(&m, 4) && !allowed(&m, EOS), "the close quote, but nothing after it");
    check_mask_consistent(&m, EOS + 1, "string body");
}

}  // namespace

int main() {
    test_parse_refusals();
    test_tokens_span_elements();
    test_multibyte();
    test_overlong_and_surrogate_forms();
    test_end_of_turn();
    test_nesting();
    test_string_loop_state_repeats();
    if (g_failures) {
        std::fprintf(stderr, "grammar_test: %d failure(s)\n", g_failures);
        return 1;
    }
    std::printf("grammar_test: ok\n");
    return 0;
}

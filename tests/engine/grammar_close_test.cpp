// tests/engine/grammar_close_test.cpp — output that always parses (engine/grammar_close.cpp): the shortest
// completion of a grammar state against a breadth-first search over bytes, close_text() completing the output
// in exactly close_bytes() bytes, and random generation under set_budget(): whatever the draws, every reply
// that ran out of budget is a complete sentence of the grammar, and closing never triggers far from the budget.
#include <cstdint>
#include <cstdio>
#include <deque>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "grammar.h"
#include "test_check.h"

namespace {

// every printable ASCII byte as a token, some multi-byte ones as a BPE vocabulary has them, then <eos>
std::vector<std::string> tokens() {
    std::vector<std::string> t;
    for (int c = 0x20; c < 0x7F; ++c) t.push_back(std::string(1, char(c)));
    for (const char* s : {"{\"", "\":", "\",\"", "\"}", "true", "false", "null", "12", "ab", "[[", "]]", "\":\"",
                          "},{\"", "abc", "  ", "\"name\":\""}) {
        t.push_back(s);
    }
    return t;
}

struct vocab_fixture {
    std::vector<std::string> toks = tokens();
    int32_t eos = static_cast<int32_t>(toks.size());
    std::unique_ptr<grammar_vocab> v;
    vocab_fixture() {
        std::vector<std::string> bytes = toks;
        bytes.push_back("<eos>");
        v = grammar_vocab_init(bytes, std::vector<uint8_t>(bytes.size(), 1), {eos});
    }
};

std::shared_ptr<grammar> parse(const std::string& text) {
    std::string err;
    auto g = grammar_parse(text, &err);
    if (!g) std::fprintf(stderr, "parse failed: %s\n", err.c_str());
    return g;
}

// A small JSON-like grammar in the shape the server's JSON Schema compiler writes: an object with a required
// string and a required integer, an optional array of booleans, whitespace allowed.
const char* OBJECT_GRAMMAR =
    "root ::= \"{\" ws \"\\\"name\\\"\" ws \":\" ws str ws \",\" ws \"\\\"age\\\"\" ws \":\" ws int ( ws \",\" ws "
    "\"\\\"tags\\\"\" ws \":\" ws arr )? ws \"}\"\n"
    "str ::= \"\\\"\" [a-z ]* \"\\\"\"\n"
    "int ::= \"0\" | [1-9] [0-9]*\n"
    "arr ::= \"[\" ws ( bool ( ws \",\" ws bool )* )? ws \"]\"\n"
    "bool ::= \"true\" | \"false\"\n"
    "ws ::= [ ]?\n";

const char* NEST_GRAMMAR = "root ::= arr\narr ::= \"[\" ( arr ( \",\" arr )* )? \"]\"\n";

// fewest bytes (over printable ASCII) after which the output may end, by breadth-first search; -1 past max_depth
int bfs_close(const grammar_matcher& start, int max_depth) {
    std::deque<std::pair<grammar_matcher, int>> q;
    q.emplace_back(start, 0);
    std::set<std::string> seen;
    while (!q.empty()) {
        auto [m, d] = q.front();
        q.pop_front();
        if (m.can_end()) return d;
        if (d == max_depth) continue;
        for (int c = 0x20; c < 0x7F; ++c) {
            grammar_matcher next = m;
            const std::string b(1, char(c));
            if (!next.accept_bytes(b)) continue;
            q.emplace_back(next, d + 1);
        }
        if (q.size() > 200000) return -2;
    }
    return -1;
}

void test_close_against_bfs() {
    vocab_fixture vf;
    for (const char* gtext : {NEST_GRAMMAR, OBJECT_GRAMMAR}) {
        auto g = parse(gtext);
        for (const char* prefix : {"", "[", "[[", "[[],[", "{", "{\"name\"", "{ \"name\": \"ab", "{\"name\":\"x\",\"age\":1",
                                   "{\"name\":\"\",\"age\":12,\"tags\":[tr"}) {
            grammar_matcher m(g, vf.v.get());
            if (!m.accept_bytes(prefix)) continue;  // the prefix belongs to the other grammar
            const int want = bfs_close(m, 12);
            if (want < 0) continue;                 // beyond the search: checked by the next test's consistency
            CHECK(m.close_bytes() == want, "'%s': close_bytes %d, search %d", prefix, m.close_bytes(), want);
            grammar_matcher done = m;
            const std::string text = m.close_text();
            CHECK(int(text.size()) == want && done.accept_bytes(text) && done.can_end(),
                  "'%s': close_text '%s' does not finish it in %d bytes", prefix, text.c_str(), want);
        }
    }
    grammar_matcher m(parse(NEST_GRAMMAR), vf.v.get());
    m.accept_bytes("[[[],");  // after a comma another array must come before the brackets close
    CHECK(m.close_text() == "[]]]", "nested close: '%s'", m.close_text().c_str());
}

// random replies under a budget: each token drawn uniformly among the allowed ones
void test_budget_always_closes() {
    vocab_fixture vf;
    std::mt19937 rng(5);
    int closed_early = 0, ran_out = 0, total = 0;
    for (const char* gtext : {OBJECT_GRAMMAR, NEST_GRAMMAR}) {
        auto g = parse(gtext);
        // the fewest tokens any reply needs: closing from the first token on (budget 0 closes at once)
        int least = 0;
        for (grammar_matcher m(g, vf.v.get()); !m.can_end() && least < 100; ++least) {
            m.set_budget(0);
            const uint32_t* mask = m.mask();
            int32_t id = 0;
            while (id < vf.eos && !((mask[id >> 5] >> (id & 31)) & 1u)) ++id;
            CHECK(id < vf.eos && m.accept(id), "closing from the start allowed no token");
        }
        std::printf("%s: the shortest reply takes %d tokens\n", gtext == NEST_GRAMMAR ? "nest" : "object", least);
        for (int budget = least; budget <= least + 36; budget += 3) {
            for (int rep = 0; rep < 20; ++rep) {
                grammar_matcher m(g, vf.v.get());
                std::string out;
                bool ended = false;
                int used = 0;
                for (; used < budget && !ended; ++used) {
                    m.set_budget(budget - used);
                    const uint32_t* mask = m.mask();
                    std::vector<int32_t> ok;
                    for (int32_t id = 0; id <= vf.eos; ++id) {
                        if ((mask[id >> 5] >> (id & 31)) & 1u) ok.push_back(id);
                    }
                    CHECK(!ok.empty(), "budget %d: no token allowed after '%s'", budget, out.c_str());
                    if (ok.empty()) break;
                    const int32_t id = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
                    if (id == vf.eos) {
                        ended = true;
                    } else {
                        CHECK(m.accept(id), "budget %d: an allowed token was refused", budget);
                        out += vf.toks[size_t(id)];
                    }
                }
                ++total;
                if (!ended) ++ran_out;
                if (m.closing()) ++closed_early;
                CHECK(m.can_end(), "budget %d: the reply '%s' is not a complete sentence", budget, out.c_str());
            }
        }
    }
    std::printf("budget: %d replies, %d ran to the budget, %d closed by it\n", total, ran_out, closed_early);
    CHECK(ran_out > total / 4 && closed_early > total / 4, "the budget rarely bound: the test tests nothing");
    // far from the budget, the mask is the grammar's own
    grammar_matcher a(parse(OBJECT_GRAMMAR), vf.v.get()), b(parse(OBJECT_GRAMMAR), vf.v.get());
    a.set_budget(1000);
    const uint32_t* ma = a.mask();
    const uint32_t* mb = b.mask();
    bool same = true;
    for (int32_t id = 0; id <= vf.eos; ++id) same = same && (((ma[id >> 5] ^ mb[id >> 5]) >> (id & 31)) & 1u) == 0;
    CHECK(same && !a.closing(), "a distant budget changed the mask");
}

}  // namespace

int main() {
    test_close_against_bfs();
    test_budget_always_closes();
    if (g_failures) {
        std::fprintf(stderr, "%d failures\n", g_failures);
        return 1;
    }
    std::printf("PASS\n");
    return 0;
}

// engine/grammar_parse.cpp — GBNF text -> the flat rule table of engine/grammar_impl.h (see grammar.h).
#include <cstring>
#include <functional>
#include <unordered_map>

#include "grammar.h"
#include "grammar_impl.h"

namespace {

constexpr uint32_t CODE_POINT_MAX = 0x10FFFF;
// Repetition counts beyond this would make rule tables of millions of elements from a short text.
constexpr int32_t REPEAT_MAX = 4096;
// Nesting of groups; deeper text is refused rather than recursing without end.
constexpr int32_t NESTING_MAX = 256;

using seq_t = std::vector<gram_elem>;
using alts_t = std::vector<seq_t>;

struct parser {
    explicit parser(const std::string& text) : s(text) {}
    const std::string& s;
    size_t i = 0;
    std::string err;
    std::vector<alts_t> rules;                          // rule index -> alternatives
    std::vector<std::string> names;                     // rule index -> name (synthetic ones get a suffix)
    std::vector<uint8_t> defined;
    std::unordered_map<std::string, int32_t> by_name;
    std::vector<std::vector<gram_range>> classes;

    bool fail(const std::string& why) {
        if (err.empty()) err = why + " at offset " + std::to_string(i);
        return false;
    }
    bool at_end() const { return i >= s.size(); }
    void skip_space(bool newline_ok) {
        while (i < s.size()) {
            const char c = s[i];
            if (c == '#') {
                while (i < s.size() && s[i] != '\n') ++i;
            } else if (c == ' ' || c == '\t' || c == '\r' || (newline_ok && c == '\n')) {
                ++i;
            } else {
                break;
            }
        }
    }
    static bool name_char(char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    }
    std::string parse_name() {
        const size_t b = i;
        while (i < s.size() && name_char(s[i])) ++i;
        return s.substr(b, i - b);
    }
    int32_t rule_id(const std::string& name) {
        auto it = by_name.find(name);
        if (it != by_name.end()) return it->second;
        const int32_t id = static_cast<int32_t>(rules.size());
        rules.emplace_back();
        names.push_back(name);
        defined.push_back(0);
        by_name.emplace(name, id);
        return id;
    }
    int32_t new_rule(const std::string& base) {
        const int32_t id = static_cast<int32_t>(rules.size());
        rules.emplace_back();
        names.push_back(base + "_" + std::to_string(id));
        defined.push_back(1);
        return id;
    }
    int32_t add_class(std::vector<gram_range> r) {
        classes.push_back(gram_normalise(std::move(r)));
        return static_cast<int32_t>(classes.size() - 1);
    }
    // One code point from UTF-8 text or an escape; false on malformed input.
    bool parse_char(uint32_t* cp) {
        if (at_end()) return fail("unexpected end");
        const uint8_t c = static_cast<uint8_t>(s[i]);
        if (c == '\\') {
            if (i + 1 >= s.size()) return fail("unfinished escape");
            const char e = s[i + 1];
            i += 2;
            int hex = 0;
            switch (e) {
                case 'n': *cp = '\n'; return true;
                case 't': *cp = '\t'; return true;
                case 'r': *cp = '\r'; return true;
                case 'x': hex = 2; break;
                case 'u': hex = 4; break;
                case 'U': hex = 8; break;
                default: *cp = static_cast<uint8_t>(e); return true;  // \\ \" \[ \] \- \^ ...
            }
            uint32_t v = 0;
            for (int k = 0; k < hex; ++k, ++i) {
                if (at_end()) return fail("unfinished \\x/\\u escape");
                const char h = s[i];
                const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                            : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (d < 0) return fail("bad hex digit in escape");
                v = v * 16 + static_cast<uint32_t>(d);
            }
            if (v > CODE_POINT_MAX) return fail("escape beyond U+10FFFF");
            *cp = v;
            return true;
        }
        const int n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (n == 0 || i + n > s.size()) return fail("malformed UTF-8");
        uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
        for (int k = 1; k < n; ++k) {
            const uint8_t t = static_cast<uint8_t>(s[i + k]);
            if ((t & 0xC0) != 0x80) return fail("malformed UTF-8");
            v = (v << 6) | (t & 0x3F);
        }
        i += n;
        *cp = v;
        return true;
    }
    bool parse_class(int32_t* out) {
        ++i;  // '['
        bool negate = false;
        if (i < s.size() && s[i] == '^') {
            negate = true;
            ++i;
        }
        std::vector<gram_range> r;
        while (true) {
            if (at_end()) return fail("unterminated [class]");
            if (s[i] == ']') {
                ++i;
                break;
            }
            uint32_t lo = 0, hi = 0;
            if (!parse_char(&lo)) return false;
            hi = lo;
            if (i + 1 < s.size() && s[i] == '-' && s[i + 1] != ']') {
                ++i;
                if (!parse_char(&hi)) return false;
                if (hi < lo) return fail("reversed range in [class]");
            }
            r.push_back({lo, hi});
        }
        if (negate) r = gram_complement(gram_normalise(std::move(r)));
        *out = add_class(std::move(r));
        return true;
    }
    bool parse_literal(seq_t* seq) {
        ++i;  // '"'
        while (true) {
            if (at_end()) return fail("unterminated \"literal\"");
            if (s[i] == '"') {
                ++i;
                return true;
            }
            uint32_t cp = 0;
            if (!parse_char(&cp)) return false;
            seq->push_back({GRAM_CHARS, add_class({{cp, cp}})});
        }
    }
    bool parse_int(int32_t* out) {
        const size_t b = i;
        int64_t v = 0;
        while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
            v = v * 10 + (s[i] - '0');
            if (v > REPEAT_MAX) return fail("repetition count over " + std::to_string(REPEAT_MAX));
            ++i;
        }
        if (i == b) return fail("expected a number");
        *out = static_cast<int32_t>(v);
        return true;
    }
    // Replaces the last element (seq[from..]) by its repetition {lo, hi} (hi < 0: unbounded).
    bool repeat(seq_t* seq, size_t from, int32_t lo, int32_t hi, const std::string& base) {
        const seq_t item(seq->begin() + static_cast<std::ptrdiff_t>(from), seq->end());
        seq->resize(from);
        for (int32_t k = 0; k < lo; ++k) seq->insert(seq->end(), item.begin(), item.end());
        if (hi < 0) {  // R ::= item R | ε
            const int32_t r = new_rule(base);
            seq_t loop = item;
            loop.push_back({GRAM_RULE, r});
            rules[static_cast<size_t>(r)] = {loop, {}};
            seq->push_back({GRAM_RULE, r});
            return true;
        }
        // (hi - lo) nested optionals: R1 ::= item R2 | ε ... Rn ::= item | ε
        int32_t next = -1;
        for (int32_t k = 0; k < hi - lo; ++k) {
            const int32_t r = new_rule(base);
            seq_t alt = item;
            if (next >= 0) alt.push_back({GRAM_RULE, next});
            rules[static_cast<size_t>(r)] = {alt, {}};
            next = r;
        }
        if (next >= 0) seq->push_back({GRAM_RULE, next});
        return true;
    }
    bool parse_alternatives(alts_t* out, const std::string& base, int32_t depth);
    bool parse_sequence(seq_t* seq, const std::string& base, int32_t depth) {
        const bool nested = depth > 0;
        while (true) {
            skip_space(nested);
            if (at_end()) return true;
            const char c = s[i];
            const size_t start = seq->size();
            if (c == '"') {
                if (!parse_literal(seq)) return false;
            } else if (c == '[') {
                int32_t cls = 0;
                if (!parse_class(&cls)) return false;
                seq->push_back({GRAM_CHARS, cls});
            } else if (c == '.') {
                ++i;
                seq->push_back({GRAM_CHARS, add_class({{0, CODE_POINT_MAX}})});
            } else if (c == '(') {
                ++i;
                if (depth + 1 > NESTING_MAX) return fail("groups nested too deep");
                const int32_t r = new_rule(base);
                alts_t alts;
                if (!parse_alternatives(&alts, base, depth + 1)) return false;
                skip_space(true);
                if (at_end() || s[i] != ')') return fail("expected ')'");
                ++i;
                rules[static_cast<size_t>(r)] = std::move(alts);
                seq->push_back({GRAM_RULE, r});
            } else if (name_char(c)) {
                const size_t save = i;
                const std::string name = parse_name();
                skip_space(false);
                if (i + 2 < s.size() + 0 && s.compare(i, 3, "::=") == 0) {  // the next rule begins
                    i = save;
                    return true;
                }
                i = save + name.size();
                seq->push_back({GRAM_RULE, rule_id(name)});
            } else {
                return true;  // '|', ')', newline, ...
            }
            // postfix operators apply to the element just parsed (a literal repeats whole)
            skip_space(nested);
            if (at_end()) continue;
            const char op = s[i];
            if (op == '*' || op == '+' || op == '?') {
                ++i;
                if (!wrap_literal(seq, start, base)) return false;
                if (!repeat(seq, start, op == '+' ? 1 : 0, op == '?' ? 1 : -1, base)) return false;
            } else if (op == '{') {
                ++i;
                skip_space(false);
                int32_t lo = 0, hi = 0;
                if (!parse_int(&lo)) return false;
                skip_space(false);
                hi = lo;
                if (i < s.size() && s[i] == ',') {
                    ++i;
                    skip_space(false);
                    hi = -1;
                    if (i < s.size() && s[i] != '}' && !parse_int(&hi)) return false;
                    skip_space(false);
                }
                if (at_end() || s[i] != '}') return fail("expected '}'");
                ++i;
                if (hi >= 0 && hi < lo) return fail("{m,n} with n < m");
                if (!wrap_literal(seq, start, base)) return false;
                if (!repeat(seq, start, lo, hi, base)) return false;
            }
        }
    }
    // A literal of several characters repeats as one unit: wrap it in a rule.
    bool wrap_literal(seq_t* seq, size_t start, const std::string& base) {
        if (seq->size() - start <= 1) return true;
        const int32_t r = new_rule(base);
        rules[static_cast<size_t>(r)] = {seq_t(seq->begin() + static_cast<std::ptrdiff_t>(start), seq->end())};
        seq->resize(start);
        seq->push_back({GRAM_RULE, r});
        return true;
    }
    bool parse_rules() {
        while (true) {
            skip_space(true);
            if (at_end()) return true;
            const std::string name = parse_name();
            if (name.empty()) return fail("expected a rule name");
            skip_space(false);
            if (s.compare(i, 3, "::=") != 0) return fail("expected '::=' after '" + name + "'");
            i += 3;
            const int32_t r = rule_id(name);
            if (defined[static_cast<size_t>(r)]) return fail("rule '" + name + "' defined twice");
            defined[static_cast<size_t>(r)] = 1;
            alts_t alts;
            if (!parse_alternatives(&alts, name, 0)) return false;
            rules[static_cast<size_t>(r)] = std::move(alts);
            skip_space(false);
            // the rule ends at a newline, or where the next `name ::=` begins (after an empty last alternative)
            const size_t save = i;
            const bool next_rule = !parse_name().empty() && (skip_space(false), s.compare(i, 3, "::=") == 0);
            i = save;
            if (!at_end() && s[i] != '\n' && !next_rule) return fail("unexpected '" + std::string(1, s[i]) + "'");
        }
    }
};

bool parser::parse_alternatives(alts_t* out, const std::string& base, int32_t depth) {
    while (true) {
        seq_t seq;
        if (!parse_sequence(&seq, base, depth)) return false;
        out->push_back(std::move(seq));
        skip_space(depth > 0);
        if (at_end() || s[i] != '|') return true;
        ++i;
        skip_space(true);
    }
}

// Rules that can match the empty string.
std::vector<uint8_t> nullable_rules(const std::vector<alts_t>& rules) {
    std::vector<uint8_t> nul(rules.size(), 0);
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t r = 0; r < rules.size(); ++r) {
            if (nul[r]) continue;
            for (const seq_t& alt : rules[r]) {
                bool all = true;
                for (const gram_elem& e : alt) {
                    if (e.kind == GRAM_CHARS || !nul[static_cast<size_t>(e.arg)]) {
                        all = false;
                        break;
                    }
                }
                if (all) {
                    nul[r] = 1;
                    changed = true;
                    break;
                }
            }
        }
    }
    return nul;
}

// The name of a rule that reaches itself before consuming a character, or "" when none does.
std::string left_recursion(const std::vector<alts_t>& rules, const std::vector<std::string>& names) {
    const std::vector<uint8_t> nul = nullable_rules(rules);
    std::vector<std::vector<int32_t>> left(rules.size());
    for (size_t r = 0; r < rules.size(); ++r) {
        for (const seq_t& alt : rules[r]) {
            for (const gram_elem& e : alt) {
                if (e.kind == GRAM_CHARS) break;
                left[r].push_back(e.arg);
                if (!nul[static_cast<size_t>(e.arg)]) break;
            }
        }
    }
    std::vector<uint8_t> mark(rules.size(), 0);  // 0 new, 1 on the path, 2 done
    std::string found;
    std::function<void(int32_t)> visit = [&](int32_t r) {
        mark[static_cast<size_t>(r)] = 1;
        for (int32_t t : left[static_cast<size_t>(r)]) {
            if (!found.empty()) return;
            if (mark[static_cast<size_t>(t)] == 1) found = names[static_cast<size_t>(t)];
            else if (mark[static_cast<size_t>(t)] == 0) visit(t);
        }
        mark[static_cast<size_t>(r)] = 2;
    };
    for (size_t r = 0; r < rules.size() && found.empty(); ++r) {
        if (mark[r] == 0) visit(static_cast<int32_t>(r));
    }
    return found;
}

}  // namespace

std::vector<gram_range> gram_normalise(std::vector<gram_range> r) {
    std::sort(r.begin(), r.end(), [](const gram_range& a, const gram_range& b) { return a.lo < b.lo; });
    std::vector<gram_range> out;
    for (const gram_range& x : r) {
        if (!out.empty() && x.lo <= out.back().hi + 1) out.back().hi = std::max(out.back().hi, x.hi);
        else out.push_back(x);
    }
    return out;
}

std::vector<gram_range> gram_complement(const std::vector<gram_range>& r) {
    std::vector<gram_range> out;
    uint32_t next = 0;
    for (const gram_range& x : r) {
        if (x.lo > next) out.push_back({next, x.lo - 1});
        next = x.hi + 1;
    }
    if (next <= CODE_POINT_MAX) out.push_back({next, CODE_POINT_MAX});
    return out;
}

std::shared_ptr<grammar> grammar_parse(const std::string& text, std::string* err) {
    parser p(text);
    if (!p.parse_rules()) {
        *err = "grammar: " + p.err;
        return nullptr;
    }
    auto root = p.by_name.find("root");
    if (root == p.by_name.end()) {
        *err = "grammar: no 'root' rule";
        return nullptr;
    }
    for (size_t r = 0; r < p.rules.size(); ++r) {
        if (!p.defined[r]) {
            *err = "grammar: rule '" + p.names[r] + "' is used but not defined";
            return nullptr;
        }
    }
    const std::string rec = left_recursion(p.rules, p.names);
    if (!rec.empty()) {
        *err = "grammar: rule '" + rec + "' is left recursive";
        return nullptr;
    }
    auto g = std::make_shared<grammar>();
    g->classes = std::move(p.classes);
    g->root = root->second;
    g->rule_alts.resize(p.rules.size());
    for (size_t r = 0; r < p.rules.size(); ++r) {
        for (const seq_t& alt : p.rules[r]) {
            g->rule_alts[r].push_back(static_cast<int32_t>(g->flat.size()));
            g->flat.insert(g->flat.end(), alt.begin(), alt.end());
            g->flat.push_back({GRAM_END, 0});
        }
    }
    return g;
}

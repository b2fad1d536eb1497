// engine/protocol.cpp — see protocol.h for the contract.
#include "protocol.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "logprobs.h"
#include "model.h"

namespace {

// The most ids one line can carry is bounded by the 4 MiB line limit; this bound only keeps a reserve()
// from trusting a huge count.
constexpr size_t IDS_RESERVE_MAX = 1u << 20;

std::vector<std::string> split_words(const std::string& line) {
    std::vector<std::string> words;
    size_t i = 0;
    const size_t n = line.size();
    while (i < n) {
        while (i < n && (line[i] == ' ' || line[i] == '\t')) ++i;
        if (i >= n) break;
        size_t j = i;
        while (j < n && line[j] != ' ' && line[j] != '\t') ++j;
        words.emplace_back(line, i, j - i);
        i = j;
    }
    return words;
}

bool fail(command* out, const std::string& why) {
    out->error = why;
    return false;
}

std::string quoted(const std::string& word) {
    std::string q(1, '\'');
    q.append(protocol_message(word.size() > 40 ? word.substr(0, 40) + "..." : word));
    q.push_back('\'');
    return q;
}

// "1,2,3" -> ids; digits and single commas only.
bool parse_ids(const std::string& text, int32_t n_vocab, std::vector<int32_t>* ids, std::string* why) {
    ids->clear();
    if (text.empty()) {
        *why = "empty prompt";
        return false;
    }
    ids->reserve(std::min(IDS_RESERVE_MAX, text.size() / 2 + 1));
    int64_t value = 0;
    size_t digits = 0;
    for (size_t i = 0; i <= text.size(); ++i) {
        const char c = i < text.size() ? text[i] : ',';
        if (c >= '0' && c <= '9') {
            if (digits >= 10) {
                *why = "token id too long at position " + std::to_string(ids->size());
                return false;
            }
            value = value * 10 + (c - '0');
            ++digits;
        } else if (c == ',') {
            if (digits == 0) {
                *why = "malformed id list (empty entry at position " + std::to_string(ids->size()) + ")";
                return false;
            }
            if (value >= n_vocab) {
                *why = "token id " + std::to_string(value) + " out of range (n_vocab " + std::to_string(n_vocab) +
                       ")";
                return false;
            }
            ids->push_back(static_cast<int32_t>(value));
            value = 0;
            digits = 0;
        } else {
            *why = "malformed id list (unexpected character at offset " + std::to_string(i) + ")";
            return false;
        }
    }
    return true;
}

bool parse_bias(const std::string& text, int32_t n_vocab, std::vector<std::pair<int32_t, float>>* out,
                std::string* why) {
    out->clear();
    size_t start = 0;
    while (start <= text.size()) {
        size_t comma = text.find(',', start);
        if (comma == std::string::npos) comma = text.size();
        const std::string item = text.substr(start, comma - start);
        const size_t colon = item.find(':');
        int64_t id = 0;
        float bias = 0.0f;
        if (colon == std::string::npos || !protocol_parse_i64(item.substr(0, colon), &id) ||
            !protocol_parse_f32(item.substr(colon + 1), &bias) || std::isnan(bias)) {
            *why = "malformed logit_bias entry " + quoted(item);
            return false;
        }
        if (id < 0 || id >= n_vocab) {
            *why = "logit_bias id " + std::to_string(id) + " out of range (n_vocab " + std::to_string(n_vocab) + ")";
            return false;
        }
        out->emplace_back(static_cast<int32_t>(id), bias);
        start = comma + 1;
    }
    return true;
}

// "%XX" escapes -> bytes (the grammar travels in one word: spaces, '%', '=' and non-ASCII bytes are escaped).
bool percent_decode(const std::string& text, std::string* out) {
    out->clear();
    out->reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] != '%') {
            out->push_back(text[i]);
            continue;
        }
        if (i + 2 >= text.size()) return false;
        int v = 0;
        for (size_t k = i + 1; k <= i + 2; ++k) {
            const char h = text[k];
            const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'A' && h <= 'F' ? h - 'A' + 10
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10 : -1;
            if (d < 0) return false;
            v = v * 16 + d;
        }
        out->push_back(static_cast<char>(v));
        i += 2;
    }
    return true;
}

// One request key. Returns false with *why on a malformed value; unknown keys are accepted and skipped.
bool parse_key(const std::string& key, const std::string& value, int32_t n_vocab, command* out, std::string* why) {
    sampler_params& p = out->sampling;
    float f = 0.0f;
    int64_t i = 0;
    auto bad = [&]() {
        *why = "malformed value for " + key + ": " + quoted(value);
        return false;
    };
    auto want_f = [&](float lo, float hi) { return protocol_parse_f32(value, &f) && std::isfinite(f) && f >= lo && f <= hi; };
    if (key == "temperature") {
        if (!want_f(0.0f, 1e6f)) return bad();
        p.temperature = f;
    } else if (key == "top_p") {
        if (!want_f(0.0f, 1.0f)) return bad();
        p.top_p = f;
    } else if (key == "min_p") {
        if (!want_f(0.0f, 1.0f)) return bad();
        p.min_p = f;
    } else if (key == "top_k") {
        if (!protocol_parse_i64(value, &i) || i < 0 || i > (1 << 30)) return bad();
        p.top_k = static_cast<int32_t>(i);
    } else if (key == "penalty_repeat") {
        if (!want_f(1e-6f, 1e6f)) return bad();
        p.penalty_repeat = f;
    } else if (key == "penalty_freq") {
        if (!want_f(-1e6f, 1e6f)) return bad();
        p.penalty_freq = f;
    } else if (key == "penalty_present") {
        if (!want_f(-1e6f, 1e6f)) return bad();
        p.penalty_present = f;
    } else if (key == "penalty_last_n") {
        if (!protocol_parse_i64(value, &i) || i < -1 || i > (1 << 30)) return bad();
        p.penalty_last_n = static_cast<int32_t>(i);
    } else if (key == "seed") {
        if (!protocol_parse_i64(value, &i) || i < 0) return bad();
        p.has_seed = true;
        p.seed = static_cast<uint64_t>(i);
    } else if (key == "logit_bias") {
        if (!parse_bias(value, n_vocab, &p.logit_bias, why)) return false;
    } else if (key == "typical_p") {
        if (!want_f(0.0f, 1.0f)) return bad();
        p.typical_p = f;
    } else if (key == "top_n_sigma") {
        if (!want_f(-1.0f, 1e6f)) return bad();
        p.top_n_sigma = f;
    } else if (key == "xtc_probability") {
        if (!want_f(0.0f, 1.0f)) return bad();
        p.xtc_probability = f;
    } else if (key == "xtc_threshold") {
        if (!want_f(0.0f, 1.0f)) return bad();
        p.xtc_threshold = f;
    } else if (key == "mirostat") {
        if (value != "0" && value != "1" && value != "2") return bad();
        p.mirostat = value[0] - '0';
    } else if (key == "mirostat_tau") {
        if (!want_f(0.0f, 1e6f)) return bad();
        p.mirostat_tau = f;
    } else if (key == "mirostat_eta") {
        if (!want_f(0.0f, 1e6f)) return bad();
        p.mirostat_eta = f;
    } else if (key == "dry_multiplier") {
        if (!want_f(0.0f, 1e6f)) return bad();
        p.dry_multiplier = f;
    } else if (key == "dry_base") {
        if (!want_f(1.0f, 1e6f)) return bad();
        p.dry_base = f;
    } else if (key == "dry_allowed_length") {
        if (!protocol_parse_i64(value, &i) || i < 0 || i > (1 << 20)) return bad();
        p.dry_allowed_length = static_cast<int32_t>(i);
    } else if (key == "dry_penalty_last_n") {
        if (!protocol_parse_i64(value, &i) || i < -1 || i > (1 << 30)) return bad();
        p.dry_penalty_last_n = static_cast<int32_t>(i);
    } else if (key == "dry_breakers") {
        std::string unused;
        if (!parse_ids(value, n_vocab, &p.dry_breakers, &unused)) return bad();
    } else if (key == "grammar") {
        if (value.empty() || !percent_decode(value, &out->grammar)) {
            *why = "malformed value for grammar (GBNF, %XX-escaped)";
            return false;
        }
    } else if (key == "logprobs") {
        if (!protocol_parse_i64(value, &i) || i < 0 || i > LOGPROBS_TOP_MAX) return bad();
        p.n_logprobs = static_cast<int32_t>(i);
    } else if (key == "lp_post") {
        if (value != "0" && value != "1") return bad();
        p.lp_post = value == "1";
    } else if (key == "ckpt") {
        if (value != "0" && value != "1") return bad();
        out->ckpt = value == "1";
    } else if (key == "draft") {
        if (value != "0" && value != "1") return bad();
        out->draft = value == "1";
    } else if (key.empty()) {
        *why = "malformed key " + quoted(key + "=" + value);
        return false;
    }
    return true;  // unknown keys are skipped
}

// GEN/BGEN after the command word (and BGEN's slot): <max_new>[ k=v ...] <ids>
bool parse_request(const std::vector<std::string>& w, size_t first, int32_t n_vocab, command* out) {
    if (w.size() < first + 2) {
        return fail(out, w.size() < first + 1 ? "missing max_new" : "empty prompt");
    }
    int64_t max_new = 0;
    if (!protocol_parse_i64(w[first], &max_new) || max_new < 1 || max_new > (1 << 30)) {
        return fail(out, "malformed max_new " + quoted(w[first]) + " (an integer >= 1)");
    }
    out->max_new = static_cast<int32_t>(max_new);
    for (size_t k = first + 1; k + 1 < w.size(); ++k) {
        const size_t eq = w[k].find('=');
        if (eq == std::string::npos) return fail(out, "malformed key " + quoted(w[k]) + " (expected key=value)");
        std::string why;
        if (!parse_key(w[k].substr(0, eq), w[k].substr(eq + 1), n_vocab, out, &why)) return fail(out, why);
    }
    const std::string& ids = w.back();
    if (ids.find('=') != std::string::npos) return fail(out, "empty prompt (the last word is a key)");
    std::string why;
    if (!parse_ids(ids, n_vocab, &out->ids, &why)) return fail(out, why);
    return true;
}

bool parse_slot(const std::vector<std::string>& w, command* out) {
    int64_t slot = -1;
    if (w.size() < 2 || !protocol_parse_i64(w[1], &slot) || slot < 0 || slot > 1000000) {
        return fail(out, w[0] + ": malformed slot " + quoted(w.size() < 2 ? std::string() : w[1]));
    }
    out->slot = static_cast<int32_t>(slot);
    return true;
}

}  // namespace

bool protocol_parse_i64(const std::string& text, int64_t* out) {
    if (text.empty() || text.size() > 19) return false;
    size_t i = 0;
    bool neg = false;
    if (text[0] == '-' || text[0] == '+') {
        neg = text[0] == '-';
        i = 1;
        if (text.size() == 1) return false;
    }
    int64_t v = 0;
    for (; i < text.size(); ++i) {
        if (text[i] < '0' || text[i] > '9') return false;
        v = v * 10 + (text[i] - '0');
    }
    *out = neg ? -v : v;
    return true;
}

bool protocol_parse_f32(const std::string& text, float* out) {
    if (text.empty() || text.size() > 64) return false;
    for (char c : text) {
        if (!((c >= '0' && c <= '9') || c == '.' || c == '-' || c == '+' || c == 'e' || c == 'E' || c == 'i' ||
              c == 'n' || c == 'f' || c == 'I' || c == 'N' || c == 'F')) {
            return false;
        }
    }
    char buf[80];
    std::memcpy(buf, text.data(), text.size());
    buf[text.size()] = '\0';
    char* end = nullptr;
    errno = 0;
    const float v = std::strtof(buf, &end);
    if (end != buf + text.size()) return false;
    *out = v;
    return true;
}

bool protocol_parse(const std::string& raw, int32_t n_vocab, command* out) {
    *out = command{};
    std::string line = raw;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::vector<std::string> w = split_words(line);
    if (w.empty()) return true;  // CMD_NONE
    const std::string& verb = w[0];
    if (verb == "BGEN") {
        out->kind = CMD_BGEN;
        if (!parse_slot(w, out)) return false;
        return parse_request(w, 2, n_vocab, out);
    }
    if (verb == "BEMB") {  // <slot> <ids> only: no keys, no max_new
        out->kind = CMD_BEMB;
        if (!parse_slot(w, out)) return false;
        const size_t first = 2;
        if (w.size() != first + 1) return fail(out, w.size() <= first ? "empty prompt" : verb + ": ids only");
        std::string why;
        if (!parse_ids(w[first], n_vocab, &out->ids, &why)) return fail(out, why);
        return true;
    }
    if (verb == "BSTOP") {
        out->kind = CMD_BSTOP;
        return parse_slot(w, out);
    }
    if (verb == "PING") {
        out->kind = CMD_PING;
        if (w.size() != 2 || !protocol_parse_i64(w[1], &out->ping) || out->ping < 0) {
            return fail(out, "PING: one number >= 0");
        }
        return true;
    }
    if (verb == "VRAM") {
        out->kind = CMD_VRAM;
        if (w.size() >= 2) {
            int64_t mib = 0;
            if (!protocol_parse_i64(w[1], &mib) || mib < 0) return fail(out, "VRAM: malformed reserve " + quoted(w[1]));
            out->vram_mib = mib;
        }
        return true;
    }
    if (verb == "BERASE" || verb == "BCLOSE") {
        out->kind = verb == "BERASE" ? CMD_BERASE : CMD_BCLOSE;
        if (w.size() != 2) return fail(out, verb + ": <slot> only");
        return parse_slot(w, out);
    }
    if (verb == "BSAVE" || verb == "BRESTORE") {
        out->kind = verb == "BSAVE" ? CMD_BSAVE : CMD_BRESTORE;
        size_t at = line.find(verb) + verb.size();
        if (!parse_slot(w, out)) return false;  // the slot, then the path (the rest of the line)
        at = line.find(w[1], at) + w[1].size();
        size_t b = line.find_first_not_of(" \t", at);
        size_t e = line.find_last_not_of(" \t");
        if (b == std::string::npos || e == std::string::npos || e < b) return fail(out, verb + ": missing path");
        out->path = line.substr(b, e - b + 1);
        if (out->path.find('\0') != std::string::npos) return fail(out, verb + ": path contains NUL");
        return true;
    }
    if (verb == "QUIT") {
        out->kind = CMD_QUIT;
        return true;
    }
    return fail(out, "unknown command " + quoted(verb));
}

std::string protocol_message(const std::string& text) {
    std::string s;
    s.reserve(std::min(text.size(), PROTOCOL_MESSAGE_MAX_BYTES));
    for (unsigned char c : text) {
        s.push_back(c < 0x20 || c == 0x7f ? ' ' : static_cast<char>(c));
    }
    if (s.size() > PROTOCOL_MESSAGE_MAX_BYTES) {
        size_t cut = PROTOCOL_MESSAGE_MAX_BYTES;
        while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xc0) == 0x80) --cut;  // not inside a character
        s.resize(cut);
    }
    return s;
}

namespace {
// The token flush's state (the serve loop's thread only, as every writer of stdout).
int64_t token_flush_ms = 0;
bool tokens_held = false;
std::chrono::steady_clock::time_point last_flush;

void flush_now() {
    std::fflush(stdout);
    tokens_held = false;
    last_flush = std::chrono::steady_clock::now();
}
}  // namespace

void protocol_write_line(const std::string& line) {
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fputc('\n', stdout);
    flush_now();
}

void protocol_set_token_flush_ms(int64_t ms) { token_flush_ms = ms < 0 ? 0 : ms; }

void protocol_write_token_line(const std::string& line) {
    if (token_flush_ms == 0) {
        protocol_write_line(line);
        return;
    }
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fputc('\n', stdout);
    tokens_held = true;
}

void protocol_flush_tokens() {
    if (tokens_held) flush_now();
}

void protocol_flush_tokens_due() {
    if (tokens_held && std::chrono::steady_clock::now() - last_flush >= std::chrono::milliseconds(token_flush_ms)) {
        flush_now();
    }
}

std::string protocol_fixed1(double value) {
    if (!std::isfinite(value) || value < 0.0) value = 0.0;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f", value);
    return buf;
}

std::string protocol_expert_words(uint64_t hits, uint64_t misses) {
    if (hits + misses == 0) return "";
    return " experts_hits=" + std::to_string(hits) + " experts_misses=" + std::to_string(misses);
}

std::string expert_words(const strata_model* model) {
    const expert_figures f = model_expert_figures(model);
    return protocol_expert_words(f.hits, f.misses);
}

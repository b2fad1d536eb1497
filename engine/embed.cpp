// engine/embed.cpp — see embed.h for the contract.
#include "embed.h"

#include <cmath>
#include <cstring>

void embed_pool::reset(int32_t n_embd) {
    sum.assign(static_cast<size_t>(n_embd), 0.0);
    n = 0;
}

void embed_pool::add(const float* rows, int32_t n_rows, int32_t n_embd) {
    for (int32_t r = 0; r < n_rows; ++r) {
        const float* row = rows + static_cast<size_t>(r) * static_cast<size_t>(n_embd);
        for (int32_t j = 0; j < n_embd; ++j) sum[static_cast<size_t>(j)] += row[j];
    }
    n += n_rows;
}

std::string embed_pool::payload() const {
    if (n <= 0 || sum.empty()) return "";
    double norm2 = 0.0;
    for (double v : sum) norm2 += v * v;  // the mean's 1/n cancels in the normalisation
    const double norm = std::sqrt(norm2);
    if (!std::isfinite(norm) || norm <= 0.0) return "";
    std::vector<float> out(sum.size());
    for (size_t j = 0; j < sum.size(); ++j) out[j] = static_cast<float>(sum[j] / norm);
    return std::to_string(out.size()) + " " + embed_base64(out.data(), out.size());
}

std::string embed_base64(const float* v, size_t n) {
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::vector<uint8_t> bytes(n * 4);
    for (size_t i = 0; i < n; ++i) {
        uint32_t u = 0;
        std::memcpy(&u, v + i, 4);
        for (int b = 0; b < 4; ++b) bytes[i * 4 + static_cast<size_t>(b)] = static_cast<uint8_t>(u >> (8 * b));
    }
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    for (size_t i = 0; i < bytes.size(); i += 3) {
        const size_t left = bytes.size() - i;
        const uint32_t w = (uint32_t(bytes[i]) << 16) | (left > 1 ? uint32_t(bytes[i + 1]) << 8 : 0u) |
                           (left > 2 ? uint32_t(bytes[i + 2]) : 0u);
        out += digits[(w >> 18) & 63];
        out += digits[(w >> 12) & 63];
        out += left > 1 ? digits[(w >> 6) & 63] : '=';
        out += left > 2 ? digits[w & 63] : '=';
    }
    return out;
}

int embed_eval_chunk(strata_model* model, kv_cache* kv, const int32_t* tokens, int32_t len, int32_t pos,
                     std::vector<float>* hidden, embed_pool* pool, std::string* err) {
    const int32_t E = model_get_info(model).n_embd;
    std::vector<int32_t> p(static_cast<size_t>(len)), sq(static_cast<size_t>(len), 0);
    for (int32_t i = 0; i < len; ++i) p[static_cast<size_t>(i)] = pos + i;
    const std::vector<uint8_t> no_logits(static_cast<size_t>(len), 0), all(static_cast<size_t>(len), 1);
    hidden->resize(static_cast<size_t>(len) * static_cast<size_t>(E));
    kv_cache* kvs[1] = {kv};
    const eval_batch b{.n = len, .token = tokens, .pos = p.data(), .seq = sq.data(), .want_logits = no_logits.data(),
                       .kvs = kvs, .n_seq = 1, .want_hidden = all.data(), .hidden = hidden->data()};
    const int rc = model_eval(model, b, nullptr, err);
    if (rc == 0) pool->add(hidden->data(), len, E);
    return rc;
}

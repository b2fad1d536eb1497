// engine/session.cpp — see session.h for the contract.
#include "session.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace {

// A conversation shorter than this is cheaper to read again than to keep.
constexpr size_t PARK_MIN_TOKENS = 8;
// SAVE/RESTORE move K/V in blocks of at most this many bytes (one SESSION line each).
constexpr size_t SESSION_BLOCK_BYTES = 16u << 20;
constexpr char SESSION_MAGIC[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'S', 'E'};
constexpr uint32_t SESSION_VERSION = 2;  // 2: window_lo (ring caches of sliding-window layers)
constexpr uint64_t HASH_SEED = 0xcbf29ce484222325ull;
constexpr uint64_t HASH_PRIME = 0x100000001b3ull;

// FNV-1a over 64-bit little-endian words of the byte stream (a last partial word byte by byte, in finish());
// the result does not depend on how the stream is cut into add() calls. An integrity check, not security.
struct file_hash {
    uint64_t h = HASH_SEED;
    unsigned char carry[8] = {};
    size_t n_carry = 0;
    void add(const void* data, size_t n) {
        const unsigned char* p = static_cast<const unsigned char*>(data);
        while (n > 0 && n_carry > 0) {
            carry[n_carry++] = *p++;
            --n;
            if (n_carry == 8) {
                word(carry);
                n_carry = 0;
            }
        }
        for (; n >= 8; n -= 8, p += 8) word(p);
        while (n > 0) {
            carry[n_carry++] = *p++;
            --n;
        }
    }
    uint64_t finish() const {
        uint64_t r = h;
        for (size_t i = 0; i < n_carry; ++i) r = (r ^ carry[i]) * HASH_PRIME;
        return r;
    }

private:
    void word(const unsigned char* p) {
        uint64_t w;
        std::memcpy(&w, p, 8);
        h = (h ^ w) * HASH_PRIME;
    }
};

struct session_header {
    char magic[8];
    uint32_t version;
    uint32_t kv;
    uint32_t n_layer;
    uint32_t n_vocab;
    uint64_t row_bytes;
    uint32_t n_tokens;
    uint32_t ckpt_len;
    uint32_t window_lo;  // the window layers' rows before it are zeros (kv_cache_window_lo)
    uint32_t reserved;
};
static_assert(sizeof(session_header) == 48, "session header is 48 bytes on disk");

session_io_result io_fail(const std::string& kind, const std::string& reason) {
    session_io_result r;
    r.kind = kind;
    r.reason = reason;
    return r;
}

bool write_all(int fd, const void* data, size_t n, file_hash* hash) {
    const char* p = static_cast<const char*>(data);
    if (hash) hash->add(data, n);
    while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= static_cast<size_t>(w);
    }
    return true;
}

bool read_all(int fd, void* data, size_t n) {
    char* p = static_cast<char*>(data);
    while (n > 0) {
        const ssize_t r = ::read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= static_cast<size_t>(r);
    }
    return true;
}

}  // namespace

int32_t session_common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) ++i;
    return static_cast<int32_t>(i);
}

int32_t session_turn_checkpoint(const std::vector<int32_t>& prompt, int32_t turn_token) {
    if (turn_token < 0) return 0;
    for (size_t i = prompt.size(); i > 0; --i) {
        if (prompt[i - 1] == turn_token) return static_cast<int32_t>(i);
    }
    return 0;
}

// ---- conversation cache --------------------------------------------------------------------------------

conversation_cache::conversation_cache(strata_model* model, kv_type type, int32_t max_slots, size_t budget_bytes)
    : model_(model), type_(type), max_slots_(std::max(0, max_slots)), budget_bytes_(budget_bytes) {}

conversation_cache::~conversation_cache() { clear(); }

void conversation_cache::clear() {
    for (auto& e : entries_) kv_cache_free(e.st.kv);
    entries_.clear();
}

size_t conversation_cache::bytes() const {
    size_t b = 0;
    for (const auto& e : entries_) b += e.bytes;
    return b;
}

std::string conversation_cache::summary() const {
    return "parked=" + std::to_string(entries_.size()) + " bytes=" + std::to_string(bytes()) +
           " evictions=" + std::to_string(evictions_);
}

void conversation_cache::evict_to_fit(size_t incoming_bytes) {
    auto over = [&]() {
        if (static_cast<int32_t>(entries_.size()) + 1 > max_slots_) return true;
        return budget_bytes_ > 0 && bytes() + incoming_bytes > budget_bytes_;
    };
    while (!entries_.empty() && over()) {
        size_t oldest = 0;
        for (size_t i = 1; i < entries_.size(); ++i) {
            if (entries_[i].last_used < entries_[oldest].last_used) oldest = i;
        }
        kv_cache_free(entries_[oldest].st.kv);
        entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(oldest));
        ++evictions_;
    }
}

bool conversation_cache::park(const seq_state& st) {
    const int32_t n = static_cast<int32_t>(st.tokens.size());
    if (max_slots_ <= 0 || st.kv == nullptr || st.tokens.size() < PARK_MIN_TOKENS || st.ckpt_len <= 0) return false;
    if (!kv_cache_can_resume(st.kv, n)) return false;  // its window layers lost the window: nothing to continue
    // already held whole by an entry: only refresh its place in the LRU order
    for (auto& e : entries_) {
        if (session_common_prefix(e.st.tokens, st.tokens) == n) {
            e.last_used = ++clock_;
            std::fprintf(stderr, "conversation cache: skipped %d tokens (already parked) %s\n", n, summary().c_str());
            return false;
        }
    }
    const size_t need = kv_cache_bytes(st.kv, n);
    if (budget_bytes_ > 0 && need > budget_bytes_) {
        std::fprintf(stderr, "conversation cache: skipped %d tokens (over the budget) %s\n", n, summary().c_str());
        return false;
    }
    // superseded: entries the new one contains, and older turns of the same conversation (it shares their
    // settled history up to their checkpoint)
    size_t dropped = 0;
    for (size_t i = entries_.size(); i > 0; --i) {
        parked_seq& e = entries_[i - 1];
        const int32_t common = session_common_prefix(e.st.tokens, st.tokens);
        if (common == static_cast<int32_t>(e.st.tokens.size()) || (e.st.ckpt_len > 0 && common >= e.st.ckpt_len)) {
            dropped += e.st.tokens.size();
            kv_cache_free(e.st.kv);
            entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i - 1));
        }
    }
    if (dropped > 0) {
        std::fprintf(stderr, "conversation cache: dropped %zu superseded tokens %s\n", dropped, summary().c_str());
    }
    evict_to_fit(need);
    parked_seq e;
    e.st.kv = kv_cache_init(model_, n, type_);
    if (e.st.kv == nullptr) return false;
    kv_cache_copy(e.st.kv, st.kv, n);
    e.st.tokens = st.tokens;
    e.st.ckpt_len = std::min(st.ckpt_len, n);
    e.bytes = need;
    e.last_used = ++clock_;
    entries_.push_back(std::move(e));
    std::fprintf(stderr, "conversation cache: parked %d tokens %s\n", n, summary().c_str());
    return true;
}

std::pair<int32_t, int32_t> conversation_cache::best_match(const std::vector<int32_t>& prompt) const {
    int32_t best = -1, best_len = 0;
    for (size_t i = 0; i < entries_.size(); ++i) {
        const int32_t len = session_common_prefix(entries_[i].st.tokens, prompt);
        if (len > best_len) {
            best = static_cast<int32_t>(i);
            best_len = len;
        }
    }
    return {best, best_len};
}

void conversation_cache::put_back(parked_seq&& e) {
    evict_to_fit(e.bytes);
    e.last_used = ++clock_;
    entries_.push_back(std::move(e));
}

parked_seq conversation_cache::release(int32_t index) {
    parked_seq e = std::move(entries_[static_cast<size_t>(index)]);
    entries_.erase(entries_.begin() + index);
    return e;
}

// ---- reuse -----------------------------------------------------------------------------------------------

namespace {

// The reuse rule of window layers kept as rings: n shared positions can be continued only when the source's
// rings still hold the window of position n (kv_cache_can_resume); otherwise none are (the prompt is read
// again from position 0: a window layer's state at n depends on every earlier position through the layers
// below, so no shorter restart point exists either).
int32_t usable(const kv_cache* kv, int32_t n) { return kv == nullptr || kv_cache_can_resume(kv, n) ? n : 0; }

}  // namespace

reuse_source session_find_reuse(const seq_state& target, const std::vector<int32_t>& prompt,
                                const conversation_cache* cache, const std::vector<const seq_state*>& others) {
    const int32_t cap = std::max<int32_t>(0, static_cast<int32_t>(prompt.size()) - 1);
    reuse_source best;
    const int32_t own = usable(target.kv, std::min(cap, session_common_prefix(target.tokens, prompt)));
    if (own > 0) {
        best.kind = reuse_source::SELF;
        best.n_reuse = own;
    }
    if (cache) {
        const auto [index, len] = cache->best_match(prompt);
        const int32_t n = index >= 0 ? usable(cache->entry(index).st.kv, std::min(cap, len)) : 0;
        if (n > best.n_reuse) {
            best.kind = reuse_source::PARKED;
            best.n_reuse = n;
            best.parked_index = index;
        }
    }
    for (const seq_state* o : others) {
        if (o == nullptr || o == &target || o->kv == nullptr) continue;
        const int32_t len = usable(o->kv, std::min(cap, session_common_prefix(o->tokens, prompt)));
        if (len > best.n_reuse) {
            best.kind = reuse_source::OTHER;
            best.n_reuse = len;
            best.other = o;
        }
    }
    return best;
}

int32_t session_apply_reuse(seq_state* target, const std::vector<int32_t>& prompt, const reuse_source& src,
                            conversation_cache* cache) {
    const int32_t own = session_common_prefix(target->tokens, prompt);
    const bool other_conversation = !target->tokens.empty() && own < target->ckpt_len;
    if (src.kind == reuse_source::SELF || src.kind == reuse_source::NONE) {
        if (other_conversation && cache) cache->park(*target);
        target->tokens.resize(static_cast<size_t>(src.kind == reuse_source::SELF ? src.n_reuse : 0));
        target->ckpt_len = std::min<int32_t>(target->ckpt_len, static_cast<int32_t>(target->tokens.size()));
        return static_cast<int32_t>(target->tokens.size());
    }
    const int32_t n = src.n_reuse;
    if (src.kind == reuse_source::PARKED) {
        // take the entry out first: parking the target may evict or reorder entries
        parked_seq taken = cache->release(src.parked_index);
        if (other_conversation) cache->park(*target);
        kv_cache_copy(target->kv, taken.st.kv, n);
        target->ckpt_len = std::min(taken.st.ckpt_len, n);
        if (static_cast<size_t>(n) < taken.st.tokens.size()) {
            cache->put_back(std::move(taken));  // only its start was shared: the rest of it stays parked
        } else {
            kv_cache_free(taken.st.kv);
        }
        std::fprintf(stderr, "conversation cache: restored %d tokens parked=%d bytes=%zu\n", n, cache->size(),
                     cache->bytes());
    } else {
        if (other_conversation && cache) cache->park(*target);
        kv_cache_copy(target->kv, src.other->kv, n);
        target->ckpt_len = std::min(src.other->ckpt_len, n);
    }
    target->tokens.assign(prompt.begin(), prompt.begin() + n);
    return n;
}

// ---- SAVE / RESTORE --------------------------------------------------------------------------------------

session_io_result session_save(const strata_model* model, const seq_state& st, kv_type type,
                               const std::string& path, const session_progress& progress) {
    if (path.empty()) return io_fail("invalid", "empty path");
    const model_info& info = model_get_info(model);
    const uint32_t n_tokens = static_cast<uint32_t>(st.tokens.size());
    const size_t row_bytes = st.kv ? kv_cache_row_bytes(st.kv) : 0;
    const uint64_t kv_bytes = static_cast<uint64_t>(row_bytes) * n_tokens * 2u * static_cast<uint64_t>(info.n_layer);
    const uint64_t total = sizeof(session_header) + 4ull * n_tokens + kv_bytes + 8;

    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        const int e = errno;
        return io_fail(e == ENOSPC || e == EDQUOT ? "storage" : "io", "cannot create " + tmp + ": " + std::strerror(e));
    }
    ::fchmod(fd, 0600);
    file_hash hash;
    bool ok = true;
    session_header h{};
    std::memcpy(h.magic, SESSION_MAGIC, 8);
    h.version = SESSION_VERSION;
    h.kv = static_cast<uint32_t>(type);
    h.n_layer = static_cast<uint32_t>(info.n_layer);
    h.n_vocab = static_cast<uint32_t>(info.n_vocab);
    h.row_bytes = row_bytes;
    h.n_tokens = n_tokens;
    h.ckpt_len = static_cast<uint32_t>(std::max(0, st.ckpt_len));
    h.window_lo = st.kv ? static_cast<uint32_t>(std::min<int32_t>(kv_cache_window_lo(st.kv), int32_t(n_tokens))) : 0;
    ok = write_all(fd, &h, sizeof h, &hash) && write_all(fd, st.tokens.data(), 4ull * n_tokens, &hash);
    uint64_t done = sizeof h + 4ull * n_tokens;
    std::vector<char> rows;
    for (int32_t layer = 0; ok && n_tokens > 0 && layer < info.n_layer; ++layer) {
        for (int v = 0; ok && v < 2; ++v) {
            rows.resize(row_bytes * n_tokens);
            kv_cache_read_rows(st.kv, layer, v == 1, static_cast<int32_t>(n_tokens), rows.data());
            for (size_t off = 0; ok && off < rows.size(); off += SESSION_BLOCK_BYTES) {
                const size_t len = std::min(SESSION_BLOCK_BYTES, rows.size() - off);
                ok = write_all(fd, rows.data() + off, len, &hash);
                done += len;
            }
            if (progress) progress(done, total);
        }
    }
    const uint64_t digest = hash.finish();
    ok = ok && write_all(fd, &digest, 8, nullptr) && ::fsync(fd) == 0;
    const int write_errno = errno;
    ok = (::close(fd) == 0) && ok;
    if (!ok) {
        ::unlink(tmp.c_str());
        const bool full = write_errno == ENOSPC || write_errno == EDQUOT;
        return io_fail(full ? "storage" : "io", "cannot write " + tmp + ": " + std::strerror(write_errno));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = errno;
        ::unlink(tmp.c_str());
        return io_fail("io", "cannot rename to " + path + ": " + std::strerror(e));
    }
    session_io_result r;
    r.ok = true;
    r.published = true;
    r.bytes = total;
    r.n_tokens = static_cast<int32_t>(n_tokens);
    return r;
}

session_io_result session_restore(const strata_model* model, seq_state* st, kv_type type,
                                  const std::string& path, const session_progress& progress) {
    if (path.empty()) return io_fail("invalid", "empty path");
    const model_info& info = model_get_info(model);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return io_fail("io", "cannot open " + path + ": " + std::strerror(errno));
    struct closer {
        int fd;
        ~closer() { ::close(fd); }
    } close_at_exit{fd};
    struct stat sb {};
    if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) return io_fail("invalid", path + " is not a regular file");
    const uint64_t size = static_cast<uint64_t>(sb.st_size);

    session_header h{};
    if (size < sizeof h + 8 || !read_all(fd, &h, sizeof h)) return io_fail("invalid", path + ": too short for a session file");
    if (std::memcmp(h.magic, SESSION_MAGIC, 8) != 0) return io_fail("invalid", path + ": not a Strata session file");
    if (h.version != SESSION_VERSION) return io_fail("invalid", path + ": session version " + std::to_string(h.version));
    const size_t row_bytes = kv_cache_row_bytes(st->kv);
    if (h.kv != static_cast<uint32_t>(type) || h.n_layer != static_cast<uint32_t>(info.n_layer) ||
        h.n_vocab != static_cast<uint32_t>(info.n_vocab) || h.row_bytes != row_bytes) {
        return io_fail("invalid", path + ": saved for another model or KV type");
    }
    if (h.n_tokens > static_cast<uint32_t>(kv_cache_n_ctx(st->kv))) {
        return io_fail("invalid", path + ": " + std::to_string(h.n_tokens) + " tokens exceed the context");
    }
    const uint64_t kv_bytes = static_cast<uint64_t>(row_bytes) * h.n_tokens * 2u * h.n_layer;
    const uint64_t expect = sizeof h + 4ull * h.n_tokens + kv_bytes + 8;
    if (size != expect) return io_fail("invalid", path + ": size " + std::to_string(size) + " != " + std::to_string(expect));

    // pass 1: verify the whole file before touching the session
    file_hash hash;
    hash.add(&h, sizeof h);
    std::vector<char> block(SESSION_BLOCK_BYTES);
    uint64_t left = expect - sizeof h - 8;
    while (left > 0) {
        const size_t len = static_cast<size_t>(std::min<uint64_t>(left, block.size()));
        if (!read_all(fd, block.data(), len)) return io_fail("io", path + ": read failed");
        hash.add(block.data(), len);
        left -= len;
    }
    uint64_t digest = 0;
    if (!read_all(fd, &digest, 8)) return io_fail("io", path + ": read failed");
    if (digest != hash.finish()) return io_fail("invalid", path + ": checksum mismatch (corrupt file)");

    // pass 2: load
    if (::lseek(fd, static_cast<off_t>(sizeof h), SEEK_SET) < 0) return io_fail("io", path + ": seek failed");
    std::vector<int32_t> tokens(h.n_tokens);
    if (!read_all(fd, tokens.data(), 4ull * h.n_tokens)) return io_fail("io", path + ": read failed");
    for (int32_t t : tokens) {
        if (t < 0 || t >= info.n_vocab) return io_fail("invalid", path + ": token id out of range");
    }
    st->tokens.clear();  // from here on the cache is being overwritten
    st->ckpt_len = 0;
    uint64_t done = sizeof h + 4ull * h.n_tokens;
    std::vector<char> rows(row_bytes * h.n_tokens);
    for (uint32_t layer = 0; h.n_tokens > 0 && layer < h.n_layer; ++layer) {
        for (int v = 0; v < 2; ++v) {
            if (!read_all(fd, rows.data(), rows.size())) return io_fail("io", path + ": read failed");
            kv_cache_write_rows(st->kv, static_cast<int32_t>(layer), v == 1, static_cast<int32_t>(h.n_tokens), rows.data());
            done += rows.size();
            if (progress) progress(done, expect);
        }
    }
    kv_cache_set_window_lo(st->kv, static_cast<int32_t>(h.n_tokens), static_cast<int32_t>(std::min(h.window_lo, h.n_tokens)));
    st->tokens = std::move(tokens);
    st->ckpt_len = std::min<int32_t>(static_cast<int32_t>(h.ckpt_len), static_cast<int32_t>(st->tokens.size()));
    session_io_result r;
    r.ok = true;
    r.bytes = expect;
    r.n_tokens = static_cast<int32_t>(st->tokens.size());
    return r;
}

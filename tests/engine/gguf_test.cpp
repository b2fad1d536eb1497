// tests/engine/gguf_test.cpp — the GGUF reader on a synthetic file and on the real model's header: parsing,
// every truncation, targeted corruptions (one line naming file, tensor and reason), a bounded fuzz loop of
// mutated headers that must never crash or hang (surviving real-model mutants are also built and run for
// one token), and the qwen2/qwen3 builders refusing llama weights relabelled as theirs.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "gguf.h"
#include "model.h"
#include "model_impl.h"
#include "model_test_util.h"
#include "test_check.h"

namespace {

struct writer {
    std::vector<uint8_t> b;
    template <typename T>
    void put(T v) {
        const uint8_t* p = reinterpret_cast<const uint8_t*>(&v);
        b.insert(b.end(), p, p + sizeof(T));
    }
    void str(const std::string& s) {
        put<uint64_t>(s.size());
        b.insert(b.end(), s.begin(), s.end());
    }
};

// offsets of interesting fields, for targeted corruption
struct synth {
    std::vector<uint8_t> bytes;
    size_t tensor_type_at = 0;    // the u32 type of tensor "blk.0.w"
    size_t tensor_offset_at = 0;  // its u64 data offset
    size_t tensor_ndims_at = 0;
};

// GGUF v3: 5 metadata keys, tensors "norm" F32 [8] and "blk.0.w" Q8_0 [32, 2], alignment 32
synth make_synthetic() {
    synth s;
    writer w;
    w.put<uint32_t>(0x46554747);
    w.put<uint32_t>(3);
    w.put<uint64_t>(2);
    w.put<uint64_t>(5);
    w.str("general.architecture"); w.put<uint32_t>(GGUF_TYPE_STRING); w.str("llama");
    w.str("llama.block_count"); w.put<uint32_t>(GGUF_TYPE_UINT32); w.put<uint32_t>(1);
    w.str("llama.rope.freq_base"); w.put<uint32_t>(GGUF_TYPE_FLOAT32); w.put<float>(10000.0f);
    w.str("tokenizer.ggml.tokens"); w.put<uint32_t>(GGUF_TYPE_ARRAY); w.put<uint32_t>(GGUF_TYPE_STRING);
    w.put<uint64_t>(3); w.str("a"); w.str("<|im_start|>"); w.str("bc");
    w.str("some.ints"); w.put<uint32_t>(GGUF_TYPE_ARRAY); w.put<uint32_t>(GGUF_TYPE_INT32);
    w.put<uint64_t>(4); for (int32_t i = 0; i < 4; ++i) w.put<int32_t>(i * 10);
    w.str("norm"); w.put<uint32_t>(1); w.put<uint64_t>(8); w.put<uint32_t>(GGML_TYPE_F32); w.put<uint64_t>(0);
    w.str("blk.0.w");
    s.tensor_ndims_at = w.b.size();
    w.put<uint32_t>(2); w.put<uint64_t>(32); w.put<uint64_t>(2);
    s.tensor_type_at = w.b.size();
    w.put<uint32_t>(GGML_TYPE_Q8_0);
    s.tensor_offset_at = w.b.size();
    w.put<uint64_t>(32);
    while (w.b.size() % 32) w.b.push_back(0);
    for (int i = 0; i < 8; ++i) w.put<float>(float(i));   // norm: 32 bytes
    for (int i = 0; i < 2 * 34; ++i) w.b.push_back(uint8_t(i));  // two Q8_0 blocks
    s.bytes = w.b;
    return s;
}

void test_synthetic() {
    const synth s = make_synthetic();
    std::string err;
    gguf_file* f = gguf_open_buffer(s.bytes.data(), s.bytes.size(), "synth.gguf", &err);
    CHECK(f != nullptr, "synthetic parse: %s", err.c_str());
    if (!f) return;
    CHECK(f->version == 3 && f->tensors.size() == 2 && f->kv.size() == 5, "counts");
    CHECK(gguf_find(f, "general.architecture")->str == "llama", "arch");
    CHECK(gguf_find(f, "llama.block_count")->i == 1, "u32");
    CHECK(gguf_find(f, "llama.rope.freq_base")->f == 10000.0, "f32");
    const gguf_value* toks = gguf_find(f, "tokenizer.ggml.tokens");
    CHECK(toks && toks->strs.size() == 3 && toks->strs[1] == "<|im_start|>", "string array");
    const gguf_value* ints = gguf_find(f, "some.ints");
    int32_t third = 0;
    std::memcpy(&third, ints->arr_data + 8, 4);
    CHECK(ints->arr_n == 4 && third == 20, "int array");
    const gguf_tensor* t = gguf_find_tensor(f, "blk.0.w");
    CHECK(t && t->type == GGML_TYPE_Q8_0 && t->ne[0] == 32 && t->ne[1] == 2 && t->n_bytes == 68, "tensor info");
    CHECK(t && f->data_offset % 32 == 0 && t->data == s.bytes.data() + f->data_offset + 32, "tensor data pointer");
    gguf_close(f);

    // every truncation is refused with a message naming the file
    for (size_t n = 0; n < s.bytes.size(); ++n) {
        err.clear();
        gguf_file* g = gguf_open_buffer(s.bytes.data(), n, "synth.gguf", &err);
        CHECK(g == nullptr, "truncated to %zu accepted", n);
        CHECK(err.rfind("synth.gguf: ", 0) == 0 && err.find('\n') == std::string::npos, "truncated to %zu: '%s'", n, err.c_str());
        gguf_close(g);
    }
    auto corrupt = [&](size_t at, const void* v, size_t len, const char* want) {
        std::vector<uint8_t> b = s.bytes;
        std::memcpy(b.data() + at, v, len);
        err.clear();
        gguf_file* g = gguf_open_buffer(b.data(), b.size(), "synth.gguf", &err);
        CHECK(g == nullptr && err.find(want) != std::string::npos, "corruption at %zu: got '%s', want '%s'", at, err.c_str(), want);
        gguf_close(g);
    };
    const uint32_t bad_type = 99, five = 5, v4 = 4, bad_magic = 0x12345678;
    const uint64_t misaligned = 33, far = 1ull << 40;
    corrupt(0, &bad_magic, 4, "bad magic");
    corrupt(4, &v4, 4, "unsupported GGUF version 4");
    corrupt(s.tensor_type_at, &bad_type, 4, "tensor 'blk.0.w': unsupported tensor type 99");
    corrupt(s.tensor_ndims_at, &five, 4, "tensor 'blk.0.w': 5 dimensions");
    corrupt(s.tensor_offset_at, &misaligned, 8, "tensor 'blk.0.w': misaligned");
    corrupt(s.tensor_offset_at, &far, 8, "tensor 'blk.0.w': data");
}

// mutate 1..8 bytes (random values or 0x00/0xFF/0x7F) within [lo, hi); parse must return, never crash
bool mutate_and_parse(std::vector<uint8_t>& b, size_t lo, size_t hi, std::mt19937_64& rng, gguf_file** out) {
    const int n_mut = 1 + int(rng() % 8);
    for (int i = 0; i < n_mut; ++i) {
        const size_t at = lo + size_t(rng() % (hi - lo));
        const uint8_t special[] = {0x00, 0xFF, 0x7F, 0x80};
        b[at] = rng() % 2 ? uint8_t(rng()) : special[rng() % 4];
    }
    std::string err;
    const size_t len = rng() % 4 == 0 ? size_t(rng() % b.size()) : b.size();
    *out = gguf_open_buffer(b.data(), len, "fuzz.gguf", &err);
    if (!*out) return !err.empty() && err.find('\n') == std::string::npos;
    for (const gguf_tensor& t : (*out)->tensors) {  // everything it accepted lies inside the buffer
        if (t.data < b.data() || t.data + t.n_bytes > b.data() + len) return false;
    }
    return true;
}

constexpr int FUZZ_SYNTH_ITERS = 20000;
constexpr int FUZZ_REAL_ITERS = 400;
constexpr double FUZZ_REAL_BUDGET_S = 30.0;  // the real-header loop stops early past this (slow machine)

void test_fuzz_synthetic() {
    const synth s = make_synthetic();
    std::mt19937_64 rng(7);
    int accepted = 0;
    for (int it = 0; it < FUZZ_SYNTH_ITERS; ++it) {
        std::vector<uint8_t> b = s.bytes;
        gguf_file* f = nullptr;
        CHECK(mutate_and_parse(b, 0, b.size(), rng, &f), "synthetic fuzz iteration %d", it);
        accepted += f != nullptr;
        gguf_close(f);
    }
    std::printf("synthetic fuzz: %d mutants, %d still parse\n", FUZZ_SYNTH_ITERS, accepted);
}

void relabel(std::vector<uint8_t>& b, size_t header_end, const char* from, const char* to) {
    const size_t n = std::strlen(from);
    for (size_t i = 0; i + n <= header_end; ++i) {
        if (std::memcmp(b.data() + i, from, n) == 0) std::memcpy(b.data() + i, to, n);
    }
}

std::string load_relabelled(const std::vector<uint8_t>& orig, size_t header_end, const char* arch) {
    std::vector<uint8_t> b = orig;
    relabel(b, header_end, "llama.", (std::string(arch) + ".").c_str());
    // the architecture value: length-prefixed "llama" right after its key and type
    const std::string key = "general.architecture";
    for (size_t i = 0; i + key.size() + 12 + 5 <= header_end; ++i) {
        if (std::memcmp(b.data() + i, key.data(), key.size()) == 0) {
            std::memcpy(b.data() + i + key.size() + 12, arch, 5);
            break;
        }
    }
    std::string err;
    gguf_file* f = gguf_open_buffer(b.data(), b.size(), "relabelled.gguf", &err);
    if (!f) return "parse: " + err;
    model_params mp;
    mp.n_threads = 1;
    strata_model* m = model_load_gguf(f, mp, &err);
    if (m) {
        model_free(m);
        return "loaded";
    }
    return err;
}

void test_real(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::vector<uint8_t> orig((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string err;
    gguf_file* f = gguf_open_buffer(orig.data(), orig.size(), path, &err);
    CHECK(f != nullptr, "real file: %s", err.c_str());
    if (!f) return;
    const size_t header_end = f->data_offset;
    // where the metadata scalars and the tensor table lie (most of the header is the vocabulary)
    const size_t table_start = header_end > 40000 ? header_end - 40000 : 0;
    gguf_close(f);

    for (int i = 0; i < 40; ++i) {  // truncations, also inside the data section
        const size_t n = i < 20 ? size_t(i) * header_end / 20 : header_end + size_t(i - 20) * (orig.size() - header_end) / 20 + 1;
        err.clear();
        gguf_file* g = gguf_open_buffer(orig.data(), n, path, &err);
        CHECK(g == nullptr && err.rfind(path + ": ", 0) == 0, "real truncated to %zu: '%s'", n, err.c_str());
        if (n > header_end) CHECK(err.find("tensor '") != std::string::npos, "truncation in data names no tensor: %s", err.c_str());
        gguf_close(g);
    }

    std::string e3 = load_relabelled(orig, header_end, "qwen3");
    CHECK(e3.find("tensor 'blk.0.attn_q_norm.weight': missing") != std::string::npos, "qwen3 relabel: %s", e3.c_str());
    std::string e2 = load_relabelled(orig, header_end, "qwen2");
    CHECK(e2.find("tensor 'blk.0.attn_q.bias': missing") != std::string::npos, "qwen2 relabel: %s", e2.c_str());
    std::string em = load_relabelled(orig, header_end, "mamba");
    CHECK(em.find("unsupported architecture 'mamba'") != std::string::npos, "mamba relabel: %s", em.c_str());

    std::mt19937_64 rng(11);
    std::vector<uint8_t> b = orig;
    int parsed = 0, loaded = 0, it = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (; it < FUZZ_REAL_ITERS; ++it) {
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > FUZZ_REAL_BUDGET_S) break;
        // a third each: the metadata scalars, the tensor table, anywhere in the header
        const int region = it % 3;
        const size_t lo = region == 1 ? table_start : 0;
        const size_t hi = region == 0 ? std::min<size_t>(4096, header_end) : header_end;
        gguf_file* g = nullptr;
        CHECK(mutate_and_parse(b, lo, hi, rng, &g), "real fuzz iteration %d", it);
        if (g) {
            ++parsed;
            model_params mp;
            mp.n_threads = 1;
            mp.n_batch = 8;
            err.clear();
            strata_model* m = model_load_gguf(g, mp, &err);
            if (m) {
                ++loaded;
                kv_cache* kv = kv_cache_init(m, 16, KV_TYPE_F16);
                std::vector<float> logits(static_cast<size_t>(model_get_info(m).n_vocab));
                const int32_t tok = 1;
                if (kv) CHECK(model_eval_seq(m, kv, &tok, 1, 0, logits.data(), &err) == 0, "mutant eval: %s", err.c_str());
                kv_cache_free(kv);
                model_free(m);
            } else {
                CHECK(!err.empty() && err.find('\n') == std::string::npos, "mutant load error '%s'", err.c_str());
            }
        }
        std::memcpy(b.data(), orig.data(), header_end);  // undo
    }
    std::printf("real-header fuzz: %d mutants, %d parse, %d load and run\n", it, parsed, loaded);
}

}  // namespace

int main() {
    test_synthetic();
    test_fuzz_synthetic();
    const std::string path = test_model_path();
    if (path.empty()) {
        std::printf("real-file checks SKIPPED: no model (set STRATA_TEST_MODEL)\n");
    } else {
        test_real(path);
    }
    if (g_failures) {
        std::fprintf(stderr, "%d failures\n", g_failures);
        return 1;
    }
    std::printf("PASS\n");
    return 0;
}

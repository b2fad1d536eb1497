// tests/engine/probe.cpp — `strata-test-probe`: the engine's side of the questions the pytest parity
// tests (tests/oracle.py) also ask llama.cpp. Not a CTest: a helper those tests run.
//
//   strata-test-probe logits MODEL.gguf IDS N_GEN OUT.bin [N_CTX [last|all [CHUNK]]]
//   strata-test-probe dequant TYPE IN.bin N OUT.bin      (dequantize_row of n elements of raw blocks)
//
// logits: IDS is a comma-separated token list. The prompt is evaluated in chunks of up to CHUNK (default 512)
// entries with logits for every entry (CHUNK is also the model's n_batch, so it sizes the rings of window
// layers: kv_cache.h); then N_GEN - 1 greedy tokens are fed one at a time. OUT.bin gets float32 rows of n_vocab:
// one per prompt position (with `last`: only the last prompt position's), then one per fed greedy token
// (n_prompt + N_GEN - 1 rows, or N_GEN). stdout: the N_GEN
// greedy tokens, comma-separated; stderr: "kv_bytes=B" (kv_cache_bytes of the positions written) and the expert
// tiers' figures ("experts_hits=N", ...: model_expert_figures).
// STRATA_PROBE_ACT_BITS=8 loads the model with 8-bit activations, STRATA_PROBE_THREADS=n with n threads (default 2). Exit 1 with the reason on stderr when the model or an eval fails.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "model.h"
#include "cpu/quants.h"

namespace {

constexpr int32_t DUMP_CHUNK = 512;  // the default CHUNK

int fail(const std::string& why) {
    std::fprintf(stderr, "strata-test-probe: %s\n", why.c_str());
    return 1;
}

int32_t argmax(const float* v, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; ++i) best = v[i] > v[best] ? i : best;
    return best;
}

int dequant(int argc, char** argv) {
    if (argc != 6) return fail("usage: strata-test-probe dequant TYPE IN.bin N OUT.bin");
    const auto type = static_cast<ggml_type>(std::atoi(argv[2]));
    const int64_t n = std::atoll(argv[4]);
    if (!quant_supported(type) || n <= 0 || n % quant_block_size(type) != 0) return fail("bad type or count");
    std::vector<uint8_t> raw(quant_row_bytes(type, n));
    FILE* in = std::fopen(argv[3], "rb");
    if (!in || std::fread(raw.data(), 1, raw.size(), in) != raw.size()) return fail("cannot read input");
    std::fclose(in);
    std::vector<float> y(static_cast<size_t>(n));
    dequantize_row(type, raw.data(), y.data(), n);
    FILE* out = std::fopen(argv[5], "wb");
    if (!out || std::fwrite(y.data(), sizeof(float), y.size(), out) != y.size()) return fail("cannot write output");
    std::fclose(out);
    return 0;
}

int logits(int argc, char** argv) {
    --argc, ++argv;
    if (argc < 5) return fail("usage: strata-test-probe logits MODEL.gguf IDS N_GEN OUT.bin [N_CTX]");
    std::vector<int32_t> ids;
    for (const char* p = argv[2]; *p;) {
        char* end = nullptr;
        ids.push_back(static_cast<int32_t>(std::strtol(p, &end, 10)));
        if (end == p) return fail("bad token list");
        p = *end == ',' ? end + 1 : end;
    }
    const int32_t n_gen = std::atoi(argv[3]);
    const int32_t n_ctx = argc > 5 ? std::atoi(argv[5]) : int32_t(ids.size()) + n_gen + 8;
    const int32_t chunk = argc > 7 ? std::atoi(argv[7]) : DUMP_CHUNK;
    if (chunk < 1) return fail("bad chunk");
    model_params mp;
    mp.path = argv[1];
    mp.n_threads = 2;
    // STRATA_PROBE_THREADS=n: another pool size (results must not depend on it: tests/engine/test_gemma3.py)
    if (const char* t = std::getenv("STRATA_PROBE_THREADS")) mp.n_threads = std::atoi(t);
    mp.n_batch = chunk;
    // STRATA_PROBE_ACT_BITS=8: the engine's --act-bits 8 (tests/engine/test_act_bits.py)
    if (const char* bits = std::getenv("STRATA_PROBE_ACT_BITS")) mp.act_bits = std::atoi(bits);
    // STRATA_PROBE_EXPERTS_KIB=n: the engine's expert RAM budget (--experts-ram-mib) in KiB, so that a small
    // random MoE can be split (tests/engine/test_expert_tiers.py)
    if (const char* kib = std::getenv("STRATA_PROBE_EXPERTS_KIB")) mp.experts_ram_bytes = std::atoll(kib) << 10;
    std::string err;
    strata_model* m = model_load(mp, &err);
    if (!m) return fail(err);
    const int32_t nv = model_get_info(m).n_vocab;
    kv_cache* kv = kv_cache_init(m, n_ctx, KV_TYPE_F16);
    const bool last_only = argc > 6 && std::string(argv[6]) == "last";
    // rows kept: prompt positions from `base` on, then the fed greedy tokens; row r at (r - base) * nv
    const size_t base = last_only ? ids.size() - 1 : 0;
    std::vector<float> rows((ids.size() + size_t(n_gen) - 1 - base) * size_t(nv));
    auto row_at = [&](size_t r) { return rows.data() + (r - base) * size_t(nv); };
    std::vector<int32_t> pos, seq;
    std::vector<uint8_t> want;
    kv_cache* kvs[1] = {kv};
    auto eval = [&](const int32_t* tok, int32_t n, int32_t pos0, float* out) {
        pos.resize(size_t(n));
        seq.assign(size_t(n), 0);
        want.assign(size_t(n), last_only ? 0 : 1);  // last_only: the last entry's logits land at out
        if (last_only) want[size_t(n - 1)] = 1;
        for (int32_t i = 0; i < n; ++i) pos[size_t(i)] = pos0 + i;
        eval_batch b;
        b.n = n;
        b.token = tok;
        b.pos = pos.data();
        b.seq = seq.data();
        b.want_logits = want.data();
        b.kvs = kvs;
        b.n_seq = 1;
        return model_eval(m, b, out, &err) == 0;
    };
    for (size_t i = 0; i < ids.size(); i += size_t(chunk)) {
        const int32_t n = int32_t(ids.size() - i < size_t(chunk) ? ids.size() - i : size_t(chunk));
        // last_only: a chunk before the last one writes its (unused) row over the final prompt row
        float* out = last_only ? row_at(base) : row_at(i);
        if (!eval(ids.data() + i, n, int32_t(i), out)) return fail(err);
    }
    std::vector<int32_t> gen;
    int32_t row = int32_t(ids.size()) - 1;
    for (int32_t s = 0; s < n_gen; ++s, ++row) {
        const int32_t t = argmax(row_at(size_t(row)), nv);
        gen.push_back(t);
        if (s + 1 < n_gen && !eval(&t, 1, row + 1, row_at(size_t(row) + 1))) return fail(err);
    }
    FILE* f = std::fopen(argv[4], "wb");
    if (!f || std::fwrite(rows.data(), sizeof(float), rows.size(), f) != rows.size()) return fail("cannot write output");
    std::fclose(f);
    for (size_t i = 0; i < gen.size(); ++i) std::printf("%s%d", i ? "," : "", gen[i]);
    std::printf("\n");
    std::fprintf(stderr, "kv_bytes=%zu\n", kv_cache_bytes(kv, row));
    const expert_figures ef = model_expert_figures(m);
    std::fprintf(stderr, "experts_total=%d\nexperts_resident=%d\nexperts_hits=%llu\nexperts_misses=%llu\n"
                 "experts_swaps=%llu\n", ef.total, ef.resident, (unsigned long long)ef.hits,
                 (unsigned long long)ef.misses, (unsigned long long)ef.swaps);
    kv_cache_free(kv);
    model_free(m);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "logits") return logits(argc, argv);
    if (cmd == "dequant") return dequant(argc, argv);
    return fail("usage: strata-test-probe logits|dequant ...");
}

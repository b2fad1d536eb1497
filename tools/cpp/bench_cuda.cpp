// tools/cpp/bench_cuda.cpp — strata-bench-cuda: prompt-read and decode speed of one backend on one model, and
// the GPU's greedy tokens against the CPU engine's (tools/device_check.sh runs it on the H200).
//
//   strata-bench-cuda --model F.gguf [--backend cpu|cuda] [--prefill 512,4096,16384] [--chunk 2048]
//                     [--slots 1,8] [--decode-steps 64] [--threads N] [--greedy N [--greedy-prompt P]]
// Prints one line per figure:
//   BENCH backend=B prefill n=N chunk=C s=S tok_s=T
//   BENCH backend=B decode slots=K ctx=P steps=D s=S tok_s=T      (K slots, each at P positions, D steps)
//   GREEDY prompt=P n=N equal=E first_diff=I cpu_margin=M          (--greedy: both backends, same prompt;
//                                                                   first_diff -1: all N equal)
// Prompts are token ids 1 + (i * 7919) % (n_vocab - 1) (any model, random weights too). Each figure comes after
// one untimed warm-up of the same shape; model_eval returns once the logits are on the host, so wall time
// is the device's time too.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/model.h"

namespace {

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<int> parse_list(const char* s) {
    std::vector<int> out;
    for (const char* p = s; *p;) {
        out.push_back(std::atoi(p));
        const char* c = std::strchr(p, ',');
        if (!c) break;
        p = c + 1;
    }
    return out;
}

std::vector<int32_t> prompt_ids(int n, int n_vocab) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) ids[size_t(i)] = int32_t(1 + (int64_t(i) * 7919) % (n_vocab - 1));
    return ids;
}

// Reads n tokens in chunks into a fresh cache; returns seconds (the cache is freed).
double read_prompt(strata_model* m, int n, int chunk, std::vector<float>& logits) {
    const model_info& info = model_get_info(m);
    kv_cache* kv = kv_cache_init(m, n + 8, KV_TYPE_F16);
    if (!kv) {
        std::fprintf(stderr, "bench: no cache of %d positions\n", n);
        std::exit(1);
    }
    const std::vector<int32_t> ids = prompt_ids(n, info.n_vocab);
    std::string err;
    const double t0 = now_s();
    for (int p = 0; p < n; p += chunk) {
        const int c = std::min(chunk, n - p);
        if (model_eval_seq(m, kv, ids.data() + p, c, p, logits.data(), &err) != 0) {
            std::fprintf(stderr, "bench: eval: %s\n", err.c_str());
            std::exit(1);
        }
    }
    const double s = now_s() - t0;
    kv_cache_free(kv);
    return s;
}

// K slots, each read to ctx positions, then `steps` batched decode steps of K entries.
double decode(strata_model* m, int slots, int ctx, int steps, int chunk) {
    const model_info& info = model_get_info(m);
    std::vector<kv_cache*> kvs;
    std::vector<float> logits(size_t(slots) * size_t(info.n_vocab));
    std::string err;
    const std::vector<int32_t> ids = prompt_ids(ctx, info.n_vocab);
    for (int k = 0; k < slots; ++k) {
        kvs.push_back(kv_cache_init(m, ctx + steps + 8, KV_TYPE_F16));
        for (int p = 0; p < ctx; p += chunk) {
            const int c = std::min(chunk, ctx - p);
            model_eval_seq(m, kvs.back(), ids.data() + p, c, p, logits.data(), &err);
        }
    }
    std::vector<int32_t> tok(static_cast<size_t>(slots), 1), pos(static_cast<size_t>(slots)), seq(static_cast<size_t>(slots));
    std::vector<uint8_t> want(static_cast<size_t>(slots), 1);
    for (int k = 0; k < slots; ++k) seq[size_t(k)] = k;
    eval_batch b;
    b.n = slots;
    b.token = tok.data();
    b.pos = pos.data();
    b.seq = seq.data();
    b.want_logits = want.data();
    b.kvs = kvs.data();
    b.n_seq = slots;
    const double t0 = now_s();
    for (int s = 0; s < steps; ++s) {
        for (int k = 0; k < slots; ++k) pos[size_t(k)] = ctx + s;
        if (model_eval(m, b, logits.data(), &err) != 0) {
            std::fprintf(stderr, "bench: decode: %s\n", err.c_str());
            std::exit(1);
        }
        for (int k = 0; k < slots; ++k) {  // greedy, so the steps are a real generation
            const float* l = logits.data() + size_t(k) * size_t(info.n_vocab);
            tok[size_t(k)] = int32_t(std::max_element(l, l + info.n_vocab) - l);
        }
    }
    const double secs = now_s() - t0;
    for (kv_cache* kv : kvs) kv_cache_free(kv);
    return secs;
}

int argmax(const std::vector<float>& l) { return int(std::max_element(l.begin(), l.end()) - l.begin()); }

float margin(const std::vector<float>& l) {
    std::vector<float> c(l);
    std::partial_sort(c.begin(), c.begin() + 2, c.end(), std::greater<float>());
    return c[0] - c[1];
}

// Greedy continuation of a prompt of n_prompt tokens (read in chunks) on both backends, step by step.
void greedy(const model_params& base, int n, int n_prompt, int chunk) {
    model_params pc = base, pg = base;
    pc.backend = "cpu";
    pg.backend = "cuda";
    std::string err;
    strata_model* cpu = model_load(pc, &err);
    strata_model* gpu = cpu ? model_load(pg, &err) : nullptr;
    if (!gpu) {
        std::fprintf(stderr, "bench: greedy: %s\n", err.c_str());
        std::exit(1);
    }
    const int n_vocab = model_get_info(cpu).n_vocab;
    kv_cache* kc = kv_cache_init(cpu, n_prompt + n + 8, KV_TYPE_F16);
    kv_cache* kg = kv_cache_init(gpu, n_prompt + n + 8, KV_TYPE_F16);
    std::vector<float> lc(static_cast<size_t>(n_vocab)), lg(static_cast<size_t>(n_vocab));
    const std::vector<int32_t> ids = prompt_ids(n_prompt, n_vocab);
    for (int p = 0; p < n_prompt; p += chunk) {
        const int c = std::min(chunk, n_prompt - p);
        model_eval_seq(cpu, kc, ids.data() + p, c, p, lc.data(), &err);
        model_eval_seq(gpu, kg, ids.data() + p, c, p, lg.data(), &err);
    }
    int equal = 0, first_diff = -1;
    float diff_margin = 0.0f;
    for (int s = 0; s < n; ++s) {
        const int32_t tc = argmax(lc), tg = argmax(lg);
        if (tc != tg) {
            first_diff = s;
            diff_margin = margin(lc);
            break;
        }
        ++equal;
        model_eval_seq(cpu, kc, &tc, 1, n_prompt + s, lc.data(), &err);
        model_eval_seq(gpu, kg, &tg, 1, n_prompt + s, lg.data(), &err);
    }
    std::printf("GREEDY prompt=%d n=%d equal=%d first_diff=%d cpu_margin=%.4f\n", n_prompt, n, equal, first_diff,
                double(diff_margin));
    kv_cache_free(kc);
    kv_cache_free(kg);
    model_free(cpu);
    model_free(gpu);
}

}  // namespace

int main(int argc, char** argv) {
    model_params p;
    p.backend = "cuda";
    std::vector<int> prefill = {512, 4096, 16384}, slots = {1, 8};
    int chunk = 2048, steps = 64, greedy_n = 0, greedy_prompt = 64;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        const char* v = argv[i + 1];
        if (a == "--model") p.path = v;
        else if (a == "--backend") p.backend = v;
        else if (a == "--prefill") prefill = parse_list(v);
        else if (a == "--slots") slots = parse_list(v);
        else if (a == "--chunk") chunk = std::atoi(v);
        else if (a == "--decode-steps") steps = std::atoi(v);
        else if (a == "--threads") p.n_threads = std::atoi(v);
        else if (a == "--greedy") greedy_n = std::atoi(v);
        else if (a == "--greedy-prompt") greedy_prompt = std::atoi(v);
        else {
            std::fprintf(stderr, "usage: strata-bench-cuda --model F.gguf [--backend cpu|cuda] [--prefill 512,4096] "
                                 "[--chunk N] [--slots 1,8] [--decode-steps N] [--threads N] [--greedy N]\n");
            return 2;
        }
    }
    if (p.path.empty()) {
        std::fprintf(stderr, "strata-bench-cuda: --model is required\n");
        return 2;
    }
    p.n_batch = std::max(chunk, 8) + 8;
    if (greedy_n > 0) {
        greedy(p, greedy_n, std::max(1, greedy_prompt), chunk);
        return 0;
    }
    std::string err;
    strata_model* m = model_load(p, &err);
    if (!m) {
        std::fprintf(stderr, "strata-bench-cuda: %s\n", err.c_str());
        return 1;
    }
    const model_info& info = model_get_info(m);
    std::printf("MODEL arch=%s layers=%d embd=%d vocab=%d backend=%s device=%s decode_bytes=%zu kv_bytes_per_pos=%zu\n",
                info.arch.c_str(), info.n_layer, info.n_embd, info.n_vocab, info.backend.c_str(), info.device.c_str(),
                model_decode_bytes(m), model_kv_bytes_per_pos(m));
    std::vector<float> logits(static_cast<size_t>(info.n_vocab));
    for (int n : prefill) {
        read_prompt(m, std::min(n, chunk), chunk, logits);  // warm-up of the chunk's shape
        const double s = read_prompt(m, n, chunk, logits);
        std::printf("BENCH backend=%s prefill n=%d chunk=%d s=%.4f tok_s=%.1f\n", info.backend.c_str(), n, chunk, s,
                    n / s);
        std::fflush(stdout);
    }
    for (int k : slots) {
        decode(m, k, 128, 4, chunk);  // warm-up
        const double s = decode(m, k, 128, steps, chunk);
        std::printf("BENCH backend=%s decode slots=%d ctx=128 steps=%d s=%.4f tok_s=%.1f\n", info.backend.c_str(), k,
                    steps, s, k * steps / s);
        std::fflush(stdout);
    }
    model_free(m);
    return 0;
}

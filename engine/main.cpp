// engine/main.cpp — `strata-engine --serve --model FILE.gguf [flags]`: parses the flags, loads the model,
// writes INFO and READY, then runs the command loop (engine/serve_loop.cpp) until QUIT or EOF.
//
// Exit codes: 0 after QUIT/EOF; 1 when the model (or its KV cache) cannot be loaded, with model_load's one-line
// reason on stderr; 2 for a bad command line (usage on stderr). stdout carries the protocol only.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cpu/bandwidth.h"
#include "drafting.h"
#include "gguf.h"
#include "grammar.h"
#include "model.h"
#include "protocol.h"
#include "serve_loop.h"
#include "slots.h"
#include "cpu/threadpool.h"

namespace {

constexpr const char* ENGINE_VERSION = "0.1.0";
// The default context on the CPU: the training context, but no more than this (KV memory and speed).
constexpr int32_t CPU_CONTEXT_CAP = 8192;
constexpr int32_t CONTEXT_MIN = 64;

const char* const USAGE =
    "usage: strata-engine --serve --model FILE.gguf [options]\n"
    "  --max-context N              context (default: the model's training context, at most 8192)\n"
    "  --threads N                  worker threads (default: physical cores)\n"
    "  --batch N | --slots N        1..8 decode slots (default 1)\n"
    "  --conversation-cache-slots N parked conversations kept in RAM (default 4, 0 = off)\n"
    "  --conversation-cache-mib N   byte budget of the parked conversations (default 0 = no limit)\n"
    "  --prompt-cache-every N       checkpoint interval in tokens (default 16384)\n"
    "  --turn-token ID              the turn-opening token (default: the model's <|im_start|>)\n"
    "  --eos-ids A,B                tokens that end a reply (default: the model's end-of-turn and end-of-text)\n"
    "  --chunk N                    prompt tokens per evaluation of a one-slot engine (default 512)\n"
    "  --step-tokens N              tokens one step of several slots carries: decode entries, then prompt chunks\n"
    "                               (default 64)\n"
    "  --token-flush-ms N           hold a slot's token lines (after its first) up to N ms, to write several at\n"
    "                               once (0..1000, default 0: every line at once)\n"
    "  --kv f16|q8_0                KV cache type (default f16)\n"
    "  --seed N                     seed of requests that bring none (default: random)\n"
    "  --act-bits 16|8              matmul activations in 16-bit or 8-bit blocks (default: 8 on the AVX2 set where\n"
    "                               it has 8-bit kernels, else 16; 8 is faster, less exact: engine/cpu/kernels_act8.h)\n"
    "  --experts-ram-mib N          RAM for a MoE model's packed experts: the most used that fit are kept there,\n"
    "                               the rest read from the mapped file (default: every expert; engine/expert_tiers.h)\n"
    "  --drafting off|lookup|model|auto  drafting (default off; auto: prompt lookup, else the draft model)\n"
    "  --draft-model FILE.gguf      a smaller model with the same vocabulary that proposes drafts\n"
    "  --backend cpu|cuda|auto      compute backend (default cpu; auto: the GPU when this build has CUDA, a\n"
    "                               device answers and the model has kernels there, else the CPU)\n"
    "usage: strata-engine --probe-bandwidth [--threads N] [--model FILE.gguf] [--probe-mib N]\n"
    "  prints one PROBE line: read GB/s on the engine's thread pool over an N MiB buffer (default 256) and,\n"
    "  with a model, the bytes one decode token reads and the decode bound they give\n";

int usage(const std::string& why) {
    if (!why.empty()) std::fprintf(stderr, "strata-engine: %s\n", why.c_str());
    std::fputs(USAGE, stderr);
    return 2;
}

// Physical cores: distinct (package, core) pairs in sysfs; the logical count when sysfs says nothing.
int32_t physical_cores() {
    std::set<std::pair<std::string, std::string>> cores;
    const unsigned n = std::thread::hardware_concurrency();
    for (unsigned cpu = 0; cpu < std::max(1u, n) * 2; ++cpu) {
        const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
        std::ifstream pkg(base + "physical_package_id"), core(base + "core_id");
        std::string p, c;
        if (pkg >> p && core >> c) cores.emplace(p, c);
    }
    if (!cores.empty()) return static_cast<int32_t>(cores.size());
    return n > 0 ? static_cast<int32_t>(n) : 1;
}

bool parse_int_flag(const std::string& text, int64_t lo, int64_t hi, int64_t* out) {
    return protocol_parse_i64(text, out) && *out >= lo && *out <= hi;
}

struct flags {
    bool serve = false;
    bool probe = false;          // --probe-bandwidth
    int64_t probe_mib = 256;     // far past any last-level cache
    int32_t act_bits = 0;  // 0: the kernel set's default (act_bits_default)
    int64_t experts_ram_mib = -1;   // --experts-ram-mib; -1 = every expert packed
    std::string model;
    int64_t max_context = 0;
    int64_t threads = 0;
    int64_t slots = 1;               // one slot unless --batch says more
    int64_t conv_slots = 4;
    int64_t conv_mib = 0;
    int64_t prompt_cache_every = 16384;
    int64_t turn_token = -2;  // -2: the model's <|im_start|>
    std::vector<int32_t> eos;
    int64_t chunk = 512;
    int64_t step_tokens = STEP_TOKENS_DEFAULT;
    int64_t token_flush_ms = 0;
    kv_type kv = KV_TYPE_F16;
    bool has_seed = false;
    int64_t seed = 0;
    std::string backend = "cpu";
    drafting_mode drafting = DRAFTING_OFF;
    bool drafting_set = false;
    std::string draft_model;
};

// Returns -1 on success, else the exit code.
int parse_flags(int argc, char** argv, flags* f) {
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--serve") {
            f->serve = true;
            continue;
        }
        if (a == "--probe-bandwidth") {
            f->probe = true;
            continue;
        }
        if (a == "-h" || a == "--help") {
            std::fputs(USAGE, stdout);
            return 0;
        }
        if (a == "--batch-groups") {  // never read by the slot loop; retired (docs/PROTOCOL.md "Start")
            return usage("unknown flag --batch-groups: retired, every busy slot runs in each slot step");
        }
        if (i + 1 >= argc) return usage(a.rfind("--", 0) == 0 ? "missing value for " + a : "unknown argument " + a);
        const std::string v = argv[++i];
        int64_t n = 0;
        auto bad = [&]() { return usage("bad value for " + a + ": " + v); };
        if (a == "--model") {
            f->model = v;
        } else if (a == "--max-context") {
            if (!parse_int_flag(v, CONTEXT_MIN, 1 << 24, &f->max_context)) return bad();
        } else if (a == "--threads") {
            if (!parse_int_flag(v, 1, 1024, &f->threads)) return bad();
        } else if (a == "--batch" || a == "--slots") {
            if (!parse_int_flag(v, 1, SLOTS_MAX, &f->slots)) return bad();
        } else if (a == "--conversation-cache-slots") {
            if (!parse_int_flag(v, 0, 64, &f->conv_slots)) return bad();
        } else if (a == "--conversation-cache-mib") {
            if (!parse_int_flag(v, 0, 1 << 24, &f->conv_mib)) return bad();
        } else if (a == "--prompt-cache-every") {
            if (!parse_int_flag(v, 0, 1 << 24, &f->prompt_cache_every)) return bad();
        } else if (a == "--turn-token") {
            if (!parse_int_flag(v, -1, (1LL << 31) - 1, &f->turn_token)) return bad();
        } else if (a == "--eos-ids") {
            f->eos.clear();
            size_t start = 0;
            while (start <= v.size()) {
                size_t comma = v.find(',', start);
                if (comma == std::string::npos) comma = v.size();
                if (!parse_int_flag(v.substr(start, comma - start), 0, (1LL << 31) - 1, &n)) return bad();
                f->eos.push_back(static_cast<int32_t>(n));
                start = comma + 1;
            }
        } else if (a == "--chunk") {
            if (!parse_int_flag(v, 1, 65536, &f->chunk)) return bad();
        } else if (a == "--step-tokens") {
            if (!parse_int_flag(v, SLOTS_MAX + 1, 65536, &f->step_tokens)) return bad();
        } else if (a == "--token-flush-ms") {
            if (!parse_int_flag(v, 0, 1000, &f->token_flush_ms)) return bad();
        } else if (a == "--kv") {
            if (v == "f16") f->kv = KV_TYPE_F16;
            else if (v == "q8_0") f->kv = KV_TYPE_Q8_0;
            else return bad();
        } else if (a == "--seed") {
            if (!parse_int_flag(v, 0, INT64_MAX, &f->seed)) return bad();
            f->has_seed = true;
        } else if (a == "--act-bits") {
            if (v == "16") f->act_bits = 16;
            else if (v == "8") f->act_bits = 8;
            else return bad();
        } else if (a == "--experts-ram-mib") {
            if (!parse_int_flag(v, 0, int64_t(1) << 30, &f->experts_ram_mib)) return bad();
        } else if (a == "--probe-mib") {
            if (!parse_int_flag(v, 16, 1 << 16, &f->probe_mib)) return bad();
        } else if (a == "--drafting") {
            if (!drafting_mode_parse(v, &f->drafting)) return bad();
            f->drafting_set = true;
        } else if (a == "--draft-model") {
            f->draft_model = v;
        } else if (a == "--backend") {
            if (v != "cpu" && v != "cuda" && v != "auto") return bad();
            f->backend = v;
        } else {
            return usage("unknown flag " + a);
        }
    }
    if (f->probe) return -1;
    if (!f->serve) return usage("--serve is required (or --probe-bandwidth)");
    if (f->model.empty()) return usage("--model FILE.gguf is required");
    if (f->drafting == DRAFTING_MODEL && f->draft_model.empty()) return usage("--drafting model needs --draft-model FILE");
    if (!f->drafting_set && !f->draft_model.empty()) f->drafting = DRAFTING_AUTO;  // a draft model alone turns drafting on
    return -1;
}

std::string join_ids(const std::vector<int32_t>& ids) {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i > 0) s.push_back(',');
        s.append(std::to_string(ids[i]));
    }
    return s;
}

// Passes the probe times (the fastest counts): enough to ride out a busy neighbour for a moment.
constexpr int PROBE_PASSES = 10;

// --probe-bandwidth: the model (when given) is loaded first for its decode bytes and freed, then the probe
// runs on a pool of the same thread count.
int run_probe(const flags& f) {
    const int32_t n_threads = f.threads > 0 ? static_cast<int32_t>(f.threads) : physical_cores();
    size_t decode_bytes = 0, kv_per_pos = 0;
    if (!f.model.empty()) {
        model_params mp;
        mp.path = f.model;
        mp.n_threads = 1;
        std::string err;
        strata_model* model = model_load(mp, &err);
        if (model == nullptr) {
            std::fprintf(stderr, "%s\n", err.c_str());
            return 1;
        }
        decode_bytes = model_decode_bytes(model);
        kv_per_pos = model_kv_bytes_per_pos(model);
        model_free(model);
    }
    threadpool* pool = threadpool_init(n_threads);
    const bandwidth_result r = bandwidth_probe(pool, size_t(f.probe_mib) << 20, PROBE_PASSES);
    threadpool_free(pool);
    if (r.gb_s <= 0.0) {
        std::fprintf(stderr, "strata-engine: the probe could not allocate its buffer\n");
        return 1;
    }
    char line[768];
    const int n = std::snprintf(line, sizeof line,
                  "PROBE reader=%s threads=%d buffer_mib=%lld passes=%d read_gb_s=%.2f mean_gb_s=%.2f "
                  "decode_bytes=%zu kv_bytes_per_pos=%zu bound_tok_s=%.1f",
                  r.reader, r.n_threads, static_cast<long long>(f.probe_mib), r.n_passes, r.gb_s, r.mean_gb_s,
                  decode_bytes, kv_per_pos, decode_bytes > 0 ? r.gb_s * 1e9 / double(decode_bytes) : 0.0);
    // the single-token kernels' compute ceilings (one thread, in cache, CPU time): bandwidth.h
    std::snprintf(line + n, sizeof line - size_t(n),
                  " kernel_q4_1_gb_s=%.2f kernel_q8_0_gb_s=%.2f kernel8_q4_1_gb_s=%.2f kernel8_q8_0_gb_s=%.2f",
                  kernel_ceiling_gb_s(GGML_TYPE_Q4_1, 16), kernel_ceiling_gb_s(GGML_TYPE_Q8_0, 16),
                  kernel_ceiling_gb_s(GGML_TYPE_Q4_1, 8), kernel_ceiling_gb_s(GGML_TYPE_Q8_0, 8));
    protocol_write_line(line);
    return 0;
}

// " device=NAME" (spaces as '_') with the CUDA backend, else ""
std::string device_field(const model_info& info) {
    if (info.backend != "cuda") return "";
    std::string d = info.device;
    std::replace(d.begin(), d.end(), ' ', '_');
    return " device=" + d;
}

}  // namespace

int main(int argc, char** argv) {
    flags f;
    const int rc = parse_flags(argc, argv, &f);
    if (rc >= 0) return rc;
    if (f.probe) return run_probe(f);
    if (f.backend == "cuda" && f.kv != KV_TYPE_F16) {
        std::fprintf(stderr, "strata-engine: --backend cuda keeps its KV cache in f16 (--kv q8_0 is CPU-only)\n");
        return 1;
    }

    model_params mp;
    mp.path = f.model;
    mp.n_threads = f.threads > 0 ? static_cast<int32_t>(f.threads) : physical_cores();
    // a one-slot read's chunk, or one step of several slots plus every slot's decode entry and its drafts (when
    // drafting is on); the batch limit also sizes the rings of sliding-window layers, so no room is kept for drafts that never come
    const int32_t per_slot = 1 + (f.drafting != DRAFTING_OFF ? DRAFT_K_MAX : 0);
    mp.n_batch = static_cast<int32_t>(std::max(f.chunk, f.step_tokens)) + SLOTS_MAX * per_slot;
    mp.act_bits = f.act_bits;
    mp.experts_ram_bytes = f.experts_ram_mib < 0 ? -1 : f.experts_ram_mib << 20;
    mp.backend = f.backend == "auto" && f.kv != KV_TYPE_F16 ? "cpu" : f.backend;
    std::string err;
    strata_model* model = model_load(mp, &err);
    if (model == nullptr) {
        std::fprintf(stderr, "%s\n", err.empty() ? ("cannot load " + f.model).c_str() : err.c_str());
        return 1;
    }
    const model_info& info = model_get_info(model);
    if (!info.backend_note.empty()) std::fprintf(stderr, "strata: --backend auto: on the CPU (%s)\n", info.backend_note.c_str());
    std::unique_ptr<draft_model> draft;

    engine_config cfg;
    const int32_t train = info.n_ctx_train > 0 ? info.n_ctx_train : CPU_CONTEXT_CAP;
    cfg.n_ctx = f.max_context > 0 ? static_cast<int32_t>(std::min<int64_t>(f.max_context, train))
                                  : std::min(train, CPU_CONTEXT_CAP);
    if (f.max_context > train) {
        std::fprintf(stderr, "strata: --max-context %lld is over the training context; using %d\n",
                     static_cast<long long>(f.max_context), cfg.n_ctx);
    }
    cfg.n_slots = static_cast<int32_t>(f.slots);
    cfg.chunk = static_cast<int32_t>(f.chunk);
    cfg.step_tokens = static_cast<int32_t>(f.step_tokens);
    protocol_set_token_flush_ms(f.token_flush_ms);
    cfg.turn_token = f.turn_token == -2 ? info.im_start_id : static_cast<int32_t>(f.turn_token);
    if (!f.eos.empty()) {
        cfg.eos_ids = f.eos;
    } else {
        for (int32_t id : {info.eot_id, info.endoftext_id, info.eos_id, info.call_id}) {
            if (id >= 0 && std::find(cfg.eos_ids.begin(), cfg.eos_ids.end(), id) == cfg.eos_ids.end()) {
                cfg.eos_ids.push_back(id);
            }
        }
    }
    cfg.kv = f.kv;
    cfg.conv_slots = static_cast<int32_t>(f.conv_slots);
    cfg.conv_mib = f.conv_mib;
    cfg.prompt_cache_every = static_cast<int32_t>(f.prompt_cache_every);
    cfg.has_seed = f.has_seed;
    cfg.seed = static_cast<uint64_t>(f.seed);
    cfg.drafting = f.drafting;
    if (!f.draft_model.empty()) {
        draft = draft_model_load(f.draft_model, f.model, info.n_vocab, info.n_threads > 0 ? info.n_threads : mp.n_threads,
                                 cfg.n_ctx, cfg.kv, mp.n_batch, &err);
        if (!draft) {
            std::fprintf(stderr, "strata-engine: %s\n", err.c_str());
            model_free(model);
            return 1;
        }
        cfg.draft = draft.get();
    }
    // the vocabulary as bytes for grammar= (read from the file again: the model keeps no token texts)
    std::unique_ptr<grammar_vocab> vocab;
    {
        std::string verr;
        gguf_file* gf = gguf_open(f.model, &verr);
        if (gf) vocab = grammar_vocab_from_gguf(gf, info.n_vocab, cfg.eos_ids, &verr);
        if (gf) gguf_close(gf);
        if (!vocab) std::fprintf(stderr, "strata: grammars are off: %s\n", verr.c_str());
        cfg.vocab = vocab.get();
    }

    protocol_write_line(std::string("INFO engine=") + ENGINE_VERSION + " arch=" + info.arch +
                        " n_vocab=" + std::to_string(info.n_vocab) + " n_ctx_train=" + std::to_string(info.n_ctx_train) +
                        " context=" + std::to_string(cfg.n_ctx) + " batch_slots=" + std::to_string(cfg.n_slots) +
                        " slot_cache=" + (cfg.n_slots > 0 ? "1" : "0") +
                        " conversation_cache_slots=" + std::to_string(cfg.conv_slots) +
                        " conversation_cache_mib=" + std::to_string(cfg.conv_mib) +
                        " im_start=" + std::to_string(info.im_start_id) + " eos=" + join_ids(cfg.eos_ids) +
                        " threads=" + std::to_string(info.n_threads > 0 ? info.n_threads : mp.n_threads) +
                        " backend=" + info.backend + device_field(info) + " kernels=" + model_kernel_name() + " kv=" + (cfg.kv == KV_TYPE_F16 ? "f16" : "q8_0") +
                        " chunk=" + std::to_string(cfg.chunk) +
                        " step_tokens=" + std::to_string(cfg.step_tokens) +
                        " token_flush_ms=" + std::to_string(f.token_flush_ms) + " logit_bias=1 grammar=" +
                        (vocab ? "1" : "0") + " act_bits=" + std::to_string(info.act_bits) +
                        " drafting=" + drafting_mode_name(cfg.drafting) + " draft_model=" + (draft ? "1" : "0"));
    // KV of one sequence filled to the context (window layers kept as rings count their cells only): a
    // mapping that is never touched costs no memory, so this sizing cache is free
    size_t kv_bytes = 0;
    if (kv_cache* probe = kv_cache_init(model, cfg.n_ctx, cfg.kv)) {
        kv_bytes = kv_cache_bytes(probe, cfg.n_ctx);
        kv_cache_free(probe);
    }
    protocol_write_line("INFO model_name=" + protocol_message(info.name.empty() ? "-" : info.name) +
                        " n_layer=" + std::to_string(info.n_layer) + " n_embd=" + std::to_string(info.n_embd) +
                        " weights_mib=" + std::to_string(info.weights_bytes >> 20) +
                        " kv_mib_per_seq=" + std::to_string((kv_bytes + (1u << 20) - 1) >> 20) +
                        " turn_token=" + std::to_string(cfg.turn_token) +
                        " experts_total=" + std::to_string(info.n_experts_total) +
                        " experts_resident=" + std::to_string(info.n_experts_resident) +
                        " experts_packed_mib=" + std::to_string(info.experts_packed_bytes >> 20));
    protocol_write_line("READY " + std::to_string(cfg.n_ctx) + " stop");
    std::fprintf(stderr, "strata: session is up: %s context=%d threads=%d slots=%d\n", f.model.c_str(), cfg.n_ctx,
                 info.n_threads, cfg.n_slots);

    const int code = serve_loop_run(model, cfg, STDIN_FILENO);
    draft_model_free(draft.get());
    model_free(model);
    return code;
}

// engine/moe.h — mixture-of-experts FFN shared by the MoE architectures (engine/models/qwen3moe.cpp,
// qwen2moe.cpp, gpt-oss.cpp): the stacked expert tensors, the router and the expert-batched forward step.
//
// Weights: the GGUF stores each layer's experts stacked in one 3-D tensor per projection,
// ffn_gate_exps / ffn_up_exps (n_embd, n_ff_exp, n_expert) and ffn_down_exps (n_ff_exp, n_embd, n_expert)
// (ne order); expert e is the 2-D slice at e * n_rows * row_bytes, taken as an ordinary weight_view, so the
// experts run on the same kernel sets, widening and row-group packing as the dense matrices.
//
// One step over n entries (the rows of xn, the FFN norm's output; the result to out, (n, n_embd)):
//   1. router: logits = xn Wr^T (n, n_expert); p = softmax(logits); the n_expert_used largest p (ties: the
//      lower expert) with weights p_sel, divided by their sum when the architecture normalises
//      (expert_weights_norm: qwen3moe yes, qwen2moe no; the sum clamped below at 2^-14 as the reference does);
//      gpt-oss (expert_softmax_chosen): logits + the router's bias, the n_expert_used largest logits, weights
//      the softmax over those alone;
//   2. routing: every (entry, slot) pair is placed in its expert's run, experts in index order, entries in
//      order within a run; xn rows are gathered into those runs;
//   3. one matmul_runs job computes gate and up of every used expert over its run (each used expert's
//      weights are read once per step, whatever the number of entries routed to it), act(gate) * up (gpt-oss:
//      the experts' gate and up biases added, then its clamped SwiGLU, hp.swiglu_limit), then one job for down;
//   4. out[i] = sum over i's slots, in slot order, of weight * down row (gpt-oss: + the expert's down bias)
//      (each entry's sum in a fixed order:
//      results depend neither on the thread count nor on the other entries of the batch);
//   5. (qwen2moe) a shared expert every entry takes, scaled by sigmoid(xn . w_shexp_gate), is added.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpu/kernels.h"

struct strata_model;
struct layer_weights;

// Scratch of one MoE step, sized at load for n_batch entries.
struct moe_scratch {
    std::vector<float> logits;     // (n_batch, n_expert) router logits, then probabilities
    std::vector<int32_t> sel;      // (n_batch, n_expert_used) chosen experts per entry, best first
    std::vector<float> sel_w;      // (n_batch, n_expert_used) their weights
    std::vector<int32_t> slot_row; // (n_batch, n_expert_used) each (entry, slot)'s row in the runs
    std::vector<int32_t> row_expert;  // (n_batch * n_expert_used) the expert of each row of the runs
    std::vector<int32_t> run_first, run_fill;  // (n_expert + 1), (n_expert) rows of each expert's run
    std::vector<float> xg;         // (n_batch * n_expert_used, n_embd) gathered inputs
    std::vector<float> gate, up;   // (n_batch * n_expert_used, n_ff_exp)
    std::vector<float> down;       // (n_batch * n_expert_used, n_embd)
    std::vector<mm_run> runs;      // (2 * n_expert)
    std::vector<float> shared;     // (n_batch, n_embd) the shared expert's output (qwen2moe)
};

// Reads the expert hyperparameters ({arch}.expert_count, .expert_used_count, .expert_feed_forward_length, else
// feed_forward_length / expert_used_count as the reference does) into m->hp.
bool moe_read_hparams(strata_model* m, const std::string& arch, std::string* err);
// Loads every layer's router and stacked experts (names above) into the layer's expert views.
bool moe_load_tensors(strata_model* m, std::string* err);
// Loads gpt-oss's biases: the router's ffn_gate_inp.bias (n_expert) and the experts' ffn_{gate,up}_exps.bias
// (n_ff_exp, n_expert), ffn_down_exps.bias (n_embd, n_expert) (ne order), all required.
bool moe_load_biases(strata_model* m, std::string* err);
// Sizes m's moe scratch for its n_batch (after the builder).
void moe_scratch_init(strata_model* m);
// The step above for layer l over n entries of m->s.xn; writes m->s.tmp (n, n_embd).
void moe_ffn(strata_model* m, const layer_weights& l, int32_t n);
// Weight bytes one decode step reads from the experts on average (n_expert_used of n_expert per layer).
size_t moe_decode_bytes(const strata_model* m);

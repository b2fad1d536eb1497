// engine/cpu/kernels_act8.h — the 8-bit activation mode (`strata-engine --act-bits 8`; the default on the AVX2 set).
//
// Contract:
//  - A weight with act_bits 8 has its matmuls quantise the activations to 8-bit blocks of 32: d = max|x| / 127,
//    q = nearbyint(x / d) in [-127, 127], kept both as int16 (act_q16.qs: every row kernel and the 16-bit
//    row-group kernels take them unchanged, with exact integer sums) and as int8 (act_q16.qs8: the 8-bit
//    row-group kernels). Same dsum / isum as the 16-bit blocks.
//  - The 8-bit row-group layout (weight_pack8, same size as weight_pack's) puts 4 consecutive elements of a
//    row in one 32-bit lane, so one vpdpbusd (u8 x s8 -> int32, AVX-512 VNNI) covers 16 rows x 4 elements,
//    twice as many as the 16-bit kernels' vpdpwssd. Per group of 16 rows and block b of 32 columns:
//      float dw[16] (Q4_0), half d[16] (Q8_0) or half d[16], m[16] (Q4_1)   as weight_pack
//      Q4_0/Q4_1: 4 vectors of 64 bytes; byte 4r + i of vector c holds element 8c + i of row r in its low
//                 nibble and element 8c + 4 + i in its high one (stored 0..15)
//      Q8_0:      8 vectors of 64 bytes (from byte 32); byte 4r + i of vector j is element 4j + i of row r,
//                 plus 128 (u8)
//    The integer sums start at -8 (Q4) or -128 (Q8_0) times the block's activation sum; the float steps are
//    the 16-bit row-group kernels', so the 8-bit kernel and the 16-bit kernel over the same 8-bit activations
//    give the same bits (tests/engine/kernels_test.cpp).
//  - group8_fn is non-null only where the chosen kernel set has an 8-bit kernel for the type: AVX-512 VNNI
//    (Q4_0, Q4_1, Q8_0); AArch64's dotprod set (sdot: kernels_dotprod.cpp); the AVX2 set on a CPU with AVX-VNNI (VEX vpdpbusd; Q4_0, Q4_1, Q8_0); the AVX2 set
//    without it (vpmaddubsw: Q4_0, Q4_1; kernels_act8_avx2.h says why not Q8_0). Elsewhere the model packs the
//    16-bit layout and the mode still quantises to 8 bits (same results, no speed-up).
#pragma once

#include "kernels.h"

// x[0..k) -> 8-bit blocks: qs (int16) and qs8 (int8) hold the same values; d, dsum as quantize_q16. The AVX-512
// or AVX2 quantiser when that kernel set is chosen (the same values bit for bit), else the scalar one.
void quantize_act8(const float* x, int64_t k, int16_t* qs, int8_t* qs8, float* d, float* dsum);
// The scalar block quantiser of both modes: d = max|x| / qmax, q = nearbyint(x / d) clamped to +-qmax, into qs
// and (when not null) qs8; dsum = d * (sum of q). quantize_q16's scalar set is this with qmax 32767.
void quantize_blocks_scalar(const float* x, int64_t k, int32_t qmax, int16_t* qs, int8_t* qs8, float* d, float* dsum);
// Writes w in the 8-bit row-group layout (weight_packed_bytes bytes, 64-byte aligned).
void weight_pack8(const weight_view& w, uint8_t* out);
// The 8-bit row-group kernel of this type for the chosen kernel set, nullptr when there is none.
mm_group_fn group8_fn(ggml_type type);
// The activation bits a matrix of this type gets when no --act-bits is given (model_params.act_bits 0): 8 on
// the AVX2 set (AVX-VNNI CPUs included) where it has an 8-bit kernel for the type, else 16. The reason, with
// its figures (SmolLM2-135M Q4_1, STRATA_KERNELS=avx2, docs/BENCHMARKS.md "The default activation bits per
// set"): there the 8-bit kernels (vpmaddubsw / vpdpbusd) do twice the multiply-adds per instruction of the
// 16-bit vpmaddwd, and AVX2 is compute-bound even in decode; the 8-bit logits are as far from the float64
// forward as llama.cpp's own (its activations are 8-bit q8_1 on these weights): top-10 error 3.5e-3 / 2.2e-2 /
// 1.1e-2 of the top logit on reference_forward_test's prompts (every matrix at 8 bits, Q8_0's output head too:
// 5.3e-3 / 2.6e-2 / 1.1e-2) against llama.cpp built for AVX2 4.0e-3 / 2.4e-2 / 1.4e-2 (its AVX-512 build
// 1.2e-2 / 2.7e-2 / 1.5e-2), 64 teacher-forced greedy steps with the float64 forward's argmax; 16 bits there:
// 1.1e-4 / 2.8e-4 / 1.8e-4. The test: tests/engine/test_act_bits.py, reference_forward_test_avx2. AVX-512
// VNNI keeps 16: its vpdpwssd has the full width and decode there is memory-bound, so 8 bits would buy little
// at that error. A type without an 8-bit kernel (K-quants, Q5_0; Q8_0 without AVX-VNNI) keeps 16 bits: 8 would
// cost accuracy for no speed. The scalar, NEON and dotprod sets keep 16 (not measured on a real ARM CPU yet).
int32_t act_bits_default(ggml_type type);
// The AVX-512 VNNI kernels (nullptr when not compiled in); index 0 Q4_0, 1 Q4_1, 2 Q8_0.
const mm_group_fn* kernels_act8_avx512();
using act8_quantize_fn = void (*)(const float* x, int64_t k, int16_t* qs, int8_t* qs8, float* d, float* dsum);
act8_quantize_fn kernels_act8_quantize_avx512();  // nullptr when not compiled in
// The dotprod set's sdot kernels (kernels_dotprod.cpp; nullptr when not compiled in), indexed as the AVX-512 ones.
const mm_group_fn* kernels_act8_dotprod();
// The AVX2 (vpmaddubsw) kernels, index as above, Q8_0's entry nullptr, and quantiser; nullptr when not compiled in.
const mm_group_fn* kernels_act8_avx2();
act8_quantize_fn kernels_act8_quantize_avx2();
// The AVX-VNNI (VEX vpdpbusd) kernels, index as above; nullptr when not compiled in. Callable only where
// cpu_has_avx_vnni().
const mm_group_fn* kernels_act8_avxvnni();
// The same kernels' code with the EVEX vpdpbusd (AVX-512 VNNI + VL), for tests on AVX-512 VNNI hosts; nullptr
// when not compiled in. Callable only where the AVX-512 VNNI kernel set is.
const mm_group_fn* kernels_act8_avxvnni_evex();
// The 16-bit row-group kernels (weight_pack's layout) in their AVX-VNNI form (VEX vpdpwssd; index as above), which
// kernels_avx2() takes on a CPU with AVX-VNNI, and the same code with the EVEX vpdpwssd for tests on AVX-512
// VNNI hosts; nullptr when not compiled in (kernels_group16_avx2.h).
const mm_group_fn* kernels_group16_avxvnni();
const mm_group_fn* kernels_group16_avxvnni_evex();
// CPUID.(EAX=7,ECX=1):EAX bit 4 (AVX-VNNI) and the OS saving ymm state; STRATA_AVXVNNI=0 answers false (to
// measure or test the plain AVX2 kernels on such a CPU).
bool cpu_has_avx_vnni();

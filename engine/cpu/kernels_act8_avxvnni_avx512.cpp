// engine/cpu/kernels_act8_avxvnni_avx512.cpp — the AVX-VNNI kernels' code (kernels_act8_avx2.h and
// kernels_group16_avx2.h, VNNI forms) compiled for AVX-512 VNNI + VL, where vpdpbusd and vpdpwssd on ymm have
// the EVEX encoding and the same semantics: a test aid
// only (tests/engine/act8_test.cpp), so that the code the engine runs on AVX-VNNI CPUs is checked on AVX-512
// VNNI hosts. The engine never dispatches to these.
#include "kernels_act8.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)

#include "kernels_act8_avx2.h"
#include "kernels_group16_avx2.h"

namespace {

const mm_group_fn ACT8_AVXVNNI_EVEX[3] = {group8_dispatch<0, true>, group8_dispatch<1, true>, group8_dispatch<2, true>};
const mm_group_fn GROUP16_AVXVNNI_EVEX[3] = {group_dispatch<0, true>, group_dispatch<1, true>, group_dispatch<2, true>};

}  // namespace

const mm_group_fn* kernels_act8_avxvnni_evex() { return ACT8_AVXVNNI_EVEX; }
const mm_group_fn* kernels_group16_avxvnni_evex() { return GROUP16_AVXVNNI_EVEX; }

#else

const mm_group_fn* kernels_act8_avxvnni_evex() { return nullptr; }
const mm_group_fn* kernels_group16_avxvnni_evex() { return nullptr; }

#endif

// engine/cpu/kernels_act8_avxvnni.cpp — the row-group kernels under AVX-VNNI: 8-bit activations with the VEX vpdpbusd
// (layout and arithmetic in kernels_act8_avx2.h) and 16-bit ones with the VEX vpdpwssd (kernels_group16_avx2.h);
// compiled with -mavx2 -mfma -mf16c -mavxvnni (CMakeLists.txt) and chosen only when CPUID says the CPU has
// AVX-VNNI (cpu_has_avx_vnni, kernels_act8.cpp; kernels_avx2()).
#include "kernels_act8.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__AVXVNNI__)

#include "kernels_act8_avx2.h"
#include "kernels_group16_avx2.h"

namespace {

const mm_group_fn ACT8_AVXVNNI[3] = {group8_dispatch<0, true>, group8_dispatch<1, true>, group8_dispatch<2, true>};
const mm_group_fn GROUP16_AVXVNNI[3] = {group_dispatch<0, true>, group_dispatch<1, true>, group_dispatch<2, true>};

}  // namespace

const mm_group_fn* kernels_act8_avxvnni() { return ACT8_AVXVNNI; }
const mm_group_fn* kernels_group16_avxvnni() { return GROUP16_AVXVNNI; }

#else

const mm_group_fn* kernels_act8_avxvnni() { return nullptr; }
const mm_group_fn* kernels_group16_avxvnni() { return nullptr; }

#endif

// engine/kernels_act8_avxvnni.cpp — the 8-bit-activation row-group kernels under AVX-VNNI (VEX vpdpbusd; layout
// and arithmetic in kernels_act8_avx2.h); compiled with -mavx2 -mfma -mf16c -mavxvnni (CMakeLists.txt) and
// chosen only when CPUID says the CPU has AVX-VNNI (cpu_has_avx_vnni, kernels_act8.cpp).
#include "kernels_act8.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__AVXVNNI__)

#include "kernels_act8_avx2.h"

namespace {

const mm_group_fn ACT8_AVXVNNI[3] = {group8_dispatch<0, true>, group8_dispatch<1, true>, group8_dispatch<2, true>};

}  // namespace

const mm_group_fn* kernels_act8_avxvnni() { return ACT8_AVXVNNI; }

#else

const mm_group_fn* kernels_act8_avxvnni() { return nullptr; }

#endif

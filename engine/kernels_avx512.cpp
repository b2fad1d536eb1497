// engine/kernels_avx512.cpp — AVX-512 (F/BW/VL/DQ) + VNNI kernel set; compiled with -mavx512* (CMakeLists).
#include "kernels.h"

const kernel_set* kernels_avx512() { return nullptr; }

/* AVX-512 multi-token kernels without VNNI; entered only after the run-time CPU check in gemm.c. */
#include "cpu/gemm_avx512_kernels.h"

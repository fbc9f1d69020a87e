/* AVX-512 multi-token kernels with VNNI (vpdpbusd); gemm.c enters them only where cpuid reports VNNI. */
#define GEMM_AVX512_VNNI 1
#include "cpu/gemm_avx512_kernels.h"

/* Multi-token dot kernels for prompt batches: one weight row against KILN_GEMM_TOKENS quantized activation rows at
 * once, so the row's blocks are unpacked once for all of them instead of once per token. Types without such a
 * kernel use the quant module's vec_dot token by token. */
#ifndef KILN_CPU_GEMM_H
#define KILN_CPU_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "quant/quant.h"

#define KILN_GEMM_TOKENS KILN_DOT_ROWS

/* One activation row's block scales as F32, converted once per matmul rather than once per weight row:
 * scales[2b] = d and scales[2b + 1] = d * (sum of its quants) of block b (Q8_1 stores that as s). */
void kiln_gemm_scales(const void *y, int64_t n, kiln_type y_type, float *scales);

/* out[k] = dot(row x of n elements, activation row k at y + k * y_stride) for k < KILN_GEMM_TOKENS; the rows' scales
 * are at scales + k * s_stride (from kiln_gemm_scales). */
typedef void (*kiln_gemm_fn)(int64_t n, const void *x, const void *y, size_t y_stride, const float *scales,
                             size_t s_stride, float *out);

/* The kernel for weights of type t at an ISA, or NULL (the scalar level has a reference for every type that has a
 * vec_dot, built from it; SIMD levels only for the types they cover). */
kiln_gemm_fn kiln_gemm_get(kiln_type t, kiln_isa isa);

/* The SIMD kernels (gemm_avx2.c, gemm_avx512.c and gemm_avx512vnni.c), entered only when the CPU has that ISA (and VNNI
 * for the _vnni ones). */
void kiln_gemm_q4_1_avx2(int64_t n, const void *x, const void *y, size_t y_stride, const float *scales,
                         size_t s_stride, float *out);
void kiln_gemm_q4_0_avx2(int64_t n, const void *x, const void *y, size_t y_stride, const float *scales,
                         size_t s_stride, float *out);
void kiln_gemm_q4_1_avx512(int64_t n, const void *x, const void *y, size_t y_stride, const float *scales,
                           size_t s_stride, float *out);
void kiln_gemm_q4_1_avx512_vnni(int64_t n, const void *x, const void *y, size_t y_stride, const float *scales,
                                size_t s_stride, float *out);
void kiln_gemm_q4_0_avx512(int64_t n, const void *x, const void *y, size_t y_stride, const float *scales,
                           size_t s_stride, float *out);
void kiln_gemm_q4_0_avx512_vnni(int64_t n, const void *x, const void *y, size_t y_stride, const float *scales,
                                size_t s_stride, float *out);

#endif

/* The three operations attention does on KV-cache rows, for each cache type (F16 by default, F32): store a row,
 * dot a query with a key row, add a weighted value row into an output. Scalar references here, AVX2+F16C kernels
 * in kv_ops_avx2.c. */
#ifndef KILN_CPU_KV_OPS_H
#define KILN_CPU_KV_OPS_H

#include "quant/quant.h"

typedef struct kiln_kv_ops {
    void (*store)(void *dst, const float *src, int n);
    float (*dot)(const float *q, const void *k, int n);
    void (*axpy)(float *out, float a, const void *v, int n); /* out += a * v */
} kiln_kv_ops;

/* NULL for a type other than F16/F32. */
const kiln_kv_ops *kiln_kv_ops_get(kiln_type type, kiln_isa isa);

extern const kiln_kv_ops kiln_kv_f16_avx2;
extern const kiln_kv_ops kiln_kv_f32_avx2;

#endif

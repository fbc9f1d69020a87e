/* The operations attention does on KV-cache rows, for each cache type (F16 by default, F32): store a row, dot a
 * query with a key row, add a weighted value row into an output; and the last two for up to KILN_KV_ROWS queries
 * or outputs at once, the row read and converted once, each result bit for bit the single form's. Scalar references
 * here, AVX2+F16C kernels in kv_ops_avx2.c. */
#ifndef KILN_CPU_KV_OPS_H
#define KILN_CPU_KV_OPS_H

#include <stddef.h>

#include "quant/quant.h"

#define KILN_KV_ROWS 8

typedef struct kiln_kv_ops {
    void (*store)(void *dst, const float *src, int n);
    float (*dot)(const float *q, const void *k, int n);
    void (*axpy)(float *out, float a, const void *v, int n); /* out += a * v */
    /* out[g] = dot(q[g], k, n) for g < nq <= KILN_KV_ROWS */
    void (*dot_rows)(const float *const *q, int nq, const void *k, int n, float *out);
    /* out += a[r] * (row r) for rows r < n_rows at v, v + stride, ..., in that order: each element gets the sums of
     * n_rows axpy calls, bit for bit, with out held in registers over the rows */
    void (*mix)(float *out, const float *a, const void *v, size_t stride, int n_rows, int n);
} kiln_kv_ops;

/* NULL for a type other than F16/F32. */
const kiln_kv_ops *kiln_kv_ops_get(kiln_type type, kiln_isa isa);

extern const kiln_kv_ops kiln_kv_f16_avx2;
extern const kiln_kv_ops kiln_kv_f32_avx2;

#endif

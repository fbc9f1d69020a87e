/* Scalar KV-cache row operations, and the choice of kernels by ISA. */
#include "cpu/kv_ops.h"

#include <string.h>

#include "util/half.h"

static void store_f16(void *dst, const float *src, int n) {
    kiln_half *d = dst;
    for (int i = 0; i < n; i++) d[i] = kiln_float_to_half(src[i]);
}

static float dot_f16(const float *q, const void *k, int n) {
    const kiln_half *kh = k;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += q[i] * kiln_half_to_float(kh[i]);
    return sum;
}

static void axpy_f16(float *out, float a, const void *v, int n) {
    const kiln_half *vh = v;
    for (int i = 0; i < n; i++) out[i] += a * kiln_half_to_float(vh[i]);
}

static void store_f32(void *dst, const float *src, int n) { memcpy(dst, src, sizeof(float) * (size_t)n); }

static float dot_f32(const float *q, const void *k, int n) {
    const float *kf = k;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += q[i] * kf[i];
    return sum;
}

static void axpy_f32(float *out, float a, const void *v, int n) {
    const float *vf = v;
    for (int i = 0; i < n; i++) out[i] += a * vf[i];
}

/* The references take the queries and the rows one at a time. */
static void dot_rows_f16(const float *const *q, int nq, const void *k, int n, float *out) {
    for (int g = 0; g < nq; g++) out[g] = dot_f16(q[g], k, n);
}

static void dot_rows_f32(const float *const *q, int nq, const void *k, int n, float *out) {
    for (int g = 0; g < nq; g++) out[g] = dot_f32(q[g], k, n);
}

static void mix_f16(float *out, const float *a, const void *v, size_t stride, int n_rows, int n) {
    for (int r = 0; r < n_rows; r++) axpy_f16(out, a[r], (const char *)v + (size_t)r * stride, n);
}

static void mix_f32(float *out, const float *a, const void *v, size_t stride, int n_rows, int n) {
    for (int r = 0; r < n_rows; r++) axpy_f32(out, a[r], (const char *)v + (size_t)r * stride, n);
}

static const kiln_kv_ops KV_F16 = {store_f16, dot_f16, axpy_f16, dot_rows_f16, mix_f16};
static const kiln_kv_ops KV_F32 = {store_f32, dot_f32, axpy_f32, dot_rows_f32, mix_f32};

const kiln_kv_ops *kiln_kv_ops_get(kiln_type type, kiln_isa isa) {
    bool simd = isa >= KILN_ISA_AVX2;
    if (type == KILN_TYPE_F16) return simd ? &kiln_kv_f16_avx2 : &KV_F16;
    if (type == KILN_TYPE_F32) return simd ? &kiln_kv_f32_avx2 : &KV_F32;
    return NULL;
}

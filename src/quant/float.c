/* Plain float element types (F32, F16, BF16): scalar reference kernels. Their vec_dot partner is F32 activations;
 * the references accumulate in double so the SIMD versions have an accurate value to be measured against. */
#include <string.h>

#include "quant/quant.h"

static void dequantize_row_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

static void quantize_row_f32(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

static float vec_dot_f32(int64_t n, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * y[i]);
    return (float)sum;
}

static void dequantize_row_f16(const void *src, float *dst, int64_t n) {
    const kiln_half *x = src;
    for (int64_t i = 0; i < n; i++) dst[i] = kiln_half_to_float(x[i]);
}

static void quantize_row_f16(const float *src, void *dst, int64_t n) {
    kiln_half *y = dst;
    for (int64_t i = 0; i < n; i++) y[i] = kiln_float_to_half(src[i]);
}

static float vec_dot_f16(int64_t n, const void *vx, const void *vy) {
    const kiln_half *x = vx;
    const float *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(kiln_half_to_float(x[i]) * y[i]);
    return (float)sum;
}

static void dequantize_row_bf16(const void *src, float *dst, int64_t n) {
    const kiln_bf16 *x = src;
    for (int64_t i = 0; i < n; i++) dst[i] = kiln_bf16_to_float(x[i]);
}

static void quantize_row_bf16(const float *src, void *dst, int64_t n) {
    kiln_bf16 *y = dst;
    for (int64_t i = 0; i < n; i++) y[i] = kiln_float_to_bf16(src[i]);
}

static float vec_dot_bf16(int64_t n, const void *vx, const void *vy) {
    const kiln_bf16 *x = vx;
    const float *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(kiln_bf16_to_float(x[i]) * y[i]);
    return (float)sum;
}

static const kiln_quant_entry ENTRIES[] = {
    {KILN_TYPE_F32, {dequantize_row_f32, quantize_row_f32, vec_dot_f32, KILN_TYPE_F32, NULL}},
    {KILN_TYPE_F16, {dequantize_row_f16, quantize_row_f16, vec_dot_f16, KILN_TYPE_F32, NULL}},
    {KILN_TYPE_BF16, {dequantize_row_bf16, quantize_row_bf16, vec_dot_bf16, KILN_TYPE_F32, NULL}},
};

const kiln_quant_family kiln_float_scalar_family = {
    "float_scalar", KILN_LEVEL_SCALAR, ENTRIES, (int)(sizeof ENTRIES / sizeof ENTRIES[0])};

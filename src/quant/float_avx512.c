/* AVX-512 kernels for F16 and BF16 rows (exact conversions, so dequantize matches the scalar code bit for bit) and
 * for dot products of F32/F16/BF16 rows with F32 activations (float FMA accumulators). */
#include <immintrin.h>
#include <stdint.h>

#include "quant/quant.h"

static inline __m512 load_f16(const kiln_half *x) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)x)); }

static inline __m512 load_bf16(const kiln_bf16 *x) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)x));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

static void dequantize_row_f16(const void *src, float *dst, int64_t n) {
    const kiln_half *x = src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_f16(x + i));
    for (; i < n; i++) dst[i] = kiln_half_to_float(x[i]);
}

static void dequantize_row_bf16(const void *src, float *dst, int64_t n) {
    const kiln_bf16 *x = src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_bf16(x + i));
    for (; i < n; i++) dst[i] = kiln_bf16_to_float(x[i]);
}

/* Elements to take one by one until the weight row x reaches a 64-byte boundary: 512-bit loads that straddle cache
 * lines cost a third of the streaming speed, and GGUF only aligns tensors to 32 bytes. */
static inline int64_t head_count(const void *x, size_t elem_size, int64_t n) {
    size_t misalign = (uintptr_t)x & 63;
    int64_t head = misalign ? (int64_t)((64 - misalign) / elem_size) : 0;
    return head < n ? head : n;
}

/* Two accumulators hide the FMA latency; head and tail are added in float like the vector part. */
static float vec_dot_f32(int64_t n, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    float head = 0.0f;
    int64_t i = 0, aligned_from = head_count(x, sizeof *x, n);
    for (; i < aligned_from; i++) head += x[i] * y[i];
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16), acc1);
    }
    float sum = head + _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; i < n; i++) sum += x[i] * y[i];
    return sum;
}

static float vec_dot_f16(int64_t n, const void *vx, const void *vy) {
    const kiln_half *x = vx;
    const float *y = vy;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    float head = 0.0f;
    int64_t i = 0, aligned_from = head_count(x, sizeof *x, n);
    for (; i < aligned_from; i++) head += kiln_half_to_float(x[i]) * y[i];
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(load_f16(x + i), _mm512_loadu_ps(y + i), acc0);
        acc1 = _mm512_fmadd_ps(load_f16(x + i + 16), _mm512_loadu_ps(y + i + 16), acc1);
    }
    float sum = head + _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; i < n; i++) sum += kiln_half_to_float(x[i]) * y[i];
    return sum;
}

static float vec_dot_bf16(int64_t n, const void *vx, const void *vy) {
    const kiln_bf16 *x = vx;
    const float *y = vy;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    float head = 0.0f;
    int64_t i = 0, aligned_from = head_count(x, sizeof *x, n);
    for (; i < aligned_from; i++) head += kiln_bf16_to_float(x[i]) * y[i];
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(load_bf16(x + i), _mm512_loadu_ps(y + i), acc0);
        acc1 = _mm512_fmadd_ps(load_bf16(x + i + 16), _mm512_loadu_ps(y + i + 16), acc1);
    }
    float sum = head + _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; i < n; i++) sum += kiln_bf16_to_float(x[i]) * y[i];
    return sum;
}

static const kiln_quant_entry ENTRIES[] = {
    {KILN_TYPE_F32, {NULL, NULL, vec_dot_f32, KILN_TYPE_F32, NULL}},
    {KILN_TYPE_F16, {dequantize_row_f16, NULL, vec_dot_f16, KILN_TYPE_F32, NULL}},
    {KILN_TYPE_BF16, {dequantize_row_bf16, NULL, vec_dot_bf16, KILN_TYPE_F32, NULL}},
};

const kiln_quant_family kiln_float_avx512_family = {
    "float_avx512", KILN_LEVEL_AVX512, ENTRIES, (int)(sizeof ENTRIES / sizeof ENTRIES[0])};

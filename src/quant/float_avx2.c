/* AVX2 kernels for F16 and BF16 rows (conversions are exact, so dequantize is bit-identical to the scalar code) and
 * for dot products of F32/F16/BF16 rows with F32 activations (float FMA accumulators, not the reference's double). */
#include <immintrin.h>

#include "quant/quant.h"

static inline __m256 load_f16(const kiln_half *x) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x)); }

static inline __m256 load_bf16(const kiln_bf16 *x) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)x));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static void dequantize_row_f16(const void *src, float *dst, int64_t n) {
    const kiln_half *x = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_f16(x + i));
    for (; i < n; i++) dst[i] = kiln_half_to_float(x[i]);
}

static void dequantize_row_bf16(const void *src, float *dst, int64_t n) {
    const kiln_bf16 *x = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16(x + i));
    for (; i < n; i++) dst[i] = kiln_bf16_to_float(x[i]);
}

/* Two accumulators hide the FMA latency; the tail is added in float like the vector part. */
static float vec_dot_f32(int64_t n, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), acc1);
    }
    float sum = hsum(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) sum += x[i] * y[i];
    return sum;
}

static float vec_dot_f16(int64_t n, const void *vx, const void *vy) {
    const kiln_half *x = vx;
    const float *y = vy;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(load_f16(x + i), _mm256_loadu_ps(y + i), acc0);
        acc1 = _mm256_fmadd_ps(load_f16(x + i + 8), _mm256_loadu_ps(y + i + 8), acc1);
    }
    float sum = hsum(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) sum += kiln_half_to_float(x[i]) * y[i];
    return sum;
}

static float vec_dot_bf16(int64_t n, const void *vx, const void *vy) {
    const kiln_bf16 *x = vx;
    const float *y = vy;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(load_bf16(x + i), _mm256_loadu_ps(y + i), acc0);
        acc1 = _mm256_fmadd_ps(load_bf16(x + i + 8), _mm256_loadu_ps(y + i + 8), acc1);
    }
    float sum = hsum(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) sum += kiln_bf16_to_float(x[i]) * y[i];
    return sum;
}

static const kiln_quant_entry ENTRIES[] = {
    {KILN_TYPE_F32, {NULL, NULL, vec_dot_f32, KILN_TYPE_F32, NULL}},
    {KILN_TYPE_F16, {dequantize_row_f16, NULL, vec_dot_f16, KILN_TYPE_F32, NULL}},
    {KILN_TYPE_BF16, {dequantize_row_bf16, NULL, vec_dot_bf16, KILN_TYPE_F32, NULL}},
};

const kiln_quant_family kiln_float_avx2_family = {
    "float_avx2", KILN_LEVEL_AVX2, ENTRIES, (int)(sizeof ENTRIES / sizeof ENTRIES[0])};

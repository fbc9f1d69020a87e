/* AVX2 + F16C KV-cache row operations; entered only when kiln_cpu_isa() reports AVX2. */
#include <immintrin.h>

#include "cpu/kv_ops.h"
#include "util/half.h"

static float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static void store_f16(void *dst, const float *src, int n) {
    kiln_half *d = dst;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = kiln_float_to_half(src[i]);
}

static __m256 load_f16(const kiln_half *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

static float dot_f16(const float *q, const void *k, int n) {
    const kiln_half *kh = k;
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load_f16(kh + i), acc);
    float sum = hsum(acc);
    for (; i < n; i++) sum += q[i] * kiln_half_to_float(kh[i]);
    return sum;
}

static void axpy_f16(float *out, float a, const void *v, int n) {
    const kiln_half *vh = v;
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(va, load_f16(vh + i), _mm256_loadu_ps(out + i)));
    for (; i < n; i++) out[i] += a * kiln_half_to_float(vh[i]);
}

static void store_f32(void *dst, const float *src, int n) {
    float *d = dst;
    for (int i = 0; i < n; i++) d[i] = src[i];
}

static float dot_f32(const float *q, const void *k, int n) {
    const float *kf = k;
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(kf + i), acc);
    float sum = hsum(acc);
    for (; i < n; i++) sum += q[i] * kf[i];
    return sum;
}

static void axpy_f32(float *out, float a, const void *v, int n) {
    const float *vf = v;
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(vf + i), _mm256_loadu_ps(out + i)));
    for (; i < n; i++) out[i] += a * vf[i];
}

/* dot for several queries (each 8-element run of the row loaded and converted once, taken by every query in turn)
 * and axpy over several rows (the output in registers): the single forms' operations in their order, so the same
 * bits. */
static inline __m256 load_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline float same_float(float x) { return x; }

#define KV_ROWS_OPS(type, elem_t, load, to_float)                                                                    \
    static void dot_rows_##type(const float *const *q, int nq, const void *k, int n, float *out) {                  \
        const elem_t *kr = k;                                                                                        \
        __m256 acc[KILN_KV_ROWS];                                                                                    \
        for (int g = 0; g < nq; g++) acc[g] = _mm256_setzero_ps();                                                   \
        int i = 0;                                                                                                   \
        for (; i + 8 <= n; i += 8) {                                                                                 \
            const __m256 kv = load(kr + i);                                                                          \
            for (int g = 0; g < nq; g++) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q[g] + i), kv, acc[g]);            \
        }                                                                                                            \
        for (int g = 0; g < nq; g++) {                                                                               \
            float sum = hsum(acc[g]);                                                                                \
            for (int t = i; t < n; t++) sum += q[g][t] * to_float(kr[t]);                                            \
            out[g] = sum;                                                                                            \
        }                                                                                                            \
    }                                                                                                                \
    /* 32 elements of out at a time in four registers over all the rows, then the 8-element runs, then the tail */  \
    static void mix_##type(float *out, const float *a, const void *v, size_t stride, int n_rows, int n) {           \
        const char *vb = v;                                                                                          \
        int i = 0;                                                                                                   \
        for (; i + 32 <= n; i += 32) {                                                                               \
            __m256 o0 = _mm256_loadu_ps(out + i), o1 = _mm256_loadu_ps(out + i + 8);                                 \
            __m256 o2 = _mm256_loadu_ps(out + i + 16), o3 = _mm256_loadu_ps(out + i + 24);                           \
            for (int r = 0; r < n_rows; r++) {                                                                       \
                const elem_t *vr = (const elem_t *)(vb + (size_t)r * stride) + i;                                    \
                const __m256 va = _mm256_set1_ps(a[r]);                                                              \
                o0 = _mm256_fmadd_ps(va, load(vr), o0);                                                              \
                o1 = _mm256_fmadd_ps(va, load(vr + 8), o1);                                                          \
                o2 = _mm256_fmadd_ps(va, load(vr + 16), o2);                                                         \
                o3 = _mm256_fmadd_ps(va, load(vr + 24), o3);                                                         \
            }                                                                                                        \
            _mm256_storeu_ps(out + i, o0), _mm256_storeu_ps(out + i + 8, o1);                                        \
            _mm256_storeu_ps(out + i + 16, o2), _mm256_storeu_ps(out + i + 24, o3);                                  \
        }                                                                                                            \
        for (; i + 8 <= n; i += 8) {                                                                                 \
            __m256 o = _mm256_loadu_ps(out + i);                                                                     \
            for (int r = 0; r < n_rows; r++)                                                                         \
                o = _mm256_fmadd_ps(_mm256_set1_ps(a[r]), load((const elem_t *)(vb + (size_t)r * stride) + i), o);   \
            _mm256_storeu_ps(out + i, o);                                                                            \
        }                                                                                                            \
        for (; i < n; i++)                                                                                           \
            for (int r = 0; r < n_rows; r++)                                                                         \
                out[i] += a[r] * to_float(((const elem_t *)(vb + (size_t)r * stride))[i]);                           \
    }

KV_ROWS_OPS(f16, kiln_half, load_f16, kiln_half_to_float)
KV_ROWS_OPS(f32, float, load_f32, same_float)

const kiln_kv_ops kiln_kv_f16_avx2 = {store_f16, dot_f16, axpy_f16, dot_rows_f16, mix_f16};
const kiln_kv_ops kiln_kv_f32_avx2 = {store_f32, dot_f32, axpy_f32, dot_rows_f32, mix_f32};

/* AVX2 multi-token kernels for Q4_1 and Q4_0 weights; entered only after the run-time CPU check in gemm.c. Each
 * weight block is unpacked once and dotted with the block of every token. Per token the arithmetic is that of the
 * AVX2 vec_dot in quant/legacy_avx2.c, step for step (groups of 4 blocks scaled by one multiply of their heads, the
 * same FMA order, the same tail and horizontal sums), so a token gets the same bits from either: a prompt position
 * computed in a batch equals the same position decoded alone, which keeps sampling reproducible whatever the
 * batching (a seed gives one text). */
#include <immintrin.h>
#include <string.h>

#include "cpu/gemm.h"
#include "quant/legacy_avx2_blocks.h"

/* (unsigned x - bias) times the signed quants at qy, as eight int32 partial sums: the vec_dot's block dot. */
static inline __m256i block_dot(__m256i ux, const int8_t *qy, int bias) {
    __m256i sy = _mm256_loadu_si256((const __m256i *)qy);
    return bias ? dot_biased(ux, sy, bias) : dot_u8_i8(ux, sy);
}

/* m_x of a Q4_1 block; Q4_0 has no such term. */
static inline float block_min_q4_1(const block_q4_1 *x) { return half_to_float(x->m); }
static inline float block_min_q4_0(const block_q4_0 *x) {
    (void)x;
    return 0.0f;
}

/* bias: Q4_0's quants are stored +8 and dotted as (x - 8) . y; Q4_1 adds m_x * s_y per block instead (has_offset).
 * scales hold d_y, s_y per block (from kiln_gemm_scales), the same floats as the activation blocks' own halves. */
#define GEMM_Q4_AVX2(wtype, atype, bias, has_offset)                                                                 \
    void kiln_gemm_##wtype##_avx2(int64_t n, const void *vx, const void *vy, size_t y_stride, const float *scales,  \
                                  size_t s_stride, float *out) {                                                    \
        const block_##wtype *x = vx;                                                                                 \
        const int64_t nb = n / 32;                                                                                   \
        __m256 acc[KILN_GEMM_TOKENS], offsets[KILN_GEMM_TOKENS];                                                     \
        float tail_offsets[KILN_GEMM_TOKENS] = {0};                                                                  \
        for (int k = 0; k < KILN_GEMM_TOKENS; k++) acc[k] = offsets[k] = _mm256_setzero_ps();                        \
        int64_t i = 0;                                                                                               \
        for (; i + 4 <= nb; i += 4) {                                                                                \
            __m256i qx[4];                                                                                           \
            for (int b = 0; b < 4; b++) qx[b] = unpack_nibbles(x[i + b].qs);                                         \
            __m256 heads = block_heads(x + i, sizeof *x);                                                            \
            _Pragma("GCC unroll 4") for (int k = 0; k < KILN_GEMM_TOKENS; k++) {                                     \
                const block_##atype *y = (const block_##atype *)((const char *)vy + (size_t)k * y_stride) + i;       \
                __m256 products = _mm256_mul_ps(heads, _mm256_loadu_ps(scales + (size_t)k * s_stride + 2 * i));      \
                _Pragma("GCC unroll 4") for (int b = 0; b < 4; b++) {                                                \
                    __m256 d = _mm256_permutevar8x32_ps(products, _mm256_set1_epi32(2 * b));                         \
                    acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(block_dot(qx[b], y[b].qs, bias)), acc[k]);        \
                }                                                                                                    \
                if (has_offset)                                                                                      \
                    offsets[k] = _mm256_add_ps(offsets[k], _mm256_blend_ps(_mm256_setzero_ps(), products, 0xAA));    \
            }                                                                                                        \
        }                                                                                                            \
        for (; i < nb; i++) {                                                                                        \
            __m256i qx = unpack_nibbles(x[i].qs);                                                                    \
            float dx = half_to_float(x[i].d);                                                                            \
            for (int k = 0; k < KILN_GEMM_TOKENS; k++) {                                                             \
                const block_##atype *y = (const block_##atype *)((const char *)vy + (size_t)k * y_stride) + i;       \
                const float *sc = scales + (size_t)k * s_stride + 2 * i;                                             \
                acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(dx * sc[0]), _mm256_cvtepi32_ps(block_dot(qx, y->qs, bias)), \
                                         acc[k]);                                                                    \
                if (has_offset) tail_offsets[k] += block_min_##wtype(&x[i]) * sc[1];                                 \
            }                                                                                                        \
        }                                                                                                            \
        for (int k = 0; k < KILN_GEMM_TOKENS; k++) out[k] = hsum(acc[k]) + hsum(offsets[k]) + tail_offsets[k];       \
    }

GEMM_Q4_AVX2(q4_1, q8_1, 0, 1)
GEMM_Q4_AVX2(q4_0, q8_0, 8, 0)

/* AVX2 multi-token kernels for Q4_1 and Q4_0 weights; entered only after the run-time CPU check in gemm.c. Each
 * weight block is unpacked once and dotted with the block of every token. Per token the arithmetic is that of the
 * AVX2 vec_dot in quant/legacy_avx2.c, step for step (groups of 4 blocks scaled by one multiply of their heads, the
 * same FMA order, the same tail and horizontal sums), so a token gets the same bits from either: a prompt position
 * computed in a batch equals the same position decoded alone, which keeps sampling reproducible whatever the
 * batching (a seed gives one text). */
#include <immintrin.h>
#include <string.h>

#include "cpu/gemm.h"

/* 32 unsigned 4-bit quants of a block in element order: the low nibbles are elements 0-15. */
static inline __m256i unpack_nibbles(const uint8_t *qs) {
    __m128i packed = _mm_loadu_si128((const __m128i *)qs), mask = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(packed, mask), hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    return _mm256_set_m128i(hi, lo);
}

/* Eight int32 partial sums of (unsigned x - bias) times signed y. */
static inline __m256i block_dot(__m256i ux, const int8_t *qy, int bias) {
    __m256i sy = _mm256_loadu_si256((const __m256i *)qy);
    __m256i pairs = _mm256_maddubs_epi16(ux, sy);
    if (bias) pairs = _mm256_sub_epi16(pairs, _mm256_maddubs_epi16(_mm256_set1_epi8((char)bias), sy));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* The first 4 bytes (two halves: d and m, or d and two quant bytes) of 4 consecutive blocks as 8 floats. */
static inline __m256 block_heads(const void *blocks, size_t stride) {
    const uint8_t *b = blocks;
    uint32_t w[4];
    for (int k = 0; k < 4; k++) memcpy(&w[k], b + k * stride, sizeof w[k]);
    __m128i v = _mm_cvtsi32_si128((int)w[0]);
    v = _mm_insert_epi32(v, (int)w[1], 1);
    v = _mm_insert_epi32(v, (int)w[2], 2);
    return _mm256_cvtph_ps(_mm_insert_epi32(v, (int)w[3], 3));
}

/* m_x of a Q4_1 block; Q4_0 has no such term. */
static inline float block_min_q4_1(const block_q4_1 *x) { return _cvtsh_ss(x->m); }
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
            float dx = _cvtsh_ss(x[i].d);                                                                            \
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

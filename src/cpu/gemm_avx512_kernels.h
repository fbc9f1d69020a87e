/* The AVX-512 multi-token kernels, shared by two files: gemm_avx512.c (plain AVX-512) and gemm_avx512vnni.c, which
 * defines GEMM_AVX512_VNNI to 1 before including this. Only the VNNI file is compiled with -mavx512vnni, so the plain
 * kernels cannot pick up VNNI instructions the CPU may lack. Defines the kernels: include it only there. */
#ifndef KILN_CPU_GEMM_AVX512_KERNELS_H
#define KILN_CPU_GEMM_AVX512_KERNELS_H

#include <immintrin.h>
#include <string.h>

#include "cpu/gemm.h"

#ifndef GEMM_AVX512_VNNI
#define GEMM_AVX512_VNNI 0
#endif

#if GEMM_AVX512_VNNI
#define GEMM_NAME(wtype) kiln_gemm_##wtype##_avx512_vnni
#else
#define GEMM_NAME(wtype) kiln_gemm_##wtype##_avx512
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline float h2f(kiln_half h) { return _cvtsh_ss(h); }

/* 32 unsigned 4-bit quants of a Q4_1/Q4_0 block in element order: the low nibbles are elements 0-15. */
static inline __m256i nibbles(const uint8_t *qs) {
    __m128i packed = _mm_loadu_si128((const __m128i *)qs), mask = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(packed, mask), hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    return _mm256_set_m128i(hi, lo);
}

static inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

static inline __m512 join_scales(float lo, float hi) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(lo)), _mm256_set1_ps(hi), 1);
}

static inline uint32_t load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* d and m of 8 consecutive Q4_1 blocks as F32, interleaved: d0 m0 d1 m1 ... d7 m7. */
static inline __m512 heads8_q4_1(const block_q4_1 *x) {
    __m128i lo = _mm_setr_epi32((int)load_u32(&x[0]), (int)load_u32(&x[1]), (int)load_u32(&x[2]), (int)load_u32(&x[3]));
    __m128i hi = _mm_setr_epi32((int)load_u32(&x[4]), (int)load_u32(&x[5]), (int)load_u32(&x[6]), (int)load_u32(&x[7]));
    return _mm512_cvtph_ps(_mm256_set_m128i(hi, lo));
}

/* The same for Q4_0, whose quants carry a bias of 8: d0 -8d0 d1 -8d1 ..., so that the offset term
 * m_x * s_y = -8 d_x * (d_y * sum q_y) removes the bias. */
static inline __m512 heads8_q4_0(const block_q4_0 *x) {
    __m128i d = _mm_setr_epi16((short)x[0].d, (short)x[1].d, (short)x[2].d, (short)x[3].d, (short)x[4].d,
                               (short)x[5].d, (short)x[6].d, (short)x[7].d);
    __m512 dd = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                                      _mm512_castps256_ps512(_mm256_cvtph_ps(d)));
    return _mm512_mul_ps(dd, _mm512_setr_ps(1, -8, 1, -8, 1, -8, 1, -8, 1, -8, 1, -8, 1, -8, 1, -8));
}

static inline float offset_q4_1(const block_q4_1 *x) { return h2f(x->m); }
static inline float offset_q4_0(const block_q4_0 *x) { return -8.0f * h2f(x->d); }

/* Lanes 0-7 take lane 4p of a head product (block 2p's d_x d_y), lanes 8-15 lane 4p + 2 (block 2p + 1's). */
static inline __m512i pair_pick(int p) {
    return _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(4 * p), _mm512_set1_epi32(4 * p + 2));
}

/* Sums of products of unsigned weight quants and signed activation quants, per group of four bytes. */
ALWAYS_INLINE __m512i dot_u8_i8(__m512i ux, __m512i sy) {
#if GEMM_AVX512_VNNI
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), ux, sy);
#else
    return _mm512_madd_epi16(_mm512_maddubs_epi16(ux, sy), _mm512_set1_epi16(1));
#endif
}

/* One block's dot done plainly, for an odd last block; sc: the activation block's d and s. */
#define BLOCK_DOT(wtype, atype)                                                                                     \
    static float dot_block_##wtype(const block_##wtype *x, const block_##atype *y, const float *sc) {                  \
        int sum = 0;                                                                                                 \
        for (int j = 0; j < 16; j++) sum += (x->qs[j] & 0x0F) * y->qs[j] + (x->qs[j] >> 4) * y->qs[j + 16];        \
        return h2f(x->d) * sc[0] * (float)sum + offset_##wtype(x) * sc[1];                                          \
    }
BLOCK_DOT(q4_1, q8_1)
BLOCK_DOT(q4_0, q8_0)

/* Blocks go in groups of 8: the weight's quants are unpacked (4 pair vectors) and its scales converted once, then
 * each token takes one multiply for its 8 d_x d_y (even lanes) and offset terms m_x s_y (odd lanes), and per pair
 * of blocks one integer dot and one FMA. Leftover blocks go in pairs, then one by one. */
#define GEMM_Q4(wtype, atype)                                                                                        \
    ALWAYS_INLINE void gemm_##wtype(int64_t n, const void *vx, const void *vy, size_t y_stride, const float *scales, \
                                    size_t s_stride, float *out) {                                                  \
        const block_##wtype *x = vx;                                                                                 \
        const int64_t nb = n / 32;                                                                                   \
        const __m512i pick[4] = {pair_pick(0), pair_pick(1), pair_pick(2), pair_pick(3)};                            \
        __m512 acc[KILN_GEMM_TOKENS], offsets[KILN_GEMM_TOKENS];                                                     \
        float tail[KILN_GEMM_TOKENS] = {0};                                                                          \
        for (int k = 0; k < KILN_GEMM_TOKENS; k++) acc[k] = offsets[k] = _mm512_setzero_ps();                        \
        int64_t i = 0;                                                                                               \
        for (; i + 8 <= nb; i += 8) {                                                                                \
            __m512i qx[4];                                                                                           \
            _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) qx[p] =                                              \
                join(nibbles(x[i + 2 * p].qs), nibbles(x[i + 2 * p + 1].qs));                                         \
            __m512 xh = heads8_##wtype(x + i);                                                                       \
            _Pragma("GCC unroll 4") for (int k = 0; k < KILN_GEMM_TOKENS; k++) {                                     \
                const block_##atype *y = (const block_##atype *)((const char *)vy + (size_t)k * y_stride) + i;       \
                __m512 prod = _mm512_mul_ps(xh, _mm512_loadu_ps(scales + (size_t)k * s_stride + 2 * i));             \
                _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {                                                \
                    __m512i qy = join(_mm256_loadu_si256((const __m256i *)y[2 * p].qs),                              \
                                      _mm256_loadu_si256((const __m256i *)y[2 * p + 1].qs));                         \
                    acc[k] = _mm512_fmadd_ps(_mm512_permutexvar_ps(pick[p], prod),                                   \
                                             _mm512_cvtepi32_ps(dot_u8_i8(qx[p], qy)), acc[k]);                \
                }                                                                                                    \
                offsets[k] = _mm512_mask_add_ps(offsets[k], 0xAAAA, offsets[k], prod);                               \
            }                                                                                                        \
        }                                                                                                            \
        for (; i + 2 <= nb; i += 2) {                                                                                \
            __m512i qx = join(nibbles(x[i].qs), nibbles(x[i + 1].qs));                                               \
            float d0 = h2f(x[i].d), d1 = h2f(x[i + 1].d), m0 = offset_##wtype(&x[i]), m1 = offset_##wtype(&x[i + 1]); \
            for (int k = 0; k < KILN_GEMM_TOKENS; k++) {                                                             \
                const block_##atype *y = (const block_##atype *)((const char *)vy + (size_t)k * y_stride) + i;       \
                const float *sc = scales + (size_t)k * s_stride + 2 * i;                                             \
                __m512i qy = join(_mm256_loadu_si256((const __m256i *)y[0].qs),                                      \
                                  _mm256_loadu_si256((const __m256i *)y[1].qs));                                     \
                acc[k] = _mm512_fmadd_ps(join_scales(d0 * sc[0], d1 * sc[2]),                                        \
                                         _mm512_cvtepi32_ps(dot_u8_i8(qx, qy)), acc[k]);                       \
                tail[k] += m0 * sc[1] + m1 * sc[3];                                                                  \
            }                                                                                                        \
        }                                                                                                            \
        for (int k = 0; k < KILN_GEMM_TOKENS; k++) {                                                                 \
            const block_##atype *y = (const block_##atype *)((const char *)vy + (size_t)k * y_stride);               \
            if (i < nb) tail[k] += dot_block_##wtype(&x[i], &y[i], scales + (size_t)k * s_stride + 2 * i);               \
            out[k] = _mm512_reduce_add_ps(acc[k]) + _mm512_reduce_add_ps(offsets[k]) + tail[k];                      \
        }                                                                                                            \
    }                                                                                                                \
    void GEMM_NAME(wtype)(int64_t n, const void *x, const void *y, size_t y_stride, const float *scales,           \
                          size_t s_stride, float *out) {                                                            \
        gemm_##wtype(n, x, y, y_stride, scales, s_stride, out);                                                      \
    }

GEMM_Q4(q4_1, q8_1)
GEMM_Q4(q4_0, q8_0)

#endif

/* The dot products of the 32-element block formats with AVX-512, shared by two files: legacy_avx512.c (plain
 * AVX-512 F/BW/VL/DQ) and legacy_avx512vnni.c, which defines LEGACY_AVX512_VNNI to 1 before including this. Two
 * blocks per 512-bit step: an exact integer dot per block (vpdpbusd with VNNI, maddubs + madd otherwise), then one
 * float FMA with d_x * d_y per block, as the reference engine does. Only the VNNI file is compiled with
 * -mavx512vnni: the plain one must run on AVX-512 CPUs without it, so the compiler may not fuse its multiply-adds
 * into VNNI instructions. Defines static functions: include it only there. */
#ifndef KILN_QUANT_LEGACY_AVX512_DOT_H
#define KILN_QUANT_LEGACY_AVX512_DOT_H

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "quant/quant.h"

#ifndef LEGACY_AVX512_VNNI
#define LEGACY_AVX512_VNNI 0
#endif

/* F16C converts exactly, like kiln_half_to_float, but in one instruction. */
static inline float half_to_float(kiln_half h) { return _cvtsh_ss(h); }

#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __m128i low_nibbles(__m128i packed) { return _mm_and_si128(packed, _mm_set1_epi8(0x0F)); }

static inline __m128i high_nibbles(__m128i packed) {
    return _mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0F));
}

/* ---- dot products: two blocks per step, the second left zero when the row has an odd block count ---- */

/* The 32 quants of a block in element order, as bytes. */
static inline __m256i nibbles32(const uint8_t *qs) {
    __m128i packed = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_set_m128i(high_nibbles(packed), low_nibbles(packed));
}

static inline __m256i fifth_bits32(const uint8_t *qh) { return _mm256_maskz_set1_epi8(load_u32(qh), 0x10); }

static inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

static inline __m512 join_scales(float lo, float hi) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(lo)), _mm256_set1_ps(hi), 1);
}

#if LEGACY_AVX512_VNNI
/* Sixteen int32 partial sums of unsigned x times signed y. */
ALWAYS_INLINE __m512i dot_u8_i8(__m512i ux, __m512i sy) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), ux, sy);
}
#else
/* Sixteen int32 partial sums of unsigned x times signed y. The int16 step cannot saturate while x <= 128 and
 * |y| <= 127, which every quantizer's output satisfies. */
ALWAYS_INLINE __m512i dot_u8_i8(__m512i ux, __m512i sy) {
    return _mm512_madd_epi16(_mm512_maddubs_epi16(ux, sy), _mm512_set1_epi16(1));
}
#endif

/* Signed times signed: move x's sign onto y so x can be treated as unsigned. */
ALWAYS_INLINE __m512i dot_i8_i8(__m512i x, __m512i y) {
    __m512i y_signed = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), _mm512_setzero_si512(), y);
    return dot_u8_i8(_mm512_abs_epi8(x), y_signed);
}

/* (x - bias) . y for unsigned x, as dot(x, y) - dot(bias, y): cheaper than moving signs, and (without VNNI) the int16
 * step stays within range for any y. */
ALWAYS_INLINE __m512i dot_biased(__m512i ux, __m512i sy, const int bias) {
    const __m512i b = _mm512_set1_epi8((char)bias);
#if LEGACY_AVX512_VNNI
    return _mm512_sub_epi32(dot_u8_i8(ux, sy), dot_u8_i8(b, sy));
#else
    __m512i pairs = _mm512_sub_epi16(_mm512_maddubs_epi16(ux, sy), _mm512_maddubs_epi16(b, sy));
    return _mm512_madd_epi16(pairs, _mm512_set1_epi16(1));
#endif
}

/* The integer block dot of each symmetric type: Q4_0 and Q5_0 quants are unsigned with a bias of 8 and 16. */
ALWAYS_INLINE __m512i dot_q4_0(__m512i qx, __m512i qy) { return dot_biased(qx, qy, 8); }
ALWAYS_INLINE __m512i dot_q5_0(__m512i qx, __m512i qy) { return dot_biased(qx, qy, 16); }
ALWAYS_INLINE __m512i dot_q8_0(__m512i qx, __m512i qy) { return dot_i8_i8(qx, qy); }

static inline float scale_of(kiln_half dx, kiln_half dy) { return half_to_float(dx) * half_to_float(dy); }

static inline __m256i q8_quants(const int8_t *qs) { return _mm256_loadu_si256((const __m256i *)qs); }

/* Weight quants of one block as stored: unsigned for Q4_0/Q5_0 (their bias is applied in the dot), signed for Q8_0. */
static inline __m256i quants_q4_0(const block_q4_0 *b) { return nibbles32(b->qs); }

static inline __m256i quants_q5_0(const block_q5_0 *b) {
    return _mm256_or_si256(nibbles32(b->qs), fifth_bits32(b->qh));
}

static inline __m256i quants_q8_0(const block_q8_0 *b) { return q8_quants(b->qs); }

/* Unsigned weight quants of one block of an offset type. */
static inline __m256i quants_q4_1(const block_q4_1 *b) { return nibbles32(b->qs); }

static inline __m256i quants_q5_1(const block_q5_1 *b) {
    return _mm256_or_si256(nibbles32(b->qs), fifth_bits32(b->qh));
}

/* Offset types add m_x * s_y per block; symmetric types have no such term. */
static inline float offset_q4_1(const block_q4_1 *x, const block_q8_1 *y) {
    return half_to_float(x->m) * half_to_float(y->s);
}
static inline float offset_q5_1(const block_q5_1 *x, const block_q8_1 *y) {
    return half_to_float(x->m) * half_to_float(y->s);
}
static inline float no_offset(const void *x, const void *y) {
    (void)x;
    (void)y;
    return 0.0f;
}

/* The first 4 bytes of 4 blocks, inserted one by one: built any other way, compilers assemble the vector in memory
 * and stall on the reload. */
static inline __m128i heads4(const uint8_t *b, size_t stride) {
    __m128i v = _mm_cvtsi32_si128((int)load_u32(b));
    v = _mm_insert_epi32(v, (int)load_u32(b + stride), 1);
    v = _mm_insert_epi32(v, (int)load_u32(b + 2 * stride), 2);
    return _mm_insert_epi32(v, (int)load_u32(b + 3 * stride), 3);
}

/* The first two halves of 8 consecutive blocks: d and m of offset weights, d and s of Q8_1, d and two quant bytes
 * of the others. */
static inline __m512 block_heads(const void *blocks, size_t stride) {
    const uint8_t *b = blocks;
    return _mm512_cvtph_ps(_mm256_set_m128i(heads4(b + 4 * stride, stride), heads4(b, stride)));
}

/* Permute indices that spread the scale of block 2p over the low half of a vector and of block 2p + 1 over the
 * high half, taken from the even lanes of the head products. */
static inline __m512i pair_pick(int p) {
    return _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(4 * p), _mm512_set1_epi32(4 * p + 2));
}

/* A dot product of weights with Q8_0 or Q8_1 activations. Blocks go in groups of 8, whose scales come from one
 * multiply of their heads: d_x d_y lands in the even lanes and, for offset types, m_x s_y in the odd ones. Each pair
 * of blocks then takes one integer dot and one FMA. Leftover blocks take their scales one by one. */
#define VEC_DOT(name, block_type, act_type, quants, dot, offset, has_offset)                                        \
    ALWAYS_INLINE __m512 name##_pair(const block_type *x, const act_type *y, __m512 d, __m512 acc, const bool pair) { \
        __m512i qx = join(quants(&x[0]), pair ? quants(&x[1]) : _mm256_setzero_si256());                             \
        __m512i qy = join(q8_quants(y[0].qs), pair ? q8_quants(y[1].qs) : _mm256_setzero_si256());                   \
        return _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot(qx, qy)), acc);                                             \
    }                                                                                                                \
    static float name(int64_t n, const void *vx, const void *vy) {                                                  \
        const block_type *x = vx;                                                                                    \
        const act_type *y = vy;                                                                                      \
        const int64_t nb = n / QK8_0;                                                                                \
        const __m512i pick[4] = {pair_pick(0), pair_pick(1), pair_pick(2), pair_pick(3)};                            \
        __m512 acc = _mm512_setzero_ps(), offsets = _mm512_setzero_ps();                                             \
        int64_t i = 0;                                                                                               \
        for (; i + 8 <= nb; i += 8) {                                                                                \
            __m512 products = _mm512_mul_ps(block_heads(x + i, sizeof *x), block_heads(y + i, sizeof *y));           \
            for (int p = 0; p < 4; p++)                                                                              \
                acc = name##_pair(x + i + 2 * p, y + i + 2 * p, _mm512_permutexvar_ps(pick[p], products), acc, true); \
            if (has_offset) offsets = _mm512_mask_add_ps(offsets, 0xAAAA, offsets, products);                        \
        }                                                                                                            \
        float tail_offsets = 0.0f;                                                                                   \
        for (; i < nb; i += 2) {                                                                                     \
            bool pair = i + 1 < nb;                                                                                  \
            __m512 d = join_scales(scale_of(x[i].d, y[i].d), pair ? scale_of(x[i + 1].d, y[i + 1].d) : 0.0f);       \
            acc = name##_pair(x + i, y + i, d, acc, pair);                                                           \
            tail_offsets += offset(&x[i], &y[i]) + (pair ? offset(&x[i + 1], &y[i + 1]) : 0.0f);                     \
        }                                                                                                            \
        return _mm512_reduce_add_ps(acc) + _mm512_reduce_add_ps(offsets) + tail_offsets;                             \
    }

/* VEC_DOT's operations for KILN_DOT_ROWS activation rows at once, the weights' quants and heads unpacked once: per
 * row the same products, FMAs and sums in the same order, so the same bits. */
#define VEC_DOT_ROWS(name, block_type, act_type, quants, dot, offset, has_offset)                                   \
    static void name##_rows(int64_t n, const void *vx, const void *vy, size_t y_stride, float *out) {               \
        const block_type *x = vx;                                                                                    \
        const int64_t nb = n / QK8_0;                                                                                \
        const __m512i pick[4] = {pair_pick(0), pair_pick(1), pair_pick(2), pair_pick(3)};                            \
        __m512 acc[KILN_DOT_ROWS], offsets[KILN_DOT_ROWS];                                                           \
        float tail_offsets[KILN_DOT_ROWS] = {0};                                                                     \
        for (int k = 0; k < KILN_DOT_ROWS; k++) acc[k] = offsets[k] = _mm512_setzero_ps();                           \
        int64_t i = 0;                                                                                               \
        for (; i + 8 <= nb; i += 8) {                                                                                \
            const __m512 heads = block_heads(x + i, sizeof *x);                                                      \
            __m512i qx[4];                                                                                           \
            for (int p = 0; p < 4; p++) qx[p] = join(quants(&x[i + 2 * p]), quants(&x[i + 2 * p + 1]));            \
            for (int k = 0; k < KILN_DOT_ROWS; k++) {                                                                \
                const act_type *y = (const act_type *)((const char *)vy + (size_t)k * y_stride) + i;                 \
                __m512 products = _mm512_mul_ps(heads, block_heads(y, sizeof *y));                                   \
                for (int p = 0; p < 4; p++) {                                                                        \
                    __m512i qy = join(q8_quants(y[2 * p].qs), q8_quants(y[2 * p + 1].qs));                           \
                    acc[k] = _mm512_fmadd_ps(_mm512_permutexvar_ps(pick[p], products),                               \
                                             _mm512_cvtepi32_ps(dot(qx[p], qy)), acc[k]);                            \
                }                                                                                                    \
                if (has_offset) offsets[k] = _mm512_mask_add_ps(offsets[k], 0xAAAA, offsets[k], products);           \
            }                                                                                                        \
        }                                                                                                            \
        for (; i < nb; i += 2) {                                                                                     \
            bool pair = i + 1 < nb;                                                                                  \
            __m512i qx = join(quants(&x[i]), pair ? quants(&x[i + 1]) : _mm256_setzero_si256());                     \
            for (int k = 0; k < KILN_DOT_ROWS; k++) {                                                                \
                const act_type *y = (const act_type *)((const char *)vy + (size_t)k * y_stride) + i;                 \
                __m512i qy = join(q8_quants(y[0].qs), pair ? q8_quants(y[1].qs) : _mm256_setzero_si256());           \
                __m512 d = join_scales(scale_of(x[i].d, y[0].d), pair ? scale_of(x[i + 1].d, y[1].d) : 0.0f);       \
                acc[k] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot(qx, qy)), acc[k]);                                \
                tail_offsets[k] += offset(&x[i], &y[0]) + (pair ? offset(&x[i + 1], &y[1]) : 0.0f);                  \
            }                                                                                                        \
        }                                                                                                            \
        for (int k = 0; k < KILN_DOT_ROWS; k++)                                                                      \
            out[k] = _mm512_reduce_add_ps(acc[k]) + _mm512_reduce_add_ps(offsets[k]) + tail_offsets[k];              \
    }

VEC_DOT(vec_dot_q4_0_q8_0, block_q4_0, block_q8_0, quants_q4_0, dot_q4_0, no_offset, false)
VEC_DOT(vec_dot_q5_0_q8_0, block_q5_0, block_q8_0, quants_q5_0, dot_q5_0, no_offset, false)
VEC_DOT(vec_dot_q8_0_q8_0, block_q8_0, block_q8_0, quants_q8_0, dot_q8_0, no_offset, false)
VEC_DOT(vec_dot_q4_1_q8_1, block_q4_1, block_q8_1, quants_q4_1, dot_u8_i8, offset_q4_1, true)
VEC_DOT(vec_dot_q5_1_q8_1, block_q5_1, block_q8_1, quants_q5_1, dot_u8_i8, offset_q5_1, true)
VEC_DOT_ROWS(vec_dot_q4_0_q8_0, block_q4_0, block_q8_0, quants_q4_0, dot_q4_0, no_offset, false)
VEC_DOT_ROWS(vec_dot_q4_1_q8_1, block_q4_1, block_q8_1, quants_q4_1, dot_u8_i8, offset_q4_1, true)
VEC_DOT_ROWS(vec_dot_q5_0_q8_0, block_q5_0, block_q8_0, quants_q5_0, dot_q5_0, no_offset, false)
VEC_DOT_ROWS(vec_dot_q8_0_q8_0, block_q8_0, block_q8_0, quants_q8_0, dot_q8_0, no_offset, false)
VEC_DOT_ROWS(vec_dot_q5_1_q8_1, block_q5_1, block_q8_1, quants_q5_1, dot_u8_i8, offset_q5_1, true)

#endif

/* The AVX2 pieces of the 32-element block dot products, shared by quant/legacy_avx2.c (vec_dot) and
 * cpu/gemm_avx2.c (several tokens per weight block), so that both do the same arithmetic step for step and a token
 * gets the same bits from either. Defines static functions: include it only in files compiled for AVX2 + F16C. */
#ifndef KILN_QUANT_LEGACY_AVX2_BLOCKS_H
#define KILN_QUANT_LEGACY_AVX2_BLOCKS_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "quant/quant.h"

/* F16C converts exactly, like kiln_half_to_float, but in one instruction. */
static inline float half_to_float(kiln_half h) { return _cvtsh_ss(h); }

/* Element order: low nibbles are elements 0..15, high nibbles 16..31, as in the scalar code. */
static inline __m256i unpack_nibbles(const uint8_t *qs) {
    __m128i packed = _mm_loadu_si128((const __m128i *)qs);
    __m128i mask = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(packed, mask);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    return _mm256_set_m128i(hi, lo);
}

/* Eight int32 partial sums of unsigned x times signed y. Pairs cannot saturate the int16 step while x <= 128 and
 * |y| <= 127, which holds for every quantizer's output. */
static inline __m256i dot_u8_i8(__m256i ux, __m256i sy) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ux, sy), _mm256_set1_epi16(1));
}

/* (x - bias) . y for unsigned x, as dot(x, y) - dot(bias, y): cheaper than moving signs, and the int16 step stays
 * within range for any y. */
static inline __m256i dot_biased(__m256i ux, __m256i sy, int bias) {
    __m256i bias_sums = _mm256_maddubs_epi16(_mm256_set1_epi8((char)bias), sy);
    __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(ux, sy), bias_sums);
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The first two halves of 4 consecutive blocks as 8 floats: d and m of offset weights, d and s of Q8_1, d and two
 * quant bytes of the others. Inserted one by one: built any other way, compilers assemble the vector in memory and
 * stall on the reload. */
static inline __m256 block_heads(const void *blocks, size_t stride) {
    const uint8_t *b = blocks;
    uint32_t w[4];
    for (int k = 0; k < 4; k++) memcpy(&w[k], b + k * stride, sizeof w[k]);
    __m128i v = _mm_cvtsi32_si128((int)w[0]);
    v = _mm_insert_epi32(v, (int)w[1], 1);
    v = _mm_insert_epi32(v, (int)w[2], 2);
    return _mm256_cvtph_ps(_mm_insert_epi32(v, (int)w[3], 3));
}

#endif

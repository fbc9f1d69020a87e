/* Private to the AVX2 and AVX-512 k-quant files (both compile with AVX2): helpers that keep scale unpacking in
 * vector registers. */
#ifndef KILN_QUANT_KQUANT_SIMD_H
#define KILN_QUANT_KQUANT_SIMD_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "quant/blocks.h"

/* Block i of activation row k of a vec_dot_rows call */
static inline const block_q8_K *kquant_row_block(const void *vy, size_t y_stride, int k, int64_t i) {
    return (const block_q8_K *)((const char *)vy + (size_t)k * y_stride) + i;
}

/* The 12 packed bytes of Q4_K/Q5_K scales and mins (see kquant_scale_min_k4) as 16 bytes: 8 scales, then 8 mins.
 * Reads 16 bytes from packed: callers pass x->scales, which the block's quants follow. Word by word, with
 * w0..w2 the packed words: scales 0-3 = w0 & 63, scales 4-7 = low nibbles of w2 | top bits of w0, mins 0-3 =
 * w1 & 63, mins 4-7 = high nibbles of w2 | top bits of w1. */
static inline __m128i kquant_k4_scales_mins(const uint8_t *packed) {
    const __m128i w = _mm_loadu_si128((const __m128i *)packed);
    const __m128i low = _mm_shuffle_epi32(w, 0x98);  /* w0, w2, w1, w2 */
    const __m128i high = _mm_shuffle_epi32(w, 0x50); /* w0, w0, w1, w1 */
    const __m128i lo6 = _mm_and_si128(_mm_srlv_epi32(low, _mm_setr_epi32(0, 0, 0, 4)),
                                      _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i top = _mm_and_si128(_mm_slli_epi32(_mm_srli_epi32(high, 6), 4),
                                      _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo6, top);
}

/* The 16 Q3_K scales (see kquant_unpack_q3_scales) as bytes, their +32 bias still on. Reads exactly the 12 packed
 * bytes: Q3_K blocks end 2 bytes after them. With w0..w2 the packed words: scales 0-3 = low nibbles of w0 | bits
 * 0-1 of w2, 4-7 = low nibbles of w1 | bits 2-3, 8-11 = high nibbles of w0 | bits 4-5, 12-15 = high nibbles of w1 |
 * bits 6-7. */
static inline __m128i kquant_q3_scales(const uint8_t *packed) {
    int32_t w2;
    memcpy(&w2, packed + 8, sizeof w2);
    const __m128i w = _mm_insert_epi32(_mm_loadl_epi64((const __m128i *)packed), w2, 2);
    const __m128i nibbles = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(w, 0x44), _mm_setr_epi32(0, 0, 4, 4)),
                                          _mm_set1_epi32(0x0f0f0f0f));
    const __m128i top = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(w, 0xAA), _mm_setr_epi32(0, 2, 4, 6)),
                                      _mm_set1_epi32(0x03030303));
    return _mm_or_si128(nibbles, _mm_slli_epi32(top, 4));
}

#endif

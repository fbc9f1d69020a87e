/* Private to the k-quant files: the reference quantizers (kquant_quantize.c) that the scalar family registers, and
 * the scale unpacking every ISA's kernels share, so the bit layouts are written down once. */
#ifndef KILN_QUANT_KQUANT_H
#define KILN_QUANT_KQUANT_H

#include <stdint.h>
#include <string.h>

#include "quant/blocks.h"

void kiln_quantize_row_q2_K(const float *src, void *dst, int64_t n);
void kiln_quantize_row_q3_K(const float *src, void *dst, int64_t n);
void kiln_quantize_row_q4_K(const float *src, void *dst, int64_t n);
void kiln_quantize_row_q5_K(const float *src, void *dst, int64_t n);
void kiln_quantize_row_q6_K(const float *src, void *dst, int64_t n);
void kiln_quantize_row_q8_K(const float *src, void *dst, int64_t n);

/* The Q4_K/Q5_K sub-block fit: for each of a block's 8 sub-blocks of 32 weights, the reference's weighted affine
 * search (levels 0..nmax, candidate scales from rmin in nstep steps); writes the scales, mins and levels L. The
 * scalar one lives in kquant_quantize.c; a SIMD one must give the same bits, and then quantizes through these: */
typedef void (*kquant_k4_fit_fn)(const float *x, int nmax, float rmin, int nstep, float scales[8], float mins[8],
                                 uint8_t L[QK_K]);
void kquant_quantize_q4_K_with(const float *src, void *dst, int64_t n, kquant_k4_fit_fn fit);
void kquant_quantize_q5_K_with(const float *src, void *dst, int64_t n, kquant_k4_fit_fn fit);

/* The same for Q2_K: 16 sub-blocks of 16, levels 0..3, weighted absolute error. */
typedef void (*kquant_q2_fit_fn)(const float *x, float scales[16], float mins[16], uint8_t L[QK_K]);
void kquant_quantize_q2_K_with(const float *src, void *dst, int64_t n, kquant_q2_fit_fn fit);

/* And for Q6_K: 16 sub-blocks of 16, symmetric levels stored with their +32 bias (0..63). */
typedef void (*kquant_q6_fit_fn)(const float *x, float scales[16], int8_t L[QK_K]);
void kquant_quantize_q6_K_with(const float *src, void *dst, int64_t n, kquant_q6_fit_fn fit);

/* Q4_K/Q5_K: 8 six-bit scales and 8 six-bit mins in 12 bytes. Bytes 0-3 hold scales 0-3 (low 6 bits) and the top
 * 2 bits of scales 4-7; bytes 4-7 the same for the mins; bytes 8-11 the low nibbles of scales 4-7 (low half) and
 * mins 4-7 (high half). */
static inline void kquant_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* All 8 scales then all 8 mins of a Q4_K/Q5_K block, as bytes. */
static inline void kquant_unpack_k4(const uint8_t *packed, uint8_t out[16]) {
    for (int j = 0; j < 8; j++) kquant_scale_min_k4(j, packed, &out[j], &out[8 + j]);
}

/* Q3_K: 16 six-bit scales stored with a +32 bias. Scale j has its low nibble in byte j%8 (low half for j < 8, high
 * half otherwise) and its top 2 bits in byte 8 + j%4 at bit 2*(j/4). */
static inline void kquant_unpack_q3_scales(const uint8_t *packed, int8_t out[16]) {
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
        int hi = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

#endif

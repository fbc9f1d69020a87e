/* The k-quant dot products with AVX-512, shared by two files: kquant_avx512.c (plain AVX-512 F/BW/VL/DQ) and
 * kquant_avx512vnni.c, which defines KQUANT_AVX512_VNNI to 1 before including this. The dot products work on 64
 * weights per instruction: two 32-weight groups side by side, unpacked to bytes 0..63 by per-half shifts (vpsrlvq).
 * The plain kernels multiply by vpmaddubsw and apply per-sub-block scales by vpmaddwd; the VNNI kernels sum each 4
 * products by vpdpbusd (exact: 4 * 63 * 128 fits in 16 bits) and apply the scales by vpdpwssd against scale words
 * whose upper halves are zero. Min and bias terms go through the activations' bsums; the integer block sums are
 * exact. Only the VNNI file is compiled with -mavx512vnni: the plain one must run on AVX-512 CPUs without it, so the
 * compiler may not fuse its multiply-adds into VNNI instructions. Defines static functions: include it only there. */
#ifndef KILN_QUANT_KQUANT_AVX512_DOT_H
#define KILN_QUANT_KQUANT_AVX512_DOT_H

#include <immintrin.h>
#include <stdbool.h>

#include "quant/kquant.h"
#include "quant/kquant_simd.h"
#include "quant/quant.h"

#ifndef KQUANT_AVX512_VNNI
#define KQUANT_AVX512_VNNI 0
#endif

/* Bit-exactness with the references needs every multiply and add rounded on its own: GCC in ISO C mode never fuses
 * them, clang would (its default contracts even across intrinsics). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* F16C conversion: exact like kiln_half_to_float, without its branches */
static inline float half_to_float(kiln_half h) { return _cvtsh_ss(h); }

/* 32 bytes in both halves of a vector, the low half shifted right by lo bits and the high half by hi bits */
static inline __m512i split_shift(const uint8_t *p, int lo, int hi) {
    const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    const __m512i counts = _mm512_inserti64x4(_mm512_set1_epi64(lo), _mm256_set1_epi64x(hi), 1);
    return _mm512_srlv_epi64(v, counts);
}

static inline __m512i and8(__m512i v, int mask) { return _mm512_and_si512(v, _mm512_set1_epi8((char)mask)); }

/* Q2_K, 64 weights of chunk half h (0..1), shift pair p (0..1): groups 2p and 2p+1 of that half */
static inline __m512i q2_pair(const uint8_t *qs, int h, int p) {
    return and8(split_shift(qs + 32 * h, 4 * p, 4 * p + 2), 3);
}

/* Q3_K: 64 weights as bytes 0..7 (decoded weight = byte - 4); groups 4h + 2p and 4h + 2p + 1 */
static inline __m512i q3_pair(const uint8_t *qs, const uint8_t *hmask, int h, int p) {
    const __m512i lo = q2_pair(qs, h, p);
    const __m512i hi = and8(split_shift(hmask, 4 * h + 2 * p, 4 * h + 2 * p + 1), 1);
    return _mm512_or_si512(lo, _mm512_slli_epi16(hi, 2));
}

/* Q4_K: the 64 weights of sub-blocks 2j and 2j+1 (low nibbles then high nibbles of 32 bytes) */
static inline __m512i q4_pair(const uint8_t *qs, int j) { return and8(split_shift(qs + 32 * j, 0, 4), 0xF); }

static inline __m512i q5_pair(const uint8_t *qs, const uint8_t *qh, int j) {
    const __m512i hi = and8(split_shift(qh, 2 * j, 2 * j + 1), 1);
    return _mm512_or_si512(q4_pair(qs, j), _mm512_slli_epi16(hi, 4));
}

/* Q6_K: 64 weights of chunk c, pair p (p = 0: groups 0,1; p = 1: groups 2,3), bytes 0..63 (weight = byte - 32) */
static inline __m512i q6_pair(const uint8_t *ql, const uint8_t *qh, int p) {
    const __m512i l = _mm512_loadu_si512(ql);
    const __m512i nib = p ? and8(_mm512_srli_epi16(l, 4), 0xF) : and8(l, 0xF);
    const __m512i hi = and8(split_shift(qh, 4 * p, 4 * p + 2), 3);
    return _mm512_or_si512(nib, _mm512_slli_epi16(hi, 4));
}

#if KQUANT_AVX512_VNNI
/* Per-sub-block scales as one int32 per lane (upper 16 bits zero), for vpdpwssd after vpdpbusd */
static inline __m512i scale_words(__m512i scales32) { return _mm512_and_si512(scales32, _mm512_set1_epi32(0xFFFF)); }

/* acc += 64 weights (bytes 0..63) times 64 activations, each 4-byte lane's products times that lane's scale */
static inline __m512i dot64(__m512i acc, __m512i q, const int8_t *q8, __m512i scales) {
    const __m512i y = _mm512_loadu_si512(q8);
    return _mm512_dpwssd_epi32(acc, _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, y), scales);
}
#else
/* Per-sub-block scales for vpmaddwd after vpmaddubsw: the scale in both 16-bit halves of each lane */
static inline __m512i scale_words(__m512i scales32) {
    const __m512i lo = _mm512_and_si512(scales32, _mm512_set1_epi32(0xFFFF));
    return _mm512_or_si512(lo, _mm512_slli_epi32(lo, 16));
}

/* acc += 64 weights (bytes 0..63) times 64 activations, each 4-byte lane's products times that lane's scale */
static inline __m512i dot64(__m512i acc, __m512i q, const int8_t *q8, __m512i scales) {
    const __m512i y = _mm512_loadu_si512(q8);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(q, y), scales));
}
#endif

/* lane l of the result: scales[first + l / per] (per = lanes per sub-block: 8 for 32 weights, 4 for 16) */
static inline __m512i pick_scales(__m512i scales, int first, int per) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(first), _mm512_srli_epi32(lane, per == 8 ? 3 : 2));
    return _mm512_permutexvar_epi32(idx, scales);
}

static inline float block_sum(__m512 acc) { return _mm512_reduce_add_ps(acc); }

/* sum_j scales[j] * bsums[j] over 16 sub-blocks as 8 int32, widened into a zmm */
static inline __m512i bsum_dot(__m128i scale_bytes, const int16_t *bsums, bool is_signed) {
    const __m256i s = is_signed ? _mm256_cvtepi8_epi16(scale_bytes) : _mm256_cvtepu8_epi16(scale_bytes);
    return _mm512_zextsi256_si512(_mm256_madd_epi16(s, _mm256_loadu_si256((const __m256i *)bsums)));
}

static inline float vec_dot_q2_K_impl(int64_t n, const void *vx, const void *vy) {
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    /* the min terms accumulate apart, which halves the loop-carried dependency chain */
    __m512 acc = _mm512_setzero_ps(), acc_m = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i sc = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m512i mins = bsum_dot(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0xF)), y[i].bsums, false);
        const __m512i scales = scale_words(_mm512_cvtepu8_epi32(_mm_and_si128(sc, _mm_set1_epi8(0xF))));
        __m512i sumi = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++)
            for (int p = 0; p < 2; p++) {
                const int g = 2 * h + p;
                sumi = dot64(sumi, q2_pair(x[i].qs, h, p), y[i].qs + 64 * g, pick_scales(scales, 4 * g, 4));
            }
        const float dall = y[i].d * half_to_float(x[i].d);
        const float dmin = y[i].d * half_to_float(x[i].dmin);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(dall), _mm512_cvtepi32_ps(sumi), acc);
        acc_m = _mm512_fmadd_ps(_mm512_set1_ps(dmin), _mm512_cvtepi32_ps(mins), acc_m);
    }
    return block_sum(_mm512_sub_ps(acc, acc_m));
}

static inline float vec_dot_q3_K_impl(int64_t n, const void *vx, const void *vy) {
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i sc = _mm_sub_epi8(kquant_q3_scales(x[i].scales), _mm_set1_epi8(32));
        const __m512i scales = scale_words(_mm512_cvtepi8_epi32(sc));
        /* weights are stored as (0..7) - 4: the -4 goes through the bsums */
        __m512i sumi = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(bsum_dot(sc, y[i].bsums, true), 2));
        for (int h = 0; h < 2; h++)
            for (int p = 0; p < 2; p++) {
                const int g = 2 * h + p;
                sumi = dot64(sumi, q3_pair(x[i].qs, x[i].hmask, h, p), y[i].qs + 64 * g, pick_scales(scales, 4 * g, 4));
            }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(y[i].d * half_to_float(x[i].d)), _mm512_cvtepi32_ps(sumi), acc);
    }
    return block_sum(acc);
}

/* Q4_K/Q5_K mins: each min covers two 16-sums */
static inline __m512i k4_mins(__m128i scales_mins, const int16_t *bsums) {
    const __m128i mins = _mm_unpackhi_epi64(scales_mins, scales_mins);
    const __m256i m = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins, mins)),
                                        _mm256_loadu_si256((const __m256i *)bsums));
    return _mm512_zextsi256_si512(m);
}

static inline float vec_dot_k4_impl(int64_t n, const void *vx, const void *vy, bool five_bits) {
    const uint8_t *xb = vx;
    const block_q8_K *y = vy;
    const size_t size = five_bits ? sizeof(block_q5_K) : sizeof(block_q4_K);
    /* the min terms accumulate apart, which halves the loop-carried dependency chain */
    __m512 acc = _mm512_setzero_ps(), acc_m = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++, xb += size) {
        /* Q4_K and Q5_K share d, dmin and scales at the same offsets; Q5_K adds qh before qs */
        const block_q4_K *x4 = (const block_q4_K *)xb;
        const block_q5_K *x5 = (const block_q5_K *)xb;
        const __m128i scales_mins = kquant_k4_scales_mins(x4->scales);
        const __m512i scales = scale_words(_mm512_cvtepu8_epi32(scales_mins));
        __m512i sumi = _mm512_setzero_si512();
        for (int j = 0; j < QK_K / 64; j++) {
            const __m512i q = five_bits ? q5_pair(x5->qs, x5->qh, j) : q4_pair(x4->qs, j);
            sumi = dot64(sumi, q, y[i].qs + 64 * j, pick_scales(scales, 2 * j, 8));
        }
        const float d = y[i].d * half_to_float(x4->d), dmin = y[i].d * half_to_float(x4->dmin);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
        acc_m = _mm512_fmadd_ps(_mm512_set1_ps(dmin), _mm512_cvtepi32_ps(k4_mins(scales_mins, y[i].bsums)), acc_m);
    }
    return block_sum(_mm512_sub_ps(acc, acc_m));
}

static inline float vec_dot_q6_K_impl(int64_t n, const void *vx, const void *vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i sc = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m512i scales = scale_words(_mm512_cvtepi8_epi32(sc));
        /* weights are stored as (0..63) - 32: the -32 goes through the bsums */
        __m512i sumi = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(bsum_dot(sc, y[i].bsums, true), 5));
        for (int c = 0; c < QK_K / 128; c++)
            for (int p = 0; p < 2; p++) {
                const int g = 2 * c + p;
                sumi = dot64(sumi, q6_pair(x[i].ql + 64 * c, x[i].qh + 32 * c, p), y[i].qs + 64 * g,
                             pick_scales(scales, 4 * g, 4));
            }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(y[i].d * half_to_float(x[i].d)), _mm512_cvtepi32_ps(sumi), acc);
    }
    return block_sum(acc);
}

/* ---- KILN_DOT_ROWS activation rows at once: the same operations per row as the single-row kernels above, the
 * weights' unpacking and scales shared ---- */

static void vec_dot_rows_q2_K(int64_t n, const void *vx, const void *vy, size_t y_stride, float *out) {
    const block_q2_K *x = vx;
    __m512 acc[KILN_DOT_ROWS], acc_m[KILN_DOT_ROWS];
    for (int k = 0; k < KILN_DOT_ROWS; k++) acc[k] = acc_m[k] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i sc = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m128i min_bytes = _mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0xF));
        const __m512i scales = scale_words(_mm512_cvtepu8_epi32(_mm_and_si128(sc, _mm_set1_epi8(0xF))));
        __m512i q[4], scg[4];
        for (int g = 0; g < 4; g++) {
            q[g] = q2_pair(x[i].qs, g / 2, g % 2);
            scg[g] = pick_scales(scales, 4 * g, 4);
        }
        const float xd = half_to_float(x[i].d), xdmin = half_to_float(x[i].dmin);
        for (int k = 0; k < KILN_DOT_ROWS; k++) {
            const block_q8_K *y = kquant_row_block(vy, y_stride, k, i);
            const __m512i mins = bsum_dot(min_bytes, y->bsums, false);
            __m512i sumi = _mm512_setzero_si512();
            for (int g = 0; g < 4; g++) sumi = dot64(sumi, q[g], y->qs + 64 * g, scg[g]);
            acc[k] = _mm512_fmadd_ps(_mm512_set1_ps(y->d * xd), _mm512_cvtepi32_ps(sumi), acc[k]);
            acc_m[k] = _mm512_fmadd_ps(_mm512_set1_ps(y->d * xdmin), _mm512_cvtepi32_ps(mins), acc_m[k]);
        }
    }
    for (int k = 0; k < KILN_DOT_ROWS; k++) out[k] = block_sum(_mm512_sub_ps(acc[k], acc_m[k]));
}

/* Q3_K and Q6_K, per activation row of a block: the four 64-weight groups' scaled dots, less the weights' bias
 * (1 << bias_shift) through the row's bsums, times d. */
static inline void rows_signed_block(__m512 *acc, const __m512i *q, const __m512i *scg, __m128i sc, int bias_shift,
                                     float xd, const void *vy, size_t y_stride, int64_t i) {
    for (int k = 0; k < KILN_DOT_ROWS; k++) {
        const block_q8_K *y = kquant_row_block(vy, y_stride, k, i);
        __m512i sumi = _mm512_sub_epi32(_mm512_setzero_si512(),
                                        _mm512_slli_epi32(bsum_dot(sc, y->bsums, true), bias_shift));
        for (int g = 0; g < 4; g++) sumi = dot64(sumi, q[g], y->qs + 64 * g, scg[g]);
        acc[k] = _mm512_fmadd_ps(_mm512_set1_ps(y->d * xd), _mm512_cvtepi32_ps(sumi), acc[k]);
    }
}

static void vec_dot_rows_q3_K(int64_t n, const void *vx, const void *vy, size_t y_stride, float *out) {
    const block_q3_K *x = vx;
    __m512 acc[KILN_DOT_ROWS];
    for (int k = 0; k < KILN_DOT_ROWS; k++) acc[k] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i sc = _mm_sub_epi8(kquant_q3_scales(x[i].scales), _mm_set1_epi8(32));
        const __m512i scales = scale_words(_mm512_cvtepi8_epi32(sc));
        __m512i q[4], scg[4];
        for (int g = 0; g < 4; g++) {
            q[g] = q3_pair(x[i].qs, x[i].hmask, g / 2, g % 2);
            scg[g] = pick_scales(scales, 4 * g, 4);
        }
        rows_signed_block(acc, q, scg, sc, 2, half_to_float(x[i].d), vy, y_stride, i);
    }
    for (int k = 0; k < KILN_DOT_ROWS; k++) out[k] = block_sum(acc[k]);
}

static inline void vec_dot_rows_k4_impl(int64_t n, const void *vx, const void *vy, size_t y_stride, float *out,
                                        bool five_bits) {
    const uint8_t *xb = vx;
    const size_t size = five_bits ? sizeof(block_q5_K) : sizeof(block_q4_K);
    __m512 acc[KILN_DOT_ROWS], acc_m[KILN_DOT_ROWS];
    for (int k = 0; k < KILN_DOT_ROWS; k++) acc[k] = acc_m[k] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++, xb += size) {
        const block_q4_K *x4 = (const block_q4_K *)xb;
        const block_q5_K *x5 = (const block_q5_K *)xb;
        const __m128i scales_mins = kquant_k4_scales_mins(x4->scales);
        const __m512i scales = scale_words(_mm512_cvtepu8_epi32(scales_mins));
        __m512i q[QK_K / 64], sc[QK_K / 64];
        for (int j = 0; j < QK_K / 64; j++) {
            q[j] = five_bits ? q5_pair(x5->qs, x5->qh, j) : q4_pair(x4->qs, j);
            sc[j] = pick_scales(scales, 2 * j, 8);
        }
        const float xd = half_to_float(x4->d), xdmin = half_to_float(x4->dmin);
        for (int k = 0; k < KILN_DOT_ROWS; k++) {
            const block_q8_K *y = kquant_row_block(vy, y_stride, k, i);
            __m512i sumi = _mm512_setzero_si512();
            for (int j = 0; j < QK_K / 64; j++) sumi = dot64(sumi, q[j], y->qs + 64 * j, sc[j]);
            acc[k] = _mm512_fmadd_ps(_mm512_set1_ps(y->d * xd), _mm512_cvtepi32_ps(sumi), acc[k]);
            acc_m[k] = _mm512_fmadd_ps(_mm512_set1_ps(y->d * xdmin), _mm512_cvtepi32_ps(k4_mins(scales_mins, y->bsums)),
                                       acc_m[k]);
        }
    }
    for (int k = 0; k < KILN_DOT_ROWS; k++) out[k] = block_sum(_mm512_sub_ps(acc[k], acc_m[k]));
}

static void vec_dot_rows_q6_K(int64_t n, const void *vx, const void *vy, size_t y_stride, float *out) {
    const block_q6_K *x = vx;
    __m512 acc[KILN_DOT_ROWS];
    for (int k = 0; k < KILN_DOT_ROWS; k++) acc[k] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i sc = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m512i scales = scale_words(_mm512_cvtepi8_epi32(sc));
        __m512i q[4], scg[4];
        for (int g = 0; g < 4; g++) {
            q[g] = q6_pair(x[i].ql + 64 * (g / 2), x[i].qh + 32 * (g / 2), g % 2);
            scg[g] = pick_scales(scales, 4 * g, 4);
        }
        rows_signed_block(acc, q, scg, sc, 5, half_to_float(x[i].d), vy, y_stride, i);
    }
    for (int k = 0; k < KILN_DOT_ROWS; k++) out[k] = block_sum(acc[k]);
}

static float vec_dot_q2_K(int64_t n, const void *x, const void *y) { return vec_dot_q2_K_impl(n, x, y); }
static float vec_dot_q3_K(int64_t n, const void *x, const void *y) { return vec_dot_q3_K_impl(n, x, y); }
static float vec_dot_q4_K(int64_t n, const void *x, const void *y) { return vec_dot_k4_impl(n, x, y, false); }
static float vec_dot_q5_K(int64_t n, const void *x, const void *y) { return vec_dot_k4_impl(n, x, y, true); }
static float vec_dot_q6_K(int64_t n, const void *x, const void *y) { return vec_dot_q6_K_impl(n, x, y); }

static void vec_dot_rows_q4_K(int64_t n, const void *x, const void *y, size_t y_stride, float *out) {
    vec_dot_rows_k4_impl(n, x, y, y_stride, out, false);
}
static void vec_dot_rows_q5_K(int64_t n, const void *x, const void *y, size_t y_stride, float *out) {
    vec_dot_rows_k4_impl(n, x, y, y_stride, out, true);
}

#endif

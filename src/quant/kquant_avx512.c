/* k-quants with AVX-512 (F/BW/VL/DQ, no VNNI): dequantize, and the plain dot products of kquant_avx512_dot.h.
 * Dequantize is bit-exact with kquant.c (multiply then subtract, never fused). kquant_avx512vnni.c holds the VNNI
 * dot products, which quant.c prefers where cpuid has them. */
#include "quant/kquant_avx512_dot.h"

/* 16 bytes -> 16 floats: dl * q - ml (unsigned) or dl * q (signed) */
static inline void store16_affine(float *dst, __m128i v, float dl, float ml) {
    const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
    _mm512_storeu_ps(dst, _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(dl), f), _mm512_set1_ps(ml)));
}

static inline void store16_signed(float *dst, __m128i v, float dl) {
    _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_set1_ps(dl), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v))));
}

static inline __m128i lane128(__m512i v, int k) {
    switch (k) {
    case 0: return _mm512_castsi512_si128(v);
    case 1: return _mm512_extracti32x4_epi32(v, 1);
    case 2: return _mm512_extracti32x4_epi32(v, 2);
    default: return _mm512_extracti32x4_epi32(v, 3);
    }
}

static void dequantize_row_q2_K(const void *src, float *dst, int64_t n) {
    const block_q2_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = half_to_float(x[i].d), dmin = half_to_float(x[i].dmin);
        const uint8_t *sc = x[i].scales;
        for (int h = 0; h < 2; h++)
            for (int p = 0; p < 2; p++) {
                const __m512i v = q2_pair(x[i].qs, h, p);
                for (int k = 0; k < 4; k++, sc++, dst += 16)
                    store16_affine(dst, lane128(v, k), d * (float)(*sc & 0xF), dmin * (float)(*sc >> 4));
            }
    }
}

static void dequantize_row_q3_K(const void *src, float *dst, int64_t n) {
    const block_q3_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = half_to_float(x[i].d);
        int8_t sc[16];
        kquant_unpack_q3_scales(x[i].scales, sc);
        int is = 0;
        for (int h = 0; h < 2; h++)
            for (int p = 0; p < 2; p++) {
                const __m512i v = _mm512_sub_epi8(q3_pair(x[i].qs, x[i].hmask, h, p), _mm512_set1_epi8(4));
                for (int k = 0; k < 4; k++, is++, dst += 16) store16_signed(dst, lane128(v, k), d * (float)sc[is]);
            }
    }
}

static void dequantize_row_q4_K(const void *src, float *dst, int64_t n) {
    const block_q4_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = half_to_float(x[i].d), dmin = half_to_float(x[i].dmin);
        uint8_t sm[16]; /* 8 scales, then 8 mins */
        _mm_storeu_si128((__m128i *)sm, kquant_k4_scales_mins(x[i].scales));
        for (int j = 0; j < QK_K / 64; j++) {
            const __m512i v = q4_pair(x[i].qs, j);
            for (int k = 0; k < 4; k++, dst += 16) {
                const int s = 2 * j + k / 2;
                store16_affine(dst, lane128(v, k), d * (float)sm[s], dmin * (float)sm[8 + s]);
            }
        }
    }
}

static void dequantize_row_q5_K(const void *src, float *dst, int64_t n) {
    const block_q5_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = half_to_float(x[i].d), dmin = half_to_float(x[i].dmin);
        uint8_t sm[16]; /* 8 scales, then 8 mins */
        _mm_storeu_si128((__m128i *)sm, kquant_k4_scales_mins(x[i].scales));
        for (int j = 0; j < QK_K / 64; j++) {
            const __m512i v = q5_pair(x[i].qs, x[i].qh, j);
            for (int k = 0; k < 4; k++, dst += 16) {
                const int s = 2 * j + k / 2;
                store16_affine(dst, lane128(v, k), d * (float)sm[s], dmin * (float)sm[8 + s]);
            }
        }
    }
}

static void dequantize_row_q6_K(const void *src, float *dst, int64_t n) {
    const block_q6_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = half_to_float(x[i].d);
        const int8_t *sc = x[i].scales;
        for (int c = 0; c < QK_K / 128; c++)
            for (int p = 0; p < 2; p++) {
                const __m512i v = _mm512_sub_epi8(q6_pair(x[i].ql + 64 * c, x[i].qh + 32 * c, p), _mm512_set1_epi8(32));
                for (int k = 0; k < 4; k++, sc++, dst += 16) store16_signed(dst, lane128(v, k), d * (float)*sc);
            }
    }
}

static void dequantize_row_q8_K(const void *src, float *dst, int64_t n) {
    const block_q8_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int l = 0; l < QK_K; l += 16, dst += 16)
            store16_signed(dst, _mm_loadu_si128((const __m128i *)(x[i].qs + l)), x[i].d);
}

static const kiln_quant_entry ENTRIES[] = {
    {KILN_TYPE_Q2_K, {dequantize_row_q2_K, NULL, vec_dot_q2_K, KILN_TYPE_Q8_K, vec_dot_rows_q2_K}},
    {KILN_TYPE_Q3_K, {dequantize_row_q3_K, NULL, vec_dot_q3_K, KILN_TYPE_Q8_K, vec_dot_rows_q3_K}},
    {KILN_TYPE_Q4_K, {dequantize_row_q4_K, NULL, vec_dot_q4_K, KILN_TYPE_Q8_K, vec_dot_rows_q4_K}},
    {KILN_TYPE_Q5_K, {dequantize_row_q5_K, NULL, vec_dot_q5_K, KILN_TYPE_Q8_K, vec_dot_rows_q5_K}},
    {KILN_TYPE_Q6_K, {dequantize_row_q6_K, NULL, vec_dot_q6_K, KILN_TYPE_Q8_K, vec_dot_rows_q6_K}},
    {KILN_TYPE_Q8_K, {dequantize_row_q8_K, NULL, NULL, KILN_TYPE_Q8_K, NULL}},
};

const kiln_quant_family kiln_kquant_avx512_family = {
    "kquant_avx512", KILN_LEVEL_AVX512, ENTRIES, (int)(sizeof ENTRIES / sizeof ENTRIES[0])};

/* AVX-512 kernels (F/BW/VL/DQ, no VNNI) for the 32-element block formats: dequantize, quantize, and the plain dot
 * products of legacy_avx512_dot.h. Dequantize is bit-identical to the scalar reference (no fused multiply-add).
 * legacy_avx512vnni.c holds the VNNI dot products, which quant.c prefers where cpuid has them. */
#include "quant/legacy_avx512_dot.h"

/* ---- dequantize: 16 elements per vector; low nibbles are elements 0..15, high nibbles 16..31 ---- */

static inline void store16(__m128i q, __m512 d, float *dst) {
    _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d));
}

static inline void store16_min(__m128i q, __m512 d, __m512 m, float *dst) {
    _mm512_storeu_ps(dst, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d), m));
}

static void dequantize_row_q4_0(const void *src, float *dst, int64_t n) {
    const block_q4_0 *b = src;
    const __m128i eight = _mm_set1_epi8(8);
    for (int64_t i = 0; i < n / QK4_0; i++, dst += QK4_0) {
        __m128i packed = _mm_loadu_si128((const __m128i *)b[i].qs);
        __m512 d = _mm512_set1_ps(half_to_float(b[i].d));
        store16(_mm_sub_epi8(low_nibbles(packed), eight), d, dst);
        store16(_mm_sub_epi8(high_nibbles(packed), eight), d, dst + 16);
    }
}

static void dequantize_row_q4_1(const void *src, float *dst, int64_t n) {
    const block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK4_1; i++, dst += QK4_1) {
        __m128i packed = _mm_loadu_si128((const __m128i *)b[i].qs);
        __m512 d = _mm512_set1_ps(half_to_float(b[i].d)), m = _mm512_set1_ps(half_to_float(b[i].m));
        store16_min(low_nibbles(packed), d, m, dst);
        store16_min(high_nibbles(packed), d, m, dst + 16);
    }
}

/* Bit i of the mask set means element i has its fifth bit: add 0x10 to exactly those bytes. */
static inline __m128i with_fifth_bits(__m128i q, uint32_t bits16) {
    return _mm_or_si128(q, _mm_maskz_set1_epi8((__mmask16)bits16, 0x10));
}

static void dequantize_row_q5_0(const void *src, float *dst, int64_t n) {
    const block_q5_0 *b = src;
    const __m128i sixteen = _mm_set1_epi8(16);
    for (int64_t i = 0; i < n / QK5_0; i++, dst += QK5_0) {
        __m128i packed = _mm_loadu_si128((const __m128i *)b[i].qs);
        uint32_t qh = load_u32(b[i].qh);
        __m512 d = _mm512_set1_ps(half_to_float(b[i].d));
        store16(_mm_sub_epi8(with_fifth_bits(low_nibbles(packed), qh & 0xFFFF), sixteen), d, dst);
        store16(_mm_sub_epi8(with_fifth_bits(high_nibbles(packed), qh >> 16), sixteen), d, dst + 16);
    }
}

static void dequantize_row_q5_1(const void *src, float *dst, int64_t n) {
    const block_q5_1 *b = src;
    for (int64_t i = 0; i < n / QK5_1; i++, dst += QK5_1) {
        __m128i packed = _mm_loadu_si128((const __m128i *)b[i].qs);
        uint32_t qh = load_u32(b[i].qh);
        __m512 d = _mm512_set1_ps(half_to_float(b[i].d)), m = _mm512_set1_ps(half_to_float(b[i].m));
        store16_min(with_fifth_bits(low_nibbles(packed), qh & 0xFFFF), d, m, dst);
        store16_min(with_fifth_bits(high_nibbles(packed), qh >> 16), d, m, dst + 16);
    }
}

static inline void dequantize_8bit(const int8_t *qs, kiln_half d_half, float *dst) {
    __m512 d = _mm512_set1_ps(half_to_float(d_half));
    store16(_mm_loadu_si128((const __m128i *)qs), d, dst);
    store16(_mm_loadu_si128((const __m128i *)(qs + 16)), d, dst + 16);
}

static void dequantize_row_q8_0(const void *src, float *dst, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK8_0; i++, dst += QK8_0) dequantize_8bit(b[i].qs, b[i].d, dst);
}

static void dequantize_row_q8_1(const void *src, float *dst, int64_t n) {
    const block_q8_1 *b = src;
    for (int64_t i = 0; i < n / QK8_1; i++, dst += QK8_1) dequantize_8bit(b[i].qs, b[i].d, dst);
}

/* ---- quantize Q8_0/Q8_1 (the activation formats), bit-identical to the scalar reference ---- */

/* roundf semantics (ties away from zero; the vector unit's own mode is ties-to-even): truncate, then step one away
 * from zero where the dropped fraction is at least a half. v - trunc(v) is exact, so this matches roundf always. */
static inline __m512 round_half_away(__m512 v) {
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
    __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __m512 step = _mm512_or_ps(_mm512_and_ps(v, _mm512_set1_ps(-0.0f)), _mm512_set1_ps(1.0f));
    return _mm512_mask_add_ps(t, up, t, step);
}

/* Returns d (unrounded) and the sum of the quants. */
static inline float quantize_block_8bit(const float *x, int8_t *qs, int *quant_sum) {
    __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
    float d = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi))) / 127;
    __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    __m512i qlo = _mm512_cvtps_epi32(round_half_away(_mm512_mul_ps(lo, id)));
    __m512i qhi = _mm512_cvtps_epi32(round_half_away(_mm512_mul_ps(hi, id)));
    *quant_sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
    _mm_storeu_si128((__m128i *)qs, _mm512_cvtsepi32_epi8(qlo));
    _mm_storeu_si128((__m128i *)(qs + 16), _mm512_cvtsepi32_epi8(qhi));
    return d;
}

static void quantize_row_q8_0(const float *src, void *dst, int64_t n) {
    block_q8_0 *b = dst;
    int unused;
    for (int64_t i = 0; i < n / QK8_0; i++, src += QK8_0)
        b[i].d = kiln_float_to_half(quantize_block_8bit(src, b[i].qs, &unused));
}

static void quantize_row_q8_1(const float *src, void *dst, int64_t n) {
    block_q8_1 *b = dst;
    for (int64_t i = 0; i < n / QK8_1; i++, src += QK8_1) {
        int sum;
        float d = quantize_block_8bit(src, b[i].qs, &sum);
        b[i].d = kiln_float_to_half(d);
        b[i].s = kiln_float_to_half((float)sum * d);
    }
}

static const kiln_quant_entry ENTRIES[] = {
    {KILN_TYPE_Q4_0, {dequantize_row_q4_0, NULL, vec_dot_q4_0_q8_0, KILN_TYPE_Q8_0, vec_dot_q4_0_q8_0_rows}},
    {KILN_TYPE_Q4_1, {dequantize_row_q4_1, NULL, vec_dot_q4_1_q8_1, KILN_TYPE_Q8_1, vec_dot_q4_1_q8_1_rows}},
    {KILN_TYPE_Q5_0, {dequantize_row_q5_0, NULL, vec_dot_q5_0_q8_0, KILN_TYPE_Q8_0, vec_dot_q5_0_q8_0_rows}},
    {KILN_TYPE_Q5_1, {dequantize_row_q5_1, NULL, vec_dot_q5_1_q8_1, KILN_TYPE_Q8_1, vec_dot_q5_1_q8_1_rows}},
    {KILN_TYPE_Q8_0,
     {dequantize_row_q8_0, quantize_row_q8_0, vec_dot_q8_0_q8_0, KILN_TYPE_Q8_0, vec_dot_q8_0_q8_0_rows}},
    {KILN_TYPE_Q8_1, {dequantize_row_q8_1, quantize_row_q8_1, NULL, KILN_TYPE_Q8_1, NULL}},
};

const kiln_quant_family kiln_legacy_avx512_family = {
    "legacy_avx512", KILN_LEVEL_AVX512, ENTRIES, (int)(sizeof ENTRIES / sizeof ENTRIES[0])};

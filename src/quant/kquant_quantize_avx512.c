/* The Q8_K activation quantizer with AVX-512, byte for byte the reference one of kquant_quantize.c. (The weight
 * quantizers' lane-parallel fits are in kquant_quantize_avx2.c; 8 lanes already match the 8 sub-blocks of Q4_K.) */
#include <immintrin.h>
#include <string.h>

#include "quant/kquant.h"
#include "quant/quant.h"

/* Q8_K activations, byte for byte as kiln_quantize_row_q8_K: the same extreme value (the first of largest
 * magnitude; NaNs are never it unless they come first), the same product iscale * x, rounded half to even by
 * vcvtps2dq like the scalar rounding (a NaN product becomes -127 in both). One vector is one 16-weight sub-block,
 * so its sum is that sub-block's bsum. */
static void quantize_row_q8_K(const float *src, void *dst, int64_t n) {
    block_q8_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        /* vmaxps returns its second operand when either is NaN: NaNs drop out, as in the scalar search */
        __m512 m = _mm512_setzero_ps();
        for (int j = 0; j < QK_K; j += 16) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(src + j)), m);
        const float amax = _mm512_reduce_max_ps(m);
        int first = 0;
        for (int j = 0; j < QK_K; j += 16) {
            const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(src + j)), _mm512_set1_ps(amax),
                                                     _CMP_EQ_OQ);
            if (hit) {
                first = j + __builtin_ctz(hit);
                break;
            }
        }
        const float max = src[first];
        if (amax == 0 || src[0] != src[0] || max != max) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K / 16; j++) {
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_set1_ps(iscale), _mm512_loadu_ps(src + 16 * j)));
            q = _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
            _mm_storeu_si128((__m128i *)(y[i].qs + 16 * j), _mm512_cvtepi32_epi8(q));
            y[i].bsums[j] = (int16_t)_mm512_reduce_add_epi32(q);
        }
        y[i].d = 1 / iscale;
    }
}

static const kiln_quant_entry ENTRIES[] = {
    {KILN_TYPE_Q8_K, {NULL, quantize_row_q8_K, NULL, KILN_TYPE_Q8_K, NULL}},
};

const kiln_quant_family kiln_kquant_quantize_avx512_family = {
    "kquant_quantize_avx512", KILN_LEVEL_AVX512, ENTRIES, (int)(sizeof ENTRIES / sizeof ENTRIES[0])};

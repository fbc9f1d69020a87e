/* k-quants (Q2_K..Q6_K, and Q8_K activations): scalar reference dequantize and vec_dot. Each SIMD kernel is tested
 * against these.
 *
 * Dequantize computes (d * scale) * q - (dmin * min) with one rounding per operation and no fused multiply-add, the
 * same float operations as the gguf package's numpy dequantizer, so the results agree bit for bit.
 *
 * vec_dot pairs a weight row with Q8_K activations: per block the integer sums are exact, and the float part is
 * (wd * ad) * isum - (wdmin * ad) * msum, where msum uses the activation's 16-element sums (bsums) so the min terms
 * cost one small dot per block instead of one per weight. */
#include "quant/kquant.h"
#include "quant/quant.h"

/* Bit-exactness with the references needs every multiply and add rounded on its own: GCC in ISO C mode never fuses
 * them, clang would (its default contracts even across intrinsics). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

static void dequantize_row_q2_K(const void *src, float *dst, int64_t n) {
    const block_q2_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kiln_half_to_float(x[i].d), dmin = kiln_half_to_float(x[i].dmin);
        const uint8_t *q = x[i].qs;
        int is = 0;
        /* each 32 bytes of qs carry 4 bit-planes of 32 weights: 8 sub-blocks of 16 */
        for (int half = 0; half < QK_K / 128; half++, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int part = 0; part < 2; part++, is++) {
                    const float dl = d * (float)(x[i].scales[is] & 0xF);
                    const float ml = dmin * (float)(x[i].scales[is] >> 4);
                    for (int l = 0; l < 16; l++) {
                        const float v = dl * (float)((q[16 * part + l] >> shift) & 3);
                        *dst++ = v - ml;
                    }
                }
            }
        }
    }
}

static void dequantize_row_q3_K(const void *src, float *dst, int64_t n) {
    const block_q3_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kiln_half_to_float(x[i].d);
        int8_t scales[16];
        kquant_unpack_q3_scales(x[i].scales, scales);
        const uint8_t *q = x[i].qs;
        int is = 0, hbit = 0;
        for (int half = 0; half < QK_K / 128; half++, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, hbit++) {
                for (int part = 0; part < 2; part++, is++) {
                    const float dl = d * (float)scales[is];
                    for (int l = 16 * part; l < 16 * part + 16; l++) {
                        /* a clear high bit means the low 2 bits are offset by -4 */
                        const int hi = (x[i].hmask[l] >> hbit) & 1;
                        *dst++ = dl * (float)(((q[l] >> shift) & 3) - (hi ? 0 : 4));
                    }
                }
            }
        }
    }
}

static void dequantize_row_q4_K(const void *src, float *dst, int64_t n) {
    const block_q4_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kiln_half_to_float(x[i].d), dmin = kiln_half_to_float(x[i].dmin);
        uint8_t sm[16];
        kquant_unpack_k4(x[i].scales, sm);
        const uint8_t *q = x[i].qs;
        /* 32 bytes hold two sub-blocks of 32: low nibbles first, then high nibbles */
        for (int j = 0; j < QK_K / 64; j++, q += 32) {
            const float d1 = d * (float)sm[2 * j], m1 = dmin * (float)sm[8 + 2 * j];
            const float d2 = d * (float)sm[2 * j + 1], m2 = dmin * (float)sm[8 + 2 * j + 1];
            for (int l = 0; l < 32; l++) {
                const float v = d1 * (float)(q[l] & 0xF);
                *dst++ = v - m1;
            }
            for (int l = 0; l < 32; l++) {
                const float v = d2 * (float)(q[l] >> 4);
                *dst++ = v - m2;
            }
        }
    }
}

static void dequantize_row_q5_K(const void *src, float *dst, int64_t n) {
    const block_q5_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kiln_half_to_float(x[i].d), dmin = kiln_half_to_float(x[i].dmin);
        uint8_t sm[16];
        kquant_unpack_k4(x[i].scales, sm);
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        /* like Q4_K, plus a fifth bit per weight: bit 2j of qh[l] for the low-nibble sub-block, 2j+1 for the high */
        for (int j = 0; j < QK_K / 64; j++, ql += 32) {
            const float d1 = d * (float)sm[2 * j], m1 = dmin * (float)sm[8 + 2 * j];
            const float d2 = d * (float)sm[2 * j + 1], m2 = dmin * (float)sm[8 + 2 * j + 1];
            for (int l = 0; l < 32; l++) {
                const float v = d1 * (float)((ql[l] & 0xF) | (((qh[l] >> (2 * j)) & 1) << 4));
                *dst++ = v - m1;
            }
            for (int l = 0; l < 32; l++) {
                const float v = d2 * (float)((ql[l] >> 4) | (((qh[l] >> (2 * j + 1)) & 1) << 4));
                *dst++ = v - m2;
            }
        }
    }
}

/* Q6_K: per 128 weights, 64 bytes of low nibbles and 32 bytes of 2-bit high parts; weight l + 32k (k = 0..3) takes
 * its nibble from ql[l + 32 (k & 1)] (low half for k < 2) and its high bits from qh[l] at bit 2k. */
static inline int q6_value(const uint8_t *ql, const uint8_t *qh, int k, int l) {
    const int nib = k < 2 ? ql[l + 32 * k] & 0xF : ql[l + 32 * (k - 2)] >> 4;
    return (nib | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
}

static void dequantize_row_q6_K(const void *src, float *dst, int64_t n) {
    const block_q6_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kiln_half_to_float(x[i].d);
        for (int c = 0; c < QK_K / 128; c++) {
            const uint8_t *ql = x[i].ql + 64 * c, *qh = x[i].qh + 32 * c;
            const int8_t *sc = x[i].scales + 8 * c;
            for (int k = 0; k < 4; k++) {
                for (int l = 0; l < 32; l++) {
                    const float dl = d * (float)sc[2 * k + l / 16];
                    *dst++ = dl * (float)q6_value(ql, qh, k, l);
                }
            }
        }
    }
}

static void dequantize_row_q8_K(const void *src, float *dst, int64_t n) {
    const block_q8_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int l = 0; l < QK_K; l++) *dst++ = x[i].d * (float)x[i].qs[l];
}

/* Sum of each 16-weight sub-block's min times the activations' sum over it. */
static int32_t min_dot_bsums16(const uint8_t *scales, const int16_t *bsums) {
    int32_t s = 0;
    for (int j = 0; j < QK_K / 16; j++) s += (int32_t)(scales[j] >> 4) * bsums[j];
    return s;
}

static float vec_dot_q2_K(int64_t n, const void *vx, const void *vy) {
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const int8_t *q8 = y[i].qs;
        int32_t isum = 0;
        int is = 0;
        for (int half = 0; half < QK_K / 128; half++) {
            const uint8_t *q = x[i].qs + 32 * half;
            for (int shift = 0; shift < 8; shift += 2) {
                for (int part = 0; part < 2; part++, is++, q8 += 16) {
                    int32_t s = 0;
                    for (int l = 0; l < 16; l++) s += ((q[16 * part + l] >> shift) & 3) * q8[l];
                    isum += (x[i].scales[is] & 0xF) * s;
                }
            }
        }
        const float dall = y[i].d * kiln_half_to_float(x[i].d);
        const float dmin = y[i].d * kiln_half_to_float(x[i].dmin);
        sum += dall * (float)isum - dmin * (float)min_dot_bsums16(x[i].scales, y[i].bsums);
    }
    return sum;
}

static float vec_dot_q3_K(int64_t n, const void *vx, const void *vy) {
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t scales[16];
        kquant_unpack_q3_scales(x[i].scales, scales);
        const int8_t *q8 = y[i].qs;
        int32_t isum = 0;
        int is = 0, hbit = 0;
        for (int half = 0; half < QK_K / 128; half++) {
            const uint8_t *q = x[i].qs + 32 * half;
            for (int shift = 0; shift < 8; shift += 2, hbit++) {
                for (int part = 0; part < 2; part++, is++, q8 += 16) {
                    /* weights are (low 2 bits + 4 * high bit) - 4; the -4 goes through the activation sum */
                    int32_t s = 0;
                    for (int l = 0; l < 16; l++) {
                        const int hi = (x[i].hmask[16 * part + l] >> hbit) & 1;
                        s += (((q[16 * part + l] >> shift) & 3) | (hi << 2)) * q8[l];
                    }
                    isum += scales[is] * (s - 4 * y[i].bsums[is]);
                }
            }
        }
        sum += y[i].d * kiln_half_to_float(x[i].d) * (float)isum;
    }
    return sum;
}

static float vec_dot_q4_K(int64_t n, const void *vx, const void *vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sm[16];
        kquant_unpack_k4(x[i].scales, sm);
        const uint8_t *q = x[i].qs;
        const int8_t *q8 = y[i].qs;
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < QK_K / 64; j++, q += 32, q8 += 64) {
            int32_t s1 = 0, s2 = 0;
            for (int l = 0; l < 32; l++) {
                s1 += (q[l] & 0xF) * q8[l];
                s2 += (q[l] >> 4) * q8[l + 32];
            }
            isum += sm[2 * j] * s1 + sm[2 * j + 1] * s2;
        }
        for (int j = 0; j < 8; j++) msum += sm[8 + j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        const float d = y[i].d * kiln_half_to_float(x[i].d);
        const float dmin = y[i].d * kiln_half_to_float(x[i].dmin);
        sum += d * (float)isum - dmin * (float)msum;
    }
    return sum;
}

static float vec_dot_q5_K(int64_t n, const void *vx, const void *vy) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sm[16];
        kquant_unpack_k4(x[i].scales, sm);
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        const int8_t *q8 = y[i].qs;
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < QK_K / 64; j++, ql += 32, q8 += 64) {
            int32_t s1 = 0, s2 = 0;
            for (int l = 0; l < 32; l++) {
                s1 += ((ql[l] & 0xF) | (((qh[l] >> (2 * j)) & 1) << 4)) * q8[l];
                s2 += ((ql[l] >> 4) | (((qh[l] >> (2 * j + 1)) & 1) << 4)) * q8[l + 32];
            }
            isum += sm[2 * j] * s1 + sm[2 * j + 1] * s2;
        }
        for (int j = 0; j < 8; j++) msum += sm[8 + j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        const float d = y[i].d * kiln_half_to_float(x[i].d);
        const float dmin = y[i].d * kiln_half_to_float(x[i].dmin);
        sum += d * (float)isum - dmin * (float)msum;
    }
    return sum;
}

static float vec_dot_q6_K(int64_t n, const void *vx, const void *vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t isum = 0;
        for (int c = 0; c < QK_K / 128; c++) {
            const uint8_t *ql = x[i].ql + 64 * c, *qh = x[i].qh + 32 * c;
            for (int k = 0; k < 4; k++) {
                for (int part = 0; part < 2; part++) {
                    const int is = 8 * c + 2 * k + part;
                    const int8_t *q8 = y[i].qs + 16 * is;
                    /* unbiased weight q - 32: the bias goes through the activation sum */
                    int32_t s = 0;
                    for (int l = 0; l < 16; l++) s += (q6_value(ql, qh, k, 16 * part + l) + 32) * q8[l];
                    isum += x[i].scales[is] * (s - 32 * y[i].bsums[is]);
                }
            }
        }
        sum += y[i].d * kiln_half_to_float(x[i].d) * (float)isum;
    }
    return sum;
}

/* Q8_K is an activation format; its dot with itself exists so the type is complete and round-trips are testable. */
static float vec_dot_q8_K(int64_t n, const void *vx, const void *vy) {
    const block_q8_K *x = vx, *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t s = 0;
        for (int l = 0; l < QK_K; l++) s += x[i].qs[l] * y[i].qs[l];
        sum += x[i].d * y[i].d * (float)s;
    }
    return sum;
}

static const kiln_quant_entry ENTRIES[] = {
    {KILN_TYPE_Q2_K, {dequantize_row_q2_K, kiln_quantize_row_q2_K, vec_dot_q2_K, KILN_TYPE_Q8_K, NULL}},
    {KILN_TYPE_Q3_K, {dequantize_row_q3_K, kiln_quantize_row_q3_K, vec_dot_q3_K, KILN_TYPE_Q8_K, NULL}},
    {KILN_TYPE_Q4_K, {dequantize_row_q4_K, kiln_quantize_row_q4_K, vec_dot_q4_K, KILN_TYPE_Q8_K, NULL}},
    {KILN_TYPE_Q5_K, {dequantize_row_q5_K, kiln_quantize_row_q5_K, vec_dot_q5_K, KILN_TYPE_Q8_K, NULL}},
    {KILN_TYPE_Q6_K, {dequantize_row_q6_K, kiln_quantize_row_q6_K, vec_dot_q6_K, KILN_TYPE_Q8_K, NULL}},
    {KILN_TYPE_Q8_K, {dequantize_row_q8_K, kiln_quantize_row_q8_K, vec_dot_q8_K, KILN_TYPE_Q8_K, NULL}},
};

const kiln_quant_family kiln_kquant_scalar_family = {
    "kquant_scalar", KILN_LEVEL_SCALAR, ENTRIES, (int)(sizeof ENTRIES / sizeof ENTRIES[0])};

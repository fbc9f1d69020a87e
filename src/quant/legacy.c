/* The 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1): scalar reference kernels.
 * Quantizers follow the reference engine's round-to-nearest rules exactly (which rounding, where the reciprocal is
 * taken, what is stored in half), so kiln and gguf's numpy quantizers produce the same bytes.
 * Element order in every block: quant j of the first half sits in the low nibble of qs[j], quant j of the second
 * half in the high nibble; for 5-bit types bit j of qh is the fifth bit of element j. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "quant/quant.h"

#define HALF (QK4_0 / 2)

static int min_int(int a, int b) { return a < b ? a : b; }

/* The element with the largest magnitude, sign kept: symmetric formats map it to the most negative quant. */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static void min_max(const float *x, int n, float *min, float *max) {
    *min = FLT_MAX;
    *max = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < *min) *min = x[j];
        if (x[j] > *max) *max = x[j];
    }
}

/* ---- Q4_0: x = d * (q - 8) ---- */

static void dequantize_row_q4_0(const void *src, float *dst, int64_t n) {
    const block_q4_0 *b = src;
    for (int64_t i = 0; i < n / QK4_0; i++, dst += QK4_0) {
        float d = kiln_half_to_float(b[i].d);
        for (int j = 0; j < HALF; j++) {
            dst[j] = (float)((b[i].qs[j] & 0x0F) - 8) * d;
            dst[j + HALF] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void quantize_row_q4_0(const float *src, void *dst, int64_t n) {
    block_q4_0 *b = dst;
    for (int64_t i = 0; i < n / QK4_0; i++, src += QK4_0) {
        float d = signed_absmax(src, QK4_0) / -8;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = kiln_float_to_half(d);
        for (int j = 0; j < HALF; j++) {
            int q0 = min_int(15, (int)(src[j] * id + 8.5f));
            int q1 = min_int(15, (int)(src[j + HALF] * id + 8.5f));
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static float vec_dot_q4_0_q8_0(int64_t n, const void *vx, const void *vy) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK4_0; i++) {
        int sumi = 0;
        for (int j = 0; j < HALF; j++) {
            sumi += ((x[i].qs[j] & 0x0F) - 8) * y[i].qs[j];
            sumi += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + HALF];
        }
        sum += (float)sumi * (kiln_half_to_float(x[i].d) * kiln_half_to_float(y[i].d));
    }
    return sum;
}

/* ---- Q4_1: x = d * q + m ---- */

static void dequantize_row_q4_1(const void *src, float *dst, int64_t n) {
    const block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK4_1; i++, dst += QK4_1) {
        float d = kiln_half_to_float(b[i].d), m = kiln_half_to_float(b[i].m);
        for (int j = 0; j < HALF; j++) {
            dst[j] = (float)(b[i].qs[j] & 0x0F) * d + m;
            dst[j + HALF] = (float)(b[i].qs[j] >> 4) * d + m;
        }
    }
}

static void quantize_row_q4_1(const float *src, void *dst, int64_t n) {
    block_q4_1 *b = dst;
    for (int64_t i = 0; i < n / QK4_1; i++, src += QK4_1) {
        float min, max;
        min_max(src, QK4_1, &min, &max);
        float d = (max - min) / 15;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = kiln_float_to_half(d);
        b[i].m = kiln_float_to_half(min);
        for (int j = 0; j < HALF; j++) {
            int q0 = min_int(15, (int)((src[j] - min) * id + 0.5f));
            int q1 = min_int(15, (int)((src[j + HALF] - min) * id + 0.5f));
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* sum(d_x q_x + m_x)(d_y q_y) = d_x d_y sum(q_x q_y) + m_x s_y, with s_y = d_y sum(q_y) stored in the Q8_1 block */
static float vec_dot_q4_1_q8_1(int64_t n, const void *vx, const void *vy) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK4_1; i++) {
        int sumi = 0;
        for (int j = 0; j < HALF; j++) {
            sumi += (x[i].qs[j] & 0x0F) * y[i].qs[j];
            sumi += (x[i].qs[j] >> 4) * y[i].qs[j + HALF];
        }
        sum += (float)sumi * (kiln_half_to_float(x[i].d) * kiln_half_to_float(y[i].d)) +
               kiln_half_to_float(x[i].m) * kiln_half_to_float(y[i].s);
    }
    return sum;
}

/* ---- Q5_0: x = d * (q - 16), q's fifth bit in qh ---- */

static uint32_t load_qh(const uint8_t qh[4]) {
    uint32_t v;
    memcpy(&v, qh, sizeof v);
    return v;
}

/* The two 5-bit quants of byte j: element j and element j + 16. */
static void unpack_q5(const uint8_t *qs, uint32_t qh, int j, int *q0, int *q1) {
    *q0 = (qs[j] & 0x0F) | (int)(((qh >> j) & 1u) << 4);
    *q1 = (qs[j] >> 4) | (int)(((qh >> (j + HALF)) & 1u) << 4);
}

static uint32_t pack_q5(uint8_t *qs, const int *q) {
    uint32_t qh = 0;
    for (int j = 0; j < HALF; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0F) | ((q[j + HALF] & 0x0F) << 4));
        qh |= (uint32_t)(q[j] >> 4) << j;
        qh |= (uint32_t)(q[j + HALF] >> 4) << (j + HALF);
    }
    return qh;
}

static void dequantize_row_q5_0(const void *src, float *dst, int64_t n) {
    const block_q5_0 *b = src;
    for (int64_t i = 0; i < n / QK5_0; i++, dst += QK5_0) {
        float d = kiln_half_to_float(b[i].d);
        uint32_t qh = load_qh(b[i].qh);
        for (int j = 0; j < HALF; j++) {
            int q0, q1;
            unpack_q5(b[i].qs, qh, j, &q0, &q1);
            dst[j] = (float)(q0 - 16) * d;
            dst[j + HALF] = (float)(q1 - 16) * d;
        }
    }
}

static void quantize_row_q5_0(const float *src, void *dst, int64_t n) {
    block_q5_0 *b = dst;
    for (int64_t i = 0; i < n / QK5_0; i++, src += QK5_0) {
        float d = signed_absmax(src, QK5_0) / -16;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[QK5_0];
        for (int j = 0; j < QK5_0; j++) q[j] = min_int(31, (int)(src[j] * id + 16.5f));
        b[i].d = kiln_float_to_half(d);
        uint32_t qh = pack_q5(b[i].qs, q);
        memcpy(b[i].qh, &qh, sizeof qh);
    }
}

static float vec_dot_q5_0_q8_0(int64_t n, const void *vx, const void *vy) {
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK5_0; i++) {
        uint32_t qh = load_qh(x[i].qh);
        int sumi = 0;
        for (int j = 0; j < HALF; j++) {
            int q0, q1;
            unpack_q5(x[i].qs, qh, j, &q0, &q1);
            sumi += (q0 - 16) * y[i].qs[j] + (q1 - 16) * y[i].qs[j + HALF];
        }
        sum += (float)sumi * (kiln_half_to_float(x[i].d) * kiln_half_to_float(y[i].d));
    }
    return sum;
}

/* ---- Q5_1: x = d * q + m ---- */

static void dequantize_row_q5_1(const void *src, float *dst, int64_t n) {
    const block_q5_1 *b = src;
    for (int64_t i = 0; i < n / QK5_1; i++, dst += QK5_1) {
        float d = kiln_half_to_float(b[i].d), m = kiln_half_to_float(b[i].m);
        uint32_t qh = load_qh(b[i].qh);
        for (int j = 0; j < HALF; j++) {
            int q0, q1;
            unpack_q5(b[i].qs, qh, j, &q0, &q1);
            dst[j] = (float)q0 * d + m;
            dst[j + HALF] = (float)q1 * d + m;
        }
    }
}

static void quantize_row_q5_1(const float *src, void *dst, int64_t n) {
    block_q5_1 *b = dst;
    for (int64_t i = 0; i < n / QK5_1; i++, src += QK5_1) {
        float min, max;
        min_max(src, QK5_1, &min, &max);
        float d = (max - min) / 31;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[QK5_1];
        for (int j = 0; j < QK5_1; j++) q[j] = min_int(31, (int)((src[j] - min) * id + 0.5f));
        b[i].d = kiln_float_to_half(d);
        b[i].m = kiln_float_to_half(min);
        uint32_t qh = pack_q5(b[i].qs, q);
        memcpy(b[i].qh, &qh, sizeof qh);
    }
}

static float vec_dot_q5_1_q8_1(int64_t n, const void *vx, const void *vy) {
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK5_1; i++) {
        uint32_t qh = load_qh(x[i].qh);
        int sumi = 0;
        for (int j = 0; j < HALF; j++) {
            int q0, q1;
            unpack_q5(x[i].qs, qh, j, &q0, &q1);
            sumi += q0 * y[i].qs[j] + q1 * y[i].qs[j + HALF];
        }
        sum += (float)sumi * (kiln_half_to_float(x[i].d) * kiln_half_to_float(y[i].d)) +
               kiln_half_to_float(x[i].m) * kiln_half_to_float(y[i].s);
    }
    return sum;
}

/* ---- Q8_0 and Q8_1: x = d * q, rounded to nearest (ties away from zero) ---- */

static void dequantize_row_q8_0(const void *src, float *dst, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK8_0; i++, dst += QK8_0) {
        float d = kiln_half_to_float(b[i].d);
        for (int j = 0; j < QK8_0; j++) dst[j] = (float)b[i].qs[j] * d;
    }
}

/* Returns d (before it is rounded to half) after writing the 32 quants. */
static float quantize_block_8bit(const float *x, int8_t *qs) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK8_0; j++) qs[j] = (int8_t)roundf(x[j] * id);
    return d;
}

static void quantize_row_q8_0(const float *src, void *dst, int64_t n) {
    block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK8_0; i++, src += QK8_0)
        b[i].d = kiln_float_to_half(quantize_block_8bit(src, b[i].qs));
}

static float vec_dot_q8_0_q8_0(int64_t n, const void *vx, const void *vy) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int sumi = 0;
        for (int j = 0; j < QK8_0; j++) sumi += x[i].qs[j] * y[i].qs[j];
        sum += (float)sumi * (kiln_half_to_float(x[i].d) * kiln_half_to_float(y[i].d));
    }
    return sum;
}

static void dequantize_row_q8_1(const void *src, float *dst, int64_t n) {
    const block_q8_1 *b = src;
    for (int64_t i = 0; i < n / QK8_1; i++, dst += QK8_1) {
        float d = kiln_half_to_float(b[i].d);
        for (int j = 0; j < QK8_1; j++) dst[j] = (float)b[i].qs[j] * d;
    }
}

/* s is d (unrounded) times the quant sum, as the reference stores it */
static void quantize_row_q8_1(const float *src, void *dst, int64_t n) {
    block_q8_1 *b = dst;
    for (int64_t i = 0; i < n / QK8_1; i++, src += QK8_1) {
        float d = quantize_block_8bit(src, b[i].qs);
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) sum += b[i].qs[j];
        b[i].d = kiln_float_to_half(d);
        b[i].s = kiln_float_to_half((float)sum * d);
    }
}

/* Q8_1 is only ever an activation format, so it has no vec_dot of its own (as in the reference engine). */
static const kiln_quant_entry ENTRIES[] = {
    {KILN_TYPE_Q4_0, {dequantize_row_q4_0, quantize_row_q4_0, vec_dot_q4_0_q8_0, KILN_TYPE_Q8_0, NULL}},
    {KILN_TYPE_Q4_1, {dequantize_row_q4_1, quantize_row_q4_1, vec_dot_q4_1_q8_1, KILN_TYPE_Q8_1, NULL}},
    {KILN_TYPE_Q5_0, {dequantize_row_q5_0, quantize_row_q5_0, vec_dot_q5_0_q8_0, KILN_TYPE_Q8_0, NULL}},
    {KILN_TYPE_Q5_1, {dequantize_row_q5_1, quantize_row_q5_1, vec_dot_q5_1_q8_1, KILN_TYPE_Q8_1, NULL}},
    {KILN_TYPE_Q8_0, {dequantize_row_q8_0, quantize_row_q8_0, vec_dot_q8_0_q8_0, KILN_TYPE_Q8_0, NULL}},
    {KILN_TYPE_Q8_1, {dequantize_row_q8_1, quantize_row_q8_1, NULL, KILN_TYPE_Q8_1, NULL}},
};

const kiln_quant_family kiln_legacy_scalar_family = {
    "legacy_scalar", KILN_LEVEL_SCALAR, ENTRIES, (int)(sizeof ENTRIES / sizeof ENTRIES[0])};

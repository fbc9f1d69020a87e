/* k-quant reference quantizers from F32 (no importance matrix), following the reference engine's algorithms so that
 * files kiln writes quantize the same way:
 * - Q2_K, Q4_K, Q5_K: per sub-block an affine fit (scale, min) searched over a few candidate scales, minimizing a
 *   weighted error (Q2_K: weighted absolute error, weights |x|; Q4_K/Q5_K: squared error, weights rms + |x|);
 * - Q3_K: a symmetric fit refined one weight at a time, weights x^2;
 * - Q6_K: a symmetric fit searched over 19 candidate scales, weights x^2;
 * then the sub-block scales (and mins) are themselves quantized against one half-precision super-block scale, and
 * every weight is re-quantized with the scale it will actually be decoded with.
 * Q8_K: d = max|x| / 127 with the sign of the extreme value folded in, plus the 16-element sums. */
#include <math.h>

#include "quant/kquant.h"

/* Bit-exactness with the references needs every multiply and add rounded on its own: GCC in ISO C mode never fuses
 * them, clang would (its default contracts even across intrinsics). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* below this a group counts as all zeros */
#define GROUP_MAX_EPS 1e-15f

/* Round half to even: adding 1.5 * 2^23 leaves the rounded integer in the low mantissa bits (valid for |v| < 2^22).
 * The clamp keeps huge or NaN inputs defined; callers clamp to the quant range afterwards anyway. */
static inline int nearest_int(float v) {
    if (!(v > -4194303.0f)) v = -4194303.0f;
    if (v > 4194303.0f) v = 4194303.0f;
    const float shifted = v + 12582912.0f;
    int32_t bits;
    memcpy(&bits, &shifted, sizeof bits);
    return (bits & 0x007fffff) - 0x00400000;
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The affine search: x ~ scale * L - min with L in [0, nmax] and min >= 0 (returned in *the_min). Starts from the
 * plain range fit, then tries iscale = (nmax + rmin + rdelta * is) / range for is = 0..nstep, each time solving the
 * weighted least-squares (scale, min) for the levels it gives, and keeps the best. */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min,
                              uint8_t *Laux, float rmin, float rdelta, int nstep, int use_mad) {
    float min = x[0], max = x[0], sum_w = w[0], sum_x = w[0] * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1 / iscale;
    float best_err = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * L[i] + min - x[i];
        best_err += w[i] * (use_mad ? fabsf(diff) : diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0)) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0) {
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            float diff = this_scale * Laux[i] + this_min - x[i];
            err += w[i] * (use_mad ? fabsf(diff) : diff * diff);
        }
        if (err < best_err) {
            memcpy(L, Laux, (size_t)n);
            best_err = err;
            scale = this_scale;
            min = this_min;
        }
    }
    *the_min = -min;
    return scale;
}

/* Index of the element with the largest magnitude (the first one on ties). */
static int argmax_abs(int n, const float *x) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (fabsf(x[i]) > fabsf(x[best])) best = i;
    return best;
}

/* Weighted squared-error sums of the symmetric levels l = round(iscale * x) clamped to [-nmax, nmax - 1]. */
static void sym_levels(int n, int nmax, const float *x, float iscale, int8_t *L, float *sumlx, float *suml2) {
    *sumlx = *suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        float w = x[i] * x[i];
        if (L) L[i] = (int8_t)(l + nmax);
        *sumlx += w * x[i] * (float)l;
        *suml2 += w * (float)l * (float)l;
    }
}

/* Symmetric fit for Q6_K: x ~ scale * (L - nmax), weights x^2, trying iscale = -(nmax + 0.1 is) / max for
 * is = -9..9 and keeping the scale with the smallest weighted error. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    const float max = x[argmax_abs(n, x)];
    if (fabsf(max) < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float sumlx, suml2;
    sym_levels(n, nmax, x, -(float)nmax / max, L, &sumlx, &suml2);
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        float iscale = -((float)nmax + 0.1f * (float)is) / max;
        sym_levels(n, nmax, x, iscale, NULL, &sumlx, &suml2);
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            sym_levels(n, nmax, x, iscale, L, &sumlx, &suml2);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Symmetric fit for Q3_K: start from the range fit, then up to 5 passes that move single weights to the level the
 * current least-squares scale prefers whenever that lowers the weighted error (weights x^2). */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
    const float max = x[argmax_abs(n, x)];
    if (fabsf(max) < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    const float iscale = -(float)nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (!(slx > 0)) continue;
            float sl2 = suml2 - w * (float)L[i] * (float)L[i];
            int new_l = clampi(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
            if (new_l == L[i]) continue;
            slx += w * x[i] * (float)new_l;
            sl2 += w * (float)new_l * (float)new_l;
            if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (int8_t)new_l;
                sumlx = slx;
                suml2 = sl2;
                n_changed++;
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0 ? sumlx / suml2 : 0.0f;
}

/* The scalar Q2_K fit: each sub-block of 16 gets the affine search minimizing the |x|-weighted absolute error. */
static void fit_q2_scalar(const float *x, float *scales, float *mins, uint8_t *L) {
    float weights[16];
    uint8_t Laux[16];
    for (int j = 0; j < QK_K / 16; j++) {
        for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
        scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, 1);
    }
}

void kquant_quantize_q2_K_with(const float *src, void *dst, int64_t n, kquant_q2_fit_fn fit) {
    block_q2_K *y = dst;
    const float q4scale = 15.0f;
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        uint8_t L[QK_K];
        float mins[QK_K / 16], scales[QK_K / 16], max_scale = 0, max_min = 0;
        fit(src, scales, mins, L);
        for (int j = 0; j < QK_K / 16; j++) {
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        memset(y[i].scales, 0, sizeof y[i].scales);
        y[i].d = y[i].dmin = 0;
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; j++)
                y[i].scales[j] = (uint8_t)clampi(nearest_int(iscale * scales[j]), 0, 15);
            y[i].d = kiln_float_to_half(max_scale / q4scale);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; j++)
                y[i].scales[j] |= (uint8_t)(clampi(nearest_int(iscale * mins[j]), 0, 15) << 4);
            y[i].dmin = kiln_float_to_half(max_min / q4scale);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = kiln_half_to_float(y[i].d) * (float)(y[i].scales[j] & 0xF);
            if (!d) continue;
            const float dm = kiln_half_to_float(y[i].dmin) * (float)(y[i].scales[j] >> 4);
            for (int l = 0; l < 16; l++) L[16 * j + l] = (uint8_t)clampi(nearest_int((src[16 * j + l] + dm) / d), 0, 3);
        }
        for (int j = 0; j < QK_K; j += 128)
            for (int l = 0; l < 32; l++)
                y[i].qs[j / 4 + l] =
                    (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
    }
}

void kiln_quantize_row_q2_K(const float *src, void *dst, int64_t n) {
    kquant_quantize_q2_K_with(src, dst, n, fit_q2_scalar);
}

/* Packs Q3_K's 16 biased 6-bit scales (see kquant_unpack_q3_scales). */
static void pack_q3_scales(const int *ls, uint8_t *packed) {
    memset(packed, 0, 12);
    for (int j = 0; j < 16; j++) {
        if (j < 8)
            packed[j] = (uint8_t)(ls[j] & 0xF);
        else
            packed[j - 8] |= (uint8_t)((ls[j] & 0xF) << 4);
        packed[8 + j % 4] |= (uint8_t)((ls[j] >> 4) << (2 * (j / 4)));
    }
}

void kiln_quantize_row_q3_K(const float *src, void *dst, int64_t n) {
    block_q3_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        int8_t L[QK_K];
        float scales[QK_K / 16];
        for (int j = 0; j < QK_K / 16; j++) scales[j] = make_q3_quants(16, 4, src + 16 * j, L + 16 * j);
        const float max_scale = scales[argmax_abs(QK_K / 16, scales)];
        int ls[QK_K / 16] = {0};
        y[i].d = 0;
        if (max_scale != 0) {
            const float iscale = -32.0f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) ls[j] = clampi(nearest_int(iscale * scales[j]), -32, 31) + 32;
            y[i].d = kiln_float_to_half(1 / iscale);
        }
        pack_q3_scales(ls, y[i].scales);
        int8_t sc[16];
        kquant_unpack_q3_scales(y[i].scales, sc);
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = kiln_half_to_float(y[i].d) * (float)sc[j];
            if (!d) continue;
            for (int l = 0; l < 16; l++) L[16 * j + l] = (int8_t)(clampi(nearest_int(src[16 * j + l] / d), -4, 3) + 4);
        }
        /* the third bit of weight j goes to hmask[j % 32] at bit j / 32 */
        memset(y[i].hmask, 0, sizeof y[i].hmask);
        for (int j = 0; j < QK_K; j++) {
            if (L[j] > 3) {
                y[i].hmask[j % 32] |= (uint8_t)(1 << (j / 32));
                L[j] = (int8_t)(L[j] - 4);
            }
        }
        for (int j = 0; j < QK_K; j += 128)
            for (int l = 0; l < 32; l++)
                y[i].qs[j / 4 + l] =
                    (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
    }
}

/* Packs 8 six-bit scales and mins the way kquant_scale_min_k4 reads them. */
static void pack_k4_scales(const int *ls, const int *lm, uint8_t *q) {
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            q[j] = (uint8_t)ls[j];
            q[j + 4] = (uint8_t)lm[j];
        } else {
            q[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            q[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            q[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

/* The scalar Q4_K/Q5_K fit: each sub-block of 32 gets the affine search with weights rms(x) + |x|. */
static void fit_k4_scalar(const float *x, int nmax, float rmin, int nstep, float *scales, float *mins, uint8_t *L) {
    float weights[32];
    uint8_t Laux[32];
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, 0);
    }
}

/* The Q4_K/Q5_K block head: fits the sub-blocks, quantizes scales and mins to 6 bits, then fills L (levels
 * 0..nmax) using the decoded scales. */
static void quantize_k4_head(const float *x, int nmax, float rmin, int nstep, kquant_k4_fit_fn fit, kiln_half *dh,
                             kiln_half *dminh, uint8_t *packed, uint8_t *L) {
    float scales[8], mins[8], max_scale = 0, max_min = 0;
    fit(x, nmax, rmin, nstep, scales, mins, L);
    for (int j = 0; j < 8; j++) {
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    int ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = clampi(nearest_int(inv_scale * scales[j]), 0, 63);
        lm[j] = clampi(nearest_int(inv_min * mins[j]), 0, 63);
    }
    pack_k4_scales(ls, lm, packed);
    *dh = kiln_float_to_half(max_scale / 63.0f);
    *dminh = kiln_float_to_half(max_min / 63.0f);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        kquant_scale_min_k4(j, packed, &sc, &m);
        const float d = kiln_half_to_float(*dh) * (float)sc;
        if (!d) continue;
        const float dm = kiln_half_to_float(*dminh) * (float)m;
        for (int l = 0; l < 32; l++) L[32 * j + l] = (uint8_t)clampi(nearest_int((x[32 * j + l] + dm) / d), 0, nmax);
    }
}

void kquant_quantize_q4_K_with(const float *src, void *dst, int64_t n, kquant_k4_fit_fn fit) {
    block_q4_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        uint8_t L[QK_K];
        quantize_k4_head(src, 15, -1.0f, 20, fit, &y[i].d, &y[i].dmin, y[i].scales, L);
        for (int j = 0; j < QK_K / 64; j++)
            for (int l = 0; l < 32; l++) y[i].qs[32 * j + l] = (uint8_t)(L[64 * j + l] | (L[64 * j + l + 32] << 4));
    }
}

void kquant_quantize_q5_K_with(const float *src, void *dst, int64_t n, kquant_k4_fit_fn fit) {
    block_q5_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        uint8_t L[QK_K];
        quantize_k4_head(src, 31, -0.5f, 15, fit, &y[i].d, &y[i].dmin, y[i].scales, L);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int j = 0; j < QK_K / 64; j++) {
            for (int l = 0; l < 32; l++) {
                const int l1 = L[64 * j + l], l2 = L[64 * j + l + 32];
                y[i].qh[l] |= (uint8_t)(((l1 >> 4) << (2 * j)) | ((l2 >> 4) << (2 * j + 1)));
                y[i].qs[32 * j + l] = (uint8_t)((l1 & 0xF) | ((l2 & 0xF) << 4));
            }
        }
    }
}

void kiln_quantize_row_q4_K(const float *src, void *dst, int64_t n) {
    kquant_quantize_q4_K_with(src, dst, n, fit_k4_scalar);
}

void kiln_quantize_row_q5_K(const float *src, void *dst, int64_t n) {
    kquant_quantize_q5_K_with(src, dst, n, fit_k4_scalar);
}

/* The scalar Q6_K fit: each sub-block of 16 gets the symmetric search. */
static void fit_q6_scalar(const float *x, float *scales, int8_t *L) {
    for (int j = 0; j < QK_K / 16; j++) scales[j] = make_qx_quants(16, 32, x + 16 * j, L + 16 * j);
}

void kiln_quantize_row_q6_K(const float *src, void *dst, int64_t n) {
    kquant_quantize_q6_K_with(src, dst, n, fit_q6_scalar);
}

void kquant_quantize_q6_K_with(const float *src, void *dst, int64_t n, kquant_q6_fit_fn fit) {
    block_q6_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        int8_t L[QK_K];
        float scales[QK_K / 16];
        fit(src, scales, L);
        const float max_scale = scales[argmax_abs(QK_K / 16, scales)];
        if (fabsf(max_scale) < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -128.0f / max_scale;
        y[i].d = kiln_float_to_half(1 / iscale);
        for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = (int8_t)clampi(nearest_int(iscale * scales[j]), -128, 127);
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = kiln_half_to_float(y[i].d) * (float)y[i].scales[j];
            if (!d) continue;
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (int8_t)(clampi(nearest_int(src[16 * j + l] / d), -32, 31) + 32);
        }
        for (int c = 0; c < QK_K / 128; c++) {
            const int8_t *Lc = L + 128 * c;
            uint8_t *ql = y[i].ql + 64 * c, *qh = y[i].qh + 32 * c;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((Lc[l] & 0xF) | ((Lc[l + 64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((Lc[l + 32] & 0xF) | ((Lc[l + 96] & 0xF) << 4));
                qh[l] = (uint8_t)((Lc[l] >> 4) | ((Lc[l + 32] >> 4) << 2) | ((Lc[l + 64] >> 4) << 4) |
                                  ((Lc[l + 96] >> 4) << 6));
            }
        }
    }
}

void kiln_quantize_row_q8_K(const float *src, void *dst, int64_t n) {
    block_q8_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        const float max = src[argmax_abs(QK_K, src)];
        if (max == 0 || max != max) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        /* -127/max rather than -128/max keeps every value in [-127, 127], which the SIMD dot products rely on */
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) y[i].qs[j] = (int8_t)clampi(nearest_int(iscale * src[j]), -127, 127);
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

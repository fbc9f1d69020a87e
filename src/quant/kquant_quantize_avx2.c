/* k-quant quantizers with AVX2, byte for byte the reference ones of kquant_quantize.c:
 * - Q8_K activations, 8 weights per instruction;
 * - Q2_K, Q4_K, Q5_K and Q6_K: the expensive part, the per-sub-block search, runs with one sub-block per lane, each
 *   lane doing the reference's operations in the reference's order (running sums, no fused multiply-add), so 8
 *   sub-blocks are fitted at once with the same bits; the rest of the block is the scalar code's.
 * Q3_K's fit is cheap and stays scalar. */
#include <immintrin.h>
#include <string.h>

#include "quant/kquant.h"
#include "quant/quant.h"

/* Bit-exactness with the references needs every multiply and add rounded on its own: GCC in ISO C mode never fuses
 * them, clang would (its default contracts even across intrinsics). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* Q8_K activations, byte for byte as kiln_quantize_row_q8_K: the same extreme value (the first of largest
 * magnitude; NaNs are never it unless they come first), the same product iscale * x, rounded half to even by
 * vcvtps2dq like the scalar rounding (a NaN product becomes -127 in both). */
static int first_index_of_abs(const float *x, float amax) {
    const __m256 sign = _mm256_set1_ps(-0.0f), target = _mm256_set1_ps(amax);
    for (int j = 0; j < QK_K; j += 8) {
        const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j));
        const int mask = _mm256_movemask_ps(_mm256_cmp_ps(a, target, _CMP_EQ_OQ));
        if (mask) return j + __builtin_ctz((unsigned)mask);
    }
    return 0;
}

static float max_abs(const float *x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    /* vmaxps returns its second operand when either is NaN: NaNs drop out, as in the scalar search */
    for (int j = 0; j < QK_K; j += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

static inline __m256i round_clamp(const float *x, __m256 iscale) {
    const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(iscale, _mm256_loadu_ps(x)));
    return _mm256_max_epi32(_mm256_min_epi32(q, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
}

static void quantize_row_q8_K(const float *src, void *dst, int64_t n) {
    block_q8_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        const float amax = max_abs(src);
        const float max = src[first_index_of_abs(src, amax)];
        if (amax == 0 || src[0] != src[0] || max != max) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.0f / max;
        const __m256 vscale = _mm256_set1_ps(iscale);
        for (int j = 0; j < QK_K / 16; j++) {
            const __m256i a = round_clamp(src + 16 * j, vscale), b = round_clamp(src + 16 * j + 8, vscale);
            const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
            _mm_storeu_si128((__m128i *)(y[i].qs + 16 * j),
                             _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
            __m128i s = _mm_add_epi32(_mm256_castsi256_si128(_mm256_add_epi32(a, b)),
                                      _mm256_extracti128_si256(_mm256_add_epi32(a, b), 1));
            s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
            s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
            y[i].bsums[j] = (int16_t)_mm_cvtsi128_si32(s);
        }
        y[i].d = 1 / iscale;
    }
}

/* The Q2_K/Q4_K/Q5_K sub-block fits with one sub-block per lane: every lane runs the reference's affine search on
 * its own weights in the reference's operation order (no fused multiply-add, running sums), so the bits are the
 * scalar fit's, 8 sub-blocks at a time. */
static inline __m256i nearest_int8(__m256 v) {
    /* the scalar clamp, NaN included (vmaxps gives its second operand for NaN), then the 1.5 * 2^23 trick */
    v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-4194303.0f)), _mm256_set1_ps(4194303.0f));
    const __m256i bits = _mm256_castps_si256(_mm256_add_ps(v, _mm256_set1_ps(12582912.0f)));
    return _mm256_sub_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x00400000));
}

static inline __m256i levels8(__m256 iscale, __m256 x, __m256 min, int nmax) {
    const __m256i l = nearest_int8(_mm256_mul_ps(iscale, _mm256_sub_ps(x, min)));
    return _mm256_min_epi32(_mm256_max_epi32(l, _mm256_setzero_si256()), _mm256_set1_epi32(nmax));
}

/* sum over weights of w * |scale * L + min - x| (use_mad) or w * (scale * L + min - x)^2 */
static inline __m256 fit_error8(int n, const __m256 *xt, const __m256 *wt, const __m256i *L, __m256 scale, __m256 min,
                                int use_mad) {
    __m256 err = _mm256_setzero_ps();
    for (int i = 0; i < n; i++) {
        const __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(L[i])), min), xt[i]);
        const __m256 e = use_mad ? _mm256_andnot_ps(_mm256_set1_ps(-0.0f), diff) : _mm256_mul_ps(diff, diff);
        err = _mm256_add_ps(err, _mm256_mul_ps(wt[i], e));
    }
    return err;
}

/* make_qkx2_quants of kquant_quantize.c, one group of n weights per lane (xt[i], wt[i]: weight i of each group) */
static void qkx2_lanes(int n, const __m256 *xt, const __m256 *wt, int nmax, float rmin, int nstep, int use_mad,
                       float *scales, float *mins, __m256i *best_l) {
    const __m256 zero = _mm256_setzero_ps();
    __m256i cand_l[32];
    __m256 min = xt[0], max = xt[0], sum_w = wt[0], sum_x = _mm256_mul_ps(wt[0], xt[0]);
    for (int i = 1; i < n; i++) {
        min = _mm256_min_ps(xt[i], min); /* x < min ? x : min */
        max = _mm256_max_ps(xt[i], max);
        sum_w = _mm256_add_ps(sum_w, wt[i]);
        sum_x = _mm256_add_ps(sum_x, _mm256_mul_ps(wt[i], xt[i]));
    }
    min = _mm256_blendv_ps(min, zero, _mm256_cmp_ps(min, zero, _CMP_GT_OQ));
    const __m256 flat = _mm256_cmp_ps(max, min, _CMP_EQ_OQ);
    __m256 iscale = _mm256_div_ps(_mm256_set1_ps((float)nmax), _mm256_sub_ps(max, min));
    __m256 scale = _mm256_div_ps(_mm256_set1_ps(1.0f), iscale);
    for (int i = 0; i < n; i++) best_l[i] = levels8(iscale, xt[i], min, nmax);
    __m256 best = fit_error8(n, xt, wt, best_l, scale, min, use_mad);
    for (int is = 0; is <= nstep; is++) {
        iscale = _mm256_div_ps(_mm256_set1_ps(rmin + 0.1f * (float)is + (float)nmax), _mm256_sub_ps(max, min));
        __m256 sum_l = zero, sum_l2 = zero, sum_xl = zero;
        for (int i = 0; i < n; i++) {
            cand_l[i] = levels8(iscale, xt[i], min, nmax);
            const __m256 wl = _mm256_mul_ps(wt[i], _mm256_cvtepi32_ps(cand_l[i]));
            sum_l = _mm256_add_ps(sum_l, wl);
            sum_l2 = _mm256_add_ps(sum_l2, _mm256_mul_ps(wl, _mm256_cvtepi32_ps(cand_l[i])));
            sum_xl = _mm256_add_ps(sum_xl, _mm256_mul_ps(wl, xt[i]));
        }
        const __m256 D = _mm256_sub_ps(_mm256_mul_ps(sum_w, sum_l2), _mm256_mul_ps(sum_l, sum_l));
        __m256 this_scale = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_w, sum_xl), _mm256_mul_ps(sum_x, sum_l)), D);
        __m256 this_min = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_l2, sum_x), _mm256_mul_ps(sum_l, sum_xl)), D);
        const __m256 positive = _mm256_cmp_ps(this_min, zero, _CMP_GT_OQ);
        this_min = _mm256_blendv_ps(this_min, zero, positive);
        this_scale = _mm256_blendv_ps(this_scale, _mm256_div_ps(sum_xl, sum_l2), positive);
        const __m256 err = fit_error8(n, xt, wt, cand_l, this_scale, this_min, use_mad);
        const __m256 better = _mm256_andnot_ps(
            flat, _mm256_and_ps(_mm256_cmp_ps(D, zero, _CMP_GT_OQ), _mm256_cmp_ps(err, best, _CMP_LT_OQ)));
        if (_mm256_movemask_ps(better) == 0) continue;
        for (int i = 0; i < n; i++)
            best_l[i] = _mm256_castps_si256(
                _mm256_blendv_ps(_mm256_castsi256_ps(best_l[i]), _mm256_castsi256_ps(cand_l[i]), better));
        best = _mm256_blendv_ps(best, err, better);
        scale = _mm256_blendv_ps(scale, this_scale, better);
        min = _mm256_blendv_ps(min, this_min, better);
    }
    _mm256_storeu_ps(scales, _mm256_blendv_ps(scale, zero, flat));
    _mm256_storeu_ps(mins, _mm256_xor_ps(min, _mm256_set1_ps(-0.0f)));
    for (int i = 0; i < n; i++) best_l[i] = _mm256_andnot_si256(_mm256_castps_si256(flat), best_l[i]);
}

/* Lane j's levels go to L[stride * j + i]. */
static void scatter_levels(int n, const __m256i *lanes, int stride, uint8_t *L) {
    for (int i = 0; i < n; i++) {
        int32_t l[8];
        _mm256_storeu_si256((__m256i *)l, lanes[i]);
        for (int j = 0; j < 8; j++) L[stride * j + i] = (uint8_t)l[j];
    }
}

/* 8 groups of n weights, group j at x + stride * j, transposed so weight i of every group shares a vector */
static void transpose8(int n, const float *x, int stride, __m256 *xt) {
    const __m256i offsets = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(stride));
    for (int i = 0; i < n; i++) xt[i] = _mm256_i32gather_ps(x + i, offsets, 4);
}

static void fit_k4(const float *x, int nmax, float rmin, int nstep, float *scales, float *mins, uint8_t *L) {
    __m256 xt[32], wt[32];
    __m256i best_l[32];
    transpose8(32, x, 32, xt);
    __m256 sum_x2 = _mm256_setzero_ps();
    for (int i = 0; i < 32; i++) sum_x2 = _mm256_add_ps(sum_x2, _mm256_mul_ps(xt[i], xt[i]));
    const __m256 av_x = _mm256_sqrt_ps(_mm256_div_ps(sum_x2, _mm256_set1_ps(32.0f)));
    for (int i = 0; i < 32; i++) wt[i] = _mm256_add_ps(av_x, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), xt[i]));
    qkx2_lanes(32, xt, wt, nmax, rmin, nstep, 0, scales, mins, best_l);
    scatter_levels(32, best_l, 32, L);
}

static void fit_q2(const float *x, float *scales, float *mins, uint8_t *L) {
    for (int half = 0; half < 2; half++) {
        __m256 xt[16], wt[16];
        __m256i best_l[16];
        transpose8(16, x + 128 * half, 16, xt);
        for (int i = 0; i < 16; i++) wt[i] = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), xt[i]);
        qkx2_lanes(16, xt, wt, 3, -0.5f, 15, 1, scales + 8 * half, mins + 8 * half, best_l);
        scatter_levels(16, best_l, 16, L + 128 * half);
    }
}

static void quantize_row_q2_K(const float *src, void *dst, int64_t n) {
    kquant_quantize_q2_K_with(src, dst, n, fit_q2);
}

static void quantize_row_q4_K(const float *src, void *dst, int64_t n) {
    kquant_quantize_q4_K_with(src, dst, n, fit_k4);
}

static void quantize_row_q5_K(const float *src, void *dst, int64_t n) {
    kquant_quantize_q5_K_with(src, dst, n, fit_k4);
}

/* make_qx_quants of kquant_quantize.c for Q6_K (16 weights, levels -32..31, weights x^2), one group per lane */
static void qx_sums(const __m256 *xt, __m256 iscale, __m256i *L, __m256 *sumlx, __m256 *suml2) {
    *sumlx = *suml2 = _mm256_setzero_ps();
    for (int i = 0; i < 16; i++) {
        __m256i l = nearest_int8(_mm256_mul_ps(iscale, xt[i]));
        l = _mm256_min_epi32(_mm256_max_epi32(l, _mm256_set1_epi32(-32)), _mm256_set1_epi32(31));
        const __m256 lf = _mm256_cvtepi32_ps(l), w = _mm256_mul_ps(xt[i], xt[i]);
        L[i] = _mm256_add_epi32(l, _mm256_set1_epi32(32));
        *sumlx = _mm256_add_ps(*sumlx, _mm256_mul_ps(_mm256_mul_ps(w, xt[i]), lf));
        *suml2 = _mm256_add_ps(*suml2, _mm256_mul_ps(_mm256_mul_ps(w, lf), lf));
    }
}

static void qx_lanes(const __m256 *xt, float *scales, __m256i *best_l) {
    const __m256 sign = _mm256_set1_ps(-0.0f), zero = _mm256_setzero_ps();
    /* the first weight of largest magnitude; a NaN there stays, as in the scalar search */
    __m256 max = xt[0], amax = _mm256_andnot_ps(sign, xt[0]);
    for (int i = 1; i < 16; i++) {
        const __m256 a = _mm256_andnot_ps(sign, xt[i]), gt = _mm256_cmp_ps(a, amax, _CMP_GT_OQ);
        amax = _mm256_blendv_ps(amax, a, gt);
        max = _mm256_blendv_ps(max, xt[i], gt);
    }
    const __m256 tiny = _mm256_cmp_ps(_mm256_andnot_ps(sign, max), _mm256_set1_ps(1e-15f), _CMP_LT_OQ);
    __m256i cand_l[16];
    __m256 sumlx, suml2;
    qx_sums(xt, _mm256_div_ps(_mm256_set1_ps(-32.0f), max), best_l, &sumlx, &suml2);
    __m256 scale = _mm256_and_ps(_mm256_div_ps(sumlx, suml2), _mm256_cmp_ps(suml2, zero, _CMP_NEQ_UQ));
    __m256 best = _mm256_mul_ps(scale, sumlx);
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        qx_sums(xt, _mm256_div_ps(_mm256_set1_ps(-(32.0f + 0.1f * (float)is)), max), cand_l, &sumlx, &suml2);
        const __m256 better = _mm256_and_ps(_mm256_cmp_ps(suml2, zero, _CMP_GT_OQ),
                                            _mm256_cmp_ps(_mm256_mul_ps(sumlx, sumlx), _mm256_mul_ps(best, suml2),
                                                          _CMP_GT_OQ));
        if (_mm256_movemask_ps(better) == 0) continue;
        for (int i = 0; i < 16; i++)
            best_l[i] = _mm256_castps_si256(
                _mm256_blendv_ps(_mm256_castsi256_ps(best_l[i]), _mm256_castsi256_ps(cand_l[i]), better));
        scale = _mm256_blendv_ps(scale, _mm256_div_ps(sumlx, suml2), better);
        best = _mm256_blendv_ps(best, _mm256_mul_ps(scale, sumlx), better);
    }
    _mm256_storeu_ps(scales, _mm256_andnot_ps(tiny, scale));
    for (int i = 0; i < 16; i++) best_l[i] = _mm256_andnot_si256(_mm256_castps_si256(tiny), best_l[i]);
}

static void fit_q6(const float *x, float *scales, int8_t *L) {
    for (int half = 0; half < 2; half++) {
        __m256 xt[16];
        __m256i best_l[16];
        transpose8(16, x + 128 * half, 16, xt);
        qx_lanes(xt, scales + 8 * half, best_l);
        scatter_levels(16, best_l, 16, (uint8_t *)L + 128 * half);
    }
}

static void quantize_row_q6_K(const float *src, void *dst, int64_t n) {
    kquant_quantize_q6_K_with(src, dst, n, fit_q6);
}

static const kiln_quant_entry ENTRIES[] = {
    {KILN_TYPE_Q2_K, {NULL, quantize_row_q2_K, NULL, KILN_TYPE_Q8_K, NULL}},
    {KILN_TYPE_Q4_K, {NULL, quantize_row_q4_K, NULL, KILN_TYPE_Q8_K, NULL}},
    {KILN_TYPE_Q5_K, {NULL, quantize_row_q5_K, NULL, KILN_TYPE_Q8_K, NULL}},
    {KILN_TYPE_Q6_K, {NULL, quantize_row_q6_K, NULL, KILN_TYPE_Q8_K, NULL}},
    {KILN_TYPE_Q8_K, {NULL, quantize_row_q8_K, NULL, KILN_TYPE_Q8_K, NULL}},
};

const kiln_quant_family kiln_kquant_quantize_avx2_family = {
    "kquant_quantize_avx2", KILN_LEVEL_AVX2, ENTRIES, (int)(sizeof ENTRIES / sizeof ENTRIES[0])};

/* The end of the sampling chain over candidates already ranked (logits best first): top-p, min-p, then the draw at
 * the temperature. Shared by the host sampler and the GPU (topk.cu, which draws in the step that ranks), so that both
 * choose the same token from the same logits, draw for draw: every step is an IEEE operation that rounds the same
 * way on both (no library exp, whose last bits differ between glibc and CUDA; no contraction into FMA, so the
 * device side spells its products with the _rn intrinsics), and the running sums are taken in one order that a warp
 * computes in parallel (kiln_draw_first_reaching; the device's copy of that order is checked against this one by
 * cuda_kernels' test_top_k_draw). */
#ifndef KILN_SAMPLE_DRAW_H
#define KILN_SAMPLE_DRAW_H

#include <math.h>
#include <stdint.h>

#include "sample/rng.h"

#ifdef __CUDA_ARCH__
#define KILN_DRAW_MUL(a, b) __fmul_rn(a, b)
#define KILN_DRAW_SUB(a, b) __fsub_rn(a, b)
#define KILN_DRAW_FMA(a, b, c) __fmaf_rn(a, b, c)
#else /* C11 without GNU extensions: GCC does not contract a * b + c (-ffp-contract=off) */
#define KILN_DRAW_MUL(a, b) ((a) * (b))
#define KILN_DRAW_SUB(a, b) ((a) - (b))
#define KILN_DRAW_FMA(a, b, c) fmaf(a, b, c)
#endif

/* What the draw needs beyond the ranked logits: the temperature's inverse, top-p, and log(min-p) (-inf: off), all
 * computed once on the host. */
typedef struct kiln_draw_params {
    float inv_temp, top_p, log_min_p;
} kiln_draw_params;

/* e^x for x <= 0 (the only arguments here: logits less the best), within 2 ulp of the true value: x = n ln2 + r,
 * |r| <= ln2 / 2, e^r by its degree-7 Taylor polynomial, 2^n put into the exponent in two exact halves so that
 * results below the normal range round once, as IEEE says. */
static inline KILN_HD float kiln_draw_expf(float x) {
    if (!(x > -104.0f)) return x != x ? x : 0.0f; /* NaN stays NaN; below -104 e^x is under half the least float */
    if (x > 88.7f) return INFINITY;
    float n = floorf(KILN_DRAW_FMA(x, 1.44269504f, 0.5f));
    float r = KILN_DRAW_FMA(n, -0.693145752f, x); /* ln2 in two parts: n * hi is exact for |n| < 2^8 */
    r = KILN_DRAW_FMA(n, -1.42860677e-6f, r);
    float p = 1.98412698e-4f; /* 1/7! ... 1/0! */
    p = KILN_DRAW_FMA(p, r, 1.38888889e-3f);
    p = KILN_DRAW_FMA(p, r, 8.33333333e-3f);
    p = KILN_DRAW_FMA(p, r, 4.16666667e-2f);
    p = KILN_DRAW_FMA(p, r, 1.66666667e-1f);
    p = KILN_DRAW_FMA(p, r, 0.5f);
    p = KILN_DRAW_FMA(p, r, 1.0f);
    p = KILN_DRAW_FMA(p, r, 1.0f);
    int e = (int)n, e1 = e / 2, e2 = e - e1; /* each half within the normal exponents for e >= -151 */
    union { uint32_t u; float f; } s1 = {(uint32_t)(e1 + 127) << 23}, s2 = {(uint32_t)(e2 + 127) << 23};
    return KILN_DRAW_MUL(KILN_DRAW_MUL(p, s1.f), s2.f);
}

/* w[i] = e^(l[i] - l[0]) for the n ranked logits l: the probabilities at temperature 1, unnormalized. */
static inline KILN_HD float kiln_draw_weight(const float *l, int i) {
    return kiln_draw_expf(KILN_DRAW_SUB(l[i], l[0]));
}

/* The draw's running sums (top-p's mass, the cumulative tempered weights), in double, in one order that a warp of
 * KILN_DRAW_LANES lanes takes in parallel (topk.cu) and the host step by step, so that both get the same bits: lane
 * l holds the run [l c, l c + c) of the n values (c = ceil(n / lanes)); the runs' sums, each added in order, are
 * scanned across the lanes in the Hillis-Steele order (lane l adds lane l - o's partial to its own for o = 1, 2, 4,
 * ...); value j's running sum is the scan of the runs before its own plus its run's values up to j, added in order.
 * Returns the first j whose running sum reaches frac times the total (> with strict, else >=), or n. */
#define KILN_DRAW_LANES 32

static inline int kiln_draw_first_reaching(const float *x, int n, double frac, int strict) {
    int c = (n + KILN_DRAW_LANES - 1) / KILN_DRAW_LANES;
    double scan[KILN_DRAW_LANES];
    for (int l = 0; l < KILN_DRAW_LANES; l++) {
        double run = 0.0;
        for (int j = l * c; j < n && j < l * c + c; j++) run += (double)x[j];
        scan[l] = run;
    }
    for (int o = 1; o < KILN_DRAW_LANES; o <<= 1)
        for (int l = KILN_DRAW_LANES - 1; l >= o; l--) scan[l] = scan[l - o] + scan[l]; /* l - o not yet updated */
    double target = frac * scan[KILN_DRAW_LANES - 1];
    for (int l = 0; l < KILN_DRAW_LANES; l++) {
        double acc = l ? scan[l - 1] : 0.0;
        for (int j = l * c; j < n && j < l * c + c; j++) {
            acc += (double)x[j];
            if (strict ? target < acc : acc >= target) return j;
        }
    }
    return n;
}

/* How many of the n ranked candidates top-p and min-p keep (at least one): the shortest prefix whose weights w
 * reach top_p of their total, then those of it within min-p of the best. */
static inline int kiln_draw_keep(const float *l, const float *w, int n, const kiln_draw_params *p) {
    int keep = n;
    if (p->top_p < 1.0f) {
        int cut = kiln_draw_first_reaching(w, n, (double)p->top_p, 0);
        if (cut < n) keep = cut + 1;
    }
    float floor_logit = l[0] + p->log_min_p;
    int m = 1;
    while (m < keep && l[m] >= floor_logit) m++;
    return m;
}

/* t[i] = e^((l[i] - l[0]) / T): the weight of candidate i at the temperature. */
static inline KILN_HD float kiln_draw_tempered(const float *l, int i, const kiln_draw_params *p) {
    return kiln_draw_expf(KILN_DRAW_MUL(KILN_DRAW_SUB(l[i], l[0]), p->inv_temp));
}

/* The candidate a uniform u in [0, 1) lands on among the first keep, by their tempered weights t. */
static inline int kiln_draw_index(const float *t, int keep, float u) {
    int i = kiln_draw_first_reaching(t, keep, (double)u, 1);
    return i < keep ? i : keep - 1;
}

#endif

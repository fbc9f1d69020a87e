/* The end of the sampling chain over candidates already ranked (logits best first): top-p, min-p, then the draw at
 * the temperature. Written once for the host sampler and the GPU (a CUDA kernel includes this header), so that both
 * choose the same token from the same logits, draw for draw: every step is an IEEE operation that rounds the same
 * way on both (no library exp, whose last bits differ between glibc and CUDA; no contraction into FMA, so the
 * device side spells its products and sums with the _rn intrinsics). */
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
static inline KILN_HD float kiln_draw_weight(const float *l, int i) { return kiln_draw_expf(KILN_DRAW_SUB(l[i], l[0])); }

/* How many of the n ranked candidates top-p and min-p keep (at least one): the shortest prefix whose weights w
 * reach top_p of their total (summed in order, in double), then those within min-p of the best. */
static inline KILN_HD int kiln_draw_keep(const float *l, const float *w, int n, const kiln_draw_params *p) {
    double total = 0.0, mass = 0.0;
    for (int i = 0; i < n; i++) total += (double)w[i];
    int keep = n;
    if (p->top_p < 1.0f)
        for (int i = 0; i < n; i++) {
            mass += (double)w[i];
            if (mass >= (double)p->top_p * total) {
                keep = i + 1;
                break;
            }
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
static inline KILN_HD int kiln_draw_index(const float *t, int keep, float u) {
    double sum = 0.0, acc = 0.0;
    for (int i = 0; i < keep; i++) sum += (double)t[i];
    double r = (double)u * sum;
    for (int i = 0; i < keep; i++) {
        acc += (double)t[i];
        if (r < acc) return i;
    }
    return keep - 1;
}

#endif

/* Every k-quant SIMD kernel against its scalar reference (kquant.c), for each level this CPU runs (plain AVX-512
 * and VNNI separately), on fresh random blocks; plus the scalar vec_dot against a float dot of the dequantized rows.
 * Bounds: dequantize bit-exact. vec_dot |got - want| <= 1e-5 * sum_i |y_i| (|x_i| + 2 |m_i|) over the dequantized
 * operands, m_i being the min offset of x_i's sub-block: the integer block sums are exact, so only the float
 * accumulation differs, and the bound covers the cancellation between the scale and min terms. vec_dot_rows: bit for
 * bit the same level's vec_dot, row by row. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "quant/quant.h"

typedef struct kq_case {
    kiln_type type;
    int d_offset;    /* byte offset of the half d in a block */
    int dmin_offset; /* of the half dmin, or -1 */
} kq_case;

static const kq_case CASES[] = {
    {KILN_TYPE_Q2_K, 80, 82}, {KILN_TYPE_Q3_K, 108, -1}, {KILN_TYPE_Q4_K, 0, 2},
    {KILN_TYPE_Q5_K, 0, 2},   {KILN_TYPE_Q6_K, 208, -1},
};
#define N_CASES ((int)(sizeof CASES / sizeof CASES[0]))
#define N_BLOCKS 13

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static uint32_t next_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static float next_normal(void) {
    float u1 = ((float)(next_u32() >> 8) + 1.0f) / 16777217.0f, u2 = (float)(next_u32() >> 8) / 16777216.0f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

/* A finite half of either sign; wide exponents for dequantize, a moderate range for dot products. */
static kiln_half random_half(int wide) {
    uint32_t mag = wide ? next_u32() % 0x7C00 : 0x1C00 + next_u32() % 0x2800;
    return (kiln_half)(mag | ((next_u32() & 1) << 15));
}

static void put_half(uint8_t *p, kiln_half h) { memcpy(p, &h, sizeof h); }

static void random_blocks(const kq_case *c, uint8_t *row, int wide) {
    const size_t size = kiln_type_get(c->type)->type_size;
    for (size_t i = 0; i < size * N_BLOCKS; i++) row[i] = (uint8_t)next_u32();
    for (int b = 0; b < N_BLOCKS; b++) {
        put_half(row + size * b + c->d_offset, random_half(wide));
        if (c->dmin_offset >= 0) put_half(row + size * b + c->dmin_offset, random_half(wide));
    }
}

static const kq_case *case_of(kiln_type type) {
    for (int i = 0; i < N_CASES; i++)
        if (CASES[i].type == type) return &CASES[i];
    return NULL;
}

static void check_dequantize(const char *name, const kiln_quant_ops *ops, const kiln_quant_ops *ref, kiln_type type) {
    const int64_t n = QK_K * N_BLOCKS;
    uint8_t *row = malloc(kiln_row_size(type, n));
    float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
    for (int trial = 0; trial < 8; trial++) {
        if (type == KILN_TYPE_Q8_K) {
            for (int64_t i = 0; i < n; i++) want[i] = next_normal() * (float)(trial + 1);
            ref->quantize(want, row, n);
        } else {
            random_blocks(case_of(type), row, 1);
        }
        ref->dequantize(row, want, n);
        ops->dequantize(row, got, n);
        if (memcmp(want, got, n * sizeof *got) != 0) fail_msg("%s %s dequantize differs", name, kiln_type_name(type));
    }
    free(row);
    free(want);
    free(got);
}

/* Quantizers must agree byte for byte: normal rows at many scales, plus the rows the reference treats specially. */
static void check_quantize(const char *name, const kiln_quant_ops *ops, const kiln_quant_ops *ref, kiln_type type) {
    const int64_t n = QK_K * N_BLOCKS;
    const size_t bytes = kiln_row_size(type, n);
    float *x = malloc(n * sizeof *x);
    uint8_t *want = malloc(bytes), *got = malloc(bytes);
    for (int trial = 0; trial < 32; trial++) {
        for (int64_t i = 0; i < n; i++) {
            const float scale = powf(10.0f, (float)(i / QK_K % 9) - 4.0f), v = next_normal();
            switch (trial % 4) {
            case 0: x[i] = v * scale; break;
            case 1: x[i] = roundf(v * 4.0f) * 0.5f; break;            /* many exact rounding ties */
            case 2: x[i] = (fabsf(v) + 0.25f) * scale; break;         /* all positive: the min clamps to 0 */
            default: x[i] = next_u32() % 8 == 0 ? v * scale : 0.0f; /* sparse, with flat sub-blocks */
            }
        }
        for (int64_t i = 0; i < QK_K; i++) x[i] = 0.0f;                    /* all zero */
        x[QK_K] = NAN;                                                        /* NaN first: the block is zero */
        x[2 * QK_K + 5] = NAN;                                                /* NaN later: ignored as extreme */
        x[3 * QK_K + 7] = 9.0f, x[3 * QK_K + 9] = -9.0f;                     /* tie: the first one wins */
        x[4 * QK_K + 3] = INFINITY;
        x[5 * QK_K + 100] = -0.5f * (float)(trial + 1), x[5 * QK_K + 101] = 0.5f * (float)(trial + 1);
        ref->quantize(x, want, n);
        ops->quantize(x, got, n);
        if (memcmp(want, got, bytes) != 0) fail_msg("%s %s quantize differs", name, kiln_type_name(type));
    }
    free(x);
    free(want);
    free(got);
}

/* sum_i |y_i| (|x_i| + 2 |m_i|); |m_i| comes from dequantizing with d zeroed, which leaves -dmin * min. */
static double dot_magnitude(const kq_case *c, const kiln_quant_ops *ref, uint8_t *x, const float *xf,
                            const float *yf, float *tmp, int64_t n) {
    const size_t size = kiln_type_get(c->type)->type_size;
    for (int64_t i = 0; i < n; i++) tmp[i] = 0;
    if (c->dmin_offset >= 0) {
        uint8_t *copy = malloc(size * N_BLOCKS);
        memcpy(copy, x, size * N_BLOCKS);
        for (int b = 0; b < N_BLOCKS; b++) put_half(copy + size * b + c->d_offset, 0);
        ref->dequantize(copy, tmp, n);
        free(copy);
    }
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += fabs((double)yf[i]) * (fabs((double)xf[i]) + 2 * fabs((double)tmp[i]));
    return sum;
}

/* want_fn NULL: compare with a float64 dot of the dequantized rows instead of the scalar kernel. */
static void check_vec_dot(const char *name, kiln_vec_dot_fn fn, kiln_vec_dot_fn want_fn, kiln_type type) {
    const kq_case *c = case_of(type);
    const kiln_quant_ops *ref = kiln_quant_ops_get(type, KILN_ISA_SCALAR);
    const kiln_quant_ops *act = kiln_quant_ops_get(KILN_TYPE_Q8_K, KILN_ISA_SCALAR);
    const int64_t n = QK_K * N_BLOCKS;
    uint8_t *x = malloc(kiln_row_size(type, n)), *y = malloc(kiln_row_size(KILN_TYPE_Q8_K, n));
    float *xf = malloc(n * sizeof *xf), *yf = malloc(n * sizeof *yf), *tmp = malloc(n * sizeof *tmp);
    for (int trial = 0; trial < 16; trial++) {
        if (trial % 2) {
            random_blocks(c, x, 0);
        } else {
            for (int64_t i = 0; i < n; i++) xf[i] = next_normal() + (trial % 4 == 0 ? 1.5f : 0.0f);
            ref->quantize(xf, x, n);
        }
        for (int64_t i = 0; i < n; i++) yf[i] = next_normal() * (float)(trial + 1);
        act->quantize(yf, y, n);
        ref->dequantize(x, xf, n);
        act->dequantize(y, yf, n);
        const double bound = 1e-5 * dot_magnitude(c, ref, x, xf, yf, tmp, n);
        double want = 0;
        if (want_fn) {
            want = want_fn(n, x, y);
        } else {
            for (int64_t i = 0; i < n; i++) want += (double)xf[i] * yf[i];
        }
        const double got = fn(n, x, y);
        if (!(fabs(got - want) <= bound))
            fail_msg("%s %s vec_dot %.9g vs %.9g (bound %.3g)", name, kiln_type_name(type), got, want, bound);
    }
    free(x);
    free(y);
    free(xf);
    free(yf);
    free(tmp);
}

/* vec_dot_rows gives each of its activation rows exactly the bits of the same level's vec_dot. */
static void check_vec_dot_rows(const char *name, const kiln_quant_ops *ops, kiln_type type) {
    const kq_case *c = case_of(type);
    const kiln_quant_ops *act = kiln_quant_ops_get(KILN_TYPE_Q8_K, KILN_ISA_SCALAR);
    const int64_t n = QK_K * N_BLOCKS;
    const size_t y_stride = kiln_row_size(KILN_TYPE_Q8_K, n) + 4; /* rows not packed back to back */
    uint8_t *x = malloc(kiln_row_size(type, n)), *y = malloc(y_stride * KILN_DOT_ROWS);
    float *v = malloc(n * sizeof *v), got[KILN_DOT_ROWS];
    for (int trial = 0; trial < 4; trial++) {
        random_blocks(c, x, trial % 2);
        for (int k = 0; k < KILN_DOT_ROWS; k++) {
            for (int64_t i = 0; i < n; i++) v[i] = next_normal() * (float)(k + 1);
            act->quantize(v, y + k * y_stride, n);
        }
        ops->vec_dot_rows(n, x, y, y_stride, got);
        for (int k = 0; k < KILN_DOT_ROWS; k++) {
            float alone = ops->vec_dot(n, x, y + k * y_stride);
            if (memcmp(&got[k], &alone, sizeof alone))
                fail_msg("%s %s vec_dot_rows row %d: %.9g, vec_dot %.9g", name, kiln_type_name(type), k, got[k],
                         alone);
        }
    }
    free(x);
    free(y);
    free(v);
}

static void test_scalar_vec_dot_matches_float_dot(void **state) {
    (void)state;
    for (int i = 0; i < N_CASES; i++) {
        const kiln_quant_ops *ref = kiln_quant_ops_get(CASES[i].type, KILN_ISA_SCALAR);
        assert_non_null(ref);
        assert_int_equal(ref->vec_dot_type, KILN_TYPE_Q8_K);
        check_vec_dot("kquant_scalar", ref->vec_dot, NULL, CASES[i].type);
    }
}

static void test_simd_matches_scalar(void **state) {
    (void)state;
    int count, checked = 0;
    const kiln_quant_family *const *families = kiln_quant_families(&count);
    for (int i = 0; i < count; i++) {
        const kiln_quant_family *f = families[i];
        if (strncmp(f->name, "kquant_", 7) != 0 || f->level == KILN_LEVEL_SCALAR) continue;
        if (!kiln_quant_level_supported(f->level)) continue;
        for (int k = 0; k < f->n_entries; k++) {
            const kiln_quant_entry *e = &f->entries[k];
            const kiln_quant_ops *ref = kiln_quant_ops_get(e->type, KILN_ISA_SCALAR);
            assert_non_null(ref);
            if (e->ops.dequantize) check_dequantize(f->name, &e->ops, ref, e->type);
            if (e->ops.quantize) check_quantize(f->name, &e->ops, ref, e->type);
            if (e->ops.vec_dot) check_vec_dot(f->name, e->ops.vec_dot, ref->vec_dot, e->type);
            if (e->ops.vec_dot_rows) check_vec_dot_rows(f->name, &e->ops, e->type);
            checked++;
        }
    }
    printf("checked %d k-quant SIMD entries against scalar\n", checked);
}

/* The quantizers must survive rows the reference handles specially: zeros, constants, huge, tiny, NaN-free extremes. */
static void test_quantize_edge_rows(void **state) {
    (void)state;
    const kiln_type types[] = {KILN_TYPE_Q2_K, KILN_TYPE_Q3_K, KILN_TYPE_Q4_K,
                               KILN_TYPE_Q5_K, KILN_TYPE_Q6_K, KILN_TYPE_Q8_K};
    float x[QK_K], back[QK_K];
    uint8_t block[sizeof(block_q8_K)];
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const kiln_quant_ops *ops = kiln_quant_ops_get(types[t], KILN_ISA_SCALAR);
        for (int kind = 0; kind < 4; kind++) {
            for (int i = 0; i < QK_K; i++)
                x[i] = kind == 0 ? 0.0f : kind == 1 ? -2.5f : kind == 2 ? 3e38f * (i % 2 ? 1 : -1) : 1e-40f * i;
            ops->quantize(x, block, QK_K);
            ops->dequantize(block, back, QK_K);
            for (int i = 0; i < QK_K; i++) {
                if (kind == 0) assert_true(back[i] == 0.0f);
                if (kind != 2) assert_true(isfinite(back[i]));
            }
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalar_vec_dot_matches_float_dot),
        cmocka_unit_test(test_simd_matches_scalar),
        cmocka_unit_test(test_quantize_edge_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

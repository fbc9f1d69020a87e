/* Every SIMD kernel of the float and 32-element block families against its scalar reference, for each level this
 * CPU runs (plain AVX-512 and VNNI separately), on fresh random data.
 * Bounds: dequantize and quantize bit-exact; vec_dot |simd - scalar| <= 1e-5 * (sum|x_i y_i| + sum|m_x s_y|) over the
 * dequantized operands (the integer block dots are exact, only the float accumulation order differs); vec_dot_rows
 * bit for bit the same level's vec_dot, row by row. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "quant/quant.h"

typedef struct type_case {
    kiln_type type;
    int half_offsets[2]; /* byte offsets of the half scales in a block; -1 for none */
    int min_offset;      /* offset of the half m (offset types), or -1 */
} type_case;

static const type_case CASES[] = {
    {KILN_TYPE_F32, {-1, -1}, -1},    {KILN_TYPE_F16, {-1, -1}, -1},   {KILN_TYPE_BF16, {-1, -1}, -1},
    {KILN_TYPE_Q4_0, {0, -1}, -1},    {KILN_TYPE_Q4_1, {0, 2}, 2},      {KILN_TYPE_Q5_0, {0, -1}, -1},
    {KILN_TYPE_Q5_1, {0, 2}, 2},      {KILN_TYPE_Q8_0, {0, -1}, -1},    {KILN_TYPE_Q8_1, {0, 2}, -1},
};
#define N_CASES ((int)(sizeof CASES / sizeof CASES[0]))

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

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

/* A finite half of either sign over the whole exponent range (subnormals and zero included). */
static kiln_half random_half(void) { return (kiln_half)((next_u32() % 0x7C00) | ((next_u32() & 1) << 15)); }

/* Random bytes, with every scale and float element forced finite. */
static void random_row(const type_case *c, uint8_t *row, int64_t n) {
    const kiln_type_traits *t = kiln_type_get(c->type);
    size_t bytes = kiln_row_size(c->type, n);
    for (size_t i = 0; i < bytes; i++) row[i] = (uint8_t)next_u32();
    if (c->type == KILN_TYPE_F32) {
        for (int64_t i = 0; i < n; i++) ((float *)row)[i] = next_normal() * 100.0f;
    } else if (c->type == KILN_TYPE_F16) {
        for (int64_t i = 0; i < n; i++) ((kiln_half *)row)[i] = random_half();
    } else if (c->type == KILN_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++) ((kiln_bf16 *)row)[i] = kiln_float_to_bf16(next_normal());
    } else {
        for (int64_t b = 0; b < n / t->block_size; b++)
            for (int k = 0; k < 2; k++)
                if (c->half_offsets[k] >= 0) {
                    kiln_half h = random_half();
                    memcpy(row + b * t->type_size + c->half_offsets[k], &h, sizeof h);
                }
    }
}

static const type_case *case_of(kiln_type type) {
    for (int i = 0; i < N_CASES; i++)
        if (CASES[i].type == type) return &CASES[i];
    return NULL;
}

static bool is_ours(const kiln_quant_family *f) {
    return strncmp(f->name, "legacy_", 7) == 0 || strncmp(f->name, "float_", 6) == 0;
}

static void check_dequantize(const kiln_quant_family *f, const kiln_quant_entry *e, const kiln_quant_ops *ref) {
    const type_case *c = case_of(e->type);
    assert_non_null(c);
    int64_t n = 32 * 37; /* an odd block count, and a float length that is no multiple of the vector width */
    if (kiln_type_get(e->type)->block_size == 1) n += 7;
    uint8_t *row = malloc(kiln_row_size(e->type, n));
    float *want = malloc((size_t)n * sizeof *want), *got = malloc((size_t)n * sizeof *got);
    for (int trial = 0; trial < 8; trial++) {
        random_row(c, row, n);
        ref->dequantize(row, want, n);
        e->ops.dequantize(row, got, n);
        if (memcmp(want, got, (size_t)n * sizeof *got) != 0)
            fail_msg("%s %s dequantize differs", f->name, kiln_type_name(e->type));
    }
    free(row);
    free(want);
    free(got);
}

/* Normal data at many scales, plus a block holding 127 and exact halves, where d = 1 and every quant is a tie. */
static void check_quantize(const kiln_quant_family *f, const kiln_quant_entry *e, const kiln_quant_ops *ref) {
    int64_t n = 32 * 37;
    size_t bytes = kiln_row_size(e->type, n);
    float *x = malloc((size_t)n * sizeof *x);
    uint8_t *want = malloc(bytes), *got = malloc(bytes);
    for (int trial = 0; trial < 8; trial++) {
        float scale = powf(10.0f, (float)trial - 4.0f);
        for (int64_t i = 0; i < n; i++) x[i] = next_normal() * scale;
        for (int j = 0; j < 32; j++) x[32 + j] = (float)j - 15.5f;
        x[32] = 127.0f;
        ref->quantize(x, want, n);
        e->ops.quantize(x, got, n);
        if (memcmp(want, got, bytes) != 0) fail_msg("%s %s quantize differs", f->name, kiln_type_name(e->type));
    }
    free(x);
    free(want);
    free(got);
}

/* sum|m_x s_y| over blocks, for the offset types */
static double offset_magnitude(const type_case *c, const uint8_t *x, const uint8_t *y, int64_t n) {
    if (c->min_offset < 0) return 0.0;
    const kiln_type_traits *t = kiln_type_get(c->type);
    const block_q8_1 *yb = (const block_q8_1 *)y;
    double sum = 0.0;
    for (int64_t b = 0; b < n / t->block_size; b++) {
        kiln_half m;
        memcpy(&m, x + b * t->type_size + c->min_offset, sizeof m);
        sum += fabs((double)kiln_half_to_float(m) * kiln_half_to_float(yb[b].s));
    }
    return sum;
}

static void check_vec_dot(const kiln_quant_family *f, const kiln_quant_entry *e, const kiln_quant_ops *ref) {
    const type_case *c = case_of(e->type);
    const kiln_quant_ops *act = kiln_quant_ops_get(ref->vec_dot_type, KILN_ISA_SCALAR);
    int64_t n = 32 * 37;
    if (kiln_type_get(e->type)->block_size == 1) n += 7;
    uint8_t *x_allocation = malloc(kiln_row_size(e->type, n) + 64), *y = malloc(kiln_row_size(ref->vec_dot_type, n));
    float *xf = malloc((size_t)n * sizeof *xf), *yf = malloc((size_t)n * sizeof *yf);
    for (int trial = 0; trial < 16; trial++) {
        /* the weight row starts at every 4-byte offset within a cache line: kernels may align their loads */
        uint8_t *x = x_allocation + 4 * trial;
        /* 8-bit weights come from the quantizer: random bytes could hold -128, which no quantizer writes */
        if (e->type == KILN_TYPE_Q8_0) {
            for (int64_t i = 0; i < n; i++) xf[i] = next_normal();
            ref->quantize(xf, x, n);
        } else {
            random_row(c, x, n);
        }
        for (int64_t i = 0; i < n; i++) yf[i] = next_normal() * (float)(trial + 1);
        act->quantize(yf, y, n);
        ref->dequantize(x, xf, n);
        act->dequantize(y, yf, n);
        double magnitude = offset_magnitude(c, x, y, n);
        for (int64_t i = 0; i < n; i++) magnitude += fabs((double)xf[i] * yf[i]);
        double want = ref->vec_dot(n, x, y), got = e->ops.vec_dot(n, x, y);
        if (!(fabs(got - want) <= 1e-5 * magnitude))
            fail_msg("%s %s vec_dot %.9g vs scalar %.9g (bound %.3g)", f->name, kiln_type_name(e->type), got, want,
                     1e-5 * magnitude);
    }
    free(x_allocation);
    free(y);
    free(xf);
    free(yf);
}

/* vec_dot_rows gives each of its activation rows exactly the bits of the same level's vec_dot. */
static void check_vec_dot_rows(const kiln_quant_family *f, const kiln_quant_entry *e, const kiln_quant_ops *ref) {
    const type_case *c = case_of(e->type);
    const kiln_quant_ops *act = kiln_quant_ops_get(ref->vec_dot_type, KILN_ISA_SCALAR);
    for (int64_t n = 32 * 37; n >= 32 * 36; n -= 32) { /* an odd and an even tail after the groups of 8 blocks */
        size_t y_stride = kiln_row_size(ref->vec_dot_type, n) + 36; /* rows not packed back to back */
        uint8_t *x = malloc(kiln_row_size(e->type, n)), *y = malloc(y_stride * KILN_DOT_ROWS);
        float *v = malloc((size_t)n * sizeof *v), got[KILN_DOT_ROWS];
        for (int trial = 0; trial < 4; trial++) {
            if (e->type == KILN_TYPE_Q8_0) {
                for (int64_t i = 0; i < n; i++) v[i] = next_normal();
                ref->quantize(v, x, n);
            } else {
                random_row(c, x, n);
            }
            for (int k = 0; k < KILN_DOT_ROWS; k++) {
                for (int64_t i = 0; i < n; i++) v[i] = next_normal() * (float)(k + 1);
                act->quantize(v, y + k * y_stride, n);
            }
            e->ops.vec_dot_rows(n, x, y, y_stride, got);
            for (int k = 0; k < KILN_DOT_ROWS; k++) {
                float alone = e->ops.vec_dot(n, x, y + k * y_stride);
                if (memcmp(&got[k], &alone, sizeof alone))
                    fail_msg("%s %s vec_dot_rows row %d: %.9g, vec_dot %.9g", f->name, kiln_type_name(e->type), k,
                             got[k], alone);
            }
        }
        free(x);
        free(y);
        free(v);
    }
}

static void test_simd_matches_scalar(void **state) {
    (void)state;
    int count, checked = 0;
    const kiln_quant_family *const *families = kiln_quant_families(&count);
    for (int i = 0; i < count; i++) {
        const kiln_quant_family *f = families[i];
        if (!is_ours(f) || f->level == KILN_LEVEL_SCALAR || !kiln_quant_level_supported(f->level)) continue;
        for (int k = 0; k < f->n_entries; k++) {
            const kiln_quant_entry *e = &f->entries[k];
            const kiln_quant_ops *ref = kiln_quant_ops_get(e->type, KILN_ISA_SCALAR);
            assert_non_null(ref);
            if (e->ops.dequantize) check_dequantize(f, e, ref);
            if (e->ops.quantize) check_quantize(f, e, ref);
            if (e->ops.vec_dot) check_vec_dot(f, e, ref);
            if (e->ops.vec_dot_rows) check_vec_dot_rows(f, e, ref);
            checked++;
        }
    }
    printf("checked %d SIMD entries against scalar\n", checked);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_simd_matches_scalar)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

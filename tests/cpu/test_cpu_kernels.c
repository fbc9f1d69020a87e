/* The CPU executor's kernels against their scalar references on fresh random data: KV-cache row operations, the
 * tiled quantized matmul, and the thread pool. */
#include <math.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/gemm.h"
#include "cpu/kv_ops.h"
#include "cpu/matmul.h"
#include "cpu/threadpool.h"
#include "quant/quant.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static void fill(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = frand();
}

static void test_kv_ops_simd_match_scalar(void **state) {
    (void)state;
    if (kiln_cpu_isa() < KILN_ISA_AVX2) skip();
    kiln_type types[2] = {KILN_TYPE_F16, KILN_TYPE_F32};
    enum { N = 77 }; /* not a multiple of 8: the tail path runs too */
    for (int ti = 0; ti < 2; ti++) {
        const kiln_kv_ops *ref = kiln_kv_ops_get(types[ti], KILN_ISA_SCALAR);
        const kiln_kv_ops *simd = kiln_kv_ops_get(types[ti], KILN_ISA_AVX2);
        float src[N], q[N], out_ref[N], out_simd[N];
        uint32_t row_ref[N], row_simd[N];
        fill(src, N);
        fill(q, N);
        ref->store(row_ref, src, N);
        simd->store(row_simd, src, N);
        assert_memory_equal(row_ref, row_simd, kiln_row_size(types[ti], N));
        float d_ref = ref->dot(q, row_ref, N), d_simd = simd->dot(q, row_ref, N);
        assert_true(fabsf(d_ref - d_simd) <= 1e-5f * (1.0f + fabsf(d_ref)));
        fill(out_ref, N);
        memcpy(out_simd, out_ref, sizeof out_ref);
        ref->axpy(out_ref, 0.37f, row_ref, N);
        simd->axpy(out_simd, 0.37f, row_ref, N);
        for (int i = 0; i < N; i++) assert_true(fabsf(out_ref[i] - out_simd[i]) <= 1e-6f);
    }
    assert_null(kiln_kv_ops_get(KILN_TYPE_Q4_0, KILN_ISA_SCALAR));
}

/* dot_rows gives every query the bits of dot, and mix every element the bits of axpy row after row, at every ISA,
 * for 1..8 queries and rows of 77 elements (32-element runs, 8-element runs and a tail). */
static void test_kv_rows_match_single(void **state) {
    (void)state;
    kiln_type types[2] = {KILN_TYPE_F16, KILN_TYPE_F32};
    enum { N = 77, R = KILN_KV_ROWS };
    for (int isa = KILN_ISA_SCALAR; isa <= (int)kiln_cpu_isa() && isa <= KILN_ISA_AVX2; isa++)
        for (int ti = 0; ti < 2; ti++) {
            const kiln_kv_ops *ops = kiln_kv_ops_get(types[ti], (kiln_isa)isa);
            size_t stride = kiln_row_size(types[ti], N) + 12; /* rows not packed back to back */
            float src[N], q[R][N], out[N], alone[N], got[R], a[R];
            char *rows = calloc(R, stride);
            const float *qs[R];
            for (int g = 0; g < R; g++) {
                fill(src, N);
                ops->store(rows + g * stride, src, N);
                fill(q[g], N);
                qs[g] = q[g], a[g] = 0.1f * (float)(g + 1);
            }
            for (int nq = 1; nq <= R; nq++) {
                ops->dot_rows(qs, nq, rows, N, got);
                for (int g = 0; g < nq; g++) {
                    float want = ops->dot(q[g], rows, N);
                    assert_memory_equal(&got[g], &want, sizeof want);
                }
                fill(out, N);
                memcpy(alone, out, sizeof alone);
                for (int r = 0; r < nq; r++) ops->axpy(alone, a[r], rows + r * stride, N);
                ops->mix(out, a, rows, stride, nq, N);
                assert_memory_equal(out, alone, sizeof alone);
            }
            free(rows);
        }
}

/* A random weight of the given type, its F32 dequantization, and products against both. */
static void check_matmul(kiln_type type, int n_in, int n_out, int n_tok, kiln_pool *pool) {
    const kiln_quant_ops *ops = kiln_quant_ops_best(type);
    size_t row_bytes = kiln_row_size(type, n_in);
    float *wf = malloc(sizeof(float) * (size_t)n_in * n_out), *in = malloc(sizeof(float) * (size_t)n_in * n_tok);
    char *wq = malloc(row_bytes * (size_t)n_out);
    float *out = malloc(sizeof(float) * (size_t)n_out * n_tok), *one = malloc(sizeof(float) * (size_t)n_out);
    fill(wf, n_in * n_out);
    fill(in, n_in * n_tok);
    for (int r = 0; r < n_out; r++) {
        ops->quantize(wf + (size_t)r * n_in, wq + (size_t)r * row_bytes, n_in);
        ops->dequantize(wq + (size_t)r * row_bytes, wf + (size_t)r * n_in, n_in);
    }
    kiln_weight w = {.data = wq, .type = type, .ne = {n_in, n_out}, .row_bytes = row_bytes, .name = "w"};
    const kiln_weight *ws[1] = {&w};
    void *scratch = malloc(kiln_matmul_scratch_size(&w, n_tok));
    float *outs[1] = {out};
    kiln_matmul(pool, ws, outs, 1, in, n_tok, scratch);

    double err = 0, norm = 0;
    for (int t = 0; t < n_tok; t++) {
        float *one_out[1] = {one};
        kiln_matmul(pool, ws, one_out, 1, in + (size_t)t * n_in, 1, scratch);
        for (int r = 0; r < n_out; r++) {
            double exact = 0;
            for (int i = 0; i < n_in; i++) exact += (double)wf[(size_t)r * n_in + i] * in[(size_t)t * n_in + i];
            float got = out[(size_t)t * n_out + r];
            /* the batch path (multi-token kernels) computes what token-by-token does, up to summation order */
            assert_true(fabsf(got - one[r]) <= 1e-5f * (1.0f + fabsf(one[r])));
            err += (got - exact) * (got - exact);
            norm += exact * exact;
        }
    }
    /* the input is quantized to 8 bits for the integer types: about 1% relative error at most */
    double bound = type == KILN_TYPE_F32 || type == KILN_TYPE_F16 ? 1e-5 : 2e-2;
    assert_true(sqrt(err / norm) < bound);
    free(scratch);
    free(wf);
    free(in);
    free(wq);
    free(out);
    free(one);
}

static void test_matmul_matches_dequantized_product(void **state) {
    (void)state;
    kiln_pool *pool;
    kiln_error err;
    assert_int_equal(kiln_pool_new(3, &pool, &err), 0);
    kiln_type types[] = {KILN_TYPE_F32, KILN_TYPE_F16, KILN_TYPE_Q4_0, KILN_TYPE_Q4_1, KILN_TYPE_Q8_0};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (!kiln_quant_ops_best(types[i]) || !kiln_quant_ops_best(types[i])->quantize) continue;
        check_matmul(types[i], 320, 37, 9, pool); /* 10 blocks: a group of 8 and a tail; 9 tokens: 2 x 4 and 1 */
        check_matmul(types[i], 64, 16, 1, pool);
    }
    kiln_type rows_types[] = {KILN_TYPE_Q5_0, KILN_TYPE_Q4_K, KILN_TYPE_Q6_K}; /* vec_dot_rows where the ISA has it */
    for (size_t i = 0; i < sizeof rows_types / sizeof rows_types[0]; i++) check_matmul(rows_types[i], 512, 37, 9, pool);
    kiln_pool_free(pool);
}

/* One weight type's multi-token kernels against the reference on fresh random data. */
static void check_gemm(kiln_type type, kiln_gemm_fn avx2, kiln_gemm_fn avx512, kiln_gemm_fn vnni) {
    enum { N = 576, T = KILN_GEMM_TOKENS }; /* 18 blocks: two groups of 8 and a pair */
    const kiln_quant_ops *wops = kiln_quant_ops_get(type, KILN_ISA_SCALAR);
    kiln_type act = wops->vec_dot_type;
    const kiln_quant_ops *yops = kiln_quant_ops_get(act, KILN_ISA_SCALAR);
    size_t x_bytes = kiln_row_size(type, N), y_bytes = kiln_row_size(act, N);
    float w[N], a[N], scales[T][N / 16], want[T], got[T];
    char *x = malloc(x_bytes), *y = malloc(y_bytes * T);
    for (int len = N; len >= N - 32; len -= 32) { /* 17 blocks too: an odd last block */
        fill(w, len);
        wops->quantize(w, x, len);
        for (int k = 0; k < T; k++) {
            fill(a, len);
            yops->quantize(a, y + k * y_bytes, len);
            kiln_gemm_scales(y + k * y_bytes, len, act, scales[k]);
        }
        kiln_gemm_get(type, KILN_ISA_SCALAR)(len, x, y, y_bytes, scales[0], N / 16, want);
        kiln_gemm_fn simd[3] = {avx2, avx512, vnni};
        for (int v = 0; v < 3; v++) {
            if (!simd[v]) continue;
            simd[v](len, x, y, y_bytes, scales[0], N / 16, got);
            for (int k = 0; k < T; k++) assert_true(fabsf(got[k] - want[k]) <= 1e-5f * (1.0f + fabsf(want[k])));
        }
        if (avx2) { /* bit for bit the AVX2 vec_dot's result: a batched prompt token equals the same token alone */
            kiln_vec_dot_fn dot = kiln_quant_ops_get(type, KILN_ISA_AVX2)->vec_dot;
            avx2(len, x, y, y_bytes, scales[0], N / 16, got);
            for (int k = 0; k < T; k++) {
                float alone = dot(len, x, y + k * y_bytes);
                assert_memory_equal(&got[k], &alone, sizeof alone);
            }
        }
    }
    free(x);
    free(y);
}

static void test_gemm_simd_matches_reference(void **state) {
    (void)state;
    bool avx2 = kiln_cpu_isa() >= KILN_ISA_AVX2, avx512 = kiln_cpu_isa() >= KILN_ISA_AVX512;
    bool vnni = avx512 && __builtin_cpu_supports("avx512vnni");
    check_gemm(KILN_TYPE_Q4_1, avx2 ? kiln_gemm_q4_1_avx2 : NULL, avx512 ? kiln_gemm_q4_1_avx512 : NULL,
               vnni ? kiln_gemm_q4_1_avx512_vnni : NULL);
    check_gemm(KILN_TYPE_Q4_0, avx2 ? kiln_gemm_q4_0_avx2 : NULL, avx512 ? kiln_gemm_q4_0_avx512 : NULL,
               vnni ? kiln_gemm_q4_0_avx512_vnni : NULL);
    assert_null(kiln_gemm_get(KILN_TYPE_Q6_K, KILN_ISA_SCALAR));
}

/* Items handed out through an atomic counter, as every job must: each is done exactly once, whoever joins. */
typedef struct count_job {
    atomic_int next;
    int done[1000];
} count_job;

static void count_run(void *arg, int ith, int nth) {
    count_job *j = arg;
    if (ith < 0 || ith >= nth) return;
    int i;
    while ((i = atomic_fetch_add(&j->next, 1)) < 1000) j->done[i]++;
}

static void test_pool_does_every_item_once(void **state) {
    (void)state;
    kiln_pool *pool;
    kiln_error err;
    assert_int_equal(kiln_pool_new(4, &pool, &err), 0);
    static count_job j;
    for (int round = 0; round < 300; round++) {
        atomic_store(&j.next, 0);
        memset(j.done, 0, sizeof j.done);
        kiln_pool_run(pool, count_run, &j);
        for (int i = 0; i < 1000; i++) assert_int_equal(j.done[i], 1);
    }
    kiln_pool_free(pool);
    assert_int_equal(kiln_pool_new(0, &pool, &err), -1);
    assert_true(kiln_physical_cores() >= 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_ops_simd_match_scalar),
        cmocka_unit_test(test_kv_rows_match_single),
        cmocka_unit_test(test_matmul_matches_dequantized_product),
        cmocka_unit_test(test_gemm_simd_matches_reference),
        cmocka_unit_test(test_pool_does_every_item_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

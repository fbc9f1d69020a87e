/* The CUDA kernels against CPU references on fresh random data: GEMV per weight type (and its fused SwiGLU form)
 * against src/quant's scalar dequantize, Q8_1 quantization, embedding lookup and F16 dequantization, RMSNorm with the
 * residual add, RoPE with bias and the KV store, split-K attention, argmax. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"
#include "cuda/kernels_batch.h"
#include "gpu_quant.h"
#include "gpu_test.h"
#include "quant/quant.h"
#include "sample/sample.h"
#include "util/half.h"

#define SKIP_WITHOUT_GPU()                                                                                             \
    do {                                                                                                               \
        if (!gpu_present()) skip();                                                                                    \
        rng_seed();                                                                                                    \
    } while (0)

/* Q8_1 as the GPU stores it: n int8, then n/32 (d, s) half pairs. */
static void check_quantize_q8_1(int k, int rows) {
    const int n = k * rows;
    float *x = malloc(sizeof(float) * n), *back = malloc(sizeof(float) * n);
    uint8_t *q = malloc(Q8_1_BYTES(n));
    rng_fill(x, (size_t)n, 3.0f);
    float *dx = gpu_upload(x, sizeof(float) * n);
    void *dq = gpu_alloc(Q8_1_BYTES(n));
    kiln_cuda_quantize_q8_1(dx, dq, k, rows, 0);
    CUDA_SYNC();
    CUDA_OK(cudaMemcpy(q, dq, Q8_1_BYTES(n), cudaMemcpyDeviceToHost));
    dequant_q8_1(q, n, back);
    for (int b = 0; b < n / 32; b++) {
        float amax = 0, d = q8_1_d(q, n, b);
        int sum = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * b + i])), sum += (int8_t)q[32 * b + i];
        /* each value within half a step of d (plus the rounding of d to half precision) */
        for (int i = 0; i < 32; i++) assert_true(fabsf(back[32 * b + i] - x[32 * b + i]) <= 0.5f * d + amax * 2e-3f);
        assert_true(fabsf(q8_1_s(q, n, b) - d * sum) <= 1e-3f * fabsf(d * sum) + 1e-3f);
    }
    free(x), free(back), free(q);
    gpu_free_all();
}

static void test_quantize_q8_1(void **state) {
    SKIP_WITHOUT_GPU();
    check_quantize_q8_1(4096, 3);
    check_quantize_q8_1(1536, 1); /* a last thread block partly past the end */
    check_quantize_q8_1(32, 1);
}

static bool has_reference(kiln_type type) {
    const kiln_quant_ops *ops = kiln_quant_ops_get(type, KILN_ISA_SCALAR);
    if (ops && ops->quantize && ops->dequantize) return true;
    fprintf(stderr, "%s: no CPU reference quantizer yet, skipped\n", kiln_type_name(type));
    return false;
}

/* y = W x with x as the GPU sees it (Q8_1 for quantized types): only summation order differs from the double
 * reference, so the bound is tight; the error against the unquantized x is printed for the record. */
static void check_gemv_case(kiln_type type, bool swiglu, bool accumulate, int k, int n) {
    float *deq, *deq_up = NULL;
    uint8_t *w = random_rows(type, k, n, &deq), *w_up = swiglu ? random_rows(type, k, n, &deq_up) : NULL;
    size_t rb = kiln_row_size(type, k);
    float *x = malloc(sizeof(float) * k), *xs = malloc(sizeof(float) * k), *y = malloc(sizeof(float) * n);
    float *y0 = malloc(sizeof(float) * n);
    double *ref = malloc(sizeof(double) * n), *ref_exact = malloc(sizeof(double) * n);
    uint8_t *q = malloc(Q8_1_BYTES(k));
    rng_fill(x, k, 1.0f);
    rng_fill(y0, n, accumulate ? 1.0f : 0.0f);
    float *dx = gpu_upload(x, sizeof(float) * k), *dy = gpu_upload(y0, sizeof(float) * n);
    void *dq = gpu_alloc(Q8_1_BYTES(k));
    kiln_cuda_matrix m = {upload_matrix(type, w, k, n), type, k, n, rb}, mu = m;
    if (swiglu) mu.data = upload_matrix(type, w_up, k, n);
    bool quantized = kiln_cuda_type_uses_q8_1(type);
    if (quantized) kiln_cuda_quantize_q8_1(dx, dq, k, 1, 0);
    int rc = swiglu ? kiln_cuda_gemv_swiglu(&m, &mu, dq, dx, dy, 0) : kiln_cuda_gemv(&m, dq, dx, dy, accumulate, 0);
    assert_int_equal(rc, 0);
    CUDA_SYNC();
    CUDA_OK(cudaMemcpy(y, dy, sizeof(float) * n, cudaMemcpyDeviceToHost));
    if (quantized) {
        CUDA_OK(cudaMemcpy(q, dq, Q8_1_BYTES(k), cudaMemcpyDeviceToHost));
        dequant_q8_1(q, k, xs);
    } else {
        memcpy(xs, x, sizeof(float) * k);
    }
    for (int r = 0; r < n; r++) {
        double a = 0, b = 0, ae = 0, be = 0;
        for (int i = 0; i < k; i++) {
            a += (double)deq[(size_t)r * k + i] * xs[i], ae += (double)deq[(size_t)r * k + i] * x[i];
            if (swiglu) b += (double)deq_up[(size_t)r * k + i] * xs[i], be += (double)deq_up[(size_t)r * k + i] * x[i];
        }
        ref[r] = y0[r] + (swiglu ? a / (1 + exp(-a)) * b : a);
        ref_exact[r] = y0[r] + (swiglu ? ae / (1 + exp(-ae)) * be : ae);
    }
    double e = rel_err(y, ref, n), e_exact = rel_err(y, ref_exact, n);
    fprintf(stderr, "gemv%s%s %-5s k %5d n %5d rel err %.2e (vs unquantized activations %.2e)\n",
            swiglu ? "+swiglu" : "", accumulate ? "+=" : "", kiln_type_name(type), k, n, e, e_exact);
    assert_true(e < 1e-5);
    assert_true(e_exact < (quantized ? 3e-2 : 1e-5));
    free(deq), free(deq_up), free(w), free(w_up), free(x), free(xs), free(y), free(y0), free(ref), free(ref_exact);
    free(q);
    gpu_free_all();
}

static void check_gemv(kiln_type type, bool swiglu, int k) {
    check_gemv_case(type, swiglu, false, k, 301); /* not a multiple of the rows per block */
}

/* Three matrices of different heights (the Q/K/V form), the first two of type tq, the last of tv, each against its
 * double reference: one launch when the types are one, or a mixed pair. */
static void check_gemv_multi(kiln_type tq, kiln_type tv, int k) {
    const int ns[3] = {256, 64, 66};
    float *x = malloc(sizeof(float) * k), *xs = malloc(sizeof(float) * k), *deq[3];
    uint8_t *q = malloc(Q8_1_BYTES(k)), *w[3];
    rng_fill(x, k, 1.0f);
    float *dx = gpu_upload(x, sizeof(float) * k), *dys[3];
    void *dq = gpu_alloc(Q8_1_BYTES(k));
    kiln_cuda_matrix m[3];
    const kiln_cuda_matrix *ms[3] = {&m[0], &m[1], &m[2]};
    for (int i = 0; i < 3; i++) {
        kiln_type type = i < 2 ? tq : tv;
        w[i] = random_rows(type, k, ns[i], &deq[i]);
        m[i] = (kiln_cuda_matrix){upload_matrix(type, w[i], k, ns[i]), type, k, ns[i], kiln_row_size(type, k)};
        dys[i] = gpu_alloc(sizeof(float) * ns[i]);
    }
    kiln_cuda_quantize_q8_1(dx, dq, k, 1, 0);
    assert_int_equal(kiln_cuda_gemv_multi(ms, dys, 3, dq, dx, 0), 0);
    CUDA_SYNC();
    CUDA_OK(cudaMemcpy(q, dq, Q8_1_BYTES(k), cudaMemcpyDeviceToHost));
    dequant_q8_1(q, k, xs);
    for (int i = 0; i < 3; i++) {
        float *y = malloc(sizeof(float) * ns[i]);
        double *ref = malloc(sizeof(double) * ns[i]);
        CUDA_OK(cudaMemcpy(y, dys[i], sizeof(float) * ns[i], cudaMemcpyDeviceToHost));
        for (int r = 0; r < ns[i]; r++) {
            ref[r] = 0;
            for (int e = 0; e < k; e++) ref[r] += (double)deq[i][(size_t)r * k + e] * xs[e];
        }
        assert_true(rel_err(y, ref, ns[i]) < 1e-5);
        free(y), free(ref), free(deq[i]), free(w[i]);
    }
    free(x), free(xs), free(q);
    gpu_free_all();
}

static double rel_err_f(const float *a, const float *ref, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
    }
    return isnan(num) ? INFINITY : sqrt(num / den);
}

/* y += W x with the next RMSNorm in the same launch, against the separate GEMV and norm kernels (themselves checked
 * against the CPU above): the same y, the same normed values and the same Q8_1 copy, launched twice to see the
 * block counter reset. k 8448 with few rows takes the two-warps-per-row form. */
static void check_gemv_norm(kiln_type type, int k, int n) {
    float *deq;
    uint8_t *w = random_rows(type, k, n, &deq);
    float *x = malloc(sizeof(float) * k), *y0 = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n);
    float *outs[2][2];
    uint8_t *qs[2];
    rng_fill(x, k, 1.0f), rng_fill(y0, n, 1.0f), rng_fill(g, n, 1.0f);
    void *dq = gpu_alloc(Q8_1_BYTES(k));
    kiln_cuda_quantize_q8_1(gpu_upload(x, sizeof(float) * k), dq, k, 1, 0);
    kiln_cuda_matrix m = {upload_matrix(type, w, k, n), type, k, n, kiln_row_size(type, k)};
    const float *dg = gpu_upload(g, sizeof(float) * n);
    unsigned zero = 0, *counter = gpu_upload(&zero, sizeof zero);
    for (int fused = 0; fused < 2; fused++) {
        float *dy = gpu_upload(y0, sizeof(float) * n), *dh = gpu_alloc(sizeof(float) * n);
        void *dhq = gpu_alloc(Q8_1_BYTES(n));
        kiln_cuda_norm_args na = {dg, dh, dhq, 1e-5f, counter};
        for (int rep = 0; rep < 2; rep++) {
            if (rep) CUDA_OK(cudaMemcpy(dy, y0, sizeof(float) * n, cudaMemcpyHostToDevice));
            if (fused) {
                assert_int_equal(kiln_cuda_gemv_norm(&m, dq, dy, &na, 0), 0);
            } else {
                assert_int_equal(kiln_cuda_gemv(&m, dq, NULL, dy, true, 0), 0);
                kiln_cuda_rmsnorm(dy, NULL, dg, dh, dhq, n, 1, 1e-5f, 0);
            }
        }
        CUDA_SYNC();
        outs[fused][0] = malloc(sizeof(float) * n), outs[fused][1] = malloc(sizeof(float) * n);
        qs[fused] = malloc(Q8_1_BYTES(n));
        CUDA_OK(cudaMemcpy(outs[fused][0], dy, sizeof(float) * n, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(outs[fused][1], dh, sizeof(float) * n, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(qs[fused], dhq, Q8_1_BYTES(n), cudaMemcpyDeviceToHost));
    }
    unsigned left;
    CUDA_OK(cudaMemcpy(&left, counter, sizeof left, cudaMemcpyDeviceToHost));
    assert_int_equal(left, 0);
    double ey = rel_err_f(outs[1][0], outs[0][0], n), eh = rel_err_f(outs[1][1], outs[0][1], n);
    float *q0 = malloc(sizeof(float) * n), *q1 = malloc(sizeof(float) * n);
    dequant_q8_1(qs[0], n, q0), dequant_q8_1(qs[1], n, q1);
    double eq = rel_err_f(q1, q0, n);
    fprintf(stderr, "gemv+norm %-5s k %5d n %4d: y %.1e, normed %.1e, Q8_1 %.1e against separate kernels\n",
            kiln_type_name(type), k, n, ey, eh, eq);
    assert_true(ey < 1e-6 && eh < 1e-5 && eq < 1e-2);
    free(deq), free(w), free(x), free(y0), free(g), free(q0), free(q1);
    for (int f = 0; f < 2; f++) free(outs[f][0]), free(outs[f][1]), free(qs[f]);
    gpu_free_all();
}

static void test_gemv_norm(void **state) {
    SKIP_WITHOUT_GPU();
    check_gemv_norm(KILN_TYPE_Q4_K, 1024, 1536);
    check_gemv_norm(KILN_TYPE_Q6_K, 8448, 1536);
    check_gemv_norm(KILN_TYPE_Q8_0, 512, 4096);
}

/* Embedding rows and F16 tiles against the CPU's dequantized rows. */
static void check_dequant(kiln_type type) {
    const int k = 512, n = 40, n_tok = 5;
    float *deq;
    uint8_t *w = random_rows(type, k, n, &deq);
    size_t rb = kiln_row_size(type, k);
    kiln_cuda_matrix m = {upload_matrix(type, w, k, n), type, k, n, rb};
    int32_t tokens[5] = {7, 0, 39, 7, 21};
    int32_t *dt = gpu_upload(tokens, sizeof tokens);
    float *drows = gpu_alloc(sizeof(float) * k * n_tok), *rows = malloc(sizeof(float) * k * n_tok);
    void *dh = gpu_alloc(2 * (size_t)k * n);
    kiln_half *h = malloc(2 * (size_t)k * n);
    assert_int_equal(kiln_cuda_get_rows(&m, dt, n_tok, drows, 0), 0);
    assert_int_equal(kiln_cuda_dequantize_f16(&m, dh, 0), 0);
    CUDA_SYNC();
    CUDA_OK(cudaMemcpy(rows, drows, sizeof(float) * k * n_tok, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(h, dh, 2 * (size_t)k * n, cudaMemcpyDeviceToHost));
    for (int t = 0; t < n_tok; t++)
        for (int i = 0; i < k; i++) {
            float want = deq[(size_t)tokens[t] * k + i], got = rows[(size_t)t * k + i];
            if (fabsf(got - want) > 1e-6f * fabsf(want) + 1e-30f)
                fail_msg("%s get_rows token %d elem %d: %g, want %g", kiln_type_name(type), tokens[t], i, got, want);
        }
    for (size_t i = 0; i < (size_t)k * n; i++) {
        float want = kiln_half_to_float(kiln_float_to_half(deq[i])), got = kiln_half_to_float(h[i]);
        if (got != want && fabsf(got - want) > 1e-3f * fabsf(want))
            fail_msg("%s f16 elem %zu: %g, want %g", kiln_type_name(type), i, got, want);
    }
    free(deq), free(w), free(rows), free(h);
    gpu_free_all();
}

/* The row loop (gemv_q_loop_kernel: one wave of blocks, rows in turn a warp, the activations held) on launches of
 * one-batch rows past a wave, forced on these rows: more rows than a wave's warps (several a warp), rows shorter than
 * a warp's lanes, the residual add, the gate/up pair, row pairs; and those launches' forms without it. */
static void check_gemv_loop(kiln_type type) {
    setenv("KILN_CUDA_GEMV_WAVES", "1", 1);
    const char *loop[] = {"1", "0"};
    for (int i = 0; i < 2; i++) {
        setenv("KILN_CUDA_GEMV_LOOP", loop[i], 1);
        check_gemv_case(type, false, false, 1536, 4501);
        check_gemv_case(type, true, false, 1536, 4501);
        check_gemv_case(type, false, true, 512, 301);
        setenv("KILN_CUDA_GEMV_PAIR", "1", 1);
        check_gemv_case(type, false, true, 1536, 4502);
        unsetenv("KILN_CUDA_GEMV_PAIR");
    }
    unsetenv("KILN_CUDA_GEMV_LOOP");
    unsetenv("KILN_CUDA_GEMV_WAVES");
}

static void test_type(void **state) {
    SKIP_WITHOUT_GPU();
    kiln_type type = (kiln_type)(intptr_t)*state;
    if (!has_reference(type)) skip();
    check_gemv(type, false, 1024);
    check_gemv(type, true, 1024);
    check_gemv(type, false, 3328); /* four parts a lane in one batch, the fourth past the row's end for most lanes */
    /* the residual add in batches of two and of four: y loaded right after the wait (the default: 1), after the sums
     * (0), right after the wait in the batches of two only (2) */
    const char *add_early[] = {"1", "0", "2"};
    for (int i = 0; i < 3; i++) {
        setenv("KILN_CUDA_GEMV_ADD_EARLY", add_early[i], 1);
        check_gemv_case(type, false, true, 1536, 1000);
        check_gemv_case(type, false, true, 3328, 1000);
    }
    unsetenv("KILN_CUDA_GEMV_ADD_EARLY");
    /* batches of four on a row of two batches, the second part-empty: the form KILN_CUDA_GEMV_BATCH=4 forces */
    setenv("KILN_CUDA_GEMV_BATCH", "4", 1);
    check_gemv(type, false, 6144);
    unsetenv("KILN_CUDA_GEMV_BATCH");
    /* rows of 8192+ inputs take the kernel's two-warps-per-row path */
    if (type == KILN_TYPE_Q4_0 || type == KILN_TYPE_Q4_K || type == KILN_TYPE_Q6_K) check_gemv(type, true, 8448);
    if (type == KILN_TYPE_Q8_0 || type == KILN_TYPE_Q5_K) check_gemv(type, false, 8448);
    const char *five_parts[] = {"5", "2"}; /* such rows' five parts a lane in one batch (the default), in twos */
    for (int i = 0; i < 2 && kiln_cuda_type_uses_q8_1(type); i++) {
        setenv("KILN_CUDA_GEMV_BATCH", five_parts[i], 1);
        check_gemv(type, false, 8448);
        check_gemv_case(type, false, true, 8960, 1000);
    }
    unsetenv("KILN_CUDA_GEMV_BATCH");
    if (kiln_cuda_type_uses_q8_1(type)) check_gemv_multi(type, type, 512);
    /* the forms launches of more than one wave take (8 blocks an SM), forced on these few rows */
    setenv("KILN_CUDA_GEMV_WAVES", "1", 1);
    check_gemv(type, false, 4096);
    check_gemv(type, true, 1536);
    if (type == KILN_TYPE_Q4_K || type == KILN_TYPE_Q6_K) check_gemv(type, false, 8448);
    unsetenv("KILN_CUDA_GEMV_WAVES");
    /* row pairs (rows r and r + n / 2 a warp), forced on these few rows: the residual add, Q/K/V, two batches */
    setenv("KILN_CUDA_GEMV_PAIR", "1", 1);
    check_gemv_case(type, false, true, 1536, 1000);
    check_gemv_case(type, false, false, 6144, 302);
    if (kiln_cuda_type_uses_q8_1(type)) check_gemv_multi(type, type, 512);
    unsetenv("KILN_CUDA_GEMV_PAIR");
    if (kiln_cuda_type_uses_q8_1(type)) check_gemv_loop(type);
    check_dequant(type);
}

/* Q/K and V of different types: the K-quant mixes' pairs in one launch (4096 wide: Q4_K's lanes take batches of
 * four there, Q6_K's two; and both two in the form of launches past one wave), another pair in two */
static void test_gemv_mixed(void **state) {
    SKIP_WITHOUT_GPU();
    check_gemv_multi(KILN_TYPE_Q4_K, KILN_TYPE_Q6_K, 512);
    check_gemv_multi(KILN_TYPE_Q4_K, KILN_TYPE_Q6_K, 4096);
    check_gemv_multi(KILN_TYPE_Q5_K, KILN_TYPE_Q6_K, 1536);
    check_gemv_multi(KILN_TYPE_Q8_0, KILN_TYPE_Q4_0, 512);
    setenv("KILN_CUDA_GEMV_WAVES", "1", 1); /* the 8-blocks-an-SM form of launches past one wave */
    check_gemv_multi(KILN_TYPE_Q4_K, KILN_TYPE_Q6_K, 4096);
    unsetenv("KILN_CUDA_GEMV_WAVES");
    setenv("KILN_CUDA_GEMV_PAIR", "1", 1); /* row pairs, as llama3-8b's Q/K/V take them */
    check_gemv_multi(KILN_TYPE_Q4_K, KILN_TYPE_Q6_K, 4096);
    check_gemv_multi(KILN_TYPE_Q5_K, KILN_TYPE_Q6_K, 1536);
    unsetenv("KILN_CUDA_GEMV_PAIR");
}

/* A head-like launch of many waves of short rows, which takes row pairs in the form of launches past one wave
 * (pair_launch), without any setting: Q6_K as Q4_K_M keeps the output matrix, rows of 48 parts. */
static void test_gemv_head(void **state) {
    SKIP_WITHOUT_GPU();
    check_gemv_case(KILN_TYPE_Q6_K, false, false, 1536, 40000);
    check_gemv_case(KILN_TYPE_Q8_0, false, false, 576, 49152);
}

/* Rows of n with a residual: each width takes one of the kernel's forms (a run of 4 values a thread up to 4096,
 * two runs, four). */
static void check_rmsnorm(int n) {
    const int rows = 3;
    size_t bytes = sizeof(float) * n * rows;
    float *x = malloc(bytes), *res = malloc(bytes), *w = malloc(sizeof(float) * n), *out = malloc(bytes),
          *xo = malloc(bytes), *qb = malloc(bytes);
    double *ref = malloc(sizeof(double) * n * rows), *ref_x = malloc(sizeof(double) * n * rows);
    uint8_t *q = malloc(Q8_1_BYTES(n * rows));
    rng_fill(x, (size_t)n * rows, 2.0f), rng_fill(res, (size_t)n * rows, 1.0f), rng_fill(w, n, 1.5f);
    float *dx = gpu_upload(x, bytes), *dr = gpu_upload(res, bytes), *dw = gpu_upload(w, sizeof(float) * n);
    float *dout = gpu_alloc(bytes);
    void *dq = gpu_alloc(Q8_1_BYTES(n * rows));
    kiln_cuda_rmsnorm(dx, dr, dw, dout, dq, n, rows, 1e-5f, 0);
    CUDA_SYNC();
    CUDA_OK(cudaMemcpy(out, dout, bytes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(xo, dx, bytes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(q, dq, Q8_1_BYTES(n * rows), cudaMemcpyDeviceToHost));
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < n; i++) {
            ref_x[r * n + i] = (double)x[r * n + i] + res[r * n + i];
            ss += ref_x[r * n + i] * ref_x[r * n + i];
        }
        double scale = 1.0 / sqrt(ss / n + 1e-5);
        for (int i = 0; i < n; i++) ref[r * n + i] = ref_x[r * n + i] * scale * w[i];
    }
    dequant_q8_1(q, n * rows, qb);
    assert_true(rel_err(xo, ref_x, (size_t)n * rows) < 1e-6);
    assert_true(rel_err(out, ref, (size_t)n * rows) < 1e-5);
    assert_true(rel_err(qb, ref, (size_t)n * rows) < 1e-2);
    /* the Q8_1 is the very bytes the quantize kernel makes of the normed rows */
    uint8_t *q2 = malloc(Q8_1_BYTES(n * rows));
    void *dq2 = gpu_alloc(Q8_1_BYTES(n * rows));
    kiln_cuda_quantize_q8_1(dout, dq2, n, rows, 0);
    CUDA_SYNC();
    CUDA_OK(cudaMemcpy(q2, dq2, Q8_1_BYTES(n * rows), cudaMemcpyDeviceToHost));
    assert_memory_equal(q, q2, Q8_1_BYTES(n * rows));
    free(x), free(res), free(w), free(out), free(xo), free(qb), free(ref), free(ref_x), free(q), free(q2);
    gpu_free_all();
}

/* A decode step's rows (kiln_cuda_rmsnorm_rows) against a double reference; their Q8_1 the very bytes the quantize
 * kernel makes of the normed rows, their half-mode form (kiln_cuda_rmsnorm_rows_half) the very halves; and the
 * last row alone the same bytes as among the others. */
static void check_rmsnorm_rows(int n, int rows) {
    size_t all = (size_t)n * rows;
    float *x = malloc(sizeof(float) * all), *w = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * all);
    float *qb = malloc(sizeof(float) * all), *one = malloc(sizeof(float) * n);
    double *ref = malloc(sizeof(double) * all);
    uint8_t *q = malloc(Q8_1_BYTES(all)), *q2 = malloc(Q8_1_BYTES(all));
    rng_fill(x, all, 2.0f), rng_fill(w, n, 1.5f);
    float *dx = gpu_upload(x, sizeof(float) * all), *dw = gpu_upload(w, sizeof(float) * n);
    float *dout = gpu_alloc(sizeof(float) * all), *done = gpu_alloc(sizeof(float) * n);
    void *dq = gpu_alloc(Q8_1_BYTES(all)), *dq2 = gpu_alloc(Q8_1_BYTES(all));
    kiln_cuda_rmsnorm_rows(dx, dw, dout, dq, n, rows, 1e-5f, 0);
    kiln_cuda_quantize_q8_1(dout, dq2, n, rows, 0);
    kiln_cuda_rmsnorm_rows(dx + all - n, dw, done, NULL, n, 1, 1e-5f, 0);
    /* the half mode's form: the same F32 rows, and the very halves kiln_cuda_batch_to_half makes of them */
    float *dout_h = gpu_alloc(sizeof(float) * all);
    void *dh = gpu_alloc(sizeof(uint16_t) * all), *dh2 = gpu_alloc(sizeof(uint16_t) * all);
    kiln_cuda_rmsnorm_rows_half(dx, dw, dout_h, dh, n, rows, 1e-5f, 0);
    kiln_cuda_batch_to_half(dout, dh2, n, rows, 0);
    CUDA_SYNC();
    float *out_h = malloc(sizeof(float) * all);
    uint16_t *h = malloc(sizeof(uint16_t) * all), *h2 = malloc(sizeof(uint16_t) * all);
    CUDA_OK(cudaMemcpy(out_h, dout_h, sizeof(float) * all, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(h, dh, sizeof(uint16_t) * all, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(h2, dh2, sizeof(uint16_t) * all, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(out, dout, sizeof(float) * all, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(one, done, sizeof(float) * n, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(q, dq, Q8_1_BYTES(all), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(q2, dq2, Q8_1_BYTES(all), cudaMemcpyDeviceToHost));
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * n;
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        for (int i = 0; i < n; i++) ref[(size_t)r * n + i] = xr[i] / sqrt(ss / n + 1e-5) * w[i];
    }
    dequant_q8_1(q, (int)all, qb);
    assert_true(rel_err(out, ref, all) < 1e-5);
    assert_true(rel_err(qb, ref, all) < 1e-2);
    assert_memory_equal(q, q2, Q8_1_BYTES(all));
    assert_memory_equal(one, out + all - n, sizeof(float) * n);
    assert_memory_equal(out_h, out, sizeof(float) * all);
    assert_memory_equal(h, h2, sizeof(uint16_t) * all);
    free(x), free(w), free(out), free(qb), free(one), free(ref), free(q), free(q2), free(out_h), free(h), free(h2);
    gpu_free_all();
}

static void test_rmsnorm(void **state) {
    SKIP_WITHOUT_GPU();
    static const int widths[] = {576, 1536, 4096, 5120, KILN_CUDA_NORM_MAX};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) check_rmsnorm(widths[i]);
    static const int rows[] = {576, 1536, 3072, 4096, 5120, 8192};
    /* rows over several blocks each (the default), up to 8192 values; past that, and under KILN_CUDA_NORM_SPLIT=0,
     * one block a row */
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        check_rmsnorm_rows(rows[i], 1);
        check_rmsnorm_rows(rows[i], 3);
    }
    check_rmsnorm_rows(KILN_CUDA_NORM_MAX, 2);
    setenv("KILN_CUDA_NORM_SPLIT", "0", 1);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) check_rmsnorm_rows(rows[i], 3);
    unsetenv("KILN_CUDA_NORM_SPLIT");
}

/* Rope with biases on q and k (and a bias on v), NeoX and normal pairing, a partial rope_dim, several tokens. */
static void check_rope(bool neox) {
    kiln_cuda_rope_args a = {.n_head = 4, .n_head_kv = 2, .head_dim = 64, .rope_dim = 48, .n_ctx = 32, .neox = neox,
                             .q_scale = 0.125f};
    const int T = 3, pos0 = 17, qd = a.n_head * a.head_dim, kvd = a.n_head_kv * a.head_dim;
    float freq[32], *q = malloc(sizeof(float) * T * qd), *k = malloc(sizeof(float) * T * kvd),
                    *v = malloc(sizeof(float) * T * kvd), bq[256], bk[128], bv[128];
    for (int i = 0; i < a.rope_dim / 2; i++) freq[i] = powf(10000.0f, -2.0f * i / a.rope_dim);
    rng_fill(q, (size_t)T * qd, 1), rng_fill(k, (size_t)T * kvd, 1), rng_fill(v, (size_t)T * kvd, 1);
    rng_fill(bq, qd, 0.5f), rng_fill(bk, kvd, 0.5f), rng_fill(bv, kvd, 0.5f);
    a.freq = gpu_upload(freq, sizeof freq);
    float *dq = gpu_upload(q, sizeof(float) * T * qd), *dk = gpu_upload(k, sizeof(float) * T * kvd);
    float *dv = gpu_upload(v, sizeof(float) * T * kvd);
    size_t cache_bytes = 2 * (size_t)kvd * a.n_ctx;
    void *kc = gpu_alloc(cache_bytes), *vc = gpu_alloc(cache_bytes);
    int32_t pos = pos0, *dpos = gpu_upload(&pos, sizeof pos);
    kiln_cuda_rope_store(&a, dq, dk, dv, gpu_upload(bq, sizeof bq), gpu_upload(bk, sizeof bk),
                         gpu_upload(bv, sizeof bv), kc, vc, dpos, T, 0);
    CUDA_SYNC();
    float *qo = malloc(sizeof(float) * T * qd), *ko = malloc(sizeof(float) * T * kvd), *vo = malloc(sizeof(float) * T * kvd);
    double *qr = malloc(sizeof(double) * T * qd), *kr = malloc(sizeof(double) * T * kvd), *vr = malloc(sizeof(double) * T * kvd);
    kiln_half *kh = malloc(cache_bytes), *vh = malloc(cache_bytes);
    CUDA_OK(cudaMemcpy(qo, dq, sizeof(float) * T * qd, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(kh, kc, cache_bytes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(vh, vc, cache_bytes, cudaMemcpyDeviceToHost));
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < a.n_head + a.n_head_kv; h++) {
            bool is_q = h < a.n_head;
            int off = (is_q ? h : h - a.n_head) * a.head_dim;
            const float *src = is_q ? q + t * qd + off : k + t * kvd + off, *b = is_q ? bq + off : bk + off;
            double *dst = is_q ? qr + t * qd + off : kr + t * kvd + off;
            for (int i = 0; i < a.head_dim; i++) dst[i] = (double)src[i] + b[i];
            for (int i = 0; i < a.rope_dim / 2; i++) {
                int i0 = neox ? i : 2 * i, i1 = neox ? i + a.rope_dim / 2 : 2 * i + 1;
                double ang = (double)((float)(pos0 + t) * freq[i]), x0 = dst[i0], x1 = dst[i1];
                dst[i0] = x0 * cos(ang) - x1 * sin(ang), dst[i1] = x0 * sin(ang) + x1 * cos(ang);
            }
            if (is_q)
                for (int i = 0; i < a.head_dim; i++) dst[i] *= a.q_scale;
        }
        for (int i = 0; i < kvd; i++) vr[t * kvd + i] = (double)v[t * kvd + i] + bv[i];
        for (int h = 0; h < a.n_head_kv; h++)
            for (int i = 0; i < a.head_dim; i++) {
                size_t c = ((size_t)h * a.n_ctx + pos0 + t) * a.head_dim + i;
                ko[t * kvd + h * a.head_dim + i] = kiln_half_to_float(kh[c]);
                vo[t * kvd + h * a.head_dim + i] = kiln_half_to_float(vh[c]);
            }
    }
    assert_true(rel_err(qo, qr, (size_t)T * qd) < 1e-5);
    assert_true(rel_err(ko, kr, (size_t)T * kvd) < 1e-3); /* F16 storage */
    assert_true(rel_err(vo, vr, (size_t)T * kvd) < 1e-3);
    free(q), free(k), free(v), free(qo), free(ko), free(vo), free(qr), free(kr), free(vr), free(kh), free(vh);
    gpu_free_all();
}

static void test_rope(void **state) {
    SKIP_WITHOUT_GPU();
    check_rope(false);
    check_rope(true);
}

/* Q/K/V with the rope stage in the GEMV launch (kiln_cuda_gemv_qkv_rope), its biases loaded before the wait (the
 * default) or after the sums (KILN_CUDA_ROPE_BIAS_EARLY=0), against kiln_cuda_gemv_multi and then
 * kiln_cuda_rope_store (each checked against the CPU above): the same arithmetic, so the same q and the same cache
 * bytes. llama3-8b's shape takes row pairs and the Q4_K + Q6_K mixed launch on an H100; the small one one type, a
 * partial rotary dim and biases. NeoX pairs are refused. */
static void check_qkv_rope(kiln_type tq, kiln_type tv, int k, int n_head, int n_head_kv, int head_dim, int rope_dim,
                           bool bias) {
    kiln_cuda_rope_args a = {.n_head = n_head, .n_head_kv = n_head_kv, .head_dim = head_dim, .rope_dim = rope_dim,
                             .n_ctx = 64, .neox = false, .q_scale = 0.088f};
    int ns[3] = {n_head * head_dim, n_head_kv * head_dim, n_head_kv * head_dim}, qd = ns[0], kvd = ns[1];
    float *x = malloc(sizeof(float) * k), freq[128], *deq, *b[3] = {NULL, NULL, NULL};
    for (int i = 0; i < rope_dim / 2; i++) freq[i] = powf(500000.0f, -2.0f * i / rope_dim);
    a.freq = gpu_upload(freq, sizeof freq);
    rng_fill(x, k, 1.0f);
    void *dx = gpu_alloc(Q8_1_BYTES(k));
    kiln_cuda_quantize_q8_1(gpu_upload(x, sizeof(float) * k), dx, k, 1, 0);
    kiln_cuda_matrix m[3];
    const kiln_cuda_matrix *ms[3] = {&m[0], &m[1], &m[2]};
    for (int i = 0; i < 3; i++) {
        kiln_type t = i < 2 ? tq : tv;
        uint8_t *w = random_rows(t, k, ns[i], &deq);
        m[i] = (kiln_cuda_matrix){upload_matrix(t, w, k, ns[i]), t, k, ns[i], kiln_row_size(t, k)};
        free(w), free(deq);
        if (bias) {
            float *h = malloc(sizeof(float) * ns[i]);
            rng_fill(h, ns[i], 0.5f);
            b[i] = gpu_upload(h, sizeof(float) * ns[i]);
            free(h);
        }
    }
    int32_t pos = 37, *dpos = gpu_upload(&pos, sizeof pos);
    size_t cache = 2 * (size_t)kvd * a.n_ctx;
    float *q[3];
    uint8_t *kc[3], *vc[3];
    for (int form = 0; form < 3; form++) { /* the two kernels, the fused launch with the biases late, then early */
        bool fused = form > 0;
        float *dq = gpu_alloc(sizeof(float) * qd), *dk = gpu_alloc(sizeof(float) * kvd), *dv = gpu_alloc(sizeof(float) * kvd);
        float *ys[3] = {dq, dk, dv};
        void *dkc = gpu_alloc(cache), *dvc = gpu_alloc(cache);
        CUDA_OK(cudaMemset(dkc, 0, cache));
        CUDA_OK(cudaMemset(dvc, 0, cache));
        if (fused) {
            if (form == 1) setenv("KILN_CUDA_ROPE_BIAS_EARLY", "0", 1);
            assert_int_equal(kiln_cuda_gemv_qkv_rope(ms, dq, dx, &a, b[0], b[1], b[2], dkc, dvc, dpos, 0), 0);
            unsetenv("KILN_CUDA_ROPE_BIAS_EARLY");
        } else {
            assert_int_equal(kiln_cuda_gemv_multi(ms, ys, 3, dx, NULL, 0), 0);
            kiln_cuda_rope_store(&a, dq, dk, dv, b[0], b[1], b[2], dkc, dvc, dpos, 1, 0);
        }
        CUDA_SYNC();
        q[form] = malloc(sizeof(float) * qd), kc[form] = malloc(cache), vc[form] = malloc(cache);
        CUDA_OK(cudaMemcpy(q[form], dq, sizeof(float) * qd, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(kc[form], dkc, cache, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(vc[form], dvc, cache, cudaMemcpyDeviceToHost));
    }
    fprintf(stderr, "gemv+rope %s/%s k %d heads %d/%d hd %d rope %d%s: q, k and v rows as the two kernels'\n",
            kiln_type_name(tq), kiln_type_name(tv), k, n_head, n_head_kv, head_dim, rope_dim, bias ? " bias" : "");
    for (int form = 1; form < 3; form++) {
        assert_memory_equal(q[0], q[form], sizeof(float) * qd);
        assert_memory_equal(kc[0], kc[form], cache);
        assert_memory_equal(vc[0], vc[form], cache);
    }
    a.neox = true;
    assert_int_equal(kiln_cuda_gemv_qkv_rope(ms, q[0], dx, &a, NULL, NULL, NULL, kc[0], vc[0], dpos, 0), -1);
    for (int f = 0; f < 3; f++) free(q[f]), free(kc[f]), free(vc[f]);
    free(x);
    gpu_free_all();
}

static void test_gemv_qkv_rope(void **state) {
    SKIP_WITHOUT_GPU();
    check_qkv_rope(KILN_TYPE_Q4_K, KILN_TYPE_Q6_K, 4096, 32, 8, 128, 128, false);
    check_qkv_rope(KILN_TYPE_Q8_0, KILN_TYPE_Q8_0, 512, 4, 2, 64, 48, true);
    check_qkv_rope(KILN_TYPE_Q4_K, KILN_TYPE_Q4_K, 1024, 8, 2, 128, 128, true);
}

/* Attention of T query tokens over a random F16 cache, against a double softmax over the same halves; one token's
 * blocks of `warps` warps (0: the default). */
static void check_attention(int head_dim, int n_split, int min_chunk, int pos0, int T, int warps) {
    kiln_cuda_attn_args a = {.n_head = 8, .n_head_kv = 2, .head_dim = head_dim, .n_ctx = 640, .n_split = n_split,
                             .min_chunk = min_chunk, .warps = warps};
    const int qd = a.n_head * head_dim;
    size_t cache_n = (size_t)a.n_head_kv * a.n_ctx * head_dim;
    kiln_half *kh = malloc(2 * cache_n), *vh = malloc(2 * cache_n);
    for (size_t i = 0; i < cache_n; i++) kh[i] = kiln_float_to_half(rng_uniform()), vh[i] = kiln_float_to_half(rng_uniform());
    float *q = malloc(sizeof(float) * T * qd), *out = malloc(sizeof(float) * T * qd);
    double *ref = malloc(sizeof(double) * T * qd), *sc = malloc(sizeof(double) * a.n_ctx);
    rng_fill(q, (size_t)T * qd, 0.3f);
    int32_t pos = pos0;
    float *dpart = gpu_alloc(sizeof(float) * T * a.n_head * n_split * (head_dim + 2)), *dout = gpu_alloc(sizeof(float) * T * qd);
    /* a Q8_1 copy for decode-sized batches; prompt batches take the tiled kernel, which writes none */
    void *dq = T < KILN_CUDA_PREFILL_ATTENTION_MIN ? gpu_alloc(Q8_1_BYTES(T * qd)) : NULL;
    int rc = kiln_cuda_attention(&a, gpu_upload(q, sizeof(float) * T * qd), gpu_upload(kh, 2 * cache_n),
                                 gpu_upload(vh, 2 * cache_n), gpu_upload(&pos, sizeof pos), T, dpart, dout, dq, 0);
    assert_int_equal(rc, 0);
    CUDA_SYNC();
    CUDA_OK(cudaMemcpy(out, dout, sizeof(float) * T * qd, cudaMemcpyDeviceToHost));
    if (dq) {
        uint8_t *qb = malloc(Q8_1_BYTES(T * qd));
        float *back = malloc(sizeof(float) * T * qd);
        CUDA_OK(cudaMemcpy(qb, dq, Q8_1_BYTES(T * qd), cudaMemcpyDeviceToHost));
        dequant_q8_1(qb, T * qd, back);
        for (int i = 0; i < T * qd; i++) { /* within half a step, plus the rounding of the scale to half precision */
            float d = q8_1_d(qb, T * qd, i / 32);
            if (fabsf(back[i] - out[i]) > 0.5f * d + fabsf(out[i]) * 2e-3f)
                fail_msg("attention Q8_1 elem %d: %g vs %g", i, back[i], out[i]);
        }
        free(qb), free(back);
    }
    for (int t = 0; t < T; t++)
        for (int h = 0; h < a.n_head; h++) {
            int kvh = h / (a.n_head / a.n_head_kv), n_pos = pos0 + t + 1;
            const kiln_half *kb = kh + (size_t)kvh * a.n_ctx * head_dim, *vb = vh + (size_t)kvh * a.n_ctx * head_dim;
            double mx = -INFINITY, sum = 0;
            for (int p = 0; p < n_pos; p++) {
                double s = 0;
                for (int d = 0; d < head_dim; d++) s += (double)q[(size_t)t * qd + h * head_dim + d] * kiln_half_to_float(kb[(size_t)p * head_dim + d]);
                sc[p] = s, mx = fmax(mx, s);
            }
            for (int p = 0; p < n_pos; p++) sc[p] = exp(sc[p] - mx), sum += sc[p];
            for (int d = 0; d < head_dim; d++) {
                double o = 0;
                for (int p = 0; p < n_pos; p++) o += sc[p] * kiln_half_to_float(vb[(size_t)p * head_dim + d]);
                ref[(size_t)t * qd + h * head_dim + d] = o / sum;
            }
        }
    /* prompt batches on tensor cores round q and the probabilities to F16 (attention_prefill.cu) */
    const char *mma_env = getenv("KILN_CUDA_PREFILL_MMA");
    bool mma = T >= KILN_CUDA_PREFILL_ATTENTION_MIN && head_dim <= 128 && !(mma_env && atoi(mma_env) == 0);
    double e = rel_err(out, ref, (size_t)T * qd), bound = mma ? 2e-3 : 1e-5;
    fprintf(stderr, "attention hd %d split %d (slices of %d+) pos %d T %d warps %d%s: rel err %.2e (bound %.0e)\n",
            head_dim, n_split, min_chunk, pos0, T, warps, mma ? " tensor cores" : "", e, bound);
    assert_true(e < bound);
    free(kh), free(vh), free(q), free(out), free(ref), free(sc);
    gpu_free_all();
}

static void test_attention(void **state) {
    SKIP_WITHOUT_GPU();
    check_attention(64, 1, 0, 0, 1, 0);    /* a single position */
    check_attention(64, 16, 0, 5, 1, 0);   /* more slices than positions: empty slices */
    check_attention(128, 16, 0, 600, 1, 0);
    check_attention(128, 7, 0, 300, 4, 0); /* a causal batch */
    check_attention(256, 3, 0, 100, 2, 0);
    /* the decode setting: slices of a minimum length, the later ones empty while the context is short */
    check_attention(128, KILN_CUDA_DECODE_SPLITS, KILN_CUDA_DECODE_MIN_CHUNK, 40, 1, 0);
    check_attention(128, KILN_CUDA_DECODE_SPLITS, KILN_CUDA_DECODE_MIN_CHUNK, 639, 1, 0);
    check_attention(128, KILN_CUDA_DECODE_SPLITS, 64, 600, 1, 0);
    check_attention(64, 32, 7, 100, 1, 0); /* a last slice shorter than the rest */
    /* one token in one slice, no merge: within a block's first loads, and over several rounds of them */
    check_attention(128, 1, 0, 100, 1, 0);
    check_attention(128, 1, 0, 400, 1, 0);
    check_attention(256, 1, 0, 200, 1, 16);
    /* the other block sizes one token may take (KILN_CUDA_ATTN_WARPS) */
    check_attention(128, 16, 0, 600, 1, 2);
    check_attention(64, 4, 0, 300, 1, 4);
    check_attention(128, 1, 0, 127, 1, 16);
    /* prompt batches: the tiled kernels (a partial tile, several tiles, positions before the batch), tensor cores
     * (the default) and FMA */
    for (int fma = 0; fma < 2; fma++) {
        if (fma) setenv("KILN_CUDA_PREFILL_MMA", "0", 1);
        check_attention(64, 1, 0, 0, KILN_CUDA_PREFILL_ATTENTION_MIN, 0);
        check_attention(128, 1, 0, 37, KILN_CUDA_PREFILL_ATTENTION_MIN + 45, 0);
        check_attention(128, 1, 0, 0, 640, 0);
        check_attention(64, 1, 0, 100, 333, 0);
        check_attention(256, 1, 0, 5, KILN_CUDA_PREFILL_ATTENTION_MIN + 3, 0);
    }
    unsetenv("KILN_CUDA_PREFILL_MMA");
}

/* The one-launch decode attention (rope stage, split, merge in the last block or in the only one) in slices of
 * at least `chunk` positions against rope_store and the split and merge kernels (themselves checked against the CPU
 * above), from the same raw q, k, v and the same cache: the same output, the same Q8_1 copy (up to a flipped
 * rounding), the same k and v rows written at the position; launched twice to see the counters reset. */
static void check_attention_decode(int head_dim, int n_head, int n_head_kv, bool neox, int rope_dim, int pos0,
                                   bool bias, int chunk, int warps) {
    kiln_cuda_rope_args r = {n_head, n_head_kv, head_dim, rope_dim, 2048, neox, 1.0f / sqrtf((float)head_dim), NULL};
    kiln_cuda_attn_args a = {n_head, n_head_kv, head_dim, r.n_ctx, KILN_CUDA_DECODE_SPLITS, KILN_CUDA_DECODE_MIN_CHUNK, 0};
    kiln_cuda_attn_args af = a;
    af.min_chunk = chunk;
    const int qd = n_head * head_dim, kvd = n_head_kv * head_dim;
    size_t cache_n = (size_t)kvd * r.n_ctx;
    float freq[128], *q = malloc(sizeof(float) * qd), *k = malloc(sizeof(float) * kvd);
    float *v = malloc(sizeof(float) * kvd);
    float *b = malloc(sizeof(float) * (qd + 2 * kvd)), *out[2], *back[2];
    kiln_half *cache = malloc(2 * cache_n), *rows[2][2];
    uint8_t *oq[2];
    for (int i = 0; i < rope_dim / 2; i++) freq[i] = powf(10000.0f, -2.0f * i / rope_dim);
    rng_fill(q, qd, 1.0f), rng_fill(k, kvd, 1.0f), rng_fill(v, kvd, 1.0f), rng_fill(b, qd + 2 * kvd, 0.5f);
    for (size_t i = 0; i < cache_n; i++) cache[i] = kiln_float_to_half(rng_uniform());
    r.freq = gpu_upload(freq, sizeof freq);
    const float *dk = gpu_upload(k, sizeof(float) * kvd), *dv = gpu_upload(v, sizeof(float) * kvd);
    const float *db = bias ? gpu_upload(b, sizeof(float) * (qd + 2 * kvd)) : NULL;
    const float *bq = db, *bk = db ? db + qd : NULL, *bv = db ? db + qd + kvd : NULL;
    int32_t pos = pos0, *dpos = gpu_upload(&pos, sizeof pos);
    float *dpart = gpu_alloc(sizeof(float) * n_head * a.n_split * (head_dim + 2));
    unsigned *counters = gpu_alloc(sizeof(unsigned) * n_head);
    CUDA_OK(cudaMemset(counters, 0, sizeof(unsigned) * n_head));
    for (int fused = 0; fused < 2; fused++) {
        float *dq = gpu_upload(q, sizeof(float) * qd), *dout = gpu_alloc(sizeof(float) * qd);
        void *kc = gpu_upload(cache, 2 * cache_n), *vc = gpu_upload(cache, 2 * cache_n);
        void *doq = gpu_alloc(Q8_1_BYTES(qd));
        for (int rep = 0; rep < 2; rep++) {
            if (fused) {
                kiln_cuda_attn_decode_args d = {r, dq, dk, dv, bq, bk, bv, kc, vc, dout, doq, warps};
                assert_int_equal(kiln_cuda_attention_decode(&af, &d, dpos, dpart, counters, 0), 0);
            } else if (rep == 0) { /* rotates q in place: once */
                kiln_cuda_rope_store(&r, dq, dk, dv, bq, bk, bv, kc, vc, dpos, 1, 0);
                assert_int_equal(kiln_cuda_attention(&a, dq, kc, vc, dpos, 1, dpart, dout, doq, 0), 0);
            }
        }
        CUDA_SYNC();
        out[fused] = malloc(sizeof(float) * qd), back[fused] = malloc(sizeof(float) * qd);
        oq[fused] = malloc(Q8_1_BYTES(qd));
        CUDA_OK(cudaMemcpy(out[fused], dout, sizeof(float) * qd, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(oq[fused], doq, Q8_1_BYTES(qd), cudaMemcpyDeviceToHost));
        dequant_q8_1(oq[fused], qd, back[fused]);
        for (int c = 0; c < 2; c++) { /* the k and v rows at pos, every KV head */
            rows[fused][c] = malloc(sizeof(kiln_half) * kvd);
            for (int h = 0; h < n_head_kv; h++)
                CUDA_OK(cudaMemcpy(rows[fused][c] + h * head_dim,
                                   (kiln_half *)(c ? vc : kc) + ((size_t)h * r.n_ctx + pos0) * head_dim,
                                   sizeof(kiln_half) * head_dim, cudaMemcpyDeviceToHost));
        }
    }
    unsigned left[256];
    CUDA_OK(cudaMemcpy(left, counters, sizeof(unsigned) * n_head, cudaMemcpyDeviceToHost));
    for (int h = 0; h < n_head; h++) assert_int_equal(left[h], 0);
    float kf[2][2048];
    for (int f = 0; f < 2; f++)
        for (int i = 0; i < 2 * kvd; i++) kf[f][i] = kiln_half_to_float(rows[f][i / kvd][i % kvd]);
    double eo = rel_err_f(out[1], out[0], qd), eq = rel_err_f(back[1], back[0], qd);
    double ek = rel_err_f(kf[1], kf[0], 2 * kvd);
    fprintf(stderr, "attention decode hd %d heads %d/%d %s rope %d pos %d%s chunk %d warps %d: out %.1e, Q8_1 %.1e, "
            "k/v rows %.1e\n", head_dim, n_head, n_head_kv, neox ? "neox" : "normal", rope_dim, pos0,
            bias ? " bias" : "", chunk, warps, eo, eq, ek);
    assert_true(eo < 1e-5 && eq < 1e-2 && ek < 1e-3);
    free(q), free(k), free(v), free(b), free(cache);
    for (int f = 0; f < 2; f++) free(out[f]), free(back[f]), free(oq[f]), free(rows[f][0]), free(rows[f][1]);
    gpu_free_all();
}

/* every block size of the decode form; slices of 32 positions (the merge in the last block) and of the fused
 * step's chunk (the whole context in one block while it is short) */
static void test_attention_decode(void **state) {
    SKIP_WITHOUT_GPU();
    static const int warps[] = {4, 8, 16};
    for (int i = 0; i < 3; i++) {
        int w = warps[i];
        for (int c = 0; c < 2; c++) {
            int chunk = c ? KILN_CUDA_DECODE_CHUNK : KILN_CUDA_DECODE_MIN_CHUNK;
            check_attention_decode(64, 4, 4, false, 48, 0, true, chunk, w); /* the first position, partial rope */
            check_attention_decode(128, 12, 2, true, 128, 40, true, chunk, w);
            check_attention_decode(128, 12, 2, true, 128, chunk - 1, true, chunk, w); /* one full slice */
            check_attention_decode(128, 32, 8, false, 128, 1500, false, chunk, w); /* 32 or 12 slices */
            check_attention_decode(256, 8, 1, true, 64, 100, true, chunk, w);
        }
    }
}

/* Against the host's choice: a planted maximum anywhere, a tie (the lower index wins), every value -inf (index 0);
 * widths that leave the last block part-filled, and the vocabulary of qwen2-1.5b. A counter passed as d_advance
 * goes up by one a call. */
static void check_argmax(int n) {
    float *x = malloc(sizeof(float) * n);
    void *scratch = gpu_alloc(kiln_cuda_argmax_scratch_bytes(n));
    int32_t *dout = gpu_alloc(sizeof(int32_t)), start = 7, *dcount = gpu_upload(&start, sizeof start);
    float *dx = gpu_alloc(sizeof(float) * n);
    for (int round = 0; round < 4; round++) {
        rng_fill(x, n, 10.0f);
        int want = (int)((rng_uniform() + 1.0f) * 0.5f * (n - 1));
        x[want] = 11.0f;
        if (round == 2) x[n - 1] = 11.0f, x[0] = 11.0f, want = 0;
        if (round == 3) {
            for (int i = 0; i < n; i++) x[i] = -INFINITY;
            want = 0;
        }
        int32_t got = -1;
        CUDA_OK(cudaMemcpy(dx, x, sizeof(float) * n, cudaMemcpyHostToDevice));
        kiln_cuda_argmax(dx, n, scratch, dout, round & 1 ? dcount : NULL, 0);
        CUDA_SYNC();
        CUDA_OK(cudaMemcpy(&got, dout, sizeof got, cudaMemcpyDeviceToHost));
        assert_int_equal(got, want);
    }
    int32_t count = 0;
    CUDA_OK(cudaMemcpy(&count, dcount, sizeof count, cudaMemcpyDeviceToHost));
    assert_int_equal(count, start + 2);
    free(x);
    gpu_free_all();
}

static void test_argmax(void **state) {
    SKIP_WITHOUT_GPU();
    check_argmax(1);
    check_argmax(2049);
    check_argmax(49153);
    check_argmax(151936);
}

/* The device's k best against a sort on the host: the same ids in the same order, on values drawn from a grid of
 * `levels` steps (ties at the cut; a coarse grid gives more values at the threshold than a tile holds, so the row is
 * streamed) with a run of -inf; and the window gather. */
static void check_top_k_levels(int n, int k, int levels) {
    float *x = malloc(sizeof(float) * n), *got_v = malloc(sizeof(float) * k);
    int32_t *order = malloc(sizeof(int32_t) * n), *got_id = malloc(sizeof(int32_t) * k);
    for (int i = 0; i < n; i++) x[i] = (float)(int)(rng_uniform() * (float)levels) / 4.0f;
    for (int i = n / 3; i < n / 3 + n / 10; i++) x[i] = -INFINITY;
    rank_order(x, n, order);
    float *dx = gpu_upload(x, sizeof(float) * n), *dv = gpu_alloc(sizeof(float) * k);
    int32_t *did = gpu_alloc(sizeof(int32_t) * k);
    void *scratch = gpu_alloc(kiln_cuda_top_k_scratch_bytes(n, 1, KILN_CUDA_TOP_K_MAX));
    assert_int_equal(kiln_cuda_top_k(dx, n, 1, k, scratch, dv, did, 0), 0);
    CUDA_SYNC();
    CUDA_OK(cudaMemcpy(got_v, dv, sizeof(float) * k, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(got_id, did, sizeof(int32_t) * k, cudaMemcpyDeviceToHost));
    for (int i = 0; i < k; i++) {
        assert_int_equal(got_id[i], order[i]);
        assert_true(got_v[i] == x[order[i]]);
    }
    /* the gather of a few ids (the sampler's penalty window) */
    int32_t ids[5] = {0, n - 1, n / 2, order[0], n / 3};
    int32_t *dids = gpu_upload(ids, sizeof ids);
    float *dg = gpu_alloc(sizeof(float) * 5), g[5];
    kiln_cuda_gather_f32(dx, dids, 5, dg, 0);
    CUDA_SYNC();
    CUDA_OK(cudaMemcpy(g, dg, sizeof g, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 5; i++) assert_true(g[i] == x[ids[i]]);
    assert_int_equal(kiln_cuda_top_k(dx, n, 1, KILN_CUDA_TOP_K_MAX + 1, scratch, dv, did, 0), -1);
    free(x), free(got_v), free(order), free(got_id);
    gpu_free_all();
}

static void check_top_k(int n, int k) { check_top_k_levels(n, k, 64); }

/* Several rows in one call (the batched step's sequences): each row's k best, rows k apart; rows of a coarse grid
 * (streamed, see check_top_k_levels) and of a fine one alternate. */
static void check_top_k_rows(int n, int rows, int k) {
    float *x = malloc(sizeof(float) * n * rows), *got_v = malloc(sizeof(float) * k * rows);
    int32_t *order = malloc(sizeof(int32_t) * n), *got_id = malloc(sizeof(int32_t) * k * rows);
    for (int i = 0; i < n * rows; i++) x[i] = (float)(int)(rng_uniform() * (i / n % 2 ? 65536.0f : 64.0f)) / 4.0f;
    float *dx = gpu_upload(x, sizeof(float) * n * rows), *dv = gpu_alloc(sizeof(float) * k * rows);
    int32_t *did = gpu_alloc(sizeof(int32_t) * k * rows);
    void *scratch = gpu_alloc(kiln_cuda_top_k_scratch_bytes(n, rows, k));
    assert_int_equal(kiln_cuda_top_k(dx, n, rows, k, scratch, dv, did, 0), 0);
    CUDA_SYNC();
    CUDA_OK(cudaMemcpy(got_v, dv, sizeof(float) * k * rows, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(got_id, did, sizeof(int32_t) * k * rows, cudaMemcpyDeviceToHost));
    for (int r = 0; r < rows; r++) {
        const float *row = x + (size_t)r * n;
        rank_order(row, n, order);
        for (int i = 0; i < k; i++) {
            assert_int_equal(got_id[r * k + i], order[i]);
            assert_true(got_v[r * k + i] == row[order[i]]);
        }
    }
    free(x), free(got_v), free(order), free(got_id);
    gpu_free_all();
}

static void test_top_k(void **state) {
    SKIP_WITHOUT_GPU();
    check_top_k(1, 1);
    check_top_k(300, 40);
    check_top_k(2048, 256);
    check_top_k(49153, 1);
    check_top_k(151936, 40);
    check_top_k(151936, 104);
    check_top_k(151936, KILN_CUDA_TOP_K_MAX);
    check_top_k_rows(151936, 3, 40);
    check_top_k_rows(5000, 7, 1);
    /* a fine grid: the candidates at the threshold fit a tile (the usual case), a few ties among them */
    check_top_k_levels(151936, 40, 1 << 16);
    check_top_k_levels(151936, KILN_CUDA_TOP_K_MAX, 1 << 16);
    check_top_k_levels(128256, 1, 1 << 20);
    check_top_k_levels(1000, 256, 1 << 16);
    setenv("KILN_CUDA_TOPK", "2", 1); /* the tiles reduced by halving */
    check_top_k(151936, 40);
    check_top_k(2048, 256);
    check_top_k_levels(151936, 40, 1 << 16);
    check_top_k_rows(5000, 7, 3);
    unsetenv("KILN_CUDA_TOPK");
}

/* The device's draw among the k best (kiln_cuda_top_k_draw) against the host sampler on the whole row, from the
 * same PRNG state: the same token and the same state after, draw after draw, on rows of `levels` steps over [-16,
 * 16) (a coarse grid ties at every cut); the position moved on by one a draw. */
static void check_top_k_draw(int n, kiln_sampler_params p, int levels) {
    kiln_error err = {{0}};
    kiln_sampler *host = NULL;
    assert_int_equal(kiln_sampler_new(&p, n, &host, &err), 0);
    kiln_cuda_draw d = {0};
    int k = kiln_sampler_device_draw(host, KILN_CUDA_TOP_K_MAX, &d.p);
    assert_true(k > 0);
    kiln_sampler_get_rng(host, d.rng.s);
    int32_t start = 5, pos = 0, tok = -1;
    kiln_cuda_draw *dd = gpu_upload(&d, sizeof d);
    int32_t *dpos = gpu_upload(&start, sizeof start), *dtok = gpu_alloc(sizeof(int32_t)), *did = gpu_alloc(4 * k);
    float *x = malloc(sizeof(float) * n), *dx = gpu_alloc(sizeof(float) * n), *dv = gpu_alloc(sizeof(float) * k);
    void *scratch = gpu_alloc(kiln_cuda_top_k_scratch_bytes(n, 1, KILN_CUDA_TOP_K_MAX));
    enum { DRAWS = 48 };
    for (int i = 0; i < DRAWS; i++) {
        for (int j = 0; j < n; j++) x[j] = (float)(int)(rng_uniform() * (float)levels) * (16.0f / (float)levels);
        CUDA_OK(cudaMemcpy(dx, x, sizeof(float) * n, cudaMemcpyHostToDevice));
        assert_int_equal(kiln_cuda_top_k_draw(dx, n, k, scratch, dv, did, dd, dtok, dpos, 0), 0);
        CUDA_SYNC();
        CUDA_OK(cudaMemcpy(&d, dd, sizeof d, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(&tok, dtok, sizeof tok, cudaMemcpyDeviceToHost));
        int32_t want = kiln_sampler_sample(host, x, NULL);
        uint64_t host_rng[4];
        kiln_sampler_get_rng(host, host_rng);
        assert_int_equal(d.token, want);
        assert_int_equal(tok, want);
        assert_memory_equal(d.rng.s, host_rng, sizeof host_rng);
    }
    CUDA_OK(cudaMemcpy(&pos, dpos, sizeof pos, cudaMemcpyDeviceToHost));
    assert_int_equal(pos, start + DRAWS);
    assert_int_equal(kiln_cuda_top_k_draw(dx, n, KILN_CUDA_TOP_K_MAX + 1, scratch, dv, did, dd, dtok, dpos, 0), -1);
    kiln_sampler_free(host);
    free(x);
    gpu_free_all();
}

static void test_top_k_draw(void **state) {
    SKIP_WITHOUT_GPU();
    kiln_sampler_params p[5];
    for (int i = 0; i < 5; i++) p[i] = kiln_sampler_default_params(), p[i].seed = 100 + (uint64_t)i;
    p[1].top_k = 1;
    p[2].top_k = KILN_CUDA_TOP_K_MAX, p[2].top_p = 1.0f, p[2].min_p = 0.0f, p[2].temperature = 2.0f;
    p[3].top_k = 5, p[3].top_p = 0.5f, p[3].temperature = 0.3f;
    p[4].top_k = 100, p[4].min_p = 0.2f, p[4].top_p = 0.99f;
    for (int i = 0; i < 5; i++) {
        check_top_k_draw(151936, p[i], 64);
        check_top_k_draw(151936, p[i], 1 << 20);
    }
    check_top_k_draw(300, p[0], 1 << 12);
}

/* Launches that ask for a split of the SM's L1 (KILN_CUDA_CARVEOUT: the most L1 cache; each kernel's from its
 * occupancy) compute what they do without: GEMVs and the row loop, decode attention over 32 slices, the top-k. */
static void test_carveout(void **state) {
    SKIP_WITHOUT_GPU();
    const char *settings[] = {"0", "auto"};
    for (int i = 0; i < 2; i++) {
        setenv("KILN_CUDA_CARVEOUT", settings[i], 1);
        check_gemv(KILN_TYPE_Q4_K, true, 1536);
        check_gemv_loop(KILN_TYPE_Q4_K);
        check_attention_decode(128, 32, 8, false, 128, 1500, false, KILN_CUDA_DECODE_CHUNK, 8);
        check_top_k(151936, 40);
    }
    unsetenv("KILN_CUDA_CARVEOUT");
}

/* The persistent step's GEMV stage alone (kiln_cuda_stream_gemv, timed by bench_cuda_gemv) against the plain GEMV on
 * the same Q8_1 vector: only the order of the sums differs. Two matrices streamed in turn, three times over, so
 * the ring wraps and y holds the first's product again; rows of 6 and 16 blocks. Hopper only. */
static void check_stream_gemv(kiln_type type, int k, int n, int warps) {
    float *deq0, *deq1, *x = malloc(sizeof(float) * k), *y = malloc(sizeof(float) * n);
    float *want = malloc(sizeof(float) * n);
    uint8_t *w0 = random_rows(type, k, n, &deq0), *w1 = random_rows(type, k, n, &deq1);
    size_t rb = kiln_row_size(type, k);
    rng_fill(x, k, 1.0f);
    float *dx = gpu_upload(x, sizeof(float) * k), *dy = gpu_alloc(sizeof(float) * n);
    float *dwant = gpu_alloc(sizeof(float) * n);
    void *dq = gpu_alloc(Q8_1_BYTES(k));
    kiln_cuda_quantize_q8_1(dx, dq, k, 1, 0);
    kiln_cuda_stream_args a = {.n_mats = 2, .repeats = 5, .xq = dq, .y = dy};
    a.m[0] = (kiln_cuda_matrix){upload_matrix(type, w0, k, n), type, k, n, rb};
    a.m[1] = (kiln_cuda_matrix){upload_matrix(type, w1, k, n), type, k, n, rb};
    assert_int_equal(kiln_cuda_gemv(&a.m[0], dq, dx, dwant, false, 0), 0);
    int rc = kiln_cuda_stream_gemv(&a, warps, 0);
    CUDA_SYNC();
    if (rc) {
        fprintf(stderr, "stream gemv: does not run on this GPU (it needs compute capability 9.0), skipped\n");
    } else {
        CUDA_OK(cudaMemcpy(y, dy, sizeof(float) * n, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(want, dwant, sizeof(float) * n, cudaMemcpyDeviceToHost));
        double e = rel_err_f(y, want, n);
        fprintf(stderr, "stream gemv %s k %d n %d, %d warps: rel err %.2e against the plain GEMV\n",
                kiln_type_name(type), k, n, warps, e);
        assert_true(e < 1e-5);
    }
    free(deq0), free(deq1), free(w0), free(w1), free(x), free(y), free(want);
    gpu_free_all();
}

static void test_stream_gemv(void **state) {
    SKIP_WITHOUT_GPU();
    const int warps[] = {4, 8, 16};
    for (int i = 0; i < 3; i++) {
        check_stream_gemv(KILN_TYPE_Q4_K, 1536, 4004, warps[i]); /* 6 blocks a row, 4004 rows: 24,024 blocks */
        check_stream_gemv(KILN_TYPE_Q6_K, 4096, 1000, warps[i]);
    }
}

#define TYPE_TEST(t) cmocka_unit_test_prestate(test_type, (void *)(intptr_t)(t))

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_q8_1),
        TYPE_TEST(KILN_TYPE_F32),  TYPE_TEST(KILN_TYPE_F16),  TYPE_TEST(KILN_TYPE_BF16), TYPE_TEST(KILN_TYPE_Q4_0),
        TYPE_TEST(KILN_TYPE_Q4_1), TYPE_TEST(KILN_TYPE_Q5_0), TYPE_TEST(KILN_TYPE_Q5_1), TYPE_TEST(KILN_TYPE_Q8_0),
        TYPE_TEST(KILN_TYPE_Q2_K), TYPE_TEST(KILN_TYPE_Q3_K), TYPE_TEST(KILN_TYPE_Q4_K), TYPE_TEST(KILN_TYPE_Q5_K),
        TYPE_TEST(KILN_TYPE_Q6_K),
        cmocka_unit_test(test_gemv_mixed),
        cmocka_unit_test(test_gemv_head),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_gemv_qkv_rope),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_gemv_norm),
        cmocka_unit_test(test_attention_decode),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_k_draw),
        cmocka_unit_test(test_carveout),
        cmocka_unit_test(test_stream_gemv),
    };
    const char *only = getenv("KILN_TEST_FILTER"); /* a device call short of time runs the tests it is about */
    if (only && *only) cmocka_set_test_filter(only);
    return cmocka_run_group_tests_name("cuda_kernels", tests, NULL, NULL);
}

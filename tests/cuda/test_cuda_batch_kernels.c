/* The batched step's kernels against CPU references on fresh random data: the multi-vector GEMV per weight type (and
 * its Q/K/V and SwiGLU forms) against src/quant's scalar dequantize, RoPE with the store into paged KV slots, and
 * split-K attention through block tables. Each also checks batch invariance: a vector's (token's) result computed
 * alone is bit for bit the one computed among others. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cuda/kernels_batch.h"
#include "gpu_quant.h"
#include "gpu_test.h"
#include "quant/quant.h"
#include "util/half.h"

#define SKIP_WITHOUT_GPU()                                                                                             \
    do {                                                                                                               \
        if (!gpu_present()) skip();                                                                                    \
        rng_seed();                                                                                                    \
    } while (0)

/* The GEMV's input as the GPU sees it: Q8_1 of each of the n_vec rows (quantized types; their F16 form in half
 * mode, which float types with rows of whole parts take too) or the rows themselves. */
typedef struct batch_input {
    float *x, *xs; /* host: the rows, and what the kernel multiplies */
    float *dx;
    void *dq;
} batch_input;

/* Bytes of a tensor-core GEMV's input of n values in either mode (F16's are the more). */
#define INPUT_BYTES(n) (2 * (size_t)(n))

/* The tensor-core GEMV's input (dq) from n_vec device rows of k values, in the current mode. */
static void prepare_input(const float *dx, void *dq, int k, int n_vec) {
    if (kiln_cuda_batch_half()) kiln_cuda_batch_to_half(dx, dq, k, n_vec, 0);
    else kiln_cuda_quantize_q8_1(dx, dq, k, n_vec, 0);
}

/* How close a tensor-core GEMV comes to the double reference over the values it multiplies: exact integer sums with
 * F32 scales, or in half mode weights rounded to F16 (d * q + m, or the F16 or BF16 weight) and F32 sums in the tensor
 * cores. */
static double gemv_bound(void) { return kiln_cuda_batch_half() ? 2e-3 : 1e-5; }

/* act: the GEMV takes dq (kiln_cuda_gemv_batch_takes_act), else the F32 rows. */
static batch_input make_input(bool act, int k, int n_vec) {
    size_t n = (size_t)k * n_vec;
    batch_input in = {malloc(sizeof(float) * n), malloc(sizeof(float) * n), NULL, NULL};
    rng_fill(in.x, n, 1.0f);
    in.dx = gpu_upload(in.x, sizeof(float) * n);
    in.dq = gpu_alloc(INPUT_BYTES(n));
    if (act) prepare_input(in.dx, in.dq, k, n_vec);
    if (act && kiln_cuda_batch_half()) {
        for (size_t i = 0; i < n; i++) in.xs[i] = kiln_half_to_float(kiln_float_to_half(in.x[i]));
    } else if (act) {
        uint8_t *q = malloc(Q8_1_BYTES(n));
        CUDA_SYNC();
        CUDA_OK(cudaMemcpy(q, in.dq, Q8_1_BYTES(n), cudaMemcpyDeviceToHost));
        dequant_q8_1(q, (int)n, in.xs);
        free(q);
    } else {
        memcpy(in.xs, in.x, sizeof(float) * n);
    }
    return in;
}

/* dh, a kernel's half-mode input for the next GEMV from n_rows device rows of k values dx, holds the very halves
 * kiln_cuda_batch_to_half makes of them. */
static void assert_half_input(const void *dh, const float *dx, int k, int n_rows) {
    size_t bytes = INPUT_BYTES((size_t)k * n_rows);
    void *want = gpu_alloc(bytes);
    kiln_cuda_batch_to_half(dx, want, k, n_rows, 0);
    uint8_t *a = malloc(bytes), *b = malloc(bytes);
    CUDA_SYNC();
    CUDA_OK(cudaMemcpy(a, dh, bytes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(b, want, bytes, cudaMemcpyDeviceToHost));
    assert_memory_equal(a, b, bytes);
    free(a), free(b);
}

static double dot(const float *w, const float *x, int k) {
    double s = 0;
    for (int i = 0; i < k; i++) s += (double)w[i] * x[i];
    return s;
}

static float *download(const float *d, size_t n) {
    float *h = malloc(sizeof(float) * n);
    CUDA_SYNC();
    CUDA_OK(cudaMemcpy(h, d, sizeof(float) * n, cudaMemcpyDeviceToHost));
    return h;
}

/* y = W x_j for 83 vectors (a full group of 64 and a partial one, its last tile partial too), against the double
 * reference, then vector j alone and vectors j.. j + 3 together, two to four (the small kernel), eight (half mode's
 * one-tile forms at their edge) and twelve (the mma kernel loading its activations directly, where 83 stage them in
 * shared memory): the same bits.
 * n rows: few (a launch of fewer row blocks than SMs takes 16 warps a block) or many (8); k inputs: 512, 4096
 * (each warp's parts span two K-quant blocks; the small kernel's lanes 4 parts each), 8192 or 14336 (its lanes
 * 8 to 14 parts each, the long form). */
static void check_gemv_batch(kiln_type type, bool swiglu, int n, int k) {
    const int n_vec = 83, alone = 70;
    float *deq, *deq_up = NULL;
    uint8_t *w = random_rows(type, k, n, &deq), *w_up = swiglu ? random_rows(type, k, n, &deq_up) : NULL;
    kiln_cuda_matrix m = {upload_matrix(type, w, k, n), type, k, n, kiln_row_size(type, k)}, mu = m;
    if (swiglu) mu.data = upload_matrix(type, w_up, k, n);
    /* quantized weights always take the tensor-core input, F16 and BF16 ones (rows of whole parts) in half mode */
    bool act = kiln_cuda_gemv_batch_takes_act(&m);
    assert_true(act == (kiln_cuda_type_uses_q8_1(type) || (kiln_cuda_batch_half() && k % 32 == 0 &&
                                                           (type == KILN_TYPE_F16 || type == KILN_TYPE_BF16))));
    batch_input in = make_input(act, k, n_vec);
    float *dy = gpu_alloc(sizeof(float) * n * n_vec);
    int rc = swiglu ? kiln_cuda_gemv_batch_swiglu(&m, &mu, in.dq, in.dx, n_vec, dy, 0)
                    : kiln_cuda_gemv_batch(&m, in.dq, in.dx, n_vec, dy, false, 0);
    assert_int_equal(rc, 0);
    float *y = download(dy, (size_t)n * n_vec);
    double *ref = malloc(sizeof(double) * n * n_vec);
    for (int j = 0; j < n_vec; j++)
        for (int r = 0; r < n; r++) {
            double a = dot(deq + (size_t)r * k, in.xs + (size_t)j * k, k);
            double b = swiglu ? dot(deq_up + (size_t)r * k, in.xs + (size_t)j * k, k) : 0;
            ref[(size_t)j * n + r] = swiglu ? a / (1 + exp(-a)) * b : a;
        }
    double e = rel_err(y, ref, (size_t)n * n_vec);
    fprintf(stderr, "gemv_batch%s %-5s %d rows, %d vectors rel err %.2e\n", swiglu ? "+swiglu" : "",
            kiln_type_name(type), n, n_vec, e);
    assert_true(e < (act ? gemv_bound() : 1e-5));
    if (swiglu && act && kiln_cuda_batch_half() && n % 32 == 0) { /* the down projection's input directly */
        void *dyh = gpu_alloc(INPUT_BYTES((size_t)n * n_vec));
        assert_int_equal(kiln_cuda_gemv_batch_swiglu_half(&m, &mu, in.dq, n_vec, dyh, 0), 0);
        assert_half_input(dyh, dy, n, n_vec);
    }

    /* up to four vectors take the small kernel where their rows allow, up to eight the one-tile forms */
    const int counts[] = {1, 2, 3, 4, 8, 12};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        int few = counts[i];
        batch_input one = {NULL, NULL, in.dx + (size_t)alone * k, gpu_alloc(INPUT_BYTES((size_t)k * few))};
        if (act) prepare_input(one.dx, one.dq, k, few);
        float *dy1 = gpu_alloc(sizeof(float) * n * few);
        rc = swiglu ? kiln_cuda_gemv_batch_swiglu(&m, &mu, one.dq, one.dx, few, dy1, 0)
                    : kiln_cuda_gemv_batch(&m, one.dq, one.dx, few, dy1, false, 0);
        assert_int_equal(rc, 0);
        float *y1 = download(dy1, (size_t)n * few);
        assert_memory_equal(y1, y + (size_t)alone * n, sizeof(float) * n * few);
        free(y1);
    }
    free(deq), free(deq_up), free(w), free(w_up), free(in.x), free(in.xs), free(y), free(ref);
    gpu_free_all();
}

static const kiln_type TYPES[] = {KILN_TYPE_Q4_0, KILN_TYPE_Q4_1, KILN_TYPE_Q5_0, KILN_TYPE_Q5_1, KILN_TYPE_Q8_0,
                                  KILN_TYPE_Q2_K, KILN_TYPE_Q3_K, KILN_TYPE_Q4_K, KILN_TYPE_Q5_K, KILN_TYPE_Q6_K,
                                  KILN_TYPE_F32, KILN_TYPE_F16, KILN_TYPE_BF16};

static void test_gemv_batch(void **state) {
    SKIP_WITHOUT_GPU();
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++) check_gemv_batch(TYPES[i], false, 37, 512);
    check_gemv_batch(KILN_TYPE_Q4_K, false, 4800, 512);
    check_gemv_batch(KILN_TYPE_Q6_K, false, 4800, 512);
    check_gemv_batch(KILN_TYPE_Q4_K, false, 37, 4096);
    check_gemv_batch(KILN_TYPE_Q6_K, false, 37, 4096);
    check_gemv_batch(KILN_TYPE_Q4_K, false, 37, 8192);
    check_gemv_batch(KILN_TYPE_Q6_K, false, 2200, 8192);
    check_gemv_batch(KILN_TYPE_Q4_K, false, 37, 14336);
    check_gemv_batch(KILN_TYPE_Q6_K, false, 2200, 14336);
}

static void test_gemv_batch_swiglu(void **state) {
    SKIP_WITHOUT_GPU();
    const kiln_type types[] = {KILN_TYPE_Q4_0, KILN_TYPE_Q8_0, KILN_TYPE_Q4_K, KILN_TYPE_Q5_K, KILN_TYPE_Q6_K,
                               KILN_TYPE_Q3_K, KILN_TYPE_F16};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) check_gemv_batch(types[i], true, 37, 512);
    check_gemv_batch(KILN_TYPE_Q4_K, true, 37, 4096);
    check_gemv_batch(KILN_TYPE_Q6_K, true, 37, 8192);
}

/* Three matrices of heights ns in one launch (or two: Q and K, then V in another type, as the K-quant mixes have
 * them), with the residual accumulate of a single one after. */
static void check_gemv_batch_multi(const int ns[3]) {
    const kiln_type sets[][3] = {{KILN_TYPE_Q4_K, KILN_TYPE_Q4_K, KILN_TYPE_Q4_K},
                                 {KILN_TYPE_Q6_K, KILN_TYPE_Q6_K, KILN_TYPE_Q6_K},
                                 {KILN_TYPE_BF16, KILN_TYPE_BF16, KILN_TYPE_BF16},
                                 {KILN_TYPE_Q4_K, KILN_TYPE_Q4_K, KILN_TYPE_Q6_K}};
    for (size_t t = 0; t < sizeof sets / sizeof sets[0]; t++) {
        const int k = 256, n_vec = 9;
        kiln_cuda_matrix probe = {NULL, sets[t][0], k, 1, kiln_row_size(sets[t][0], k)};
        bool act = kiln_cuda_gemv_batch_takes_act(&probe);
        batch_input in = make_input(act, k, n_vec);
        float *deq[3], *dys[3];
        uint8_t *w[3];
        kiln_cuda_matrix m[3];
        const kiln_cuda_matrix *ms[3] = {&m[0], &m[1], &m[2]};
        for (int i = 0; i < 3; i++) {
            kiln_type type = sets[t][i];
            w[i] = random_rows(type, k, ns[i], &deq[i]);
            m[i] = (kiln_cuda_matrix){upload_matrix(type, w[i], k, ns[i]), type, k, ns[i], kiln_row_size(type, k)};
            dys[i] = gpu_alloc(sizeof(float) * ns[i] * n_vec);
        }
        assert_int_equal(kiln_cuda_gemv_batch_multi(ms, dys, 3, in.dq, in.dx, n_vec, 0), 0);
        /* then y[0] += W0 x: the residual form */
        assert_int_equal(kiln_cuda_gemv_batch(&m[0], in.dq, in.dx, n_vec, dys[0], true, 0), 0);
        for (int i = 0; i < 3; i++) {
            float *y = download(dys[i], (size_t)ns[i] * n_vec);
            double *ref = malloc(sizeof(double) * ns[i] * n_vec);
            for (int j = 0; j < n_vec; j++)
                for (int r = 0; r < ns[i]; r++)
                    ref[(size_t)j * ns[i] + r] =
                        (i == 0 ? 2 : 1) * dot(deq[i] + (size_t)r * k, in.xs + (size_t)j * k, k);
            double e = rel_err(y, ref, (size_t)ns[i] * n_vec);
            fprintf(stderr, "gemv_batch_multi %-5s matrix %d rel err %.2e\n", kiln_type_name(sets[t][i]), i, e);
            assert_true(e < (act ? gemv_bound() : 1e-5));
            free(y), free(ref), free(deq[i]), free(w[i]);
        }
        free(in.x), free(in.xs);
        gpu_free_all();
    }
}

static void test_gemv_batch_multi(void **state) {
    SKIP_WITHOUT_GPU();
    const int ns[3] = {64, 16, 24};
    check_gemv_batch_multi(ns);
}

/* ---- paged KV ---- */

#define BS 16

static size_t paged_index(int n_head_kv, int hd, int block, int h, int row, int d) {
    return (((size_t)block * n_head_kv + h) * BS + row) * hd + d;
}

/* Rotation of dims (i0, i1) by pos * freq[i], i < rope_dim / 2, as the reference pass does. */
static void rope_ref(float *x, int rope_dim, bool neox, int pos, const float *freq) {
    for (int i = 0; i < rope_dim / 2; i++) {
        int i0 = neox ? i : 2 * i, i1 = neox ? i + rope_dim / 2 : 2 * i + 1;
        double a = (double)pos * freq[i], x0 = x[i0], x1 = x[i1];
        x[i0] = (float)(x0 * cos(a) - x1 * sin(a));
        x[i1] = (float)(x0 * sin(a) + x1 * cos(a));
    }
}

static void check_rope_store(bool neox) {
    enum { T = 5 };
    const int n_head = 4, n_head_kv = 2, hd = 64, rope_dim = 48, n_blocks = 6;
    const int pos[T] = {0, 17, 40, 41, 95}, slot[T] = {3 * BS + 0, 5 * BS + 1, 0 * BS + 8, 0 * BS + 9, 2 * BS + 15};
    int qd = n_head * hd, kvd = n_head_kv * hd;
    size_t cache_n = (size_t)n_blocks * n_head_kv * BS * hd;
    float *q = malloc(sizeof(float) * T * qd), *k = malloc(sizeof(float) * T * kvd);
    float *v = malloc(sizeof(float) * T * kvd);
    float *bq = malloc(sizeof(float) * qd), *bk = malloc(sizeof(float) * kvd), *bv = malloc(sizeof(float) * kvd);
    float freq[32];
    rng_fill(q, (size_t)T * qd, 1.0f), rng_fill(k, (size_t)T * kvd, 1.0f), rng_fill(v, (size_t)T * kvd, 1.0f);
    rng_fill(bq, qd, 0.5f), rng_fill(bk, kvd, 0.5f), rng_fill(bv, kvd, 0.5f);
    for (int i = 0; i < rope_dim / 2; i++) freq[i] = powf(10000.0f, -2.0f * i / rope_dim);
    float *dq = gpu_upload(q, sizeof(float) * T * qd);
    kiln_half *kc = malloc(sizeof(kiln_half) * cache_n), *vc = malloc(sizeof(kiln_half) * cache_n);
    void *dkc = gpu_alloc(sizeof(kiln_half) * cache_n), *dvc = gpu_alloc(sizeof(kiln_half) * cache_n);
    kiln_cuda_paged_args a = {n_head, n_head_kv, hd, rope_dim, BS, neox, 0.125f, gpu_upload(freq, sizeof freq)};
    kiln_cuda_rope_store_paged(&a, dq, gpu_upload(k, sizeof(float) * T * kvd), gpu_upload(v, sizeof(float) * T * kvd),
                               gpu_upload(bq, sizeof(float) * qd), gpu_upload(bk, sizeof(float) * kvd),
                               gpu_upload(bv, sizeof(float) * kvd), dkc, dvc, gpu_upload(pos, sizeof pos),
                               gpu_upload(slot, sizeof slot), T, 0);
    float *gq = download(dq, (size_t)T * qd);
    CUDA_OK(cudaMemcpy(kc, dkc, sizeof(kiln_half) * cache_n, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(vc, dvc, sizeof(kiln_half) * cache_n, cudaMemcpyDeviceToHost));
    double *rq = malloc(sizeof(double) * T * qd);
    float *rk = malloc(sizeof(float) * hd), *gk = malloc(sizeof(float) * hd), *gv = malloc(sizeof(float) * hd);
    double *rkd = malloc(sizeof(double) * hd), *rvd = malloc(sizeof(double) * hd);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < n_head; h++) {
            float row[64];
            for (int d = 0; d < hd; d++) row[d] = q[(size_t)t * qd + h * hd + d] + bq[h * hd + d];
            rope_ref(row, rope_dim, neox, pos[t], freq);
            for (int d = 0; d < hd; d++) rq[(size_t)t * qd + h * hd + d] = 0.125 * row[d];
        }
        for (int h = 0; h < n_head_kv; h++) {
            for (int d = 0; d < hd; d++) rk[d] = k[(size_t)t * kvd + h * hd + d] + bk[h * hd + d];
            rope_ref(rk, rope_dim, neox, pos[t], freq);
            for (int d = 0; d < hd; d++) {
                size_t at = paged_index(n_head_kv, hd, slot[t] / BS, h, slot[t] % BS, d);
                gk[d] = kiln_half_to_float(kc[at]), gv[d] = kiln_half_to_float(vc[at]);
                rkd[d] = rk[d], rvd[d] = v[(size_t)t * kvd + h * hd + d] + bv[h * hd + d];
            }
            assert_true(rel_err(gk, rkd, hd) < 1e-3 && rel_err(gv, rvd, hd) < 1e-3);
        }
    }
    double e = rel_err(gq, rq, (size_t)T * qd);
    fprintf(stderr, "rope_store_paged %s: q rel err %.2e\n", neox ? "neox" : "normal", e);
    assert_true(e < 1e-5);
    free(q), free(k), free(v), free(bq), free(bk), free(bv), free(kc), free(vc), free(gq), free(rq);
    free(rk), free(gk), free(gv), free(rkd), free(rvd);
    gpu_free_all();
}

static void test_rope_store_paged(void **state) {
    SKIP_WITHOUT_GPU();
    check_rope_store(false);
    check_rope_store(true);
}

/* Q/K/V with the rope stage in the GEMV's blocks against the GEMVs followed by kiln_cuda_rope_store_paged: q within
 * float rounding, the cache within a half's; then tokens alone and four together (the small kernel) give the bits
 * they had among 70 (the mma kernel). Heads of 64 dims: 4 q heads (blocks of 16 warps: fewer row blocks than SMs)
 * or 40 (8 warps); all three matrices in one launch, or V (Q6_K) in its own. */
static void check_qkv_rope(const kiln_type types[3], int n_head, int rope_dim) {
    enum { T = 70, ALONE = 66, FEW = 4 };
    const int n_head_kv = 2, hd = 64, k = 256, n_blocks = 8;
    const int ns[3] = {n_head * hd, n_head_kv * hd, n_head_kv * hd};
    size_t cache_n = (size_t)n_blocks * n_head_kv * BS * hd, cache_bytes = sizeof(kiln_half) * cache_n;
    kiln_cuda_matrix m[3];
    const kiln_cuda_matrix *ms[3] = {&m[0], &m[1], &m[2]};
    float *dys[3], *bias[3], *dbias[3], freq[32];
    for (int i = 0; i < 3; i++) {
        float *deq;
        uint8_t *w = random_rows(types[i], k, ns[i], &deq);
        m[i] = (kiln_cuda_matrix){upload_matrix(types[i], w, k, ns[i]), types[i], k, ns[i], kiln_row_size(types[i], k)};
        dys[i] = gpu_alloc(sizeof(float) * ns[i] * T);
        bias[i] = malloc(sizeof(float) * ns[i]);
        rng_fill(bias[i], ns[i], 0.5f);
        dbias[i] = gpu_upload(bias[i], sizeof(float) * ns[i]);
        free(w), free(deq), free(bias[i]);
    }
    for (int i = 0; i < rope_dim / 2; i++) freq[i] = powf(10000.0f, -2.0f * i / rope_dim);
    int32_t pos[T], slot[T];
    for (int t = 0; t < T; t++) pos[t] = (t * 37) % 500, slot[t] = (t * 53) % (n_blocks * BS); /* distinct slots */
    int32_t *dpos = gpu_upload(pos, sizeof pos), *dslot = gpu_upload(slot, sizeof slot);
    kiln_cuda_paged_args a = {n_head, n_head_kv, hd, rope_dim, BS, false, 0.125f, gpu_upload(freq, sizeof freq)};
    assert_true(kiln_cuda_gemv_batch_rope_fits(ms, &a));
    batch_input in = make_input(true, k, T);
    void *caches[4];
    for (int i = 0; i < 4; i++) CUDA_OK(cudaMemset(caches[i] = gpu_alloc(cache_bytes), 0, cache_bytes));
    assert_int_equal(kiln_cuda_gemv_batch_multi(ms, dys, 3, in.dq, in.dx, T, 0), 0);
    kiln_cuda_rope_store_paged(&a, dys[0], dys[1], dys[2], dbias[0], dbias[1], dbias[2], caches[0], caches[1], dpos,
                               dslot, T, 0);
    float *ref_q = download(dys[0], (size_t)T * ns[0]), *dq = gpu_alloc(sizeof(float) * T * ns[0]);
    assert_int_equal(kiln_cuda_gemv_batch_qkv_rope(ms, in.dq, T, &a, dq, dbias[0], dbias[1], dbias[2], caches[2],
                                                   caches[3], dpos, dslot, 0), 0);
    float *q = download(dq, (size_t)T * ns[0]);
    size_t n_q = (size_t)T * ns[0];
    double *refd = malloc(sizeof(double) * (n_q > cache_n ? n_q : cache_n));
    for (size_t i = 0; i < n_q; i++) refd[i] = ref_q[i];
    double eq = rel_err(q, refd, n_q), ec[2];
    kiln_half *hc[4];
    float *fc = malloc(sizeof(float) * cache_n);
    for (int i = 0; i < 4; i++) {
        hc[i] = malloc(cache_bytes);
        CUDA_OK(cudaMemcpy(hc[i], caches[i], cache_bytes, cudaMemcpyDeviceToHost));
    }
    for (int c = 0; c < 2; c++) { /* every row, the ones no token writes zero on both sides */
        for (size_t i = 0; i < cache_n; i++)
            refd[i] = kiln_half_to_float(hc[c][i]), fc[i] = kiln_half_to_float(hc[2 + c][i]);
        ec[c] = rel_err(fc, refd, cache_n);
    }
    fprintf(stderr, "gemv_batch_qkv_rope %s/%s, %d q heads, rope %d: q rel err %.2e, k %.2e, v %.2e\n",
            kiln_type_name(types[0]), kiln_type_name(types[2]), n_head, rope_dim, eq, ec[0], ec[1]);
    assert_true(eq < 1e-6 && ec[0] < 1e-3 && ec[1] < 1e-3);

    void *one_q8 = gpu_alloc(INPUT_BYTES((size_t)k * FEW));
    float *dq1 = gpu_alloc(sizeof(float) * FEW * ns[0]);
    for (int few = 1; few <= FEW; few += FEW - 1) {
        prepare_input(in.dx + (size_t)ALONE * k, one_q8, k, few);
        assert_int_equal(kiln_cuda_gemv_batch_qkv_rope(ms, one_q8, few, &a, dq1, dbias[0], dbias[1], dbias[2],
                                                       caches[0], caches[1], dpos + ALONE, dslot + ALONE, 0), 0);
        float *q1 = download(dq1, (size_t)few * ns[0]);
        assert_memory_equal(q1, q + (size_t)ALONE * ns[0], sizeof(float) * few * ns[0]);
        for (int c = 0; c < 2; c++) {
            CUDA_OK(cudaMemcpy(hc[c], caches[c], cache_bytes, cudaMemcpyDeviceToHost));
            for (int t = ALONE; t < ALONE + few; t++)
                for (int h = 0; h < n_head_kv; h++) {
                    size_t at = paged_index(n_head_kv, hd, slot[t] / BS, h, slot[t] % BS, 0);
                    assert_memory_equal(hc[c] + at, hc[2 + c] + at, sizeof(kiln_half) * hd);
                }
        }
        free(q1);
    }
    for (int i = 0; i < 4; i++) free(hc[i]);
    free(ref_q), free(q), free(refd), free(fc), free(in.x), free(in.xs);
    gpu_free_all();
}

static void test_gemv_batch_qkv_rope(void **state) {
    SKIP_WITHOUT_GPU();
    const kiln_type same[3] = {KILN_TYPE_Q4_K, KILN_TYPE_Q4_K, KILN_TYPE_Q4_K};
    const kiln_type mixed[3] = {KILN_TYPE_Q4_K, KILN_TYPE_Q4_K, KILN_TYPE_Q6_K};
    check_qkv_rope(same, 4, 64);
    check_qkv_rope(mixed, 4, 48);
    check_qkv_rope(mixed, 40, 64);
}

/* Half mode: every type against the reference within gemv_bound (F16 and BF16 on the tensor cores too), and each
 * form's batch invariance (one to four, eight and twelve vectors against the same among 83; half mode never
 * stages): 16-warp and 8-warp blocks, K-quant blocks spanning ranges, the long rows, SwiGLU (also writing the down
 * projection's F16 input), three matrices (in 16-warp blocks and in 8-warp ones), the rope stage. */
static void test_gemv_batch_half(void **state) {
    SKIP_WITHOUT_GPU();
    kiln_cuda_batch_half_set(true);
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++) check_gemv_batch(TYPES[i], false, 37, 512);
    check_gemv_batch(KILN_TYPE_Q4_K, false, 4800, 512);
    check_gemv_batch(KILN_TYPE_Q6_K, false, 37, 4096);
    check_gemv_batch(KILN_TYPE_Q4_K, false, 2200, 14336);
    check_gemv_batch(KILN_TYPE_F16, false, 2200, 4096);
    check_gemv_batch(KILN_TYPE_BF16, false, 37, 4096);
    const kiln_type swiglu[] = {KILN_TYPE_Q4_0, KILN_TYPE_Q4_K, KILN_TYPE_Q6_K, KILN_TYPE_Q3_K, KILN_TYPE_F32};
    for (size_t i = 0; i < sizeof swiglu / sizeof swiglu[0]; i++) check_gemv_batch(swiglu[i], true, 37, 512);
    check_gemv_batch(KILN_TYPE_Q4_K, true, 37, 4096);
    check_gemv_batch(KILN_TYPE_Q6_K, true, 96, 512);
    check_gemv_batch(KILN_TYPE_F16, true, 96, 512);
    check_gemv_batch(KILN_TYPE_BF16, true, 96, 4096);
    test_gemv_batch_multi(state);
    const int tall[3] = {1000, 1032, 136}; /* 137 row blocks, not fewer than the SMs: 8-warp blocks, where the
                                            * launch of 7 above takes 16-warp ones */
    check_gemv_batch_multi(tall);
    const kiln_type mixed[3] = {KILN_TYPE_Q4_K, KILN_TYPE_Q4_K, KILN_TYPE_Q6_K};
    check_qkv_rope(mixed, 40, 64);
    const kiln_type floats[3] = {KILN_TYPE_BF16, KILN_TYPE_BF16, KILN_TYPE_F16};
    check_qkv_rope(floats, 8, 64);
    kiln_cuda_batch_half_set(false);
}

/* The Q8_1 copy dq of n device values out (host copy): within half a step of each block's scale. */
static void check_q8_1_copy(const void *dq, const float *out, int n) {
    uint8_t *oq = malloc(Q8_1_BYTES(n));
    float *back = malloc(sizeof(float) * n);
    CUDA_OK(cudaMemcpy(oq, dq, Q8_1_BYTES(n), cudaMemcpyDeviceToHost));
    dequant_q8_1(oq, n, back);
    double *outd = malloc(sizeof(double) * n);
    for (int i = 0; i < n; i++) outd[i] = out[i];
    double eq = rel_err(back, outd, (size_t)n);
    fprintf(stderr, "  its Q8_1 %.2e\n", eq);
    assert_true(eq < 2e-2);
    free(oq), free(back), free(outd);
}

/* Tokens of lengths 1 (one slice) to 1100 (all slices, longer than 32 positions each) through shuffled block
 * tables, against double softmax attention, blocks taking a K/V head's query heads together; then token 1 alone,
 * a block a head, gives the same bits. */
static void check_attention(int hd) {
    enum { T = 5 };
    const int n_head = 8, n_head_kv = 2, n_blocks = 160;
    const int n_pos[T] = {1, 40, 300, 1100, 17};
    int qd = n_head * hd;
    size_t cache_n = (size_t)n_blocks * n_head_kv * BS * hd;
    kiln_half *kc = malloc(sizeof(kiln_half) * cache_n), *vc = malloc(sizeof(kiln_half) * cache_n);
    for (size_t i = 0; i < cache_n; i++)
        kc[i] = kiln_float_to_half(rng_uniform()), vc[i] = kiln_float_to_half(rng_uniform());
    /* each token's table: distinct blocks in a shuffled order (tokens may share blocks, as prefix reuse does) */
    int32_t tables[T * 80], off[T], pos[T], perm[160];
    int n_tab = 0;
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int t = 0; t < T; t++) {
        for (int i = n_blocks - 1; i > 0; i--) {
            int j = (int)((rng_uniform() + 1.0f) * 0.5f * i), tmp = perm[i];
            perm[i] = perm[j], perm[j] = tmp;
        }
        off[t] = n_tab, pos[t] = n_pos[t] - 1;
        for (int b = 0; b < (n_pos[t] + BS - 1) / BS; b++) tables[n_tab++] = perm[b];
    }
    float *q = malloc(sizeof(float) * T * qd);
    rng_fill(q, (size_t)T * qd, 0.3f);
    double *ref = malloc(sizeof(double) * T * qd), *s = malloc(sizeof(double) * 1100);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_head; h++) {
            int kvh = h / (n_head / n_head_kv);
            const float *qh = q + (size_t)t * qd + h * hd;
            double mx = -INFINITY, sum = 0;
            for (int p = 0; p < n_pos[t]; p++) {
                int blk = tables[off[t] + p / BS];
                double a = 0;
                for (int d = 0; d < hd; d++)
                    a += qh[d] * (double)kiln_half_to_float(kc[paged_index(n_head_kv, hd, blk, kvh, p % BS, d)]);
                s[p] = a, mx = fmax(mx, a);
            }
            for (int p = 0; p < n_pos[t]; p++) s[p] = exp(s[p] - mx), sum += s[p];
            for (int d = 0; d < hd; d++) {
                double o = 0;
                for (int p = 0; p < n_pos[t]; p++) {
                    int blk = tables[off[t] + p / BS];
                    o += s[p] * kiln_half_to_float(vc[paged_index(n_head_kv, hd, blk, kvh, p % BS, d)]);
                }
                ref[(size_t)t * qd + h * hd + d] = o / sum;
            }
        }
    void *dkc = gpu_upload(kc, sizeof(kiln_half) * cache_n), *dvc = gpu_upload(vc, sizeof(kiln_half) * cache_n);
    float *dq = gpu_upload(q, sizeof(float) * T * qd), *dout = gpu_alloc(sizeof(float) * T * qd);
    float *part = gpu_alloc(sizeof(float) * T * n_head * KILN_CUDA_DECODE_SPLITS * (hd + 2));
    void *dout_q = gpu_alloc(INPUT_BYTES(T * qd));
    int32_t *dtab = gpu_upload(tables, sizeof(int32_t) * n_tab), *doff = gpu_upload(off, sizeof off);
    int32_t *dpos = gpu_upload(pos, sizeof pos);
    kiln_cuda_paged_args a = {n_head, n_head_kv, hd, hd, BS, false, 1.0f, NULL};
    kiln_cuda_attention_paged_group(1); /* the batch's blocks take a K/V head's 4 query heads, token 1 alone 1 */
    assert_int_equal(kiln_cuda_attention_paged(&a, dq, dkc, dvc, dpos, dtab, doff, T, 1100, part, dout, dout_q, 0), 0);
    float *out = download(dout, (size_t)T * qd);
    double e = rel_err(out, ref, (size_t)T * qd);
    fprintf(stderr, "attention_paged hd %d%s: rel err %.2e\n", hd, kiln_cuda_batch_half() ? " (half mode)" : "", e);
    assert_true(e < 1e-5);
    if (kiln_cuda_batch_half()) assert_half_input(dout_q, dout, qd, T); /* out_q: the F16 input instead */
    else check_q8_1_copy(dout_q, out, T * qd);

    float *dout1 = gpu_alloc(sizeof(float) * qd);
    /* token 1 alone, in a grid of its own 2 slices where the batch's had 32, a block a head, then two heads a block:
     * the same bits */
    for (int mode = 0; mode <= 2; mode += 2) {
        kiln_cuda_attention_paged_group(mode);
        assert_int_equal(kiln_cuda_attention_paged(&a, dq + qd, dkc, dvc, dpos + 1, dtab, doff + 1, 1, n_pos[1], part,
                                                   dout1, NULL, 0), 0);
        float *out1 = download(dout1, qd);
        assert_memory_equal(out1, out + qd, sizeof(float) * qd);
        free(out1);
    }
    kiln_cuda_attention_paged_group(-1);
    free(kc), free(vc), free(q), free(ref), free(s), free(out);
    gpu_free_all();
}

/* The attention in both modes: its out_q as Q8_1 or as half mode's F16. */
static void test_attention_paged(void **state) {
    SKIP_WITHOUT_GPU();
    check_attention(64);
    check_attention(128);
    check_attention(256);
    kiln_cuda_batch_half_set(true);
    check_attention(128);
    kiln_cuda_batch_half_set(false);
}

static void test_gather_rows(void **state) {
    SKIP_WITHOUT_GPU();
    const int width = 300, rows[3] = {4, 0, 4};
    float x[5 * 300];
    rng_fill(x, 5 * 300, 1.0f);
    float *dx = gpu_upload(x, sizeof x), *dg = gpu_alloc(sizeof(float) * 3 * width);
    kiln_cuda_gather_rows(dx, gpu_upload(rows, sizeof rows), 3, width, dg, 0);
    float *g = download(dg, 3 * width);
    for (int i = 0; i < 3; i++) assert_memory_equal(g + i * width, x + rows[i] * width, sizeof(float) * width);
    free(g);
    gpu_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemv_batch),
        cmocka_unit_test(test_gemv_batch_swiglu),
        cmocka_unit_test(test_gemv_batch_multi),
        cmocka_unit_test(test_rope_store_paged),
        cmocka_unit_test(test_gemv_batch_qkv_rope),
        cmocka_unit_test(test_attention_paged),
        cmocka_unit_test(test_gather_rows),
        cmocka_unit_test(test_gemv_batch_half),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

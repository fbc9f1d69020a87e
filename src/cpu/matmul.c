/* Tiled quantized matmul over the thread pool. */
#include "cpu/matmul.h"

#include <stdatomic.h>

#include "cpu/gemm.h"
#include "quant/quant.h"

/* Output rows per run: their weight rows (a few KiB) stay in L1 while every input row passes over them. A prompt
 * batch takes its tiles a run at a time, from a shared counter. A decode step (up to STREAMED_TOKENS tokens: one
 * sequence, or the server's batch of sequences) instead gets tiles of about rows / threads, walked run by run, so
 * each thread streams one long contiguous run of weights: hardware prefetchers follow those, and interleaved small
 * tiles ran at half the speed on 2 threads (a decode batch of 2 sequences gave less than one alone). */
#define TILE_ROWS 16
#define STREAMED_TOKENS 16

/* The scratch holds the quantized rows, then (64-byte aligned) their F32 block scales for the multi-token kernels:
 * two floats per 32 elements. */
static size_t scales_offset(size_t qin_bytes) { return (qin_bytes + 63) & ~(size_t)63; }
static size_t scales_stride(int64_t n_in) { return (size_t)(n_in / 32) * 2; }

size_t kiln_matmul_scratch_size(const kiln_weight *w, int n_tok) {
    const kiln_quant_ops *ops = kiln_quant_ops_best(w->type);
    size_t qin = kiln_row_size(ops->vec_dot_type, w->ne[0]) * (size_t)n_tok;
    return scales_offset(qin) + sizeof(float) * scales_stride(w->ne[0]) * (size_t)n_tok;
}

typedef struct matmul_job {
    const kiln_weight *const *ws;
    float *const *outs;
    int n_w;
    int n_tiles[KILN_MATMUL_MAX_WEIGHTS]; /* tiles of each weight, in order */
    int total_tiles;
    int tile_rows;
    const float *in;
    int n_tok;
    int n_multi; /* leading rows the multi-token kernel may take */
    kiln_quantize_fn quantize;
    kiln_vec_dot_fn dot[KILN_MATMUL_MAX_WEIGHTS];
    kiln_gemm_fn gemm[KILN_MATMUL_MAX_WEIGHTS]; /* multi-token kernel, or NULL */
    kiln_vec_dot_rows_fn dot_rows[KILN_MATMUL_MAX_WEIGHTS]; /* vec_dot's bits for 4 tokens at once, or NULL */
    char *qin;
    size_t qin_row;
    kiln_type qin_type;
    float *scales; /* block scales of the quantized rows, when a multi-token kernel runs */
    size_t s_stride;
    atomic_int next_tile;
    atomic_int next_row; /* input rows to quantize */
} matmul_job;

static void quantize_job(void *arg, int ith, int nth) {
    matmul_job *j = arg;
    (void)ith;
    (void)nth;
    int64_t n_in = j->ws[0]->ne[0];
    int t;
    while ((t = atomic_fetch_add_explicit(&j->next_row, 1, memory_order_relaxed)) < j->n_tok) {
        char *q = j->qin + (size_t)t * j->qin_row;
        j->quantize(j->in + (size_t)t * n_in, q, n_in);
        if (j->scales) kiln_gemm_scales(q, n_in, j->qin_type, j->scales + (size_t)t * j->s_stride);
    }
}

/* Rows [r0, r1) of weight wi for every token: few enough rows that they stay in L1 while the tokens pass. */
static void run_rows(const matmul_job *j, int wi, int64_t r0, int64_t r1) {
    const kiln_weight *w = j->ws[wi];
    int64_t n_out = w->ne[1];
    const char *rows = (const char *)w->data;
    float *out = j->outs[wi];
    int t = 0;
    if (j->gemm[wi]) {
        float o[KILN_GEMM_TOKENS];
        for (; t + KILN_GEMM_TOKENS <= j->n_multi; t += KILN_GEMM_TOKENS)
            for (int64_t r = r0; r < r1; r++) {
                j->gemm[wi](w->ne[0], rows + (size_t)r * w->row_bytes, j->qin + (size_t)t * j->qin_row, j->qin_row,
                            j->scales + (size_t)t * j->s_stride, j->s_stride, o);
                for (int k = 0; k < KILN_GEMM_TOKENS; k++) out[(size_t)(t + k) * (size_t)n_out + r] = o[k];
            }
    }
    if (j->dot_rows[wi]) { /* the same bits as the token-by-token loop below: any tokens may take it */
        float o[KILN_DOT_ROWS];
        for (; t + KILN_DOT_ROWS <= j->n_tok; t += KILN_DOT_ROWS)
            for (int64_t r = r0; r < r1; r++) {
                j->dot_rows[wi](w->ne[0], rows + (size_t)r * w->row_bytes, j->qin + (size_t)t * j->qin_row,
                                j->qin_row, o);
                for (int k = 0; k < KILN_DOT_ROWS; k++) out[(size_t)(t + k) * (size_t)n_out + r] = o[k];
            }
    }
    for (; t < j->n_tok; t++) {
        const char *x = j->qin + (size_t)t * j->qin_row;
        float *o = out + (size_t)t * (size_t)n_out;
        for (int64_t r = r0; r < r1; r++) o[r] = j->dot[wi](w->ne[0], rows + (size_t)r * w->row_bytes, x);
    }
}

/* A tile: its rows in runs of TILE_ROWS, so a thread's long tile of a decode batch streams its weights once. */
static void run_tile(const matmul_job *j, int tile) {
    int wi = 0;
    while (tile >= j->n_tiles[wi]) tile -= j->n_tiles[wi++];
    int64_t n_out = j->ws[wi]->ne[1], r0 = (int64_t)tile * j->tile_rows;
    int64_t r1 = r0 + j->tile_rows < n_out ? r0 + j->tile_rows : n_out;
    for (int64_t r = r0; r < r1; r += TILE_ROWS) run_rows(j, wi, r, r + TILE_ROWS < r1 ? r + TILE_ROWS : r1);
}

static void dot_job(void *arg, int ith, int nth) {
    matmul_job *j = arg;
    (void)ith;
    (void)nth;
    int tile;
    while ((tile = atomic_fetch_add_explicit(&j->next_tile, 1, memory_order_relaxed)) < j->total_tiles)
        run_tile(j, tile);
}

static int tile_rows(const kiln_weight *const *ws, int n_w, int n_tok, int n_threads) {
    if (n_tok > STREAMED_TOKENS) return TILE_ROWS;
    int64_t rows = 0;
    for (int i = 0; i < n_w; i++) rows += ws[i]->ne[1];
    int64_t per_thread = (rows + n_threads - 1) / n_threads;
    return (int)((per_thread + TILE_ROWS - 1) / TILE_ROWS * TILE_ROWS);
}

void kiln_matmul(kiln_pool *pool, const kiln_weight *const *ws, float *const *outs, int n_w, const float *in,
                 int n_tok, void *scratch) {
    kiln_matmul_split(pool, ws, outs, n_w, in, n_tok, n_tok, scratch);
}

void kiln_matmul_split(kiln_pool *pool, const kiln_weight *const *ws, float *const *outs, int n_w, const float *in,
                       int n_tok, int n_multi, void *scratch) {
    const kiln_quant_ops *ops = kiln_quant_ops_best(ws[0]->type);
    const kiln_quant_ops *qops = kiln_quant_ops_best(ops->vec_dot_type);
    matmul_job j = {.ws = ws, .outs = outs, .n_w = n_w, .in = in, .n_tok = n_tok, .n_multi = n_multi,
                    .quantize = qops->quantize,
                    .qin = scratch, .qin_row = kiln_row_size(ops->vec_dot_type, ws[0]->ne[0]),
                    .qin_type = ops->vec_dot_type, .s_stride = scales_stride(ws[0]->ne[0])};
    j.tile_rows = tile_rows(ws, n_w, n_tok, kiln_pool_size(pool));
    for (int i = 0; i < n_w; i++) {
        j.dot[i] = kiln_quant_ops_best(ws[i]->type)->vec_dot;
        j.dot_rows[i] = kiln_quant_ops_best(ws[i]->type)->vec_dot_rows;
        j.gemm[i] = kiln_gemm_get(ws[i]->type, kiln_cpu_isa());
        if (j.gemm[i] && (kiln_cpu_isa() == KILN_ISA_SCALAR || n_multi < KILN_GEMM_TOKENS)) j.gemm[i] = NULL;
        if (j.gemm[i]) j.scales = (float *)((char *)scratch + scales_offset(j.qin_row * (size_t)n_tok));
        j.n_tiles[i] = (int)((ws[i]->ne[1] + j.tile_rows - 1) / j.tile_rows);
        j.total_tiles += j.n_tiles[i];
    }
    atomic_init(&j.next_tile, 0);
    atomic_init(&j.next_row, 0);
    if (n_tok == 1) quantize_job(&j, 0, 1);
    else kiln_pool_run(pool, quantize_job, &j);
    kiln_pool_run(pool, dot_job, &j);
}

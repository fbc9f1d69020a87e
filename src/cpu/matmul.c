/* Tiled quantized matmul over the thread pool. */
#include "cpu/matmul.h"

#include <stdatomic.h>

#include "quant/quant.h"

/* Output rows per tile: their weight rows (a few KiB) stay in L1 while every input row passes over them. */
#define TILE_ROWS 16

size_t kiln_matmul_scratch_size(const kiln_weight *w, int n_tok) {
    const kiln_quant_ops *ops = kiln_quant_ops_best(w->type);
    return kiln_row_size(ops->vec_dot_type, w->ne[0]) * (size_t)n_tok;
}

typedef struct matmul_job {
    const kiln_weight *const *ws;
    float *const *outs;
    int n_w;
    int n_tiles[KILN_MATMUL_MAX_WEIGHTS]; /* tiles of each weight, in order */
    int total_tiles;
    const float *in;
    int n_tok;
    kiln_quantize_fn quantize;
    kiln_vec_dot_fn dot[KILN_MATMUL_MAX_WEIGHTS];
    char *qin;
    size_t qin_row;
    atomic_int next_tile;
    atomic_int next_row; /* input rows to quantize */
} matmul_job;

static void quantize_job(void *arg, int ith, int nth) {
    matmul_job *j = arg;
    (void)ith;
    (void)nth;
    int64_t n_in = j->ws[0]->ne[0];
    int t;
    while ((t = atomic_fetch_add_explicit(&j->next_row, 1, memory_order_relaxed)) < j->n_tok)
        j->quantize(j->in + (size_t)t * n_in, j->qin + (size_t)t * j->qin_row, n_in);
}

static void run_tile(const matmul_job *j, int tile) {
    int wi = 0;
    while (tile >= j->n_tiles[wi]) tile -= j->n_tiles[wi++];
    const kiln_weight *w = j->ws[wi];
    int64_t n_out = w->ne[1], r0 = (int64_t)tile * TILE_ROWS;
    int64_t r1 = r0 + TILE_ROWS < n_out ? r0 + TILE_ROWS : n_out;
    const char *rows = (const char *)w->data;
    float *out = j->outs[wi];
    for (int t = 0; t < j->n_tok; t++) {
        const char *x = j->qin + (size_t)t * j->qin_row;
        float *o = out + (size_t)t * (size_t)n_out;
        for (int64_t r = r0; r < r1; r++) o[r] = j->dot[wi](w->ne[0], rows + (size_t)r * w->row_bytes, x);
    }
}

static void dot_job(void *arg, int ith, int nth) {
    matmul_job *j = arg;
    (void)ith;
    (void)nth;
    int tile;
    while ((tile = atomic_fetch_add_explicit(&j->next_tile, 1, memory_order_relaxed)) < j->total_tiles)
        run_tile(j, tile);
}

void kiln_matmul(kiln_pool *pool, const kiln_weight *const *ws, float *const *outs, int n_w, const float *in,
                 int n_tok, void *scratch) {
    const kiln_quant_ops *ops = kiln_quant_ops_best(ws[0]->type);
    const kiln_quant_ops *qops = kiln_quant_ops_best(ops->vec_dot_type);
    matmul_job j = {.ws = ws, .outs = outs, .n_w = n_w, .in = in, .n_tok = n_tok, .quantize = qops->quantize,
                    .qin = scratch, .qin_row = kiln_row_size(ops->vec_dot_type, ws[0]->ne[0])};
    for (int i = 0; i < n_w; i++) {
        j.dot[i] = kiln_quant_ops_best(ws[i]->type)->vec_dot;
        j.n_tiles[i] = (int)((ws[i]->ne[1] + TILE_ROWS - 1) / TILE_ROWS);
        j.total_tiles += j.n_tiles[i];
    }
    atomic_init(&j.next_tile, 0);
    atomic_init(&j.next_row, 0);
    if (n_tok == 1) quantize_job(&j, 0, 1);
    else kiln_pool_run(pool, quantize_job, &j);
    kiln_pool_run(pool, dot_job, &j);
}

/* The GPU executor: the same paged KV pool bookkeeping as the CPU's (sched_blocks.c: block tables, prefix reuse,
 * LRU) with the K/V blocks on the device, and one batched forward per step over every running sequence
 * (kiln_cuda_forward_batch): each weight is read once per step for all of them. The scheduler samples on the host:
 * from each sequence's best logits, ranked on the device, where its sampler can (kiln_sampler_candidates_wanted),
 * else from the whole row. The weights are uploaded once, for all sequences. */
#include <stdlib.h>

#include "engine/sched_blocks.h"

typedef struct cuda_exec {
    sched_exec base;
    kiln_model *model;
    kiln_cuda_model *cm; /* the model's shared weights on the GPU */
    kiln_cuda_batch *batch;
    kiln_kv_pool *pool;
    int n_ctx, n_vocab;
    bool half;
    kiln_cuda_seq *seqs; /* [parallel] */
    int32_t *windows;    /* [parallel][KILN_CUDA_TOP_K_MAX]: each sequence's penalty window, for its best logits */
} cuda_exec;

static int div_up(int a, int b) { return (a + b - 1) / b; }

static int cuda_admit(sched_exec *base, sched_seq *q, kiln_error *err) {
    cuda_exec *x = (cuda_exec *)base;
    return sched_blocks_admit(x->pool, x->n_ctx, q, err);
}

static void cuda_release(sched_exec *base, sched_seq *q) { sched_blocks_release(((cuda_exec *)base)->pool, q); }

static int cuda_run(sched_exec *base, sched_work *work, int n_work, kiln_error *err) {
    cuda_exec *x = (cuda_exec *)base;
    for (int i = 0; i < n_work; i++) {
        sched_work *w = &work[i];
        kiln_cuda_seq *q = &x->seqs[i];
        *q = (kiln_cuda_seq){.tokens = w->tokens, .n = w->n, .pos = w->pos,
                             .blocks = ((sched_blocks *)w->seq->exec)->blocks, .logits = w->want_logits};
        int32_t *window = x->windows + (size_t)i * KILN_CUDA_TOP_K_MAX;
        w->window = window, w->n_window = 0;
        if (w->want_logits)
            q->best = kiln_sampler_candidates_wanted(w->seq->gen.sampler, KILN_CUDA_TOP_K_MAX, window, &w->n_window);
        q->window = window, q->n_window = w->n_window;
        w->n_best = q->best;
    }
    const float *logits = NULL;
    if (kiln_cuda_forward_batch(x->batch, x->seqs, n_work, &logits, err)) return -1;
    int k = 0;
    for (int i = 0; i < n_work; i++) {
        sched_work *w = &work[i];
        if (w->want_logits) {
            if (w->n_best) kiln_cuda_batch_best(x->batch, k, &w->best_ids, &w->best_logits, &w->window_logits);
            else w->logits = logits + (size_t)k * (size_t)x->n_vocab;
            k++;
        }
        sched_blocks_publish(x->pool, w);
    }
    return 0;
}

static void cuda_stats(sched_exec *base, kiln_sched_stats *st) { sched_blocks_stats(((cuda_exec *)base)->pool, st); }

static void cuda_info(const sched_exec *base, kiln_sched_info *out) {
    const cuda_exec *x = (const cuda_exec *)base;
    *out = (kiln_sched_info){.device = KILN_DEVICE_CUDA, .gpu_f16 = x->half,
                             .kv_blocks = kiln_cuda_batch_blocks(x->batch), .kv_block_size = KILN_SCHED_BLOCK};
    out->memory.weights = kiln_cuda_model_bytes(x->cm);
    kiln_cuda_batch_memory(x->batch, &out->memory.kv_cache, &out->memory.workspace);
}

static void cuda_free(sched_exec *base) {
    cuda_exec *x = (cuda_exec *)base;
    kiln_cuda_batch_free(x->batch);
    if (x->cm) kiln_model_gpu_release(x->model);
    kiln_kv_pool_free(x->pool);
    free(x->seqs);
    free(x->windows);
    free(x);
}

static const sched_exec_ops CUDA_OPS = {cuda_admit, cuda_release, cuda_run, cuda_stats, cuda_info, cuda_free};

sched_exec *kiln_sched_cuda_new(kiln_model *m, const kiln_sched_params *p, kiln_error *err) {
    int per_ctx = div_up(p->n_ctx, KILN_SCHED_BLOCK);
    int want = p->n_kv_blocks > 0 ? p->n_kv_blocks : p->parallel * per_ctx;
    if (want < per_ctx) {
        kiln_fail(err, "a KV pool of %d blocks cannot hold one context of %d positions (%d blocks of %d)", want,
                  p->n_ctx, per_ctx, KILN_SCHED_BLOCK);
        return NULL;
    }
    cuda_exec *x = calloc(1, sizeof *x);
    if (!x || !(x->seqs = calloc((size_t)p->parallel, sizeof *x->seqs)) ||
        !(x->windows = malloc(sizeof *x->windows * (size_t)p->parallel * KILN_CUDA_TOP_K_MAX))) {
        if (x) free(x->seqs);
        free(x);
        kiln_fail(err, "out of memory");
        return NULL;
    }
    x->base.ops = &CUDA_OPS;
    x->n_ctx = p->n_ctx;
    x->n_vocab = m->cfg.n_vocab;
    /* without a pool size given, as many blocks as fit beside the weights (up to a full context per sequence) */
    kiln_cuda_batch_params bp = {.block_size = KILN_SCHED_BLOCK, .n_ctx = p->n_ctx,
                                 .max_tokens = p->n_chunk + p->parallel, .max_seqs = p->parallel,
                                 .max_blocks = want, .min_blocks = p->n_kv_blocks > 0 ? want : per_ctx,
                                 .half = kiln_sched_half_mode(&m->w, p->gpu_f16)};
    x->model = m;
    x->half = bp.half;
    if (kiln_model_gpu_acquire(m, &x->cm, err) || kiln_cuda_batch_new(x->cm, &bp, &x->batch, err) ||
        kiln_kv_pool_new(kiln_cuda_batch_blocks(x->batch), KILN_SCHED_BLOCK, &x->pool, err)) {
        cuda_free(&x->base);
        return NULL;
    }
    return &x->base;
}

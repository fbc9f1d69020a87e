/* The GPU executor: the same paged KV pool bookkeeping as the CPU's (sched_blocks.c: block tables, prefix reuse,
 * LRU) with the K/V blocks on the device, and one batched forward per step over every running sequence
 * (kiln_cuda_forward_batch): each weight is read once per step for all of them. Logits come back to the host, where
 * the scheduler samples as on the CPU. The weights are uploaded once, for all sequences. */
#include <stdlib.h>

#include "engine/sched_blocks.h"

typedef struct cuda_exec {
    sched_exec base;
    kiln_cuda_model *cm;
    kiln_cuda_batch *batch;
    kiln_kv_pool *pool;
    int n_ctx, n_vocab;
    kiln_cuda_seq *seqs; /* [parallel] */
} cuda_exec;

static int div_up(int a, int b) { return (a + b - 1) / b; }

static int cuda_admit(sched_exec *base, sched_seq *q, kiln_error *err) {
    cuda_exec *x = (cuda_exec *)base;
    return sched_blocks_admit(x->pool, x->n_ctx, q, err);
}

static void cuda_release(sched_exec *base, sched_seq *q) { sched_blocks_release(((cuda_exec *)base)->pool, q); }

static int cuda_run(sched_exec *base, sched_work *work, int n_work, kiln_error *err) {
    cuda_exec *x = (cuda_exec *)base;
    for (int i = 0; i < n_work; i++)
        x->seqs[i] = (kiln_cuda_seq){.tokens = work[i].tokens, .n = work[i].n, .pos = work[i].pos,
                                     .blocks = ((sched_blocks *)work[i].seq->exec)->blocks,
                                     .logits = work[i].want_logits};
    const float *logits = NULL;
    if (kiln_cuda_forward_batch(x->batch, x->seqs, n_work, &logits, err)) return -1;
    int k = 0;
    for (int i = 0; i < n_work; i++) {
        if (work[i].want_logits) work[i].logits = logits + (size_t)k++ * (size_t)x->n_vocab;
        sched_blocks_publish(x->pool, &work[i]);
    }
    return 0;
}

static void cuda_stats(sched_exec *base, kiln_sched_stats *st) { sched_blocks_stats(((cuda_exec *)base)->pool, st); }

static void cuda_free(sched_exec *base) {
    cuda_exec *x = (cuda_exec *)base;
    kiln_cuda_batch_free(x->batch);
    kiln_cuda_model_free(x->cm);
    kiln_kv_pool_free(x->pool);
    free(x->seqs);
    free(x);
}

static const sched_exec_ops CUDA_OPS = {cuda_admit, cuda_release, cuda_run, cuda_stats, cuda_free};

sched_exec *kiln_sched_cuda_new(kiln_model *m, const kiln_sched_params *p, kiln_error *err) {
    int per_ctx = div_up(p->n_ctx, KILN_SCHED_BLOCK);
    int want = p->n_kv_blocks > 0 ? p->n_kv_blocks : p->parallel * per_ctx;
    if (want < per_ctx) {
        kiln_fail(err, "a KV pool of %d blocks cannot hold one context of %d positions (%d blocks of %d)", want,
                  p->n_ctx, per_ctx, KILN_SCHED_BLOCK);
        return NULL;
    }
    cuda_exec *x = calloc(1, sizeof *x);
    if (!x || !(x->seqs = calloc((size_t)p->parallel, sizeof *x->seqs))) {
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
                                 .max_blocks = want, .min_blocks = p->n_kv_blocks > 0 ? want : per_ctx};
    if (kiln_cuda_model_load(&m->cfg, &m->w, &x->cm, err) || kiln_cuda_batch_new(x->cm, &bp, &x->batch, err) ||
        kiln_kv_pool_new(kiln_cuda_batch_blocks(x->batch), KILN_SCHED_BLOCK, &x->pool, err)) {
        cuda_free(&x->base);
        return NULL;
    }
    return &x->base;
}

/* The CPU executor: one KV cache of fixed-size blocks shared by every sequence through its block table
 * (sched_blocks.c), and one batched forward per step (kiln_cpu_forward_batch). */
#include <stdlib.h>

#include "engine/sched_blocks.h"

typedef struct paged_exec {
    sched_exec base;
    kiln_cpu_state *cpu;
    kiln_kv_pool *pool;
    int n_ctx, n_vocab;
    uint64_t weights;    /* bytes of the model's weights (mapped from its file) */
    float *logits;       /* [parallel][n_vocab] */
    kiln_cpu_seq *seqs;  /* [parallel] */
} paged_exec;

static int div_up(int a, int b) { return (a + b - 1) / b; }

static int paged_admit(sched_exec *base, sched_seq *q, kiln_error *err) {
    paged_exec *x = (paged_exec *)base;
    return sched_blocks_admit(x->pool, x->n_ctx, q, err);
}

static void paged_release(sched_exec *base, sched_seq *q) { sched_blocks_release(((paged_exec *)base)->pool, q); }

static int paged_run(sched_exec *base, sched_work *work, int n_work, kiln_error *err) {
    paged_exec *x = (paged_exec *)base;
    for (int i = 0; i < n_work; i++)
        x->seqs[i] = (kiln_cpu_seq){.tokens = work[i].tokens, .n = work[i].n, .pos = work[i].pos,
                                    .blocks = ((sched_blocks *)work[i].seq->exec)->blocks,
                                    .logits = work[i].want_logits};
    if (kiln_cpu_forward_batch(x->cpu, x->seqs, n_work, KILN_SCHED_BLOCK, x->logits, err)) return -1;
    int k = 0;
    for (int i = 0; i < n_work; i++) {
        if (work[i].want_logits) work[i].logits = x->logits + (size_t)k++ * (size_t)x->n_vocab;
        sched_blocks_publish(x->pool, &work[i]);
    }
    return 0;
}

static void paged_stats(sched_exec *base, kiln_sched_stats *st) { sched_blocks_stats(((paged_exec *)base)->pool, st); }

static void paged_info(const sched_exec *base, kiln_sched_info *out) {
    const paged_exec *x = (const paged_exec *)base;
    *out = (kiln_sched_info){.device = KILN_DEVICE_CPU, .kv_blocks = kiln_kv_pool_blocks(x->pool),
                             .kv_block_size = KILN_SCHED_BLOCK};
    out->memory.weights = x->weights;
    kiln_cpu_memory(x->cpu, &out->memory.kv_cache, &out->memory.workspace);
}

static void paged_free(sched_exec *base) {
    paged_exec *x = (paged_exec *)base;
    kiln_cpu_free(x->cpu);
    kiln_kv_pool_free(x->pool);
    free(x->logits);
    free(x->seqs);
    free(x);
}

static const sched_exec_ops PAGED_OPS = {paged_admit, paged_release, paged_run, paged_stats, paged_info, paged_free};

sched_exec *kiln_sched_paged_new(kiln_model *m, const kiln_sched_params *p, kiln_error *err) {
    int per_ctx = div_up(p->n_ctx, KILN_SCHED_BLOCK);
    int n_blocks = p->n_kv_blocks > 0 ? p->n_kv_blocks : p->parallel * per_ctx;
    if (n_blocks < per_ctx) {
        kiln_fail(err, "a KV pool of %d blocks cannot hold one context of %d positions (%d blocks of %d)", n_blocks,
                  p->n_ctx, per_ctx, KILN_SCHED_BLOCK);
        return NULL;
    }
    paged_exec *x = calloc(1, sizeof *x);
    if (!x) {
        kiln_fail(err, "out of memory");
        return NULL;
    }
    x->base.ops = &PAGED_OPS;
    x->n_ctx = p->n_ctx;
    x->n_vocab = m->cfg.n_vocab;
    x->weights = kiln_weights_bytes(&m->w);
    kiln_cpu_params cp = {.n_ctx = p->n_ctx, .n_batch = p->n_chunk + p->parallel,
                          .n_kv_rows = n_blocks * KILN_SCHED_BLOCK, .n_threads = p->n_threads,
                          .kv_type = KILN_TYPE_F16};
    x->logits = malloc(sizeof *x->logits * (size_t)p->parallel * (size_t)x->n_vocab);
    x->seqs = calloc((size_t)p->parallel, sizeof *x->seqs);
    if (!x->logits || !x->seqs) kiln_fail(err, "out of memory for %d sequences' logits", p->parallel);
    if (!x->logits || !x->seqs || kiln_kv_pool_new(n_blocks, KILN_SCHED_BLOCK, &x->pool, err) ||
        kiln_cpu_new(&m->cfg, &m->w, &cp, &x->cpu, err)) {
        paged_free(&x->base);
        return NULL;
    }
    return &x->base;
}

/* The CPU executor: one KV cache of fixed-size blocks shared by every sequence through its block table, and one
 * batched forward per step (kiln_cpu_forward_batch). A sequence takes all the blocks it can ever need when admitted
 * (prompt plus max_tokens, or a full context), so a running sequence never waits for memory; its leading full
 * prompt blocks come from the prefix cache when another request already computed them. */
#include <stdlib.h>

#include "engine/kv_pool.h"
#include "engine/sched_internal.h"

typedef struct paged_seq {
    int32_t *blocks;   /* the block table */
    int n_blocks;
    int n_published;   /* leading blocks taken from or offered to the prefix cache */
    uint64_t last_hash; /* chain hash of block n_published - 1 (0 before the first) */
} paged_seq;

typedef struct paged_exec {
    sched_exec base;
    kiln_cpu_state *cpu;
    kiln_kv_pool *pool;
    int n_ctx, n_vocab;
    float *logits;       /* [parallel][n_vocab] */
    kiln_cpu_seq *seqs;  /* [parallel] */
} paged_exec;

static int div_up(int a, int b) { return (a + b - 1) / b; }

/* Takes cached blocks for the leading full prompt blocks, stopping at the first miss. The block holding the last
 * prompt token is never taken: that token is evaluated again for its logits, and shared rows are never written. */
static int take_prefix(paged_exec *x, paged_seq *ps, const sched_seq *q) {
    int n_full = (q->n_prompt - 1) / KILN_SCHED_BLOCK;
    while (ps->n_blocks < n_full) {
        const int32_t *tokens = q->prompt + (size_t)ps->n_blocks * KILN_SCHED_BLOCK;
        uint64_t h = kiln_kv_block_hash(ps->last_hash, tokens, KILN_SCHED_BLOCK);
        int32_t b = kiln_kv_pool_lookup(x->pool, h, ps->last_hash, tokens);
        if (b < 0) break;
        ps->blocks[ps->n_blocks++] = b;
        ps->last_hash = h;
    }
    ps->n_published = ps->n_blocks;
    return ps->n_blocks;
}

static void paged_seq_free(paged_exec *x, paged_seq *ps) {
    for (int i = 0; i < ps->n_blocks; i++) kiln_kv_pool_release(x->pool, ps->blocks[i]);
    free(ps->blocks);
    free(ps);
}

static int paged_admit(sched_exec *base, sched_seq *q, kiln_error *err) {
    paged_exec *x = (paged_exec *)base;
    int max_pos = q->params.max_tokens >= 0 ? q->n_prompt + q->params.max_tokens : x->n_ctx;
    int need = div_up(max_pos < x->n_ctx ? max_pos : x->n_ctx, KILN_SCHED_BLOCK);
    paged_seq *ps = calloc(1, sizeof *ps);
    if (!ps || !(ps->blocks = malloc(sizeof *ps->blocks * (size_t)need))) {
        free(ps);
        return kiln_fail(err, "out of memory for a block table");
    }
    int reused = take_prefix(x, ps, q);
    if (kiln_kv_pool_available(x->pool) < need - reused) {
        paged_seq_free(x, ps);
        return 1;
    }
    while (ps->n_blocks < need) ps->blocks[ps->n_blocks++] = kiln_kv_pool_alloc(x->pool);
    q->exec = ps;
    q->n_past = reused * KILN_SCHED_BLOCK;
    return 0;
}

static void paged_release(sched_exec *base, sched_seq *q) {
    paged_seq_free((paged_exec *)base, q->exec);
    q->exec = NULL;
}

/* Offers the prompt blocks the step completed to the prefix cache. */
static void publish(paged_exec *x, const sched_work *w) {
    paged_seq *ps = w->seq->exec;
    int done = w->pos + w->n < w->seq->n_prompt ? w->pos + w->n : w->seq->n_prompt;
    while ((ps->n_published + 1) * KILN_SCHED_BLOCK <= done) {
        const int32_t *tokens = w->seq->prompt + (size_t)ps->n_published * KILN_SCHED_BLOCK;
        uint64_t h = kiln_kv_block_hash(ps->last_hash, tokens, KILN_SCHED_BLOCK);
        kiln_kv_pool_publish(x->pool, ps->blocks[ps->n_published], h, ps->last_hash, tokens);
        ps->last_hash = h;
        ps->n_published++;
    }
}

static int paged_run(sched_exec *base, sched_work *work, int n_work, kiln_error *err) {
    paged_exec *x = (paged_exec *)base;
    for (int i = 0; i < n_work; i++)
        x->seqs[i] = (kiln_cpu_seq){.tokens = work[i].tokens, .n = work[i].n, .pos = work[i].pos,
                                    .blocks = ((paged_seq *)work[i].seq->exec)->blocks,
                                    .logits = work[i].want_logits};
    if (kiln_cpu_forward_batch(x->cpu, x->seqs, n_work, KILN_SCHED_BLOCK, x->logits, err)) return -1;
    int k = 0;
    for (int i = 0; i < n_work; i++) {
        if (work[i].want_logits) work[i].logits = x->logits + (size_t)k++ * (size_t)x->n_vocab;
        publish(x, &work[i]);
    }
    return 0;
}

static void paged_stats(sched_exec *base, kiln_sched_stats *st) {
    paged_exec *x = (paged_exec *)base;
    st->kv_blocks_used = kiln_kv_pool_used(x->pool);
    st->kv_blocks_total = kiln_kv_pool_blocks(x->pool);
    st->kv_block_size = KILN_SCHED_BLOCK;
}

static void paged_free(sched_exec *base) {
    paged_exec *x = (paged_exec *)base;
    kiln_cpu_free(x->cpu);
    kiln_kv_pool_free(x->pool);
    free(x->logits);
    free(x->seqs);
    free(x);
}

static const sched_exec_ops PAGED_OPS = {paged_admit, paged_release, paged_run, paged_stats, paged_free};

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

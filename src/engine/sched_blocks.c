/* Block tables over the paged KV pool (see sched_blocks.h). A sequence takes all the blocks it can ever need when
 * admitted, so a running sequence never waits for memory. */
#include "engine/sched_blocks.h"

#include <stdlib.h>

static int div_up(int a, int b) { return (a + b - 1) / b; }

/* Takes cached blocks for the leading full prompt blocks, stopping at the first miss. The block holding the last
 * prompt token is never taken: that token is evaluated again for its logits, and shared rows are never written. */
static int take_prefix(kiln_kv_pool *pool, sched_blocks *t, const sched_seq *q) {
    int n_full = (q->n_prompt - 1) / KILN_SCHED_BLOCK;
    while (t->n_blocks < n_full) {
        const int32_t *tokens = q->prompt + (size_t)t->n_blocks * KILN_SCHED_BLOCK;
        uint64_t h = kiln_kv_block_hash(t->last_hash, tokens, KILN_SCHED_BLOCK);
        int32_t b = kiln_kv_pool_lookup(pool, h, t->last_hash, tokens);
        if (b < 0) break;
        t->blocks[t->n_blocks++] = b;
        t->last_hash = h;
    }
    t->n_published = t->n_blocks;
    return t->n_blocks;
}

static void table_free(kiln_kv_pool *pool, sched_blocks *t) {
    for (int i = 0; i < t->n_blocks; i++) kiln_kv_pool_release(pool, t->blocks[i]);
    free(t->blocks);
    free(t);
}

int sched_blocks_admit(kiln_kv_pool *pool, int n_ctx, sched_seq *q, kiln_error *err) {
    int max_pos = q->params.max_tokens >= 0 ? q->n_prompt + q->params.max_tokens : n_ctx;
    int need = div_up(max_pos < n_ctx ? max_pos : n_ctx, KILN_SCHED_BLOCK);
    sched_blocks *t = calloc(1, sizeof *t);
    if (!t || !(t->blocks = malloc(sizeof *t->blocks * (size_t)need))) {
        free(t);
        return kiln_fail(err, "out of memory for a block table");
    }
    int reused = take_prefix(pool, t, q);
    if (kiln_kv_pool_available(pool) < need - reused) {
        table_free(pool, t);
        return 1;
    }
    while (t->n_blocks < need) t->blocks[t->n_blocks++] = kiln_kv_pool_alloc(pool);
    q->exec = t;
    q->n_past = reused * KILN_SCHED_BLOCK;
    return 0;
}

void sched_blocks_release(kiln_kv_pool *pool, sched_seq *q) {
    table_free(pool, q->exec);
    q->exec = NULL;
}

void sched_blocks_publish(kiln_kv_pool *pool, const sched_work *w) {
    sched_blocks *t = w->seq->exec;
    int done = w->pos + w->n < w->seq->n_prompt ? w->pos + w->n : w->seq->n_prompt;
    while ((t->n_published + 1) * KILN_SCHED_BLOCK <= done) {
        const int32_t *tokens = w->seq->prompt + (size_t)t->n_published * KILN_SCHED_BLOCK;
        uint64_t h = kiln_kv_block_hash(t->last_hash, tokens, KILN_SCHED_BLOCK);
        kiln_kv_pool_publish(pool, t->blocks[t->n_published], h, t->last_hash, tokens);
        t->last_hash = h;
        t->n_published++;
    }
}

void sched_blocks_stats(const kiln_kv_pool *pool, kiln_sched_stats *st) {
    st->kv_blocks_used = kiln_kv_pool_used(pool);
    st->kv_blocks_total = kiln_kv_pool_blocks(pool);
    st->kv_block_size = KILN_SCHED_BLOCK;
}

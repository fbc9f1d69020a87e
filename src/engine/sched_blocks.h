/* A sequence's share of the paged KV pool, for the executors that keep K/V in blocks (the CPU's and the GPU's): its
 * block table, taken whole at admission, with the leading full prompt blocks borrowed from the prefix cache when
 * another request already computed them, and its own full prompt blocks offered to that cache once computed. */
#ifndef KILN_ENGINE_SCHED_BLOCKS_H
#define KILN_ENGINE_SCHED_BLOCKS_H

#include "engine/kv_pool.h"
#include "engine/sched_internal.h"

typedef struct sched_blocks {
    int32_t *blocks;    /* the block table */
    int n_blocks;
    int n_published;    /* leading blocks taken from or offered to the prefix cache */
    uint64_t last_hash; /* chain hash of block n_published - 1 (0 before the first) */
} sched_blocks;

/* Gives q a block table (q->exec) holding every position it can reach (prompt plus max_tokens, or n_ctx). Returns
 * 1 when the pool has no room for it now, 0 with q->n_past set to the prompt positions found cached, -1 on error. */
int sched_blocks_admit(kiln_kv_pool *pool, int n_ctx, sched_seq *q, kiln_error *err);
/* Drops q's holds (cached blocks stay in the pool's LRU for later requests). */
void sched_blocks_release(kiln_kv_pool *pool, sched_seq *q);
/* After a step: offers the full prompt blocks w completed to the prefix cache. */
void sched_blocks_publish(kiln_kv_pool *pool, const sched_work *w);
void sched_blocks_stats(const kiln_kv_pool *pool, kiln_sched_stats *st);

#endif

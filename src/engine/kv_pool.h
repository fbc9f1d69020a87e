/* The shared KV cache's blocks: who holds each (reference counts), and which full prompt blocks are cached for
 * reuse. A cached block is keyed by a hash of every token up to and including it (a chain: the block's tokens and
 * its parent's hash), and checked against its stored tokens and parent hash on lookup, so a hash collision cannot
 * hand out wrong rows. When no one holds a cached block it waits in an LRU list and is reused for a request with the
 * same prefix, or evicted (least recently used first) when the pool runs out of never-cached blocks. */
#ifndef KILN_ENGINE_KV_POOL_H
#define KILN_ENGINE_KV_POOL_H

#include <stdint.h>

#include "util/error.h"

typedef struct kiln_kv_pool kiln_kv_pool;

int kiln_kv_pool_new(int n_blocks, int block_size, kiln_kv_pool **out, kiln_error *err);
void kiln_kv_pool_free(kiln_kv_pool *p);

int kiln_kv_pool_blocks(const kiln_kv_pool *p);
/* Blocks held by someone. */
int kiln_kv_pool_used(const kiln_kv_pool *p);
/* Blocks kiln_kv_pool_alloc can still hand out: free ones plus cached ones no one holds. */
int kiln_kv_pool_available(const kiln_kv_pool *p);

/* A block for new rows, held once: a never-cached free block if any, else the least recently used cached one
 * (forgotten). -1 when none is left. */
int32_t kiln_kv_pool_alloc(kiln_kv_pool *p);
/* Drops one hold; a block no one holds goes back to the free list, or to the LRU list when cached. */
void kiln_kv_pool_release(kiln_kv_pool *p, int32_t block);

/* The chain hash of a block: its block_size tokens after the parent block's hash (0 for the first block). */
uint64_t kiln_kv_block_hash(uint64_t parent, const int32_t *tokens, int block_size);
/* The cached block with this chain (hash, parent, tokens), held once more; -1 when there is none. */
int32_t kiln_kv_pool_lookup(kiln_kv_pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens);
/* Offers a full block whose rows are now computed for reuse under its chain. Ignored when a block with the same
 * chain is already cached (then this one stays private and is freed when released). */
void kiln_kv_pool_publish(kiln_kv_pool *p, int32_t block, uint64_t hash, uint64_t parent, const int32_t *tokens);

#endif

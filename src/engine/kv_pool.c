/* KV block bookkeeping: reference counts, a free stack of never-cached blocks, a hash table of cached blocks
 * (chained buckets) and an LRU list of the cached ones no one holds. Rows live in the CPU state; this only says
 * which block is whose. */
#include "engine/kv_pool.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct kiln_kv_pool {
    int n_blocks, block_size;
    int *refs;
    bool *cached;
    uint64_t *hash, *parent;
    int32_t *tokens;        /* [n_blocks][block_size] of cached blocks */
    int32_t *free_stack;    /* never-cached blocks no one holds */
    int n_free;
    int32_t *bucket;        /* [n_buckets] first cached block of each bucket, or -1 */
    int32_t *bucket_next;
    int n_buckets;          /* a power of two */
    int32_t *lru_prev, *lru_next; /* cached blocks no one holds; head is the least recently used */
    int32_t lru_head, lru_tail;
    int n_lru, n_used;
};

int kiln_kv_pool_new(int n_blocks, int block_size, kiln_kv_pool **out, kiln_error *err) {
    *out = NULL;
    if (n_blocks < 1 || block_size < 1 || n_blocks > (1 << 24) || block_size > 4096)
        return kiln_fail(err, "a KV pool of %d blocks of %d positions is out of range", n_blocks, block_size);
    kiln_kv_pool *p = calloc(1, sizeof *p);
    if (!p) return kiln_fail(err, "out of memory");
    size_t n = (size_t)n_blocks;
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    for (p->n_buckets = 1; p->n_buckets < n_blocks; p->n_buckets *= 2) {}
    p->refs = calloc(n, sizeof *p->refs);
    p->cached = calloc(n, sizeof *p->cached);
    p->hash = calloc(n, sizeof *p->hash);
    p->parent = calloc(n, sizeof *p->parent);
    p->tokens = calloc(n * (size_t)block_size, sizeof *p->tokens);
    p->free_stack = malloc(n * sizeof *p->free_stack);
    p->bucket = malloc((size_t)p->n_buckets * sizeof *p->bucket);
    p->bucket_next = malloc(n * sizeof *p->bucket_next);
    p->lru_prev = malloc(n * sizeof *p->lru_prev);
    p->lru_next = malloc(n * sizeof *p->lru_next);
    if (!p->refs || !p->cached || !p->hash || !p->parent || !p->tokens || !p->free_stack || !p->bucket ||
        !p->bucket_next || !p->lru_prev || !p->lru_next) {
        kiln_kv_pool_free(p);
        return kiln_fail(err, "out of memory for a KV pool of %d blocks", n_blocks);
    }
    for (int i = 0; i < n_blocks; i++) p->free_stack[i] = n_blocks - 1 - i; /* block 0 comes out first */
    p->n_free = n_blocks;
    for (int i = 0; i < p->n_buckets; i++) p->bucket[i] = -1;
    p->lru_head = p->lru_tail = -1;
    *out = p;
    return 0;
}

void kiln_kv_pool_free(kiln_kv_pool *p) {
    if (!p) return;
    void *bufs[] = {p->refs, p->cached, p->hash, p->parent, p->tokens, p->free_stack, p->bucket, p->bucket_next,
                    p->lru_prev, p->lru_next};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(p);
}

int kiln_kv_pool_blocks(const kiln_kv_pool *p) { return p->n_blocks; }
int kiln_kv_pool_used(const kiln_kv_pool *p) { return p->n_used; }
int kiln_kv_pool_available(const kiln_kv_pool *p) { return p->n_free + p->n_lru; }

/* ---- the LRU list ---- */

static void lru_remove(kiln_kv_pool *p, int32_t b) {
    int32_t prev = p->lru_prev[b], next = p->lru_next[b];
    if (prev >= 0) p->lru_next[prev] = next;
    else p->lru_head = next;
    if (next >= 0) p->lru_prev[next] = prev;
    else p->lru_tail = prev;
    p->n_lru--;
}

static void lru_push(kiln_kv_pool *p, int32_t b) {
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = b;
    else p->lru_head = b;
    p->lru_tail = b;
    p->n_lru++;
}

/* ---- the hash table ---- */

static int32_t *bucket_of(kiln_kv_pool *p, uint64_t hash) { return &p->bucket[hash & (uint64_t)(p->n_buckets - 1)]; }

static void forget(kiln_kv_pool *p, int32_t b) {
    int32_t *link = bucket_of(p, p->hash[b]);
    while (*link != b) link = &p->bucket_next[*link];
    *link = p->bucket_next[b];
    p->cached[b] = false;
}

uint64_t kiln_kv_block_hash(uint64_t parent, const int32_t *tokens, int block_size) {
    uint64_t h = parent ^ 0x9e3779b97f4a7c15ull; /* FNV-1a over the token bytes, seeded by the parent */
    for (int i = 0; i < block_size; i++) {
        uint32_t t = (uint32_t)tokens[i];
        for (int k = 0; k < 4; k++) {
            h ^= (t >> (8 * k)) & 0xff;
            h *= 0x100000001b3ull;
        }
    }
    return h ? h : 1; /* 0 stands for "no parent" */
}

int32_t kiln_kv_pool_lookup(kiln_kv_pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens) {
    size_t bytes = sizeof *tokens * (size_t)p->block_size;
    for (int32_t b = *bucket_of(p, hash); b >= 0; b = p->bucket_next[b]) {
        if (p->hash[b] != hash || p->parent[b] != parent ||
            memcmp(p->tokens + (size_t)b * p->block_size, tokens, bytes))
            continue;
        if (p->refs[b]++ == 0) {
            lru_remove(p, b);
            p->n_used++;
        }
        return b;
    }
    return -1;
}

void kiln_kv_pool_publish(kiln_kv_pool *p, int32_t block, uint64_t hash, uint64_t parent, const int32_t *tokens) {
    if (p->cached[block]) return;
    for (int32_t b = *bucket_of(p, hash); b >= 0; b = p->bucket_next[b])
        if (p->hash[b] == hash && p->parent[b] == parent) return;
    p->cached[block] = true;
    p->hash[block] = hash;
    p->parent[block] = parent;
    memcpy(p->tokens + (size_t)block * p->block_size, tokens, sizeof *tokens * (size_t)p->block_size);
    int32_t *head = bucket_of(p, hash);
    p->bucket_next[block] = *head;
    *head = block;
}

/* ---- holding ---- */

int32_t kiln_kv_pool_alloc(kiln_kv_pool *p) {
    int32_t b;
    if (p->n_free) b = p->free_stack[--p->n_free];
    else if (p->lru_head >= 0) {
        b = p->lru_head;
        lru_remove(p, b);
        forget(p, b);
    } else return -1;
    p->refs[b] = 1;
    p->n_used++;
    return b;
}

void kiln_kv_pool_release(kiln_kv_pool *p, int32_t block) {
    if (--p->refs[block] > 0) return;
    p->n_used--;
    if (p->cached[block]) lru_push(p, block);
    else p->free_stack[p->n_free++] = block;
}

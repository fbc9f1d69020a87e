/* The priority queue both merge loops (SPM by score, BPE by rank) pop candidate pairs from. The order is folded into
 * one 64-bit key, smallest first: the pair's priority in the high half, its left position in the low half, so ties
 * go to the leftmost pair as in llama.cpp. */
#ifndef KILN_TOKENIZER_MERGE_HEAP_H
#define KILN_TOKENIZER_MERGE_HEAP_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct kiln_merge {
    uint64_t key;
    int32_t left, right;
    int32_t a, b, c; /* what the pair was made of, to tell whether it is still current; c: the merged symbol */
} kiln_merge;

typedef struct kiln_merge_heap {
    kiln_merge *v;
    size_t n, cap;
} kiln_merge_heap;

static inline int kiln_heap_push(kiln_merge_heap *h, kiln_merge m) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        kiln_merge *v = realloc(h->v, cap * sizeof *v);
        if (!v) return -1;
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h->v[p].key <= m.key) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = m;
    return 0;
}

static inline kiln_merge kiln_heap_pop(kiln_merge_heap *h) {
    kiln_merge top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && h->v[c + 1].key < h->v[c].key) c++;
        if (last.key <= h->v[c].key) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n) h->v[i] = last;
    return top;
}

/* SPM: higher score first. Maps a float to a key that sorts ascending as the score descends. */
static inline uint32_t kiln_score_key(float score) {
    uint32_t u;
    memcpy(&u, &score, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* now ascending with the float */
    return ~u;
}

#endif

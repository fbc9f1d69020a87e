#include "tokenizer/strmap.h"

#include <stdlib.h>
#include <string.h>

/* Small keys dominate (tokens are a few bytes), so a word-at-a-time multiply-mix is plenty. */
uint32_t kiln_hash_bytes(const char *s, size_t len) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (len * 0xff51afd7ed558ccdull);
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 29;
        s += 8;
        len -= 8;
    }
    uint64_t tail = 0;
    memcpy(&tail, s, len);
    h = (h ^ tail) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 32;
    return (uint32_t)h;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

/* Capacity: a power of two at least twice max_keys, so probes stay short and the table never fills. */
static int capacity_for(size_t max_keys, uint32_t *cap) {
    if (max_keys > (1u << 29)) return -1;
    uint32_t c = 16;
    while (c < 2 * max_keys) c <<= 1;
    *cap = c;
    return 0;
}

int kiln_strmap_init(kiln_strmap *m, size_t max_keys) {
    uint32_t cap;
    memset(m, 0, sizeof *m);
    if (capacity_for(max_keys, &cap)) return -1;
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots) return -1;
    m->mask = cap - 1;
    return 0;
}

void kiln_strmap_free(kiln_strmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

int32_t kiln_strmap_get(const kiln_strmap *m, const char *key, size_t len) {
    uint32_t h = kiln_hash_bytes(key, len);
    for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const kiln_strmap_slot *s = &m->slots[i];
        if (!s->key) return -1;
        if (s->hash == h && s->len == len && !memcmp(s->key, key, len)) return s->val;
    }
}

int32_t kiln_strmap_put(kiln_strmap *m, const char *key, size_t len, int32_t val) {
    if (m->n + 1 > (m->mask + 1) / 2 || len > UINT32_MAX) return -1;
    uint32_t h = kiln_hash_bytes(key, len);
    for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
        kiln_strmap_slot *s = &m->slots[i];
        if (!s->key) {
            *s = (kiln_strmap_slot){key, (uint32_t)len, h, val};
            m->n++;
            return val;
        }
        if (s->hash == h && s->len == len && !memcmp(s->key, key, len)) return s->val;
    }
}

int kiln_pairmap_init(kiln_pairmap *m, size_t max_keys) {
    uint32_t cap;
    memset(m, 0, sizeof *m);
    if (capacity_for(max_keys, &cap)) return -1;
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots) return -1;
    m->mask = cap - 1;
    return 0;
}

void kiln_pairmap_free(kiln_pairmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

const kiln_pairmap_slot *kiln_pairmap_get(const kiln_pairmap *m, uint32_t a, uint32_t b) {
    uint64_t key = ((uint64_t)a << 32 | b) + 1;
    for (uint32_t i = (uint32_t)mix64(key) & m->mask;; i = (i + 1) & m->mask) {
        const kiln_pairmap_slot *s = &m->slots[i];
        if (s->key == key) return s;
        if (!s->key) return NULL;
    }
}

int kiln_pairmap_put(kiln_pairmap *m, uint32_t a, uint32_t b, int32_t v0, int32_t v1) {
    if (m->n + 1 > (m->mask + 1) / 2) return -1;
    uint64_t key = ((uint64_t)a << 32 | b) + 1;
    for (uint32_t i = (uint32_t)mix64(key) & m->mask;; i = (i + 1) & m->mask) {
        kiln_pairmap_slot *s = &m->slots[i];
        if (s->key == key) return 0;
        if (!s->key) {
            *s = (kiln_pairmap_slot){key, v0, v1};
            m->n++;
            return 0;
        }
    }
}

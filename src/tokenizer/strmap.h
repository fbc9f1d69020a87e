/* Hash maps the tokenizer looks strings up in: bytes -> id, and an (id, id) pair -> two ids.
 * Both are sized once when built (open addressing, linear probing) and read-only afterwards. */
#ifndef KILN_TOKENIZER_STRMAP_H
#define KILN_TOKENIZER_STRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct kiln_strmap_slot {
    const char *key; /* NULL = empty slot; points into storage the owner keeps alive */
    uint32_t len;
    uint32_t hash;
    int32_t val;
} kiln_strmap_slot;

typedef struct kiln_strmap {
    kiln_strmap_slot *slots;
    uint32_t mask; /* capacity - 1, capacity a power of two */
    uint32_t n;
} kiln_strmap;

uint32_t kiln_hash_bytes(const char *s, size_t len);

/* Room for up to max_keys keys; returns -1 when out of memory (or max_keys is absurd). */
int kiln_strmap_init(kiln_strmap *m, size_t max_keys);
void kiln_strmap_free(kiln_strmap *m);
/* Value of key, or -1. */
int32_t kiln_strmap_get(const kiln_strmap *m, const char *key, size_t len);
/* Inserts key -> val unless key is present; returns the value now stored for key (val, or the earlier one), or -1
 * when the map is full. */
int32_t kiln_strmap_put(kiln_strmap *m, const char *key, size_t len, int32_t val);

typedef struct kiln_pairmap_slot {
    uint64_t key; /* (a << 32 | b) + 1; 0 = empty */
    int32_t v0, v1;
} kiln_pairmap_slot;

typedef struct kiln_pairmap {
    kiln_pairmap_slot *slots;
    uint32_t mask;
    uint32_t n;
} kiln_pairmap;

int kiln_pairmap_init(kiln_pairmap *m, size_t max_keys);
void kiln_pairmap_free(kiln_pairmap *m);
/* Returns the slot of (a, b) or NULL. */
const kiln_pairmap_slot *kiln_pairmap_get(const kiln_pairmap *m, uint32_t a, uint32_t b);
/* Inserts (a, b) -> (v0, v1) unless present (the first insertion wins); -1 when full. */
int kiln_pairmap_put(kiln_pairmap *m, uint32_t a, uint32_t b, int32_t v0, int32_t v1);

#endif

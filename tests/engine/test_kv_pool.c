/* The KV block pool on its own: reference counts, the free list, prefix lookup by chain hash (with the stored
 * tokens checked), the LRU of cached blocks no one holds, and eviction order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine/kv_pool.h"

#define BS 4

static kiln_kv_pool *pool_new(int n) {
    kiln_kv_pool *p;
    kiln_error err;
    assert_int_equal(kiln_kv_pool_new(n, BS, &p, &err), 0);
    return p;
}

static void test_alloc_release_counts(void **state) {
    (void)state;
    kiln_kv_pool *p = pool_new(3);
    int32_t a = kiln_kv_pool_alloc(p), b = kiln_kv_pool_alloc(p), c = kiln_kv_pool_alloc(p);
    assert_true(a >= 0 && b >= 0 && c >= 0 && a != b && b != c && a != c);
    assert_int_equal(kiln_kv_pool_used(p), 3);
    assert_int_equal(kiln_kv_pool_available(p), 0);
    assert_int_equal(kiln_kv_pool_alloc(p), -1);
    kiln_kv_pool_release(p, b);
    assert_int_equal(kiln_kv_pool_available(p), 1);
    assert_int_equal(kiln_kv_pool_alloc(p), b);
    kiln_kv_pool_release(p, a);
    kiln_kv_pool_release(p, b);
    kiln_kv_pool_release(p, c);
    assert_int_equal(kiln_kv_pool_used(p), 0);
    assert_int_equal(kiln_kv_pool_available(p), 3);
    kiln_kv_pool_free(p);
}

static void test_chain_hash_depends_on_parent_and_tokens(void **state) {
    (void)state;
    int32_t t1[BS] = {1, 2, 3, 4}, t2[BS] = {1, 2, 3, 5};
    uint64_t h = kiln_kv_block_hash(0, t1, BS);
    assert_true(h != 0);
    assert_true(h == kiln_kv_block_hash(0, t1, BS));
    assert_true(h != kiln_kv_block_hash(0, t2, BS));
    assert_true(kiln_kv_block_hash(h, t1, BS) != h);
    assert_true(kiln_kv_block_hash(h, t1, BS) != kiln_kv_block_hash(7, t1, BS));
}

static void test_published_blocks_are_shared_then_cached(void **state) {
    (void)state;
    kiln_kv_pool *p = pool_new(4);
    int32_t t[BS] = {10, 11, 12, 13}, other[BS] = {10, 11, 12, 99};
    uint64_t h = kiln_kv_block_hash(0, t, BS);
    assert_int_equal(kiln_kv_pool_lookup(p, h, 0, t), -1);
    int32_t b = kiln_kv_pool_alloc(p);
    kiln_kv_pool_publish(p, b, h, 0, t);
    assert_int_equal(kiln_kv_pool_lookup(p, h, 0, t), b); /* a second holder */
    assert_int_equal(kiln_kv_pool_lookup(p, h, 0, other), -1); /* same hash, other tokens: no */
    assert_int_equal(kiln_kv_pool_lookup(p, h, 5, t), -1);     /* other parent: no */
    kiln_kv_pool_release(p, b);
    kiln_kv_pool_release(p, b);
    assert_int_equal(kiln_kv_pool_used(p), 0);
    assert_int_equal(kiln_kv_pool_available(p), 4); /* cached, but evictable */
    assert_int_equal(kiln_kv_pool_lookup(p, h, 0, t), b); /* revived from the LRU */
    assert_int_equal(kiln_kv_pool_used(p), 1);
    assert_int_equal(kiln_kv_pool_available(p), 3);
    /* a second block with the same chain is not cached again: it stays private */
    int32_t dup = kiln_kv_pool_alloc(p);
    kiln_kv_pool_publish(p, dup, h, 0, t);
    kiln_kv_pool_release(p, b);
    kiln_kv_pool_release(p, dup);
    assert_int_equal(kiln_kv_pool_lookup(p, h, 0, t), b);
    kiln_kv_pool_release(p, b);
    kiln_kv_pool_free(p);
}

static void test_eviction_takes_free_blocks_first_then_least_recent(void **state) {
    (void)state;
    kiln_kv_pool *p = pool_new(3);
    int32_t ta[BS] = {1, 1, 1, 1}, tb[BS] = {2, 2, 2, 2};
    uint64_t ha = kiln_kv_block_hash(0, ta, BS), hb = kiln_kv_block_hash(0, tb, BS);
    int32_t a = kiln_kv_pool_alloc(p), b = kiln_kv_pool_alloc(p);
    kiln_kv_pool_publish(p, a, ha, 0, ta);
    kiln_kv_pool_publish(p, b, hb, 0, tb);
    kiln_kv_pool_release(p, a); /* a is now the least recently used */
    kiln_kv_pool_release(p, b);
    int32_t c = kiln_kv_pool_alloc(p); /* the never-cached block goes first */
    assert_true(c != a && c != b);
    assert_int_equal(kiln_kv_pool_alloc(p), a); /* then the LRU head, forgotten */
    assert_int_equal(kiln_kv_pool_lookup(p, ha, 0, ta), -1);
    assert_int_equal(kiln_kv_pool_lookup(p, hb, 0, tb), b);
    assert_int_equal(kiln_kv_pool_alloc(p), -1);
    kiln_kv_pool_free(p);
}

static void test_bad_sizes_fail(void **state) {
    (void)state;
    kiln_kv_pool *p;
    kiln_error err;
    assert_int_equal(kiln_kv_pool_new(0, BS, &p, &err), -1);
    assert_int_equal(kiln_kv_pool_new(4, 0, &p, &err), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_release_counts),
        cmocka_unit_test(test_chain_hash_depends_on_parent_and_tokens),
        cmocka_unit_test(test_published_blocks_are_shared_then_cached),
        cmocka_unit_test(test_eviction_takes_free_blocks_first_then_least_recent),
        cmocka_unit_test(test_bad_sizes_fail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

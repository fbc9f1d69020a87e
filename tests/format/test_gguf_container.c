/* A container built in memory (as the safetensors reader builds one): arena, lookups with and without the index,
 * duplicate detection, typed getters' type rules. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "format/gguf.h"

static kiln_gguf *build(int n_kv, int n_tensors, const char *dup_key) {
    kiln_gguf *g = kiln_gguf_new("built");
    assert_non_null(g);
    g->kv = calloc((size_t)n_kv, sizeof *g->kv);
    g->tensors = calloc((size_t)n_tensors, sizeof *g->tensors);
    char name[32];
    for (int i = 0; i < n_kv; i++) {
        snprintf(name, sizeof name, "key.%d", i);
        g->kv[i].key = kiln_gguf_strdup(g, dup_key && i == n_kv - 1 ? dup_key : name,
                                        strlen(dup_key && i == n_kv - 1 ? dup_key : name));
        g->kv[i].value = (kiln_gguf_value){.type = KILN_GGUF_UINT64, .u64 = (uint64_t)i};
    }
    for (int i = 0; i < n_tensors; i++) {
        snprintf(name, sizeof name, "blk.%d.weight", i);
        g->tensors[i].name = kiln_gguf_strdup(g, name, strlen(name));
        g->tensors[i].ne[0] = g->tensors[i].ne[1] = g->tensors[i].ne[2] = g->tensors[i].ne[3] = 1;
    }
    g->n_kv = (uint64_t)n_kv;
    g->n_tensors = (uint64_t)n_tensors;
    return g;
}

static void test_lookups_with_and_without_index(void **state) {
    (void)state;
    kiln_gguf *g = build(300, 500, NULL);
    for (int pass = 0; pass < 2; pass++) {
        int64_t v;
        assert_true(kiln_gguf_get_int(g, "key.0", &v) && v == 0);
        assert_true(kiln_gguf_get_int(g, "key.299", &v) && v == 299);
        assert_false(kiln_gguf_get_int(g, "key.300", &v));
        assert_ptr_equal(kiln_gguf_find_tensor(g, "blk.499.weight"), &g->tensors[499]);
        assert_null(kiln_gguf_find_tensor(g, "blk.500.weight"));
        kiln_error err;
        assert_int_equal(kiln_gguf_build_index(g, NULL, &err), 0);
    }
    kiln_gguf_close(g);
}

static void test_duplicates_reported(void **state) {
    (void)state;
    kiln_gguf *g = build(10, 2, "key.3");
    kiln_gguf_dup dup;
    kiln_error err;
    assert_int_equal(kiln_gguf_build_index(g, &dup, &err), -1);
    assert_false(dup.is_tensor);
    assert_int_equal(dup.first, 3);
    assert_int_equal(dup.second, 9);
    assert_non_null(strstr(err.msg, "duplicate key 'key.3'"));
    kiln_gguf_close(g);

    g = build(2, 3, NULL);
    g->tensors[2].name = g->tensors[0].name;
    assert_int_equal(kiln_gguf_build_index(g, &dup, &err), -1);
    assert_true(dup.is_tensor);
    assert_non_null(strstr(err.msg, "duplicate tensor name 'blk.0.weight'"));
    kiln_gguf_close(g);
}

static void test_typed_getters(void **state) {
    (void)state;
    kiln_gguf *g = build(4, 0, NULL);
    g->kv[0].value = (kiln_gguf_value){.type = KILN_GGUF_UINT64, .u64 = UINT64_MAX};
    g->kv[1].value = (kiln_gguf_value){.type = KILN_GGUF_FLOAT32, .f64 = 0.5};
    g->kv[2].value = (kiln_gguf_value){.type = KILN_GGUF_STRING, .str = kiln_gguf_strdup(g, "x", 1)};
    g->kv[3].value = (kiln_gguf_value){.type = KILN_GGUF_BOOL, .b = true};
    int64_t i;
    double f;
    bool b;
    assert_false(kiln_gguf_get_int(g, "key.0", &i)); /* does not fit in int64 */
    assert_true(kiln_gguf_get_float(g, "key.0", &f) && f == 18446744073709551615.0);
    assert_false(kiln_gguf_get_int(g, "key.1", &i));
    assert_true(kiln_gguf_get_float(g, "key.1", &f) && f == 0.5);
    assert_string_equal(kiln_gguf_get_str(g, "key.2"), "x");
    assert_false(kiln_gguf_get_bool(g, "key.2", &b));
    assert_true(kiln_gguf_get_bool(g, "key.3", &b) && b);
    assert_false(kiln_gguf_get_int(g, "key.3", &i));
    assert_null(kiln_gguf_get_arr(g, "key.2", KILN_GGUF_STRING));
    kiln_gguf_close(g);
}

static void test_arena(void **state) {
    (void)state;
    kiln_gguf *g = kiln_gguf_new(NULL);
    assert_string_equal(g->path, "");
    assert_null(kiln_gguf_alloc(g, SIZE_MAX));
    assert_null(kiln_gguf_alloc(g, SIZE_MAX - 8));
    for (int i = 0; i < 2000; i++) {
        size_t n = (size_t)(i % 7 == 0 ? 40000 : 1 + i % 100);
        unsigned char *p = kiln_gguf_alloc(g, n);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 16, 0);
        for (size_t k = 0; k < n; k++) assert_int_equal(p[k], 0);
        memset(p, 0xab, n);
    }
    kiln_gguf_close(g);
    kiln_gguf_close(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookups_with_and_without_index),
        cmocka_unit_test(test_duplicates_reported),
        cmocka_unit_test(test_typed_getters),
        cmocka_unit_test(test_arena),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

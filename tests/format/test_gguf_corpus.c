/* The broken-file corpus: a small valid GGUF cut at every byte and with each field overwritten by hostile values.
 * Every case must fail with "<file>: <field> at byte <offset>: <problem>" and no sanitizer report.
 * With KILN_GGUF_CORPUS_OUT set, the cases are also written there as files (the CLI test feeds them to
 * `kiln inspect`, and the fuzzer takes valid.gguf as its seed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "format/gguf.h"
#include "format/gguf_sample.h"

static void save_case(const char *name, const uint8_t *bytes, size_t n) {
    const char *dir = getenv("KILN_GGUF_CORPUS_OUT");
    if (!dir) return;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.gguf", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

/* Opens from memory; on success reads every tensor byte so ASan sees any pointer outside the buffer. */
static int open_bytes(const uint8_t *bytes, size_t n, kiln_error *err) {
    kiln_gguf *g = NULL;
    err->msg[0] = '\0';
    uint8_t *copy = malloc(n ? n : 1); /* exact-size heap copy: a read past the end trips ASan */
    assert_non_null(copy);
    memcpy(copy, bytes, n);
    int rc = kiln_gguf_open_memory(copy, n, "sample.gguf", &g, err);
    if (rc == 0) {
        unsigned sum = 0;
        for (uint64_t i = 0; i < g->n_tensors; i++)
            for (uint64_t b = 0; b < g->tensors[i].size; b++) sum += ((const uint8_t *)g->tensors[i].data)[b];
        (void)sum;
        kiln_gguf_close(g);
    } else {
        assert_null(g);
    }
    free(copy);
    return rc;
}

static void expect_error_n(const char *name, const uint8_t *bytes, size_t n, const char *want) {
    kiln_error err;
    save_case(name, bytes, n);
    if (open_bytes(bytes, n, &err) == 0) fail_msg("case %s: opened without error", name);
    if (strncmp(err.msg, "sample.gguf: ", 13) != 0 || !strstr(err.msg, " at byte "))
        fail_msg("case %s: message lacks file/byte: %s", name, err.msg);
    if (!strstr(err.msg, want)) fail_msg("case %s: expected '%s' in: %s", name, want, err.msg);
}

static void expect_error(const char *name, const gguf_sample *s, const char *want) {
    expect_error_n(name, s->bytes, s->size, want);
}

static void test_valid_sample_reads_back(void **state) {
    (void)state;
    gguf_sample s;
    gguf_sample_build(&s, 0);
    save_case("valid", s.bytes, s.size);
    kiln_gguf *g;
    kiln_error err;
    assert_int_equal(kiln_gguf_open_memory(s.bytes, s.size, "sample.gguf", &g, &err), 0);
    assert_int_equal(g->version, 3);
    assert_int_equal(g->n_kv, 17);
    assert_int_equal(g->alignment, 32);
    assert_int_equal(g->data_offset, gguf_sample_at(&s, "data"));
    assert_string_equal(kiln_gguf_get_str(g, "general.architecture"), "llama");
    int64_t i;
    double f;
    bool b;
    assert_true(kiln_gguf_get_int(g, "u8", &i) && i == 200);
    assert_true(kiln_gguf_get_int(g, "i8", &i) && i == -128);
    assert_true(kiln_gguf_get_int(g, "u16", &i) && i == 60000);
    assert_true(kiln_gguf_get_int(g, "i16", &i) && i == -32768);
    assert_true(kiln_gguf_get_int(g, "i32", &i) && i == -2);
    assert_true(kiln_gguf_get_int(g, "u64", &i) && i == 1ll << 40);
    assert_true(kiln_gguf_get_int(g, "i64", &i) && i == -5);
    assert_true(kiln_gguf_get_float(g, "f32", &f) && f == 1.5);
    assert_true(kiln_gguf_get_float(g, "f64", &f) && f == 2.5);
    assert_true(kiln_gguf_get_float(g, "i64", &f) && f == -5.0);
    assert_true(kiln_gguf_get_bool(g, "bool", &b) && b);
    assert_false(kiln_gguf_get_int(g, "f32", &i));
    assert_false(kiln_gguf_get_int(g, "missing", &i));
    assert_null(kiln_gguf_get_str(g, "u8"));

    const kiln_gguf_value *tok = kiln_gguf_get_arr(g, "tokenizer.ggml.tokens", KILN_GGUF_STRING);
    assert_non_null(tok);
    assert_int_equal(tok->arr.n, 3);
    const kiln_str *strs = tok->arr.data;
    assert_string_equal(strs[0].ptr, "<s>");
    assert_int_equal(strs[1].len, 0);
    assert_string_equal(strs[2].ptr, "he\xe2\x96\x81llo");
    assert_null(kiln_gguf_get_arr(g, "tokenizer.ggml.tokens", KILN_GGUF_INT32));
    const kiln_gguf_value *tt = kiln_gguf_get_arr(g, "tokenizer.ggml.token_type", KILN_GGUF_INT32);
    assert_non_null(tt);
    assert_int_equal(((const int32_t *)tt->arr.data)[2], 3);
    const kiln_gguf_value *nest = kiln_gguf_get_arr(g, "nested", KILN_GGUF_ARRAY);
    assert_non_null(nest);
    const kiln_gguf_value *inner = nest->arr.data;
    assert_int_equal(inner[0].arr.elem_type, KILN_GGUF_INT32);
    assert_int_equal(inner[0].arr.n, 2);
    assert_int_equal(((const int32_t *)inner[0].arr.data)[1], 2);
    assert_int_equal(inner[1].arr.n, 0);
    const kiln_gguf_value *flags = kiln_gguf_get_arr(g, "flags", KILN_GGUF_BOOL);
    assert_true(((const bool *)flags->arr.data)[0]);
    assert_false(((const bool *)flags->arr.data)[1]);

    assert_int_equal(g->n_tensors, 3);
    const kiln_gguf_tensor *tb = kiln_gguf_find_tensor(g, "b");
    assert_non_null(tb);
    assert_int_equal(tb->type, KILN_TYPE_Q8_0);
    assert_int_equal(tb->ne[0], 32);
    assert_int_equal(tb->ne[1], 2);
    assert_int_equal(tb->ne[2], 1);
    assert_int_equal(tb->size, 68);
    assert_int_equal(kiln_tensor_nelements(tb), 64);
    assert_ptr_equal(tb->data, s.bytes + g->data_offset + 64);
    assert_null(kiln_gguf_find_tensor(g, "d"));
    kiln_gguf_close(g);
}

static void test_version_2_reads(void **state) {
    (void)state;
    gguf_sample s;
    gguf_sample_build(&s, 0);
    gguf_sample_put_u32(&s, "version", 2);
    kiln_gguf *g;
    kiln_error err;
    assert_int_equal(kiln_gguf_open_memory(s.bytes, s.size, "sample.gguf", &g, &err), 0);
    assert_int_equal(g->version, 2);
    assert_int_equal(g->n_tensors, 3);
    kiln_gguf_close(g);
}

static void test_truncated_everywhere(void **state) {
    (void)state;
    gguf_sample s;
    gguf_sample_build(&s, 0);
    for (size_t n = 0; n < s.size; n++) {
        char name[64];
        snprintf(name, sizeof name, "truncated_%zu", n);
        kiln_error err;
        if (open_bytes(s.bytes, n, &err) == 0) fail_msg("truncated at %zu bytes: opened", n);
        if (strncmp(err.msg, "sample.gguf: ", 13) != 0 || !strstr(err.msg, " at byte "))
            fail_msg("truncated at %zu: %s", n, err.msg);
    }
    /* the section boundaries go to the saved corpus */
    for (int m = 0; m < s.n_marks; m++) {
        if (s.marks[m].at >= s.size) continue;
        char name[80];
        snprintf(name, sizeof name, "truncated_at_%s", s.marks[m].name);
        expect_error_n(name, s.bytes, s.marks[m].at, "");
    }
}

typedef struct field_case {
    const char *name;  /* the corpus file name */
    const char *field; /* a sample mark */
    int bits;          /* 32 or 64 */
    uint64_t value;
    const char *want;  /* a part of the message */
} field_case;

static const field_case FIELD_CASES[] = {
    {"bad_magic", "magic", 32, 0x46554748, "not a GGUF file"},
    {"version_1", "version", 32, 1, "v1 is not supported"},
    {"version_4", "version", 32, 4, "unsupported version"},
    {"version_big_endian", "version", 32, 0x03000000, "big-endian"},
    {"n_tensors_huge", "n_tensors", 64, UINT64_MAX, "cannot fit"},
    {"n_tensors_plus_one", "n_tensors", 64, 4, ""},
    {"n_kv_huge", "n_kv", 64, UINT64_MAX, "cannot fit"},
    {"n_kv_plus_one", "n_kv", 64, 18, ""},
    {"n_kv_minus_one", "n_kv", 64, 16, ""},
    {"key_len_huge", "kv0", 64, UINT64_MAX, "exceeds the limit"},
    {"key_len_over_limit", "kv0", 64, 65536, "exceeds the limit"},
    {"key_len_past_end", "kv3", 64, 60000, "runs past the end"},
    {"key_empty", "kv0", 64, 0, "empty key"},
    {"string_len_huge", "kv0.value", 64, UINT64_MAX, "exceeds the limit"},
    {"string_len_past_end", "kv0.value", 64, 1u << 29, "runs past the end"},
    {"value_type_13", "kv3.type", 32, 13, "unknown value type"},
    {"value_type_max", "kv3.type", 32, UINT32_MAX, "unknown value type"},
    {"str_array_count_huge", "kv13.count", 64, UINT64_MAX, "do not fit"},
    {"str_array_count_large", "kv13.count", 64, 1ull << 40, "do not fit"},
    {"str_array_count_plus_one", "kv13.count", 64, 4, ""},
    {"array_elem_type_bad", "kv13.elem_type", 32, 13, "unknown value type"},
    {"array_string_len_huge", "kv13.str1", 64, UINT64_MAX, "exceeds the limit"},
    {"array_string_len_past_end", "kv13.str0", 64, 100000, "runs past the end"},
    {"i32_array_count_huge", "kv14.count", 64, UINT64_MAX, "do not fit"},
    {"i32_array_count_overflow", "kv14.count", 64, 1ull << 62, "do not fit"},
    {"nested_count_huge", "kv15.count", 64, UINT64_MAX, "do not fit"},
    {"inner_count_huge", "kv15.inner0.count", 64, UINT64_MAX, "do not fit"},
    {"inner_type_bad", "kv15.inner0", 32, 99, "unknown value type"},
    {"alignment_zero", "kv1.value", 32, 0, "power of two"},
    {"alignment_48", "kv1.value", 32, 48, "power of two"},
    {"alignment_2g", "kv1.value", 32, 1u << 31, "power of two"},
    {"alignment_signed", "kv1.type", 32, 5, "unsigned integer"},
    {"alignment_64_misaligns_data", "kv1.value", 32, 64, "not a multiple of the alignment"},
    {"tensor_name_huge", "tensor0", 64, UINT64_MAX, "exceeds the limit"},
    {"tensor_name_long", "tensor0", 64, 5000, "exceeds the limit"},
    {"tensor_name_empty", "tensor0", 64, 0, "empty"},
    {"n_dims_0", "tensor0.n_dims", 32, 0, "dimensions"},
    {"n_dims_5", "tensor0.n_dims", 32, 5, "dimensions"},
    {"n_dims_huge", "tensor0.n_dims", 32, UINT32_MAX, "dimensions"},
    {"dim_zero", "tensor0.ne0", 64, 0, "must be positive"},
    {"dim_negative", "tensor0.ne1", 64, UINT64_MAX, "must be positive"},
    {"dims_overflow", "tensor0.ne0", 64, 1ull << 62, "overflows"},
    {"dims_past_end", "tensor0.ne1", 64, 1ull << 40, "run past the end"},
    {"row_not_block_multiple", "tensor1.ne0", 64, 16, "block size"},
    {"type_unknown", "tensor0.type", 32, 99, "not supported"},
    {"type_iq", "tensor0.type", 32, 16, "not supported"},
    {"type_i8", "tensor0.type", 32, 24, "not supported"},
    {"type_max", "tensor0.type", 32, UINT32_MAX, "not supported"},
    {"offset_misaligned", "tensor0.offset", 64, 1, "not a multiple of the alignment"},
    {"offset_at_end", "tensor2.offset", 64, 192, "run past the end"},
    {"offset_huge", "tensor2.offset", 64, UINT64_MAX - 31, "run past the end"},
    {"offset_far", "tensor0.offset", 64, 1ull << 40, "run past the end"},
};

static void test_hostile_fields(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof FIELD_CASES / sizeof FIELD_CASES[0]; i++) {
        const field_case *fc = &FIELD_CASES[i];
        gguf_sample s;
        gguf_sample_build(&s, 0);
        if (fc->bits == 32) gguf_sample_put_u32(&s, fc->field, (uint32_t)fc->value);
        else gguf_sample_put_u64(&s, fc->field, fc->value);
        expect_error(fc->name, &s, fc->want);
    }
}

static void test_duplicates(void **state) {
    (void)state;
    gguf_sample s;
    gguf_sample_build(&s, 0);
    s.bytes[gguf_sample_at(&s, "kv4") + 8] = 'u'; /* "i8" -> "u8" */
    expect_error("duplicate_key", &s, "duplicate key 'u8'");
    gguf_sample_build(&s, 0);
    s.bytes[gguf_sample_at(&s, "tensor2") + 8] = 'a'; /* "c" -> "a" */
    expect_error("duplicate_tensor", &s, "duplicate tensor name 'a'");
}

/* Names are looked up as C strings, so a NUL inside one would make its entry unreachable. */
static void test_nul_in_names(void **state) {
    (void)state;
    gguf_sample s;
    gguf_sample_build(&s, 0);
    s.bytes[gguf_sample_at(&s, "kv3") + 9] = '\0'; /* "u8" -> "u\0" */
    expect_error("key_with_nul", &s, "NUL byte");
    gguf_sample_build(&s, 0);
    s.bytes[gguf_sample_at(&s, "tensor0") + 8] = '\0';
    expect_error("tensor_name_with_nul", &s, "NUL byte");
}

static void test_array_nesting_limit(void **state) {
    (void)state;
    gguf_sample s;
    kiln_error err;
    gguf_sample_build(&s, KILN_GGUF_MAX_ARRAY_DEPTH);
    assert_int_equal(open_bytes(s.bytes, s.size, &err), 0);
    gguf_sample_build(&s, KILN_GGUF_MAX_ARRAY_DEPTH + 1);
    expect_error("arrays_too_deep", &s, "nested too deeply");
}

/* Seeded random byte damage: any outcome is fine except a crash, a sanitizer report or a malformed message. */
static void test_random_damage(void **state) {
    (void)state;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int iter = 0; iter < 4000; iter++) {
        gguf_sample s;
        gguf_sample_build(&s, iter % 7 == 0 ? 3 : 0);
        int flips = 1 + iter % 4;
        for (int k = 0; k < flips; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)(rng >> 33) % s.size;
            s.bytes[at] = (uint8_t)(rng >> 17);
        }
        size_t n = iter % 5 == 0 ? (size_t)(rng >> 40) % s.size : s.size;
        kiln_error err;
        if (open_bytes(s.bytes, n, &err) != 0 && strncmp(err.msg, "sample.gguf: ", 13) != 0)
            fail_msg("random case %d: %s", iter, err.msg);
    }
}

static char *write_temp(const uint8_t *bytes, size_t n) {
    char *path = strdup("/tmp/kiln_gguf_corpus_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, bytes, n), (ssize_t)n);
    close(fd);
    return path;
}

/* The file path (mmap) goes through the same checks; messages name the file. */
static void test_files_on_disk(void **state) {
    (void)state;
    gguf_sample s;
    gguf_sample_build(&s, 0);
    kiln_gguf *g;
    kiln_error err;
    size_t cuts[] = {0, 3, 24, gguf_sample_at(&s, "kv13.count"), gguf_sample_at(&s, "data") + 100, s.size};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char *path = write_temp(s.bytes, cuts[i]);
        int rc = kiln_gguf_open(path, &g, &err);
        if (cuts[i] == s.size) {
            assert_int_equal(rc, 0);
            assert_int_equal(((const uint8_t *)g->tensors[2].data)[31], s.bytes[s.size - 1]);
            kiln_gguf_close(g);
        } else {
            assert_int_equal(rc, -1);
            assert_non_null(strstr(err.msg, path));
        }
        unlink(path);
        free(path);
    }
    assert_int_equal(kiln_gguf_open("/nonexistent/model.gguf", &g, &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent/model.gguf: cannot open"));
    assert_int_equal(kiln_gguf_open("/tmp", &g, &err), -1);
    assert_non_null(strstr(err.msg, "not a regular file"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_sample_reads_back),
        cmocka_unit_test(test_version_2_reads),
        cmocka_unit_test(test_truncated_everywhere),
        cmocka_unit_test(test_hostile_fields),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_nul_in_names),
        cmocka_unit_test(test_array_nesting_limit),
        cmocka_unit_test(test_random_damage),
        cmocka_unit_test(test_files_on_disk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

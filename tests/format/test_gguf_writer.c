/* The GGUF writer: every value type and several tensor types written, read back by kiln's reader, compared; the
 * default model rewritten through reader + writer comes out byte for byte the same; misuse is refused.
 * With KILN_GGUF_WRITE_OUT set, the all-types file is left at that path (the Python test reads it with gguf). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "format/gguf.h"
#include "format/gguf_writer.h"

static char *temp_path(void) {
    char *path = strdup("/tmp/kiln_gguf_writer_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    return path;
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Deterministic bytes for tensor i. */
static void fill(uint8_t *p, uint64_t n, unsigned seed) {
    for (uint64_t i = 0; i < n; i++) p[i] = (uint8_t)((i * 131u + seed * 17u) >> 1);
}

typedef struct tensor_spec {
    const char *name;
    kiln_type type;
    uint32_t n_dims;
    int64_t ne[4];
} tensor_spec;

static const tensor_spec TENSORS[] = {
    {"token_embd.weight", KILN_TYPE_Q8_0, 2, {64, 10}},
    {"blk.0.attn_norm.weight", KILN_TYPE_F32, 1, {64}},
    {"blk.0.ffn_up.weight", KILN_TYPE_Q4_K, 2, {256, 3}},
    {"blk.0.ffn_down.weight", KILN_TYPE_F16, 3, {5, 3, 2}},
    {"blk.0.attn_q.weight", KILN_TYPE_Q6_K, 4, {256, 1, 2, 1}},
    {"output.weight", KILN_TYPE_BF16, 2, {7, 3}},
};
#define N_TENSORS (sizeof TENSORS / sizeof TENSORS[0])

static void add_all_types(kiln_gguf_writer *w) {
    assert_int_equal(kiln_gguf_writer_add_str(w, "general.architecture", "llama"), 0);
    assert_int_equal(kiln_gguf_writer_add_u32(w, "general.alignment", 64), 0);
    assert_int_equal(kiln_gguf_writer_add_u32(w, "llama.block_count", 1), 0);
    assert_int_equal(kiln_gguf_writer_add_i32(w, "test.i32", -7), 0);
    assert_int_equal(kiln_gguf_writer_add_u64(w, "test.u64", 1ull << 50), 0);
    assert_int_equal(kiln_gguf_writer_add_f32(w, "test.f32", 0.1f), 0);
    assert_int_equal(kiln_gguf_writer_add_bool(w, "test.bool", true), 0);
    kiln_gguf_value v = {.type = KILN_GGUF_UINT8, .u64 = 255};
    assert_int_equal(kiln_gguf_writer_add_value(w, "test.u8", &v), 0);
    v = (kiln_gguf_value){.type = KILN_GGUF_INT8, .i64 = -128};
    assert_int_equal(kiln_gguf_writer_add_value(w, "test.i8", &v), 0);
    v = (kiln_gguf_value){.type = KILN_GGUF_UINT16, .u64 = 65535};
    assert_int_equal(kiln_gguf_writer_add_value(w, "test.u16", &v), 0);
    v = (kiln_gguf_value){.type = KILN_GGUF_INT16, .i64 = -300};
    assert_int_equal(kiln_gguf_writer_add_value(w, "test.i16", &v), 0);
    v = (kiln_gguf_value){.type = KILN_GGUF_INT64, .i64 = -(1ll << 60)};
    assert_int_equal(kiln_gguf_writer_add_value(w, "test.i64", &v), 0);
    v = (kiln_gguf_value){.type = KILN_GGUF_FLOAT64, .f64 = 3.141592653589793};
    assert_int_equal(kiln_gguf_writer_add_value(w, "test.f64", &v), 0);
    const char *toks[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81hello", ""};
    assert_int_equal(kiln_gguf_writer_add_str_arr(w, "tokenizer.ggml.tokens", toks, 5), 0);
    const float scores[] = {0.0f, -1.5f, 2.25f, -1000.0f, 7.0f};
    assert_int_equal(kiln_gguf_writer_add_arr(w, "tokenizer.ggml.scores", KILN_GGUF_FLOAT32, scores, 5), 0);
    const int32_t types[] = {2, 3, 3, 1, 1};
    assert_int_equal(kiln_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", KILN_GGUF_INT32, types, 5), 0);
    const bool flags[] = {true, false, true};
    assert_int_equal(kiln_gguf_writer_add_arr(w, "test.bools", KILN_GGUF_BOOL, flags, 3), 0);
    const uint64_t big[] = {1, UINT64_MAX};
    assert_int_equal(kiln_gguf_writer_add_arr(w, "test.u64s", KILN_GGUF_UINT64, big, 2), 0);
    assert_int_equal(kiln_gguf_writer_add_arr(w, "test.empty", KILN_GGUF_INT32, NULL, 0), 0);
    /* [[1, 2, 3], ["x"]]: nested arrays with different element types */
    const int16_t inner0[] = {1, 2, 3};
    const kiln_str inner1[] = {{"x", 1}};
    kiln_gguf_value inner[2] = {{.type = KILN_GGUF_ARRAY}, {.type = KILN_GGUF_ARRAY}};
    inner[0].arr.elem_type = KILN_GGUF_INT16;
    inner[0].arr.n = 3;
    inner[0].arr.data = inner0;
    inner[1].arr.elem_type = KILN_GGUF_STRING;
    inner[1].arr.n = 1;
    inner[1].arr.data = inner1;
    v = (kiln_gguf_value){.type = KILN_GGUF_ARRAY};
    v.arr.elem_type = KILN_GGUF_ARRAY;
    v.arr.n = 2;
    v.arr.data = inner;
    assert_int_equal(kiln_gguf_writer_add_value(w, "test.nested", &v), 0);
    for (size_t i = 0; i < N_TENSORS; i++)
        assert_int_equal(kiln_gguf_writer_add_tensor(w, TENSORS[i].name, TENSORS[i].type, TENSORS[i].n_dims,
                                                     TENSORS[i].ne), (int64_t)i);
}

/* Writes the all-types file; tensor 2 goes in uneven chunks, the rest whole. */
static void write_all_types(const char *path) {
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    kiln_error err;
    add_all_types(w);
    assert_int_equal(kiln_gguf_writer_open(w, path, &err), 0);
    for (size_t i = 0; i < N_TENSORS; i++) {
        uint64_t size = kiln_gguf_writer_tensor_size(w, i);
        uint8_t *data = malloc(size);
        fill(data, size, (unsigned)i);
        if (i == 2) {
            for (uint64_t at = 0; at < size;) {
                size_t n = size - at < 100 ? (size_t)(size - at) : 100;
                assert_int_equal(kiln_gguf_writer_write(w, data + at, n, &err), 0);
                at += n;
            }
        } else {
            assert_int_equal(kiln_gguf_writer_write_tensor(w, i, data, &err), 0);
        }
        free(data);
    }
    if (kiln_gguf_writer_close(w, &err)) fail_msg("%s", err.msg);
    kiln_gguf_writer_free(w);
}

static void test_all_types_round_trip(void **state) {
    (void)state;
    const char *keep = getenv("KILN_GGUF_WRITE_OUT");
    char *path = keep ? strdup(keep) : temp_path();
    write_all_types(path);
    kiln_gguf *g;
    kiln_error err;
    if (kiln_gguf_open(path, &g, &err)) fail_msg("%s", err.msg);
    assert_int_equal(g->version, 3);
    assert_int_equal(g->alignment, 64);
    assert_int_equal(g->data_offset % 64, 0);
    assert_int_equal(g->n_kv, 20);
    int64_t i;
    double f;
    bool b;
    assert_string_equal(kiln_gguf_get_str(g, "general.architecture"), "llama");
    assert_true(kiln_gguf_get_int(g, "test.i32", &i) && i == -7);
    assert_true(kiln_gguf_get_int(g, "test.u64", &i) && i == 1ll << 50);
    assert_true(kiln_gguf_get_float(g, "test.f32", &f) && f == (double)0.1f);
    assert_true(kiln_gguf_get_bool(g, "test.bool", &b) && b);
    assert_true(kiln_gguf_get_int(g, "test.u8", &i) && i == 255);
    assert_true(kiln_gguf_get_int(g, "test.i8", &i) && i == -128);
    assert_true(kiln_gguf_get_int(g, "test.u16", &i) && i == 65535);
    assert_true(kiln_gguf_get_int(g, "test.i16", &i) && i == -300);
    assert_true(kiln_gguf_get_int(g, "test.i64", &i) && i == -(1ll << 60));
    assert_true(kiln_gguf_get_float(g, "test.f64", &f) && f == 3.141592653589793);
    const kiln_gguf_value *tok = kiln_gguf_get_arr(g, "tokenizer.ggml.tokens", KILN_GGUF_STRING);
    assert_int_equal(tok->arr.n, 5);
    assert_string_equal(((const kiln_str *)tok->arr.data)[3].ptr, "\xe2\x96\x81hello");
    assert_int_equal(((const kiln_str *)tok->arr.data)[4].len, 0);
    const kiln_gguf_value *sc = kiln_gguf_get_arr(g, "tokenizer.ggml.scores", KILN_GGUF_FLOAT32);
    assert_true(((const float *)sc->arr.data)[3] == -1000.0f);
    const kiln_gguf_value *bools = kiln_gguf_get_arr(g, "test.bools", KILN_GGUF_BOOL);
    assert_true(((const bool *)bools->arr.data)[2]);
    assert_false(((const bool *)bools->arr.data)[1]);
    assert_true(((const uint64_t *)kiln_gguf_get_arr(g, "test.u64s", KILN_GGUF_UINT64)->arr.data)[1] == UINT64_MAX);
    assert_int_equal(kiln_gguf_get_arr(g, "test.empty", KILN_GGUF_INT32)->arr.n, 0);
    const kiln_gguf_value *nest = kiln_gguf_get_arr(g, "test.nested", KILN_GGUF_ARRAY);
    const kiln_gguf_value *inner = nest->arr.data;
    assert_int_equal(((const int16_t *)inner[0].arr.data)[2], 3);
    assert_string_equal(((const kiln_str *)inner[1].arr.data)[0].ptr, "x");

    assert_int_equal(g->n_tensors, N_TENSORS);
    for (size_t t = 0; t < N_TENSORS; t++) {
        const kiln_gguf_tensor *gt = kiln_gguf_find_tensor(g, TENSORS[t].name);
        assert_non_null(gt);
        assert_int_equal(gt->type, TENSORS[t].type);
        assert_int_equal(gt->n_dims, TENSORS[t].n_dims);
        for (uint32_t d = 0; d < TENSORS[t].n_dims; d++) assert_int_equal(gt->ne[d], TENSORS[t].ne[d]);
        assert_int_equal(gt->offset % 64, 0);
        assert_int_equal((uintptr_t)gt->data % 64, 0);
        uint8_t *want = malloc(gt->size);
        fill(want, gt->size, (unsigned)t);
        assert_memory_equal(gt->data, want, gt->size);
        free(want);
    }
    kiln_gguf_close(g);
    if (!keep) unlink(path);
    free(path);
}

static char *default_model(void) {
    const char *src = getenv("KILN_SOURCE_DIR");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/scripts/fetch-model.sh", src ? src : ".");
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    char line[1024] = "";
    char *got = fgets(line, sizeof line, p);
    pclose(p);
    if (!got) return NULL;
    line[strcspn(line, "\n")] = '\0';
    return line[0] ? strdup(line) : NULL;
}

static bool files_equal(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    static uint8_t ba[1 << 16], bb[1 << 16];
    while (same) {
        size_t na = fread(ba, 1, sizeof ba, fa), nb = fread(bb, 1, sizeof bb, fb);
        same = na == nb && memcmp(ba, bb, na) == 0;
        if (na == 0) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* Reader and writer agree with the converter that made the default model, to the byte. */
static void test_default_model_rewrites_identically(void **state) {
    (void)state;
    char *model = default_model();
    if (!model) skip();
    kiln_gguf *g;
    kiln_error err;
    if (kiln_gguf_open(model, &g, &err)) fail_msg("%s", err.msg);
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    assert_int_equal(kiln_gguf_writer_add_kvs(w, g), 0);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const kiln_gguf_tensor *t = &g->tensors[i];
        assert_int_equal(kiln_gguf_writer_add_tensor(w, t->name.ptr, t->type, t->n_dims, t->ne), (int64_t)i);
    }
    char *out = temp_path();
    assert_int_equal(kiln_gguf_writer_open(w, out, &err), 0);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        assert_int_equal(kiln_gguf_writer_write_tensor(w, i, g->tensors[i].data, &err), 0);
    assert_int_equal(kiln_gguf_writer_close(w, &err), 0);
    kiln_gguf_writer_free(w);
    kiln_gguf_close(g);
    assert_true(files_equal(model, out));
    unlink(out);
    free(out);
    free(model);
}

static void test_misuse_is_refused(void **state) {
    (void)state;
    kiln_error err;
    char *path = temp_path();
    unlink(path);

    kiln_gguf_writer *w = kiln_gguf_writer_new();
    assert_int_equal(kiln_gguf_writer_add_u32(w, "a", 1), 0);
    assert_int_equal(kiln_gguf_writer_add_u32(w, "a", 2), -1);
    assert_int_equal(kiln_gguf_writer_add_u32(w, "b", 2), 0); /* later additions still work... */
    assert_int_equal(kiln_gguf_writer_open(w, path, &err), -1); /* ...but the first failure is reported */
    assert_non_null(strstr(err.msg, "duplicate key 'a'"));
    assert_false(exists(path));
    kiln_gguf_writer_free(w);

    const int64_t ne_bad[] = {33, 2};
    const int64_t ne_zero[] = {0};
    const int64_t ne[] = {32, 2};
    w = kiln_gguf_writer_new();
    assert_int_equal(kiln_gguf_writer_add_tensor(w, "q", KILN_TYPE_Q8_0, 2, ne_bad), -1);
    kiln_gguf_writer_free(w);
    w = kiln_gguf_writer_new();
    assert_int_equal(kiln_gguf_writer_add_tensor(w, "z", KILN_TYPE_F32, 1, ne_zero), -1);
    assert_int_equal(kiln_gguf_writer_add_tensor(w, "x", KILN_TYPE_F32, 5, ne), -1);
    kiln_gguf_writer_free(w);
    w = kiln_gguf_writer_new();
    assert_int_equal(kiln_gguf_writer_add_tensor(w, "t", KILN_TYPE_F32, 2, ne), 0);
    assert_int_equal(kiln_gguf_writer_add_tensor(w, "t", KILN_TYPE_F32, 2, ne), -1);
    assert_int_equal(kiln_gguf_writer_add_u32(w, "general.alignment", 64), -1); /* after a tensor */
    kiln_gguf_writer_free(w);
    w = kiln_gguf_writer_new();
    assert_int_equal(kiln_gguf_writer_add_u32(w, "general.alignment", 24), -1);
    kiln_gguf_writer_free(w);

    /* data: too much, out of order, incomplete at close (which leaves no file behind) */
    w = kiln_gguf_writer_new();
    assert_int_equal(kiln_gguf_writer_add_tensor(w, "t0", KILN_TYPE_F32, 2, ne), 0);
    assert_int_equal(kiln_gguf_writer_add_tensor(w, "t1", KILN_TYPE_F32, 2, ne), 1);
    assert_int_equal(kiln_gguf_writer_open(w, path, &err), 0);
    float data[65] = {0};
    assert_int_equal(kiln_gguf_writer_write(w, data, sizeof data, &err), -1);
    assert_int_equal(kiln_gguf_writer_write_tensor(w, 1, data, &err), -1);
    assert_int_equal(kiln_gguf_writer_write_tensor(w, 0, data, &err), 0);
    assert_int_equal(kiln_gguf_writer_add_tensor(w, "late", KILN_TYPE_F32, 2, ne), -1);
    assert_int_equal(kiln_gguf_writer_close(w, &err), -1);
    assert_non_null(strstr(err.msg, "'t1' incomplete"));
    kiln_gguf_writer_free(w);
    assert_false(exists(path));
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_false(exists(tmp));

    /* freed while open: the partial file is removed */
    w = kiln_gguf_writer_new();
    assert_int_equal(kiln_gguf_writer_add_tensor(w, "t0", KILN_TYPE_F32, 2, ne), 0);
    assert_int_equal(kiln_gguf_writer_open(w, path, &err), 0);
    kiln_gguf_writer_free(w);
    assert_false(exists(tmp));
    assert_false(exists(path));
    free(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_types_round_trip),
        cmocka_unit_test(test_default_model_rewrites_identically),
        cmocka_unit_test(test_misuse_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* The generation loop through the public API on the default model: stop strings split over tokens, max tokens,
 * seeded sampling, KV prefix reuse, context errors; and the stop-string scanner on its own. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/model_path.h"
#include "engine/engine.h"

static void test_stop_scan_holds_back_possible_starts(void **state) {
    (void)state;
    const char *stop[] = {"END", "\n\n"};
    kiln_stop_scan s;
    kiln_error err;
    size_t release;
    bool hit;
    assert_int_equal(kiln_stop_scan_init(&s, stop, 2, &err), 0);
    assert_int_equal(kiln_stop_scan_push(&s, "abc E", 5, &release, &hit, &err), 0);
    assert_false(hit);
    assert_int_equal(release, 4); /* "E" may start "END" */
    kiln_stop_scan_consume(&s, release);
    assert_int_equal(kiln_stop_scan_push(&s, "Nx", 2, &release, &hit, &err), 0);
    assert_false(hit);
    assert_int_equal(release, 3); /* "ENx" is not a stop string after all */
    kiln_stop_scan_consume(&s, release);
    assert_int_equal(kiln_stop_scan_push(&s, "yy\n", 3, &release, &hit, &err), 0);
    assert_int_equal(release, 2);
    kiln_stop_scan_consume(&s, release);
    assert_int_equal(kiln_stop_scan_push(&s, "\nzz", 3, &release, &hit, &err), 0);
    assert_true(hit);
    assert_int_equal(release, 0); /* the text before "\n\n" was already out */
    kiln_stop_scan_free(&s);
    const char *empty[] = {""};
    assert_int_equal(kiln_stop_scan_init(&s, empty, 1, &err), -1);
}

typedef struct fixture {
    kiln_model *m;
    kiln_context *c;
} fixture;

static int setup(void **state) {
    char path[1024], err[512];
    fixture *f = calloc(1, sizeof *f);
    if (kiln_test_model_path(path, sizeof path) || !(f->m = kiln_model_open(path, err, sizeof err))) return -1;
    kiln_context_params p = kiln_context_default_params();
    p.n_ctx = 128;
    p.n_threads = 1;
    if (!(f->c = kiln_context_new(f->m, &p, err, sizeof err))) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    kiln_context_free(f->c);
    kiln_model_close(f->m);
    free(f);
    return 0;
}

typedef struct collected {
    char text[4096];
    size_t len;
    int n_events;
    int32_t tokens[256];
    int n_tokens;
} collected;

static int collect(const kiln_token_event *ev, void *user) {
    collected *c = user;
    assert_true(c->len + ev->len < sizeof c->text);
    memcpy(c->text + c->len, ev->text, ev->len);
    c->len += ev->len;
    c->text[c->len] = 0;
    if (ev->token >= 0 && c->n_tokens < 256) c->tokens[c->n_tokens++] = ev->token;
    c->n_events++;
    return 0;
}

static int tokenize(const kiln_model *m, const char *text, int32_t *ids, int max) {
    char err[512];
    int n = kiln_tokenize_text(m, text, true, false, ids, max, err, sizeof err);
    assert_true(n > 0 && n <= max);
    return n;
}

static void generate(fixture *f, const int32_t *ids, int n, kiln_generate_params *gp, collected *out,
                     kiln_generate_result *res) {
    char err[512];
    memset(out, 0, sizeof *out);
    int rc = kiln_generate(f->c, ids, n, gp, collect, out, res, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
}

static void test_greedy_max_tokens_and_prefix_reuse(void **state) {
    fixture *f = *state;
    int32_t ids[64];
    int n = tokenize(f->m, "def fibonacci(n):", ids, 64);
    kiln_generate_params gp = kiln_generate_default_params();
    gp.sampling.temperature = 0;
    gp.max_tokens = 8;
    collected a, b;
    kiln_generate_result res;
    generate(f, ids, n, &gp, &a, &res);
    assert_int_equal(res.finish, KILN_FINISH_LENGTH);
    assert_int_equal(res.n_generated, 8);
    /* from numpy_llama.py: 472 585 304 1758 216 32 42 448 */
    int32_t want[8] = {472, 585, 304, 1758, 216, 32, 42, 448};
    assert_memory_equal(a.tokens, want, sizeof want);
    /* the same prompt again reuses all but its last token from the cache, with the same result */
    generate(f, ids, n, &gp, &b, &res);
    assert_int_equal(res.n_cached, n - 1);
    assert_string_equal(a.text, b.text);
}

/* A context keeps its model: closed first, the model stays until the context goes (run under ASan in CI). */
static void test_model_closed_before_its_context(void **state) {
    char path[1024], err[512];
    assert_int_equal(kiln_test_model_path(path, sizeof path), 0);
    kiln_model *m = kiln_model_open(path, err, sizeof err);
    assert_non_null(m);
    kiln_context_params p = kiln_context_default_params();
    p.n_ctx = 64;
    p.n_threads = 1;
    fixture f = {m, kiln_context_new(m, &p, err, sizeof err)};
    assert_non_null(f.c);
    int32_t ids[64];
    int n = tokenize(m, "def fibonacci(n):", ids, 64);
    kiln_model_close(m);
    kiln_generate_params gp = kiln_generate_default_params();
    gp.sampling.temperature = 0;
    gp.max_tokens = 4;
    collected out;
    kiln_generate_result res;
    generate(&f, ids, n, &gp, &out, &res);
    int32_t want[4] = {472, 585, 304, 1758}; /* test_greedy_max_tokens_and_prefix_reuse's first four */
    assert_memory_equal(out.tokens, want, sizeof want);
    kiln_context_free(f.c);
}

static void test_stop_string_ends_the_text_before_it(void **state) {
    fixture *f = *state;
    int32_t ids[64];
    int n = tokenize(f->m, "def fibonacci(n):", ids, 64);
    kiln_generate_params gp = kiln_generate_default_params();
    gp.sampling.temperature = 0;
    gp.max_tokens = 40;
    collected full, cut;
    kiln_generate_result res;
    generate(f, ids, n, &gp, &full, &res);
    const char *stop[] = {"fib"}; /* appears in the continuation, as part of a longer token or split over two */
    char *at = strstr(full.text, "fib");
    assert_non_null(at);
    gp.stop = stop;
    gp.n_stop = 1;
    generate(f, ids, n, &gp, &cut, &res);
    assert_int_equal(res.finish, KILN_FINISH_STOP);
    assert_int_equal(cut.len, (size_t)(at - full.text));
    assert_memory_equal(cut.text, full.text, cut.len);
}

static void test_same_seed_same_text(void **state) {
    fixture *f = *state;
    int32_t ids[64];
    int n = tokenize(f->m, "Once upon a time", ids, 64);
    kiln_generate_params gp = kiln_generate_default_params();
    gp.sampling.temperature = 1.0f;
    gp.sampling.seed = 42;
    gp.max_tokens = 16;
    collected a, b;
    kiln_generate_result res;
    generate(f, ids, n, &gp, &a, &res);
    generate(f, ids, n, &gp, &b, &res);
    assert_string_equal(a.text, b.text);
}

static void test_context_overflow_is_an_error(void **state) {
    fixture *f = *state;
    int32_t ids[64];
    int n = tokenize(f->m, "Once upon a time", ids, 64);
    kiln_generate_params gp = kiln_generate_default_params();
    gp.max_tokens = 128; /* prompt + 128 > 128 */
    char err[512];
    kiln_generate_result res;
    assert_int_equal(kiln_generate(f->c, ids, n, &gp, NULL, NULL, &res, err, sizeof err), -1);
    assert_non_null(strstr(err, "context"));
    assert_int_equal(kiln_eval(f->c, ids, n, 200, NULL, false, err, sizeof err), -1);
}

/* The CPU context of setup: the file's weights, F16 keys and values of its 128 positions, some workspace. */
static void test_context_memory_counts_weights_and_cache(void **state) {
    fixture *f = *state;
    kiln_memory mem = kiln_context_memory(f->c);
    assert_true(mem.weights > 0 && mem.weights <= kiln_model_bytes_per_token(f->m));
    assert_true(mem.weights > kiln_model_bytes_per_token(f->m) / 2);
    const kiln_model *m = kiln_context_model(f->c);
    uint64_t kv_row = 2 * (uint64_t)m->cfg.n_head_kv * (uint64_t)m->cfg.head_dim; /* F16 */
    assert_int_equal(mem.kv_cache, 2 * (uint64_t)m->cfg.n_layer * 128 * kv_row);
    assert_true(mem.workspace > 0);
}

int main(void) {
    const struct CMUnitTest unit[] = {
        cmocka_unit_test(test_stop_scan_holds_back_possible_starts),
    };
    const struct CMUnitTest model[] = {
        cmocka_unit_test(test_greedy_max_tokens_and_prefix_reuse),
        cmocka_unit_test(test_stop_string_ends_the_text_before_it),
        cmocka_unit_test(test_same_seed_same_text),
        cmocka_unit_test(test_context_overflow_is_an_error),
        cmocka_unit_test(test_context_memory_counts_weights_and_cache),
        cmocka_unit_test(test_model_closed_before_its_context),
    };
    return cmocka_run_group_tests(unit, NULL, NULL) | cmocka_run_group_tests(model, setup, teardown);
}

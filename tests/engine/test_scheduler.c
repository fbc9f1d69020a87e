/* The scheduler through scheduler.h on the default model: a request alone gives kiln_generate's tokens; several at
 * once give each the tokens it gets alone (batch invariance), including prompts longer than a chunk and prompts
 * sharing cached prefix blocks; cancellation by id and by the callback; a full queue; requests that can never run. */
#include <pthread.h>
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
#include "engine/scheduler.h"
#include "model/model.h"

#define MAX_OUT 128

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;

typedef struct request {
    int32_t tokens[MAX_OUT];
    int n_tokens;
    int cancel_after; /* the callback asks to stop after this many tokens; 0: never */
    bool done;
    int n_done;
    kiln_generate_result res;
    char err[KILN_ERROR_MAX];
} request;

static int on_token(const kiln_token_event *ev, void *user) {
    request *r = user;
    if (ev->token < 0) return 0;
    pthread_mutex_lock(&lock);
    if (r->n_tokens < MAX_OUT) r->tokens[r->n_tokens++] = ev->token;
    int stop = r->cancel_after && r->n_tokens >= r->cancel_after;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    return stop;
}

static void on_done(const kiln_generate_result *res, const char *err, void *user) {
    request *r = user;
    pthread_mutex_lock(&lock);
    r->res = *res;
    if (err) snprintf(r->err, sizeof r->err, "%s", err);
    r->done = true;
    r->n_done++;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
}

static void wait_done(request *r) {
    pthread_mutex_lock(&lock);
    while (!r->done) pthread_cond_wait(&changed, &lock);
    pthread_mutex_unlock(&lock);
}

static void wait_tokens(request *r, int n) {
    pthread_mutex_lock(&lock);
    while (r->n_tokens < n && !r->done) pthread_cond_wait(&changed, &lock);
    pthread_mutex_unlock(&lock);
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
    p.n_ctx = 256;
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

static int tokenize(const kiln_model *m, const char *text, int32_t *ids, int max) {
    char err[512];
    int n = kiln_tokenize_text(m, text, true, false, ids, max, err, sizeof err);
    assert_true(n > 0 && n <= max);
    return n;
}

static kiln_sched *sched_new(fixture *f, int parallel, int max_queue) {
    kiln_sched_params p = kiln_sched_default_params();
    p.parallel = parallel;
    p.n_ctx = 256;
    p.n_threads = 1;
    p.max_queue = max_queue;
    kiln_error err = {{0}};
    kiln_sched *s = kiln_sched_new(f->m, &p, &err);
    if (!s) fprintf(stderr, "%s\n", err.msg);
    assert_non_null(s);
    return s;
}

static kiln_generate_params greedy(int max_tokens) {
    kiln_generate_params gp = kiln_generate_default_params();
    gp.sampling.temperature = 0;
    gp.max_tokens = max_tokens;
    return gp;
}

static int64_t submit(kiln_sched *s, const int32_t *ids, int n, const kiln_generate_params *gp, request *r) {
    kiln_sched_request q = {.prompt = ids, .n_prompt = n, .params = *gp, .on_token = on_token, .on_done = on_done,
                            .user = r};
    kiln_error err = {{0}};
    int64_t id = kiln_sched_submit(s, &q, &err);
    if (id < 0) fprintf(stderr, "%s\n", err.msg);
    return id;
}

/* The tokens kiln_generate gives for the prompt from an empty cache: the reference for the scheduler's output. */
static int solo(fixture *f, const int32_t *ids, int n, const kiln_generate_params *gp, int32_t *out) {
    request r = {0};
    char err[512];
    kiln_generate_result res;
    int32_t other = ids[0] == 0 ? 1 : 0; /* a first token the prompt does not share: nothing is reused */
    assert_int_equal(kiln_eval(f->c, &other, 1, 0, NULL, false, err, sizeof err), 0);
    assert_int_equal(kiln_generate(f->c, ids, n, gp, on_token, &r, &res, err, sizeof err), 0);
    memcpy(out, r.tokens, sizeof *out * (size_t)r.n_tokens);
    return r.n_tokens;
}

static void test_one_request_matches_generate(void **state) {
    fixture *f = *state;
    int32_t ids[64], want[MAX_OUT];
    int n = tokenize(f->m, "def fibonacci(n):", ids, 64);
    kiln_generate_params gp = greedy(8);
    int n_want = solo(f, ids, n, &gp, want);
    kiln_sched *s = sched_new(f, 2, 8);
    request r = {0};
    assert_true(submit(s, ids, n, &gp, &r) > 0);
    wait_done(&r);
    assert_string_equal(r.err, "");
    assert_int_equal(r.res.finish, KILN_FINISH_LENGTH);
    assert_int_equal(r.res.n_generated, 8);
    assert_int_equal(r.n_tokens, n_want);
    assert_memory_equal(r.tokens, want, sizeof *want * (size_t)n_want);
    kiln_sched_stats st;
    kiln_sched_get_stats(s, &st);
    assert_true(st.steps >= 8);
    kiln_sched_free(s);
}

/* A scheduler keeps its model: closed first, the model stays until the scheduler goes (run under ASan in CI). */
static void test_model_closed_before_the_scheduler(void **state) {
    fixture *f = *state;
    char path[1024], err[512];
    assert_int_equal(kiln_test_model_path(path, sizeof path), 0);
    fixture own = {kiln_model_open(path, err, sizeof err), NULL};
    assert_non_null(own.m);
    int32_t ids[64], want[MAX_OUT];
    int n = tokenize(f->m, "def fibonacci(n):", ids, 64);
    kiln_generate_params gp = greedy(4);
    int n_want = solo(f, ids, n, &gp, want);
    kiln_sched *s = sched_new(&own, 1, 4);
    kiln_model_close(own.m);
    request r = {0};
    assert_true(submit(s, ids, n, &gp, &r) > 0);
    wait_done(&r);
    assert_string_equal(r.err, "");
    assert_int_equal(r.n_tokens, n_want);
    assert_memory_equal(r.tokens, want, sizeof *want * (size_t)n_want);
    kiln_sched_free(s);
}

static const char *PROMPTS[] = {
    "def fibonacci(n):",
    "The capital of France is",
    "Once upon a time, in a land far away, there lived a dragon who loved to read books about the sea, the "
    "mountains, the stars and the old kings of the north. Every evening the dragon",
    "1, 2, 3, 4,",
    "Here is a recipe for bread:",
};
#define N_PROMPTS (int)(sizeof PROMPTS / sizeof PROMPTS[0])

static void test_concurrent_requests_match_their_solo_runs(void **state) {
    fixture *f = *state;
    static int32_t ids[N_PROMPTS][128], want[N_PROMPTS][MAX_OUT];
    int n[N_PROMPTS], n_want[N_PROMPTS];
    kiln_generate_params gp = greedy(8);
    for (int i = 0; i < N_PROMPTS; i++) {
        n[i] = tokenize(f->m, PROMPTS[i], ids[i], 128);
        n_want[i] = solo(f, ids[i], n[i], &gp, want[i]);
    }
    kiln_sched *s = sched_new(f, 3, 8); /* more requests than slots: some queue, then join mid-way */
    static request r[N_PROMPTS];
    memset(r, 0, sizeof r);
    for (int i = 0; i < N_PROMPTS; i++) assert_true(submit(s, ids[i], n[i], &gp, &r[i]) > 0);
    for (int i = 0; i < N_PROMPTS; i++) {
        wait_done(&r[i]);
        assert_string_equal(r[i].err, "");
        assert_int_equal(r[i].n_tokens, n_want[i]);
        assert_memory_equal(r[i].tokens, want[i], sizeof(int32_t) * (size_t)n_want[i]);
        assert_int_equal(r[i].n_done, 1);
    }
    kiln_sched_free(s);
}

#define SYSTEM                                                                                                      \
    "You are a careful assistant. You answer in short sentences, you never make up facts, and when you do not know "  \
    "something you say so plainly. You prefer simple words to long ones, and examples to definitions. You keep "      \
    "lists short. You do not repeat the question. If the question is unclear you ask one short question back, and "  \
    "if it has several parts you answer each part in the order it was asked. "

/* A second request with the same long start reuses the first one's full prompt blocks (more than a chunk of them,
 * so the first prompt also went in several steps) and still gives the tokens it gets alone. */
static void test_shared_prefix_blocks_are_reused(void **state) {
    fixture *f = *state;
    static int32_t a[256], b[256], want[MAX_OUT];
    int na = tokenize(f->m, SYSTEM "Question: what is a river?", a, 256);
    int nb = tokenize(f->m, SYSTEM "Question: why is the sky blue?", b, 256);
    int shared = 0;
    while (shared < na && shared < nb && a[shared] == b[shared]) shared++;
    assert_true(shared > 64);
    kiln_generate_params gp = greedy(4);
    int n_want = solo(f, b, nb, &gp, want);
    kiln_sched *s = sched_new(f, 2, 8);
    request ra = {0}, rb = {0};
    assert_true(submit(s, a, na, &gp, &ra) > 0);
    wait_done(&ra);
    assert_int_equal(ra.res.n_cached, 0);
    assert_true(submit(s, b, nb, &gp, &rb) > 0);
    wait_done(&rb);
    assert_int_equal(rb.res.n_cached, shared / 16 * 16);
    assert_int_equal(rb.n_tokens, n_want);
    assert_memory_equal(rb.tokens, want, sizeof *want * (size_t)n_want);
    kiln_sched_stats st;
    kiln_sched_get_stats(s, &st);
    assert_int_equal(st.prefix_tokens_reused, (uint64_t)rb.res.n_cached);
    assert_int_equal(st.kv_block_size, 16);
    assert_int_equal(st.kv_blocks_used, 0);
    kiln_sched_free(s);
}

static void test_cancel_by_id_and_by_callback(void **state) {
    fixture *f = *state;
    int32_t ids[64];
    int n = tokenize(f->m, "Once upon a time", ids, 64);
    kiln_generate_params gp = greedy(200);
    kiln_sched *s = sched_new(f, 2, 8);
    request by_id = {0}, by_cb = {.cancel_after = 3}, queued = {0};
    int64_t id = submit(s, ids, n, &gp, &by_id);
    assert_true(id > 0);
    assert_true(submit(s, ids, n, &gp, &by_cb) > 0);
    int64_t qid = submit(s, ids, n, &gp, &queued); /* waits: both slots are taken */
    kiln_sched_cancel(s, qid);
    wait_tokens(&by_id, 2);
    kiln_sched_cancel(s, id);
    kiln_sched_cancel(s, 12345); /* unknown: ignored */
    wait_done(&by_id);
    wait_done(&by_cb);
    wait_done(&queued);
    assert_int_equal(by_id.res.finish, KILN_FINISH_CALLBACK);
    assert_true(by_id.n_tokens < 200);
    assert_int_equal(by_cb.res.finish, KILN_FINISH_CALLBACK);
    assert_int_equal(by_cb.n_tokens, 3);
    assert_int_equal(queued.res.finish, KILN_FINISH_CALLBACK);
    kiln_sched_stats st;
    kiln_sched_get_stats(s, &st);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.queued, 0);
    assert_int_equal(st.kv_blocks_used, 0);
    kiln_sched_free(s);
}

static void test_full_queue_and_impossible_requests_fail_at_submit(void **state) {
    fixture *f = *state;
    int32_t ids[64];
    int n = tokenize(f->m, "Once upon a time", ids, 64);
    kiln_generate_params gp = greedy(100);
    kiln_sched *s = sched_new(f, 1, 1);
    request a = {0}, b = {0}, c = {0};
    assert_true(submit(s, ids, n, &gp, &a) > 0);
    wait_tokens(&a, 1); /* a runs; b fills the queue of one; c is refused */
    assert_true(submit(s, ids, n, &gp, &b) > 0);
    kiln_sched_request q = {.prompt = ids, .n_prompt = n, .params = gp, .on_token = on_token, .on_done = on_done,
                            .user = &c};
    kiln_error err = {{0}};
    assert_int_equal(kiln_sched_submit(s, &q, &err), -1);
    assert_non_null(strstr(err.msg, "queue is full"));
    q.params.max_tokens = 300; /* over n_ctx 256 */
    assert_int_equal(kiln_sched_submit(s, &q, &err), -1);
    assert_non_null(strstr(err.msg, "exceed the context"));
    q.n_prompt = 0;
    assert_int_equal(kiln_sched_submit(s, &q, &err), -1);
    assert_non_null(strstr(err.msg, "empty prompt"));
    int32_t bad = 1 << 30;
    q.prompt = &bad;
    q.n_prompt = 1;
    assert_int_equal(kiln_sched_submit(s, &q, &err), -1);
    assert_non_null(strstr(err.msg, "vocabulary"));
    kiln_sched_free(s); /* a and b end with on_done, cancelled */
    assert_true(a.done && b.done);
    assert_int_equal(b.res.finish, KILN_FINISH_CALLBACK);
    assert_false(c.done);
}

/* The GPU's half mode: as asked, or by default for models whose feed-forward matrices are all F16 or BF16. */
static void test_half_mode_follows_the_weights(void **state) {
    (void)state;
    kiln_layer_weights layers[2] = {0};
    kiln_weights w = {.layers = layers, .n_layer = 2};
    const kiln_layer_role ffn[3] = {KILN_ROLE_FFN_GATE, KILN_ROLE_FFN_UP, KILN_ROLE_FFN_DOWN};
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < 3; i++) layers[l].w[ffn[i]].type = i == 2 ? KILN_TYPE_F16 : KILN_TYPE_BF16;
    assert_true(kiln_sched_half_mode(&w, KILN_GPU_F16_AUTO));
    assert_false(kiln_sched_half_mode(&w, KILN_GPU_F16_OFF));
    layers[1].w[KILN_ROLE_FFN_DOWN].type = KILN_TYPE_Q6_K; /* one quantized matrix: the int8 path */
    assert_false(kiln_sched_half_mode(&w, KILN_GPU_F16_AUTO));
    assert_true(kiln_sched_half_mode(&w, KILN_GPU_F16_ON));
    layers[1].w[KILN_ROLE_FFN_DOWN].type = KILN_TYPE_F32; /* F32 keeps the FMA kernel in either mode */
    assert_false(kiln_sched_half_mode(&w, KILN_GPU_F16_AUTO));
    assert_int_equal(kiln_sched_default_params().gpu_f16, KILN_GPU_F16_AUTO);
}

int main(void) {
    const struct CMUnitTest plain[] = {cmocka_unit_test(test_half_mode_follows_the_weights)};
    if (cmocka_run_group_tests(plain, NULL, NULL)) return 1;
    const struct CMUnitTest model[] = {
        cmocka_unit_test(test_model_closed_before_the_scheduler),
        cmocka_unit_test(test_one_request_matches_generate),
        cmocka_unit_test(test_concurrent_requests_match_their_solo_runs),
        cmocka_unit_test(test_shared_prefix_blocks_are_reused),
        cmocka_unit_test(test_cancel_by_id_and_by_callback),
        cmocka_unit_test(test_full_queue_and_impossible_requests_fail_at_submit),
    };
    return cmocka_run_group_tests(model, setup, teardown);
}

/* Aggregate decode speed of the continuous-batching scheduler on the CPU: M sequences decoding at once, for
 * M = 1, 2, 4, 8, 16. Each step's matmuls take every sequence's token together, so weights are read once per step
 * and tokens per second should grow with M until compute, not memory bandwidth, is the limit. The first line is the
 * single-sequence path (kiln_generate) for comparison.
 * usage: bench_batch MODEL.gguf [n_gen=64] [n_threads=0] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "engine/engine.h"
#include "engine/scheduler.h"

#define MAX_M 16

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static int n_seqs, n_started, n_done, n_tokens_after_start;
static double t_all_started;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Counts tokens from the moment every sequence has its first one: prefill is not part of the decode rate. */
static int on_token(const kiln_token_event *ev, void *user) {
    int *seen = user;
    if (ev->token < 0) return 0;
    pthread_mutex_lock(&lock);
    if ((*seen)++ == 0) {
        if (++n_started == n_seqs) t_all_started = now();
    } else if (t_all_started > 0) n_tokens_after_start++;
    pthread_mutex_unlock(&lock);
    return 0;
}

static void on_done(const kiln_generate_result *res, const char *err, void *user) {
    (void)res;
    (void)user;
    if (err) fprintf(stderr, "request failed: %s\n", err);
    pthread_mutex_lock(&lock);
    n_done++;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
}

static int run_batch(kiln_model *m, const int32_t *ids, int n, int M, int n_gen, int n_threads) {
    kiln_sched_params p = kiln_sched_default_params();
    p.parallel = M;
    p.n_ctx = n + n_gen + 16;
    p.n_threads = n_threads;
    kiln_error err = {{0}};
    kiln_sched *s = kiln_sched_new(m, &p, &err);
    if (!s) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    static int seen[MAX_M];
    for (int i = 0; i < MAX_M; i++) seen[i] = 0;
    n_seqs = M;
    n_started = n_done = n_tokens_after_start = 0;
    t_all_started = 0;
    kiln_generate_params gp = kiln_generate_default_params();
    gp.sampling.temperature = 0; /* the counting prompt goes on for as long as asked */
    gp.max_tokens = n_gen;
    for (int i = 0; i < M; i++) {
        kiln_sched_request r = {.prompt = ids, .n_prompt = n, .params = gp, .on_token = on_token,
                                .on_done = on_done, .user = &seen[i]};
        if (kiln_sched_submit(s, &r, &err) < 0) {
            fprintf(stderr, "%s\n", err.msg);
            kiln_sched_free(s);
            return -1;
        }
    }
    pthread_mutex_lock(&lock);
    while (n_done < M) pthread_cond_wait(&changed, &lock);
    double dt = now() - t_all_started;
    int toks = n_tokens_after_start;
    pthread_mutex_unlock(&lock);
    kiln_sched_stats st;
    kiln_sched_get_stats(s, &st);
    printf("batched   M=%-2d  %5d tokens  %7.1f tok/s aggregate  %6.1f tok/s per sequence  (%llu steps)\n", M, toks,
           toks / dt, toks / dt / M, (unsigned long long)st.steps);
    kiln_sched_free(s);
    return 0;
}

static int run_single(kiln_model *m, const int32_t *ids, int n, int n_gen, int n_threads) {
    kiln_context_params cp = kiln_context_default_params();
    cp.n_ctx = n + n_gen + 16;
    cp.n_threads = n_threads;
    char err[512];
    kiln_context *c = kiln_context_new(m, &cp, err, sizeof err);
    if (!c) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    kiln_generate_params gp = kiln_generate_default_params();
    gp.sampling.temperature = 0;
    gp.max_tokens = n_gen;
    kiln_generate_result res;
    if (kiln_generate(c, ids, n, &gp, NULL, NULL, &res, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        kiln_context_free(c);
        return -1;
    }
    printf("single    M=1   %5d tokens  %7.1f tok/s (kiln_generate, for comparison)\n", res.n_generated,
           res.n_generated / (res.decode_ms / 1e3));
    kiln_context_free(c);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [n_gen=64] [n_threads=0]\n", argv[0]);
        return 2;
    }
    int n_gen = argc > 2 ? atoi(argv[2]) : 64, n_threads = argc > 3 ? atoi(argv[3]) : 0;
    char err[512];
    kiln_model *m = kiln_model_open(argv[1], err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int32_t ids[64];
    int n = kiln_tokenize_text(m, "1, 2, 3, 4, 5, 6,", true, false, ids, 64, err,
                               sizeof err);
    int rc = n > 0 ? run_single(m, ids, n, n_gen, n_threads) : -1;
    for (int M = 1; M <= MAX_M && !rc; M *= 2) rc = run_batch(m, ids, n, M, n_gen, n_threads);
    kiln_model_close(m);
    return rc ? 1 : 0;
}

/* Row conversion spread over threads, and the progress line. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "format/quantize.h"
#include "quant/quant.h"

typedef struct row_job {
    kiln_quantize_fn quantize;
    int64_t first, count, n;
    size_t row_bytes;
    kiln_row_source_fn src;
    void *ctx;
    uint8_t *dst; /* row `first` goes here */
    int failed;
} row_job;

static void *run_rows(void *arg) {
    row_job *j = arg;
    float *tmp = malloc((size_t)j->n * sizeof *tmp);
    if (!tmp) {
        j->failed = 1;
        return NULL;
    }
    for (int64_t r = 0; r < j->count; r++) {
        j->src(j->ctx, j->first + r, tmp, j->n);
        j->quantize(tmp, j->dst + (size_t)r * j->row_bytes, j->n);
    }
    free(tmp);
    return NULL;
}

#define MAX_THREADS 64

int kiln_quant_rows(kiln_type type, int64_t first_row, int64_t n_rows, int64_t n, kiln_row_source_fn src, void *ctx,
                    void *dst, int n_threads, kiln_error *err) {
    const kiln_quant_ops *ops = kiln_quant_ops_best(type);
    if (!ops || !ops->quantize) return kiln_fail(err, "no quantizer for type %s", kiln_type_name(type));
    if (n_threads < 1) n_threads = 1;
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    if (n_threads > n_rows) n_threads = (int)(n_rows > 0 ? n_rows : 1);
    row_job jobs[MAX_THREADS];
    pthread_t tids[MAX_THREADS];
    size_t row_bytes = kiln_row_size(type, n);
    int64_t per = n_rows / n_threads, extra = n_rows % n_threads, at = 0;
    bool launched[MAX_THREADS] = {false};
    for (int t = 0; t < n_threads; t++) {
        int64_t count = per + (t < extra);
        jobs[t] = (row_job){ops->quantize, first_row + at, count, n, row_bytes, src, ctx,
                            (uint8_t *)dst + (size_t)at * row_bytes, 0};
        at += count;
    }
    /* the calling thread takes job 0; a thread that cannot start has its job run here too */
    for (int t = 1; t < n_threads; t++) {
        launched[t] = pthread_create(&tids[t], NULL, run_rows, &jobs[t]) == 0;
        if (!launched[t]) run_rows(&jobs[t]);
    }
    run_rows(&jobs[0]);
    int failed = jobs[0].failed;
    for (int t = 1; t < n_threads; t++) {
        if (launched[t]) pthread_join(tids[t], NULL);
        failed |= jobs[t].failed;
    }
    return failed ? kiln_fail(err, "out of memory converting rows") : 0;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void kiln_progress_start(kiln_progress *p, bool enabled) {
    p->enabled = enabled;
    p->tty = enabled && isatty(STDERR_FILENO);
    p->t0 = now();
    p->bytes = 0;
}

void kiln_progress_tensor(kiln_progress *p, uint64_t i, uint64_t n, const char *name, kiln_type type,
                          uint64_t bytes) {
    p->bytes += bytes;
    if (!p->enabled) return;
    double dt = now() - p->t0, mb = (double)p->bytes / 1e6;
    int width = 30, filled = n ? (int)((uint64_t)width * (i + 1) / n) : width;
    fprintf(stderr, "%s[%-*.*s] %4llu/%llu %-32.32s %-5s %8.1f MB %7.1f MB/s%s", p->tty ? "\r" : "", width, filled,
            "==============================", (unsigned long long)(i + 1), (unsigned long long)n, name,
            kiln_type_name(type), mb, dt > 0 ? mb / dt : 0.0, p->tty ? "" : "\n");
    fflush(stderr);
}

void kiln_progress_end(kiln_progress *p) {
    if (!p->enabled) return;
    double dt = now() - p->t0;
    fprintf(stderr, "%sdone: %.1f MB in %.1f s\n", p->tty ? "\n" : "", (double)p->bytes / 1e6, dt);
}

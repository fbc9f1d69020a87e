#include "cli/membw.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct reader {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
    pthread_t th;
} reader;

/* Four independent accumulators keep several loads in flight; the sum is kept so the reads are not optimized out. */
static void *read_part(void *arg) {
    reader *r = arg;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= r->n; i += 4) {
        a += r->p[i];
        b ^= r->p[i + 1];
        c += r->p[i + 2];
        d ^= r->p[i + 3];
    }
    r->sum = a + b + c + d;
    return NULL;
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double membw_read(int n_threads, int mib) {
    size_t bytes = (size_t)mib << 20, words = bytes / 8;
    uint64_t *buf = malloc(bytes);
    reader *rs = calloc((size_t)n_threads, sizeof *rs);
    if (!buf || !rs) {
        free(buf);
        free(rs);
        return 0;
    }
    memset(buf, 1, bytes); /* touch every page before timing */
    double best = 0;
    for (int pass = 0; pass < 3; pass++) {
        double t0 = seconds();
        for (int i = 0; i < n_threads; i++) {
            rs[i].p = buf + words / (size_t)n_threads * (size_t)i;
            rs[i].n = words / (size_t)n_threads;
            if (i) pthread_create(&rs[i].th, NULL, read_part, &rs[i]);
        }
        read_part(&rs[0]);
        for (int i = 1; i < n_threads; i++) pthread_join(rs[i].th, NULL);
        double bw = (double)bytes / (seconds() - t0);
        if (bw > best) best = bw;
    }
    free(buf);
    free(rs);
    return best;
}

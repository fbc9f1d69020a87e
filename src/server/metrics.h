/* The server's counters and latency histograms, rendered as Prometheus text for GET /metrics. Thread-safe: the
 * connection threads count requests, the scheduler thread observes token latencies. */
#ifndef KILN_SERVER_METRICS_H
#define KILN_SERVER_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "engine/scheduler.h"

#define SRV_METRICS_MAX_SERIES 64
#define SRV_HIST_BUCKETS 14

typedef struct srv_histogram {
    uint64_t counts[SRV_HIST_BUCKETS + 1]; /* per bucket, the last one +Inf; not cumulative */
    double sum;
    uint64_t n;
} srv_histogram;

typedef struct srv_metrics {
    pthread_mutex_t mu;
    struct {
        char route[32];
        int status;
        uint64_t n;
    } requests[SRV_METRICS_MAX_SERIES];
    int n_series;
    uint64_t prompt_tokens, completion_tokens;
    srv_histogram ttft, itl;
} srv_metrics;

/* Upper bounds of the histogram buckets, in seconds. */
extern const double SRV_HIST_BOUNDS[SRV_HIST_BUCKETS];

void srv_metrics_init(srv_metrics *m);
void srv_metrics_destroy(srv_metrics *m);
/* One finished HTTP request: its route ("/v1/chat/completions", or "other" for unknown paths) and status. */
void srv_metrics_count_request(srv_metrics *m, const char *route, int status);
void srv_metrics_count_tokens(srv_metrics *m, int prompt, int completion);
void srv_metrics_observe_ttft(srv_metrics *m, double seconds);
void srv_metrics_observe_itl(srv_metrics *m, double seconds);

/* Prometheus text exposition format (version 0.0.4), malloc'd; stats may be NULL (no scheduler gauges). */
char *srv_metrics_render(srv_metrics *m, const kiln_sched_stats *stats);

#endif

#include "server/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* From 5 ms to 20 s: a token on a fast GPU up to a long prompt's wait in a full queue. */
const double SRV_HIST_BOUNDS[SRV_HIST_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25,
                                                  0.5,   1,    2.5,   5,    7.5,   10,  20};

void srv_metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void srv_metrics_destroy(srv_metrics *m) {
    pthread_mutex_destroy(&m->mu);
}

void srv_metrics_count_request(srv_metrics *m, const char *route, int status) {
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->n_series && (m->requests[i].status != status || strcmp(m->requests[i].route, route))) i++;
    if (i == m->n_series && i < SRV_METRICS_MAX_SERIES) {
        snprintf(m->requests[i].route, sizeof m->requests[i].route, "%s", route);
        m->requests[i].status = status;
        m->requests[i].n = 0;
        m->n_series++;
    }
    if (i < m->n_series) m->requests[i].n++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_count_tokens(srv_metrics *m, int prompt, int completion) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)(prompt > 0 ? prompt : 0);
    m->completion_tokens += (uint64_t)(completion > 0 ? completion : 0);
    pthread_mutex_unlock(&m->mu);
}

static void observe(srv_metrics *m, srv_histogram *h, double s) {
    int b = 0;
    while (b < SRV_HIST_BUCKETS && s > SRV_HIST_BOUNDS[b]) b++;
    pthread_mutex_lock(&m->mu);
    h->counts[b]++;
    h->sum += s;
    h->n++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_observe_ttft(srv_metrics *m, double seconds) {
    observe(m, &m->ttft, seconds);
}

void srv_metrics_observe_itl(srv_metrics *m, double seconds) {
    observe(m, &m->itl, seconds);
}

typedef struct text_buf {
    char *s;
    size_t len, cap;
    int oom;
} text_buf;

static void put(text_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(text_buf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = b->oom ? 0 : vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (b->oom || n < 0) return;
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->oom = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

static void put_histogram(text_buf *b, const char *name, const char *help, const srv_histogram *h) {
    put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < SRV_HIST_BUCKETS; i++) {
        cum += h->counts[i];
        put(b, "%s_bucket{le=\"%g\"} %llu\n", name, SRV_HIST_BOUNDS[i], (unsigned long long)cum);
    }
    put(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)h->n);
    put(b, "%s_sum %.6f\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->n);
}

static void put_gauge(text_buf *b, const char *name, const char *help, double v) {
    put(b, "# HELP %s %s\n# TYPE %s gauge\n%s %g\n", name, help, name, name, v);
}

static void put_scheduler(text_buf *b, const kiln_sched_stats *st) {
    put_gauge(b, "kiln_queue_depth", "Requests waiting to be admitted.", st->queued);
    put_gauge(b, "kiln_running_sequences", "Sequences in the running batch.", st->running);
    put_gauge(b, "kiln_kv_blocks_used", "KV-cache blocks in use.", st->kv_blocks_used);
    put_gauge(b, "kiln_kv_blocks_total", "KV-cache blocks in the pool.", st->kv_blocks_total);
    put_gauge(b, "kiln_kv_cache_usage_ratio", "Fraction of the KV-cache pool in use.",
              st->kv_blocks_total ? (double)st->kv_blocks_used / st->kv_blocks_total : 0);
    put(b, "# HELP kiln_prefix_tokens_reused_total Prompt tokens served from shared prefix blocks.\n"
           "# TYPE kiln_prefix_tokens_reused_total counter\nkiln_prefix_tokens_reused_total %llu\n",
        (unsigned long long)st->prefix_tokens_reused);
    put(b, "# HELP kiln_scheduler_steps_total Batched forward steps run.\n"
           "# TYPE kiln_scheduler_steps_total counter\nkiln_scheduler_steps_total %llu\n",
        (unsigned long long)st->steps);
}

char *srv_metrics_render(srv_metrics *m, const kiln_sched_stats *stats) {
    text_buf b = {malloc(4096), 0, 4096, 0};
    if (!b.s) return NULL;
    pthread_mutex_lock(&m->mu);
    put(&b, "# HELP kiln_requests_total HTTP requests answered, by route and status code.\n"
            "# TYPE kiln_requests_total counter\n");
    for (int i = 0; i < m->n_series; i++)
        put(&b, "kiln_requests_total{route=\"%s\",status=\"%d\"} %llu\n", m->requests[i].route,
            m->requests[i].status, (unsigned long long)m->requests[i].n);
    put(&b, "# HELP kiln_prompt_tokens_total Prompt tokens processed.\n# TYPE kiln_prompt_tokens_total counter\n"
            "kiln_prompt_tokens_total %llu\n", (unsigned long long)m->prompt_tokens);
    put(&b, "# HELP kiln_completion_tokens_total Tokens generated.\n"
            "# TYPE kiln_completion_tokens_total counter\nkiln_completion_tokens_total %llu\n",
        (unsigned long long)m->completion_tokens);
    put_histogram(&b, "kiln_time_to_first_token_seconds", "From a request's arrival to its first generated token.",
                  &m->ttft);
    put_histogram(&b, "kiln_inter_token_latency_seconds", "Between successive tokens of one sequence.", &m->itl);
    pthread_mutex_unlock(&m->mu);
    if (stats) put_scheduler(&b, stats);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

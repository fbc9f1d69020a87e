#include "server/job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

srv_job *srv_job_new(int n_choices, srv_metrics *metrics) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->choices = calloc((size_t)n_choices, sizeof *j->choices);
    if (!j->choices) {
        free(j);
        return NULL;
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    j->refs = 1;
    j->n_choices = n_choices;
    j->metrics = metrics;
    j->t_start = srv_now();
    for (int i = 0; i < n_choices; i++) {
        j->choices[i].job = j;
        j->choices[i].index = i;
    }
    return j;
}

void srv_job_ref(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void srv_job_unref(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    for (int i = 0; i < j->n_choices; i++) {
        free(j->choices[i].text);
        free(j->choices[i].pieces);
    }
    free(j->choices);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

static int append_piece(srv_choice *c, const kiln_token_event *ev) {
    if (c->len + ev->len + 1 > c->cap) {
        size_t cap = (c->cap ? c->cap * 2 : 256) + ev->len + 1;
        char *t = realloc(c->text, cap);
        if (!t) return -1;
        c->text = t;
        c->cap = cap;
    }
    if (c->n_pieces == c->cap_pieces) {
        int cap = c->cap_pieces ? c->cap_pieces * 2 : 64;
        srv_piece *p = realloc(c->pieces, sizeof *p * (size_t)cap);
        if (!p) return -1;
        c->pieces = p;
        c->cap_pieces = cap;
    }
    srv_piece *p = &c->pieces[c->n_pieces++];
    p->token = ev->token;
    p->off = c->len;
    p->len = ev->len;
    p->logprob = ev->logprob;
    p->n_top = ev->n_top < 0 ? 0 : ev->n_top > KILN_MAX_TOP_LOGPROBS ? KILN_MAX_TOP_LOGPROBS : ev->n_top;
    for (int k = 0; k < p->n_top; k++) {
        p->top_tokens[k] = ev->top_tokens[k];
        p->top_logprobs[k] = ev->top_logprobs[k];
    }
    if (ev->len) memcpy(c->text + c->len, ev->text, ev->len);
    c->len += ev->len;
    c->text[c->len] = '\0';
    return 0;
}

static void observe_latency(srv_choice *c) {
    if (!c->job->metrics) return;
    double now = srv_now();
    if (c->t_last == 0) srv_metrics_observe_ttft(c->job->metrics, now - c->job->t_start);
    else srv_metrics_observe_itl(c->job->metrics, now - c->t_last);
    c->t_last = now;
}

int srv_job_on_token(const kiln_token_event *ev, void *user) {
    srv_choice *c = user;
    srv_job *j = c->job;
    pthread_mutex_lock(&j->mu);
    if (ev->token >= 0) observe_latency(c);
    int stop = j->cancel;
    if (!stop && (ev->len || ev->token >= 0) && append_piece(c, ev)) {
        c->failed = true;
        snprintf(c->err, sizeof c->err, "out of memory");
        stop = 1;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return stop;
}

void srv_job_on_done(const kiln_generate_result *result, const char *err, void *user) {
    srv_choice *c = user;
    srv_job *j = c->job;
    pthread_mutex_lock(&j->mu);
    c->result = *result;
    if (err && !c->failed) {
        c->failed = true;
        snprintf(c->err, sizeof c->err, "%s", err);
    }
    c->done = true;
    j->n_done++;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    srv_job_unref(j);
}

void srv_job_abandon(srv_job *j, int index, const char *why) {
    pthread_mutex_lock(&j->mu);
    srv_choice *c = &j->choices[index];
    c->failed = true;
    snprintf(c->err, sizeof c->err, "%s", why);
    c->done = true;
    j->n_done++;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void srv_job_wait_locked(srv_job *j, int timeout_ms) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&j->cv, &j->mu, &ts); /* a wake-up early or late is fine: callers re-check */
}

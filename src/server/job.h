/* One HTTP request's generation: one choice per prompt, each a scheduler request. The scheduler thread appends
 * what each choice generates (never blocking: a short mutex and a condvar signal); the connection's thread reads it
 * under the same mutex, streaming it or waiting for the end. Reference-counted: the connection holds one reference
 * and each submitted choice one, dropped by its on_done, so whichever side finishes last frees the job. */
#ifndef KILN_SERVER_JOB_H
#define KILN_SERVER_JOB_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"
#include "server/metrics.h"

/* One generated token and the text it released. */
typedef struct srv_piece {
    int32_t token;   /* -1: the last flush of held-back text */
    size_t off, len; /* its text within the choice's text */
    float logprob;
    int n_top;
    int32_t top_tokens[KILN_MAX_TOP_LOGPROBS];
    float top_logprobs[KILN_MAX_TOP_LOGPROBS];
} srv_piece;

struct srv_job;

typedef struct srv_choice {
    struct srv_job *job;
    int index;
    int64_t id;      /* the scheduler's request id; 0 until submitted */
    char *text;
    size_t len, cap;
    srv_piece *pieces;
    int n_pieces, cap_pieces;
    bool done;
    bool failed;     /* done with an error (err), or out of memory while appending */
    char err[256];
    kiln_generate_result result;
    double t_last;   /* when its last token came, for the inter-token latency */
} srv_choice;

typedef struct srv_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    bool cancel;     /* the client went away: the next token event stops the choice */
    int n_choices, n_done;
    srv_choice *choices;
    srv_metrics *metrics; /* may be NULL */
    double t_start;  /* seconds, monotonic: when the request arrived */
} srv_job;

srv_job *srv_job_new(int n_choices, srv_metrics *metrics);
void srv_job_ref(srv_job *j);
void srv_job_unref(srv_job *j);

/* The scheduler's callbacks; user is a srv_choice. */
int srv_job_on_token(const kiln_token_event *ev, void *user);
void srv_job_on_done(const kiln_generate_result *result, const char *err, void *user);

/* Marks a choice that was never submitted as done (failed). */
void srv_job_abandon(srv_job *j, int index, const char *why);

/* With j->mu held: waits until the job changes or timeout_ms pass. */
void srv_job_wait_locked(srv_job *j, int timeout_ms);

/* Seconds on the monotonic clock. */
double srv_now(void);

#endif

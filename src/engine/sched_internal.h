/* The scheduler's insides, shared by scheduler.c (queue, admission, steps, callbacks) and its executors: one batched
 * forward per step over a paged KV cache, on the CPU (sched_paged.c) or the GPU (sched_cuda.c). */
#ifndef KILN_ENGINE_SCHED_INTERNAL_H
#define KILN_ENGINE_SCHED_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine/engine.h"
#include "engine/scheduler.h"

/* Positions per KV block. Prompt chunks are multiples of it, so a block's rows always go through the same kernels
 * (see "Batching" in docs/server.md). */
#define KILN_SCHED_BLOCK 16
#define KILN_SCHED_CHUNK_ALIGN KILN_SCHED_BLOCK

typedef struct sched_seq {
    int64_t id;
    int32_t *prompt;
    int n_prompt;
    kiln_generate_params params; /* stop points at the copies below */
    char **stop;
    kiln_sched_request req;      /* callbacks and user */
    kiln_gen gen;
    bool cancelled;              /* under the scheduler's lock */
    int n_past;                  /* positions in the KV cache */
    int32_t next;                /* the token to evaluate next, once decoding */
    double t_admit, t_first;     /* ms: admitted, first logits */
    void *exec;                  /* the executor's per-sequence state */
    struct sched_seq *next_queued;
} sched_seq;

/* One sequence's share of a step: tokens at positions pos..pos+n-1; logits of the last one when wanted. */
typedef struct sched_work {
    sched_seq *seq;
    const int32_t *tokens;
    int n, pos;
    bool want_logits;
    const float *logits; /* set by the executor: the whole row, or */
    int n_best;          /* ... only the row's n_best best (best_ids, best_logits) and the logits of the penalty */
    const int32_t *best_ids, *window; /* window's tokens (kiln_sampler_candidates_wanted) */
    const float *best_logits, *window_logits;
    int n_window;
    int32_t sampled;     /* drawn from logits after the step (the scheduler's sampling pass) */
    bool info_wanted;    /* the request asked for log-probabilities: info holds them */
    kiln_sample_info info;
} sched_work;

typedef struct sched_exec sched_exec;

typedef struct sched_exec_ops {
    /* Takes room for q (KV blocks or a context); returns 1 when there is none now, 0 with q->n_past set to the
     * prompt tokens already cached, -1 on error. Called with the scheduler's lock held. */
    int (*admit)(sched_exec *x, sched_seq *q, kiln_error *err);
    /* Gives q's room back (its prompt blocks may stay cached for later requests). Lock held. */
    void (*release)(sched_exec *x, sched_seq *q);
    /* Runs one step: work[0] may be a prompt chunk, the rest are single decode tokens. Lock not held. */
    int (*run)(sched_exec *x, sched_work *work, int n_work, kiln_error *err);
    /* After a step, with the lock held: KV blocks in use. */
    void (*stats)(sched_exec *x, kiln_sched_stats *st);
    /* Its device and memory (fixed once made). */
    void (*info)(const sched_exec *x, kiln_sched_info *out);
    void (*free)(sched_exec *x);
} sched_exec_ops;

struct sched_exec {
    const sched_exec_ops *ops;
};

/* Executors. Both return NULL with err set on failure. */
sched_exec *kiln_sched_paged_new(kiln_model *m, const kiln_sched_params *p, kiln_error *err);
sched_exec *kiln_sched_cuda_new(kiln_model *m, const kiln_sched_params *p, kiln_error *err);

#endif

/* A persistent pool of worker threads that run one job at a time on all threads together, the caller included.
 * Workers spin briefly for the next job (the forward pass dispatches hundreds of short jobs per token) and then
 * sleep, so an idle pool costs no CPU. */
#ifndef KILN_CPU_THREADPOOL_H
#define KILN_CPU_THREADPOOL_H

#include "util/error.h"

typedef struct kiln_pool kiln_pool;

/* The job: called at most once on each thread, with its index ith in 0..nth-1 (for per-thread scratch). A worker
 * that is late may not be called at all, so a job must hand out its work dynamically (an atomic counter of items),
 * never by ith; the caller's call (ith 0) always happens. */
typedef void (*kiln_pool_fn)(void *arg, int ith, int nth);

/* n_threads >= 1 threads in all (the caller is thread 0, so n_threads - 1 are started). */
int kiln_pool_new(int n_threads, kiln_pool **out, kiln_error *err);
void kiln_pool_free(kiln_pool *p);
int kiln_pool_size(const kiln_pool *p);

/* Runs fn on the caller and on every worker ready to join; returns when all that joined have finished. */
void kiln_pool_run(kiln_pool *p, kiln_pool_fn fn, void *arg);

/* Physical cores of this machine (logical CPUs when the topology is unknown). */
int kiln_physical_cores(void);

#endif

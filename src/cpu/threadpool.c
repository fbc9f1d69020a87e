/* Job hand-off through a generation counter: the caller publishes a job and bumps the counter; workers that see
 * the new value join it, unless the caller has already closed it. The caller runs the job itself, closes it, and
 * waits only for the workers that joined: on a busy machine a worker that is not scheduled in time is simply not
 * waited for, and the job's work (claimed item by item) is done by those who are running. Sleeping workers are
 * woken through a condition variable only when some are actually asleep. */
#include "cpu/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define cpu_relax() __asm__ volatile("" ::: "memory")

/* About 0.1-0.3 ms of polling before a worker sleeps or the caller yields. Plain loads, not PAUSE: under a
 * hypervisor PAUSE loops can trap to the host. */
#define SPIN_ROUNDS 200000

typedef struct worker {
    kiln_pool *pool;
    int ith;
    pthread_t thread;
} worker;

struct kiln_pool {
    int n_threads;
    worker *workers;
    kiln_pool_fn fn;
    void *arg;
    atomic_uint generation;
    atomic_uint closed; /* generation of the last job the caller has finished */
    atomic_int n_active; /* workers inside the current job */
    atomic_int n_sleeping;
    atomic_bool stop;
    pthread_mutex_t lock;
    pthread_cond_t wake;
};

static unsigned wait_for_job(kiln_pool *p, unsigned seen) {
    for (int i = 0; i < SPIN_ROUNDS; i++) {
        unsigned g = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax();
    }
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add(&p->n_sleeping, 1);
    unsigned g;
    while ((g = atomic_load(&p->generation)) == seen) pthread_cond_wait(&p->wake, &p->lock);
    atomic_fetch_sub(&p->n_sleeping, 1);
    pthread_mutex_unlock(&p->lock);
    return g;
}

static void *worker_main(void *arg) {
    worker *w = arg;
    kiln_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        seen = wait_for_job(p, seen);
        if (atomic_load(&p->stop)) return NULL;
        /* join, then check the job is still open: with the caller's close-then-count (both sequentially
         * consistent), either it sees this worker in n_active or this worker sees the job closed */
        atomic_fetch_add(&p->n_active, 1);
        if (atomic_load(&p->closed) != seen && atomic_load(&p->generation) == seen)
            p->fn(p->arg, w->ith, p->n_threads);
        atomic_fetch_sub(&p->n_active, 1);
    }
}

/* Bumps the generation; sleepers are woken under the lock so none can miss the change. */
static unsigned publish(kiln_pool *p) {
    unsigned g = atomic_fetch_add(&p->generation, 1) + 1;
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
    }
    return g;
}

void kiln_pool_run(kiln_pool *p, kiln_pool_fn fn, void *arg) {
    if (p->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    unsigned g = publish(p);
    fn(arg, 0, p->n_threads);
    atomic_store(&p->closed, g);
    int spins = 0;
    while (atomic_load(&p->n_active) > 0) {
        if (++spins < SPIN_ROUNDS) cpu_relax();
        else sched_yield();
    }
}

int kiln_pool_new(int n_threads, kiln_pool **out, kiln_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024) return kiln_fail(err, "thread count %d is out of range (1..1024)", n_threads);
    kiln_pool *p = calloc(1, sizeof *p);
    if (!p) return kiln_fail(err, "out of memory for the thread pool");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->workers) {
        kiln_pool_free(p);
        return kiln_fail(err, "out of memory for the thread pool");
    }
    for (int i = 1; i < n_threads; i++) {
        p->workers[i].pool = p;
        p->workers[i].ith = i;
        if (pthread_create(&p->workers[i].thread, NULL, worker_main, &p->workers[i])) {
            p->n_threads = i; /* only the started ones are joined */
            kiln_pool_free(p);
            return kiln_fail(err, "cannot start worker thread %d of %d", i, n_threads);
        }
    }
    *out = p;
    return 0;
}

void kiln_pool_free(kiln_pool *p) {
    if (!p) return;
    if (p->workers) {
        atomic_store(&p->stop, true);
        publish(p);
        for (int i = 1; i < p->n_threads; i++) pthread_join(p->workers[i].thread, NULL);
    }
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    free(p->workers);
    free(p);
}

int kiln_pool_size(const kiln_pool *p) { return p->n_threads; }

/* Counts distinct (package, core) pairs in sysfs: SMT siblings share a core and would only contend for it. */
int kiln_physical_cores(void) {
    long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (n_cpu < 1) return 1;
    if (n_cpu > 4096) n_cpu = 4096;
    int (*seen)[2] = malloc(sizeof(int[2]) * (size_t)n_cpu);
    if (!seen) return (int)n_cpu;
    int n_seen = 0;
    for (long cpu = 0; cpu < n_cpu; cpu++) {
        int ids[2] = {-1, -1};
        const char *files[2] = {"physical_package_id", "core_id"};
        for (int f = 0; f < 2; f++) {
            char path[128];
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/topology/%s", cpu, files[f]);
            FILE *fp = fopen(path, "r");
            if (!fp) {
                free(seen);
                return (int)n_cpu;
            }
            if (fscanf(fp, "%d", &ids[f]) != 1) ids[f] = -1;
            fclose(fp);
        }
        int dup = 0;
        for (int i = 0; i < n_seen && !dup; i++) dup = seen[i][0] == ids[0] && seen[i][1] == ids[1];
        if (!dup) {
            seen[n_seen][0] = ids[0];
            seen[n_seen][1] = ids[1];
            n_seen++;
        }
    }
    free(seen);
    return n_seen > 0 ? n_seen : (int)n_cpu;
}

/* The continuous-batching scheduler: a FIFO queue, up to `parallel` running sequences, and a thread that runs one
 * step at a time. A step carries every decoding sequence's next token plus at most one chunk of one admitted
 * prompt, so a long prompt does not stall the streams already running. Finished and cancelled sequences leave
 * after the step that ends them; queued requests are admitted between steps while there is room. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/threadpool.h"
#include "engine/sched_internal.h"

#define DEFAULT_PARALLEL 4
#define DEFAULT_MAX_QUEUE 256
#define DEFAULT_CHUNK 64
#define MAX_SAMPLE_THREADS 8

struct kiln_sched {
    kiln_model *model;
    kiln_sched_params p;
    sched_exec *exec;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    bool stopping;
    sched_seq *queue_head, *queue_tail;
    int n_queued;
    sched_seq **running; /* [parallel], admission order */
    int n_running;
    int64_t next_id;
    kiln_sched_stats stats;
    sched_work *work;    /* [parallel] */
    kiln_pool *sample_pool; /* draws the step's tokens for several sequences at once */
};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

kiln_sched_params kiln_sched_default_params(void) {
    return (kiln_sched_params){.device = KILN_DEVICE_CPU};
}

bool kiln_sched_half_mode(const kiln_weights *w, kiln_gpu_f16 mode) {
    if (mode != KILN_GPU_F16_AUTO) return mode == KILN_GPU_F16_ON;
    const kiln_layer_role ffn[3] = {KILN_ROLE_FFN_GATE, KILN_ROLE_FFN_UP, KILN_ROLE_FFN_DOWN};
    for (int l = 0; l < w->n_layer; l++)
        for (int i = 0; i < 3; i++) {
            kiln_type t = w->layers[l].w[ffn[i]].type;
            if (t != KILN_TYPE_F16 && t != KILN_TYPE_BF16) return false;
        }
    return w->n_layer > 0;
}

/* ---- requests ---- */

static void seq_free(sched_seq *q) {
    if (!q) return;
    kiln_gen_free(&q->gen);
    for (int i = 0; i < q->params.n_stop; i++) free(q->stop[i]);
    free(q->stop);
    free(q->prompt);
    free(q);
}

/* Copies what the caller may free after submit (prompt, stop strings) and sets up sampling and streaming. */
static sched_seq *seq_new(kiln_sched *s, const kiln_sched_request *r, kiln_error *err) {
    const kiln_generate_params *gp = &r->params;
    if (r->n_prompt < 1 || !r->prompt) {
        kiln_fail(err, "empty prompt: nothing to continue");
        return NULL;
    }
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= s->model->cfg.n_vocab) {
            kiln_fail(err, "prompt token %d (id %d) is outside the vocabulary (%d)", i, r->prompt[i],
                      s->model->cfg.n_vocab);
            return NULL;
        }
    if (gp->n_stop < 0 || (gp->n_stop > 0 && !gp->stop)) {
        kiln_fail(err, "bad stop string list (%d strings)", gp->n_stop);
        return NULL;
    }
    sched_seq *q = calloc(1, sizeof *q);
    if (!q || !(q->prompt = malloc(sizeof *q->prompt * (size_t)r->n_prompt)) ||
        (gp->n_stop && !(q->stop = calloc((size_t)gp->n_stop, sizeof *q->stop)))) {
        seq_free(q);
        kiln_fail(err, "out of memory for a request");
        return NULL;
    }
    memcpy(q->prompt, r->prompt, sizeof *q->prompt * (size_t)r->n_prompt);
    q->n_prompt = r->n_prompt;
    q->req = *r;
    q->params = *gp;
    q->params.stop = (const char *const *)q->stop;
    for (int i = 0; i < gp->n_stop; i++) {
        q->params.n_stop = i;
        if (gp->stop[i] && !(q->stop[i] = strdup(gp->stop[i]))) {
            seq_free(q);
            kiln_fail(err, "out of memory for a request");
            return NULL;
        }
        q->params.n_stop = i + 1;
    }
    q->params.n_stop = gp->n_stop;
    if (kiln_gen_init(&q->gen, s->model, &q->params, s->p.n_ctx, q->prompt, q->n_prompt, r->on_token, r->user,
                      err)) {
        seq_free(q);
        return NULL;
    }
    return q;
}

/* Calls on_done and frees q. Lock not held (callbacks may submit or cancel). */
static void seq_done(sched_seq *q, const char *err) {
    if (q->req.on_done) q->req.on_done(&q->gen.res, err, q->req.user);
    seq_free(q);
}

int64_t kiln_sched_submit(kiln_sched *s, const kiln_sched_request *r, kiln_error *err) {
    sched_seq *q = seq_new(s, r, err);
    if (!q) return -1;
    pthread_mutex_lock(&s->lock);
    if (s->n_queued >= s->p.max_queue) {
        pthread_mutex_unlock(&s->lock);
        seq_free(q);
        return kiln_fail(err, "the queue is full (%d requests waiting)", s->p.max_queue);
    }
    q->id = s->next_id++;
    if (s->queue_tail) s->queue_tail->next_queued = q;
    else s->queue_head = q;
    s->queue_tail = q;
    s->n_queued++;
    int64_t id = q->id;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
    return id;
}

void kiln_sched_cancel(kiln_sched *s, int64_t id) {
    pthread_mutex_lock(&s->lock);
    for (sched_seq *q = s->queue_head; q; q = q->next_queued)
        if (q->id == id) q->cancelled = true;
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i]->id == id) s->running[i]->cancelled = true;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
}

void kiln_sched_get_info(const kiln_sched *s, kiln_sched_info *out) { s->exec->ops->info(s->exec, out); }

void kiln_sched_get_stats(kiln_sched *s, kiln_sched_stats *out) {
    pthread_mutex_lock(&s->lock);
    *out = s->stats;
    out->queued = s->n_queued;
    out->running = s->n_running;
    pthread_mutex_unlock(&s->lock);
}

/* ---- admission and leaving, lock held ---- */

/* Ends list is a singly linked list of sequences to report once the lock is released. */
static void push_ended(sched_seq **ended, sched_seq *q) {
    q->next_queued = *ended;
    *ended = q;
}

static void drop_cancelled_queued(kiln_sched *s, sched_seq **ended) {
    sched_seq **link = &s->queue_head, *prev = NULL;
    while (*link) {
        sched_seq *q = *link;
        if (!q->cancelled) {
            prev = q;
            link = &q->next_queued;
            continue;
        }
        *link = q->next_queued;
        if (s->queue_tail == q) s->queue_tail = prev;
        s->n_queued--;
        q->gen.res.finish = KILN_FINISH_CALLBACK;
        push_ended(ended, q);
    }
}

static void leave(kiln_sched *s, int i) {
    s->exec->ops->release(s->exec, s->running[i]);
    memmove(s->running + i, s->running + i + 1, sizeof *s->running * (size_t)(s->n_running - i - 1));
    s->n_running--;
}

static void drop_cancelled_running(kiln_sched *s, sched_seq **ended) {
    for (int i = 0; i < s->n_running;) {
        sched_seq *q = s->running[i];
        if (!q->cancelled) {
            i++;
            continue;
        }
        leave(s, i);
        q->gen.res.finish = KILN_FINISH_CALLBACK;
        push_ended(ended, q);
    }
}

/* Admits from the front of the queue (FIFO: a request that does not fit yet holds the ones behind it). */
static int admit(kiln_sched *s, kiln_error *err) {
    while (s->queue_head && s->n_running < s->p.parallel) {
        sched_seq *q = s->queue_head;
        int rc = s->exec->ops->admit(s->exec, q, err);
        if (rc < 0) return -1;
        if (rc > 0) break;
        s->queue_head = q->next_queued;
        if (!s->queue_head) s->queue_tail = NULL;
        s->n_queued--;
        q->next_queued = NULL;
        q->gen.res.n_cached = q->n_past;
        s->stats.prefix_tokens_reused += (uint64_t)q->n_past;
        q->t_admit = now_ms();
        s->running[s->n_running++] = q;
    }
    return 0;
}

/* ---- a step ---- */

/* The step's work: the first sequence still in its prompt gets a chunk (first in the batch), every decoding one its
 * next token. Returns the number of items. */
static int plan_step(kiln_sched *s) {
    int n = 0;
    for (int i = 0; i < s->n_running; i++) {
        sched_seq *q = s->running[i];
        if (q->n_past >= q->n_prompt) continue;
        int chunk = q->n_prompt - q->n_past < s->p.n_chunk ? q->n_prompt - q->n_past : s->p.n_chunk;
        s->work[n++] = (sched_work){.seq = q, .tokens = q->prompt + q->n_past, .n = chunk, .pos = q->n_past,
                                    .want_logits = q->n_past + chunk == q->n_prompt};
        break;
    }
    for (int i = 0; i < s->n_running; i++) {
        sched_seq *q = s->running[i];
        if (q->n_past < q->n_prompt) continue;
        s->work[n++] = (sched_work){.seq = q, .tokens = &q->next, .n = 1, .pos = q->n_past, .want_logits = true};
    }
    return n;
}

typedef struct sample_job {
    sched_work *work;
    int n_work;
    atomic_int next;
} sample_job;

/* Draws each work item's token on the pool's threads: a sequence's sampler touches only its own state, and with
 * vocabularies of 150k entries sampling 64 sequences one after the other would take longer than a GPU step. */
static void sample_work(void *arg, int ith, int nth) {
    sample_job *j = arg;
    (void)ith;
    (void)nth;
    int i;
    while ((i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n_work) {
        sched_work *w = &j->work[i];
        if (!w->want_logits) continue;
        kiln_gen *g = &w->seq->gen;
        w->info_wanted = g->params->sampling.n_top_logprobs > 0;
        w->sampled = w->n_best ? kiln_sampler_sample_candidates(g->sampler, w->best_ids, w->best_logits, w->n_best,
                                                                 w->window, w->window_logits, w->n_window)
                               : kiln_sampler_sample(g->sampler, w->logits, w->info_wanted ? &w->info : NULL);
    }
}

/* Takes a work item's sampled token (streaming, stop rules), in step order. Returns 1 when its sequence is
 * finished, 0 to go on, -1 on error. */
static int after_work(sched_work *w, kiln_error *err) {
    sched_seq *q = w->seq;
    q->n_past = w->pos + w->n;
    if (!w->want_logits) return 0;
    double t = now_ms();
    if (!q->t_first) {
        q->t_first = t;
        q->gen.res.prefill_ms = t - q->t_admit;
    }
    int rc = kiln_gen_take(&q->gen, w->sampled, w->info_wanted ? &w->info : NULL, q->n_past, &q->next, err);
    q->gen.res.decode_ms = now_ms() - q->t_first;
    return rc;
}

/* Marks a finished sequence for leaving: it is removed under the lock after the step. */
static void run_step(kiln_sched *s, int n_work, sched_seq **ended) {
    kiln_error err = {{0}};
    bool failed = s->exec->ops->run(s->exec, s->work, n_work, &err) != 0;
    if (!failed) {
        sample_job job = {.work = s->work, .n_work = n_work};
        kiln_pool_run(s->sample_pool, sample_work, &job);
    }
    for (int i = 0; i < n_work; i++) {
        sched_seq *q = s->work[i].seq;
        kiln_error e = {{0}};
        int rc = failed ? -1 : after_work(&s->work[i], &e);
        if (rc == 0) continue;
        pthread_mutex_lock(&s->lock);
        for (int k = 0; k < s->n_running; k++)
            if (s->running[k] == q) leave(s, k);
        pthread_mutex_unlock(&s->lock);
        if (rc < 0) {
            seq_done(q, failed ? err.msg : e.msg);
            continue;
        }
        push_ended(ended, q);
    }
}

static void report_ended(sched_seq *ended) {
    while (ended) {
        sched_seq *next = ended->next_queued;
        seq_done(ended, NULL);
        ended = next;
    }
}

static void *sched_main(void *arg) {
    kiln_sched *s = arg;
    for (;;) {
        sched_seq *ended = NULL;
        kiln_error err = {{0}};
        pthread_mutex_lock(&s->lock);
        drop_cancelled_queued(s, &ended);
        drop_cancelled_running(s, &ended);
        while (!s->stopping && !s->n_running && !s->queue_head && !ended) pthread_cond_wait(&s->wake, &s->lock);
        if (s->stopping) {
            pthread_mutex_unlock(&s->lock);
            report_ended(ended);
            return NULL;
        }
        sched_seq *failed = NULL;
        if (admit(s, &err)) { /* the front request cannot be placed at all: it fails, the rest go on */
            failed = s->queue_head;
            s->queue_head = failed->next_queued;
            if (!s->queue_head) s->queue_tail = NULL;
            s->n_queued--;
        }
        int n_work = plan_step(s);
        s->exec->ops->stats(s->exec, &s->stats); /* before on_done: a caller may look right after */
        pthread_mutex_unlock(&s->lock);
        report_ended(ended);
        if (failed) seq_done(failed, err.msg);
        ended = NULL;
        if (n_work) run_step(s, n_work, &ended);
        pthread_mutex_lock(&s->lock);
        if (n_work) s->stats.steps++;
        s->exec->ops->stats(s->exec, &s->stats);
        pthread_mutex_unlock(&s->lock);
        report_ended(ended);
    }
}

/* ---- life cycle ---- */

static int resolve_params(kiln_model *m, kiln_sched_params *p, kiln_error *err) {
    int train = m->cfg.n_ctx_train > 0 ? m->cfg.n_ctx_train : 4096;
    if (p->parallel <= 0) p->parallel = DEFAULT_PARALLEL;
    if (p->n_ctx <= 0) p->n_ctx = train < 4096 ? train : 4096;
    if (p->max_queue <= 0) p->max_queue = DEFAULT_MAX_QUEUE;
    if (p->n_chunk <= 0) p->n_chunk = DEFAULT_CHUNK;
    if (p->parallel > 1024) return kiln_fail(err, "--parallel %d is out of range (1..1024)", p->parallel);
    if (p->n_chunk % KILN_SCHED_CHUNK_ALIGN)
        return kiln_fail(err, "prompt chunk %d is not a multiple of %d", p->n_chunk, KILN_SCHED_CHUNK_ALIGN);
    return 0;
}

/* The batched forward on the GPU (AUTO: when one answers and runs the architecture), else on the CPU. */
static sched_exec *make_exec(kiln_model *m, const kiln_sched_params *p, kiln_error *err) {
    kiln_error probe = {{0}};
    bool gpu = p->device == KILN_DEVICE_CUDA ||
               (p->device == KILN_DEVICE_AUTO && m->cfg.arch->gpu && !kiln_cuda_probe(NULL, 0, &probe));
    return gpu ? kiln_sched_cuda_new(m, p, err) : kiln_sched_paged_new(m, p, err);
}

kiln_sched *kiln_sched_new(kiln_model *m, const kiln_sched_params *p, kiln_error *err) {
    kiln_sched *s = calloc(1, sizeof *s);
    if (!s) {
        kiln_fail(err, "out of memory");
        return NULL;
    }
    kiln_model_retain(m);
    s->model = m;
    s->p = p ? *p : kiln_sched_default_params();
    s->next_id = 1;
    if (resolve_params(m, &s->p, err)) goto fail;
    s->running = calloc((size_t)s->p.parallel, sizeof *s->running);
    s->work = calloc((size_t)s->p.parallel, sizeof *s->work);
    if (!s->running || !s->work) {
        kiln_fail(err, "out of memory");
        goto fail;
    }
    int n_sample = s->p.n_threads > 0 ? s->p.n_threads : kiln_physical_cores();
    n_sample = n_sample < MAX_SAMPLE_THREADS ? n_sample : MAX_SAMPLE_THREADS;
    if (kiln_pool_new(n_sample < s->p.parallel ? n_sample : s->p.parallel, &s->sample_pool, err)) goto fail;
    if (!(s->exec = make_exec(m, &s->p, err))) goto fail;
    s->exec->ops->stats(s->exec, &s->stats);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake, NULL);
    if (pthread_create(&s->thread, NULL, sched_main, s)) {
        kiln_fail(err, "cannot start the scheduler thread");
        pthread_mutex_destroy(&s->lock);
        pthread_cond_destroy(&s->wake);
        goto fail;
    }
    return s;
fail:
    if (s->exec) s->exec->ops->free(s->exec);
    kiln_pool_free(s->sample_pool);
    kiln_model_release(m);
    free(s->running);
    free(s->work);
    free(s);
    return NULL;
}

void kiln_sched_free(kiln_sched *s) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    while (s->n_running) {
        sched_seq *q = s->running[s->n_running - 1];
        leave(s, s->n_running - 1);
        q->gen.res.finish = KILN_FINISH_CALLBACK;
        seq_done(q, NULL);
    }
    while (s->queue_head) {
        sched_seq *q = s->queue_head;
        s->queue_head = q->next_queued;
        q->gen.res.finish = KILN_FINISH_CALLBACK;
        seq_done(q, NULL);
    }
    s->exec->ops->free(s->exec);
    kiln_pool_free(s->sample_pool);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->wake);
    kiln_model_release(s->model);
    free(s->running);
    free(s->work);
    free(s);
}

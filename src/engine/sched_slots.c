/* The simple executor: one context per running sequence (a slot), stepped one after another. It is the GPU's path
 * until the CUDA executor has a batched multi-sequence forward: every sequence still advances each step, but
 * weights are read once per sequence, not once per step. A slot keeps its tokens after a request, so the next
 * request placed there reuses the prefix they share. */
#include <stdlib.h>

#include "engine/sched_internal.h"

typedef struct slots_exec {
    sched_exec base;
    kiln_context **ctx;
    bool *busy;
    int n;
} slots_exec;

static int slots_admit(sched_exec *base, sched_seq *q, kiln_error *err) {
    slots_exec *x = (slots_exec *)base;
    (void)err;
    int best = -1, best_len = -1;
    for (int i = 0; i < x->n; i++) {
        if (x->busy[i]) continue;
        int len = kiln_ctx_reusable_prefix(x->ctx[i], q->prompt, q->n_prompt);
        if (len > best_len) best = i, best_len = len;
    }
    if (best < 0) return 1;
    x->busy[best] = true;
    q->exec = x->ctx[best];
    q->n_past = best_len;
    return 0;
}

static void slots_release(sched_exec *base, sched_seq *q) {
    slots_exec *x = (slots_exec *)base;
    for (int i = 0; i < x->n; i++)
        if (x->ctx[i] == q->exec) x->busy[i] = false;
    q->exec = NULL;
}

static int slots_run(sched_exec *base, sched_work *work, int n_work, kiln_error *err) {
    (void)base;
    for (int i = 0; i < n_work; i++) {
        kiln_context *c = work[i].seq->exec;
        if (kiln_ctx_eval(c, work[i].tokens, work[i].n, work[i].pos, NULL, false, err)) return -1;
        work[i].logits = c->logits;
    }
    return 0;
}

static void slots_stats(sched_exec *base, kiln_sched_stats *st) {
    slots_exec *x = (slots_exec *)base;
    st->kv_blocks_total = x->n;
    st->kv_block_size = x->n ? kiln_context_n_ctx(x->ctx[0]) : 0;
    st->kv_blocks_used = 0;
    for (int i = 0; i < x->n; i++) st->kv_blocks_used += x->busy[i];
}

static void slots_free(sched_exec *base) {
    slots_exec *x = (slots_exec *)base;
    for (int i = 0; i < x->n; i++) kiln_context_free(x->ctx[i]);
    free(x->ctx);
    free(x->busy);
    free(x);
}

static const sched_exec_ops SLOTS_OPS = {slots_admit, slots_release, slots_run, slots_stats, slots_free};

sched_exec *kiln_sched_slots_new(kiln_model *m, const kiln_sched_params *p, kiln_error *err) {
    slots_exec *x = calloc(1, sizeof *x);
    if (!x || !(x->ctx = calloc((size_t)p->parallel, sizeof *x->ctx)) ||
        !(x->busy = calloc((size_t)p->parallel, sizeof *x->busy))) {
        if (x) free(x->ctx);
        free(x);
        kiln_fail(err, "out of memory");
        return NULL;
    }
    x->base.ops = &SLOTS_OPS;
    kiln_context_params cp = kiln_context_default_params();
    cp.n_ctx = p->n_ctx;
    cp.n_threads = p->n_threads;
    cp.device = p->device;
    for (; x->n < p->parallel; x->n++) {
        char msg[KILN_ERROR_MAX];
        if (!(x->ctx[x->n] = kiln_context_new(m, &cp, msg, sizeof msg))) {
            kiln_fail(err, "%s", msg);
            slots_free(&x->base);
            return NULL;
        }
    }
    return &x->base;
}

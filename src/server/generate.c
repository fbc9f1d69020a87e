/* The two generation endpoints: parse, tokenize, check against the context, submit one scheduler request per
 * choice, then stream (stream.c) or wait and answer with the whole reply. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server_impl.h"

#define WAIT_SLICE_MS 200 /* how often a waiting connection checks that its client is still there */

static const char *token_text(void *ctx, int32_t token, size_t *len) {
    return kiln_model_token_text(ctx, token, len);
}

static int tokenize(const srv_server *s, const srv_request *r, int k, int32_t **ids, srv_error *e) {
    char err[512];
    char *rendered = NULL;
    const char *text = r->prompts[k];
    const char *param = r->endpoint == SRV_CHAT ? "messages" : "prompt";
    if (r->endpoint == SRV_CHAT) {
        rendered = kiln_chat_render(s->model, r->messages, (size_t)r->n_messages, true, err, sizeof err);
        if (!rendered) return srv_fail(e, 400, "messages", "invalid_value", "chat template: %s", err);
        text = rendered;
    }
    /* special-token text in a raw completion prompt becomes those tokens, as in the reference servers */
    int n = r->endpoint == SRV_CHAT ? kiln_tokenize_chat(s->model, text, NULL, 0, err, sizeof err)
                                    : kiln_tokenize_text(s->model, text, true, true, NULL, 0, err, sizeof err);
    *ids = n >= 0 ? malloc(sizeof **ids * (size_t)(n + 1)) : NULL;
    if (n >= 0 && *ids)
        n = r->endpoint == SRV_CHAT ? kiln_tokenize_chat(s->model, text, *ids, n, err, sizeof err)
                                    : kiln_tokenize_text(s->model, text, true, true, *ids, n, err, sizeof err);
    kiln_free(rendered);
    if (n < 0) return srv_fail(e, 400, param, "invalid_value", "tokenizing: %s", err);
    if (!*ids) return srv_fail(e, 500, NULL, NULL, "out of memory");
    if (n == 0) return srv_fail(e, 400, param, "invalid_value", "the prompt is empty");
    if (n >= s->n_ctx)
        return srv_fail(e, 400, param, "context_length_exceeded",
                        "the prompt is %d tokens; this server's context holds %d (prompt and completion together)",
                        n, s->n_ctx);
    if (r->max_tokens > 0 && n + r->max_tokens > s->n_ctx)
        return srv_fail(e, 400, "max_tokens", "context_length_exceeded",
                        "the context holds %d tokens, but %d were asked for (%d in the prompt, %d to generate)",
                        s->n_ctx, n + r->max_tokens, n, r->max_tokens);
    return n;
}

int srv_submit(srv_server *s, srv_job *j, int32_t *const *prompts, const int *n_prompts, const srv_request *r,
               srv_error *e) {
    kiln_sched_request q = {0};
    q.params = kiln_generate_default_params();
    q.params.max_tokens = r->max_tokens;
    q.params.stop = r->stop;
    q.params.n_stop = r->n_stop;
    q.params.sampling = r->sampling;
    q.on_token = srv_job_on_token;
    q.on_done = srv_job_on_done;
    int rc = 0, i = 0;
    pthread_rwlock_rdlock(&s->sched_lock);
    for (; i < j->n_choices; i++) {
        kiln_error err = {{0}};
        if (!s->sched) {
            rc = srv_fail(e, 503, NULL, "shutting_down", "the server is shutting down");
            break;
        }
        q.prompt = prompts[i];
        q.n_prompt = n_prompts[i];
        q.user = &j->choices[i];
        srv_job_ref(j);
        j->choices[i].id = kiln_sched_submit(s->sched, &q, &err);
        if (j->choices[i].id < 0) {
            srv_job_unref(j);
            rc = srv_fail(e, 503, NULL, "overloaded", "the server cannot take this request now: %s", err.msg);
            break;
        }
    }
    for (int k = 0; rc && k < i; k++) kiln_sched_cancel(s->sched, j->choices[k].id);
    pthread_rwlock_unlock(&s->sched_lock);
    for (int k = i; rc && k < j->n_choices; k++) srv_job_abandon(j, k, e->message);
    return rc;
}

void srv_cancel(srv_server *s, srv_job *j) {
    pthread_mutex_lock(&j->mu);
    j->cancel = true;
    pthread_mutex_unlock(&j->mu);
    pthread_rwlock_rdlock(&s->sched_lock);
    for (int i = 0; s->sched && i < j->n_choices; i++)
        if (j->choices[i].id > 0) kiln_sched_cancel(s->sched, j->choices[i].id);
    pthread_rwlock_unlock(&s->sched_lock);
}

void srv_make_id(char *id, size_t size, const char *prefix) {
    static __thread unsigned seed;
    if (!seed) seed = (unsigned)time(NULL) ^ (unsigned)(size_t)&seed;
    int n = snprintf(id, size, "%s-", prefix);
    for (int i = 0; i < 24 && (size_t)n + 1 < size; i++) id[n++] = "0123456789abcdef"[rand_r(&seed) & 15];
    id[n] = '\0';
}

/* Waits for every choice; false when the client left first (the job is cancelled then). */
static bool wait_done(srv_server *s, struct MHD_Connection *c, srv_job *j) {
    pthread_mutex_lock(&j->mu);
    while (j->n_done < j->n_choices) {
        pthread_mutex_unlock(&j->mu);
        if (srv_client_gone(c)) {
            srv_cancel(s, j);
            return false;
        }
        pthread_mutex_lock(&j->mu);
        if (j->n_done < j->n_choices) srv_job_wait_locked(j, WAIT_SLICE_MS);
    }
    pthread_mutex_unlock(&j->mu);
    return true;
}

static enum MHD_Result reply(srv_server *s, struct MHD_Connection *c, srv_conn *cc, srv_job *j,
                             const srv_reply_meta *meta) {
    if (!wait_done(s, c, j)) return MHD_NO;
    srv_usage u = {0, 0};
    for (int i = 0; i < j->n_choices; i++) {
        const srv_choice *ch = &j->choices[i];
        if (ch->failed) {
            srv_error e;
            srv_fail(&e, 500, NULL, "generation_failed", "generating: %s", ch->err);
            return srv_send_error(s, c, cc, &e);
        }
        u.prompt_tokens += ch->result.n_prompt;
        u.completion_tokens += ch->result.n_generated;
    }
    srv_metrics_count_tokens(&s->metrics, u.prompt_tokens, u.completion_tokens);
    return srv_send(s, c, cc, 200, NULL, srv_reply_json(meta, j->choices, j->n_choices, &u));
}

enum MHD_Result srv_handle_generate(srv_server *s, struct MHD_Connection *c, srv_conn *cc, srv_endpoint ep) {
    srv_request r;
    srv_error e;
    int32_t *ids[SRV_MAX_PROMPTS] = {0};
    int n_ids[SRV_MAX_PROMPTS] = {0};
    srv_job *j = NULL;
    enum MHD_Result ret;
    if (srv_request_parse(&r, ep, cc->body ? cc->body : "", cc->len, s->n_ctx, &e)) goto fail;
    if (ep == SRV_CHAT) r.n_prompts = 1;
    for (int k = 0; k < r.n_prompts; k++)
        if ((n_ids[k] = tokenize(s, &r, k, &ids[k], &e)) < 0) goto fail;
    if (!(j = srv_job_new(r.n_prompts, &s->metrics))) {
        srv_fail(&e, 500, NULL, NULL, "out of memory");
        goto fail;
    }
    if (srv_submit(s, j, ids, n_ids, &r, &e)) goto fail;
    for (int k = 0; k < r.n_prompts; k++) free(ids[k]);
    char id[64];
    srv_make_id(id, sizeof id, ep == SRV_CHAT ? "chatcmpl" : "cmpl");
    srv_reply_meta meta = {ep, id, (long long)time(NULL), s->opt.model_id, r.logprobs, r.top_logprobs, token_text,
                           s->model};
    if (r.stream) return srv_stream(s, c, cc, j, &r, &meta);
    ret = reply(s, c, cc, j, &meta);
    srv_job_unref(j);
    srv_request_free(&r);
    return ret;
fail:
    for (int k = 0; k < SRV_MAX_PROMPTS; k++) free(ids[k]);
    if (j) srv_job_unref(j);
    srv_request_free(&r);
    return srv_send_error(s, c, cc, &e);
}

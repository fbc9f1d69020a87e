/* Streaming: an SSE response whose content reader turns what the scheduler appended to the job into chunks,
 * one per token, in OpenAI's order (the role first for chat, each choice's finish_reason last, the usage chunk when
 * asked, then [DONE]). The reader runs on the connection's own thread and may block there; it waits in short
 * slices so that a client that went away is noticed even while its request is still queued. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_impl.h"

#define WAIT_SLICE_MS 200

typedef struct stream_choice {
    bool role_sent, finish_sent;
    int sent; /* pieces turned into chunks */
} stream_choice;

typedef struct srv_stream_state {
    srv_server *srv;
    struct MHD_Connection *conn;
    srv_job *job;
    srv_request req; /* owns the stop strings the meta and the job do not need, kept for its lifetime */
    srv_reply_meta meta;
    char id[64];
    stream_choice *choices;
    bool finished; /* [DONE] queued */
    char *out;     /* SSE text not yet handed to MHD */
    size_t out_len, out_pos, out_cap;
    srv_usage usage;
} srv_stream_state;

static int emit(srv_stream_state *st, char *chunk) {
    if (!chunk) return -1;
    size_t n = strlen(chunk);
    if (st->out_len + n > st->out_cap) {
        size_t cap = st->out_cap * 2 + n;
        char *o = realloc(st->out, cap);
        if (!o) {
            free(chunk);
            return -1;
        }
        st->out = o;
        st->out_cap = cap;
    }
    memcpy(st->out + st->out_len, chunk, n);
    st->out_len += n;
    free(chunk);
    return 0;
}

static int emit_error(srv_stream_state *st, const char *why) {
    srv_error e;
    srv_fail(&e, 500, NULL, "generation_failed", "generating: %s", why);
    char *body = srv_error_json(&e);
    if (!body) return -1;
    size_t n = strlen(body);
    char *chunk = malloc(n + 9);
    if (chunk) {
        memcpy(chunk, "data: ", 6);
        memcpy(chunk + 6, body, n + 1);
        memcpy(chunk + 6 + n, "\n\n", 3);
    }
    free(body);
    return emit(st, chunk);
}

/* With the job locked: chunks for everything new in choice i. */
static int drain_choice(srv_stream_state *st, int i) {
    const srv_choice *c = &st->job->choices[i];
    stream_choice *sc = &st->choices[i];
    bool usage_null = st->req.include_usage;
    if (!sc->role_sent && st->meta.endpoint == SRV_CHAT) {
        if (emit(st, srv_chunk_role(&st->meta, i, usage_null))) return -1;
    }
    sc->role_sent = true;
    for (; sc->sent < c->n_pieces; sc->sent++) {
        const srv_piece *p = &c->pieces[sc->sent];
        bool has_logprob = st->meta.logprobs && p->token >= 0;
        if (!p->len && !has_logprob) continue;
        if (emit(st, srv_chunk_piece(&st->meta, i, c->text + p->off, p, usage_null))) return -1;
    }
    if (c->done && !sc->finish_sent) {
        sc->finish_sent = true;
        st->usage.prompt_tokens += c->result.n_prompt;
        st->usage.completion_tokens += c->result.n_generated;
        if (c->failed && !st->job->cancel) return emit_error(st, c->err);
        return emit(st, srv_chunk_finish(&st->meta, i, srv_finish_reason(c->result.finish), usage_null));
    }
    return 0;
}

/* With the job locked: chunks for everything new; the closing ones once every choice is done. */
static int drain(srv_stream_state *st) {
    srv_job *j = st->job;
    for (int i = 0; i < j->n_choices; i++)
        if (drain_choice(st, i)) return -1;
    if (j->n_done < j->n_choices) return 0;
    srv_metrics_count_tokens(&st->srv->metrics, st->usage.prompt_tokens, st->usage.completion_tokens);
    if (st->req.include_usage && emit(st, srv_chunk_usage(&st->meta, &st->usage))) return -1;
    st->finished = true;
    char *done = strdup(SRV_SSE_DONE);
    return emit(st, done);
}

static ssize_t read_stream(void *cls, uint64_t pos, char *buf, size_t max) {
    srv_stream_state *st = cls;
    while (st->out_pos == st->out_len) {
        if (st->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        st->out_pos = st->out_len = 0;
        pthread_mutex_lock(&st->job->mu);
        int rc = drain(st);
        if (!rc && st->out_len == 0) srv_job_wait_locked(st->job, WAIT_SLICE_MS);
        pthread_mutex_unlock(&st->job->mu);
        if (rc) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (st->out_len == 0 && srv_client_gone(st->conn)) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = st->out_len - st->out_pos < max ? st->out_len - st->out_pos : max;
    memcpy(buf, st->out + st->out_pos, n);
    st->out_pos += n;
    return (ssize_t)n;
}

/* MHD is done with the response: finished, or the connection failed; in the latter case stop generating. */
static void free_stream(void *cls) {
    srv_stream_state *st = cls;
    if (!st->finished) srv_cancel(st->srv, st->job);
    srv_job_unref(st->job);
    srv_request_free(&st->req);
    free(st->choices);
    free(st->out);
    free(st);
}

enum MHD_Result srv_stream(srv_server *s, struct MHD_Connection *c, srv_conn *cc, srv_job *j, srv_request *r,
                           const srv_reply_meta *meta) {
    srv_stream_state *st = calloc(1, sizeof *st);
    stream_choice *choices = calloc((size_t)j->n_choices, sizeof *choices);
    struct MHD_Response *resp = NULL;
    if (st && choices)
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, read_stream, st, free_stream);
    if (!resp) {
        free(st);
        free(choices);
        srv_cancel(s, j);
        srv_job_unref(j);
        srv_request_free(r);
        return MHD_NO;
    }
    st->srv = s;
    st->conn = c;
    st->job = j;
    st->req = *r;
    st->meta = *meta;
    snprintf(st->id, sizeof st->id, "%s", meta->id);
    st->meta.id = st->id;
    st->choices = choices;
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    srv_add_common_headers(s, resp);
    enum MHD_Result ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    srv_metrics_count_request(&s->metrics, cc->route, 200);
    return ret;
}

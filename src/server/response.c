#include "server/response.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer/utf8.h"

/* A JSON string of n bytes, each invalid UTF-8 sequence replaced by U+FFFD (jansson refuses invalid UTF-8). */
static json_t *text_json(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = kiln_utf8_strict_len(s + i, n - i, &cp);
        if (k == 0 || k == KILN_UTF8_INCOMPLETE) break;
        i += k;
    }
    if (i == n) return json_stringn(s, n);
    char *clean = malloc(3 * n + 1);
    if (!clean) return NULL;
    size_t len = 0;
    for (i = 0; i < n;) {
        uint32_t cp;
        size_t k = kiln_utf8_strict_len(s + i, n - i, &cp);
        if (k == 0 || k == KILN_UTF8_INCOMPLETE) {
            memcpy(clean + len, "\xEF\xBF\xBD", 3);
            len += 3;
            i++;
        } else {
            memcpy(clean + len, s + i, k);
            len += k;
            i += k;
        }
    }
    json_t *j = json_stringn(clean, len);
    free(clean);
    return j;
}

static char *dump(json_t *j) {
    if (!j) return NULL;
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

char *srv_error_json(const srv_error *e) {
    /* the message may quote the client's bytes (a JSON parse error, a role), cut anywhere */
    json_t *message = text_json(e->message, strlen(e->message));
    return dump(json_pack("{s:{s:o, s:s, s:s?, s:s?}}", "error", "message", message, "type", srv_error_type(e->status),
                          "param", e->param[0] ? e->param : NULL, "code", e->code));
}

const char *srv_finish_reason(kiln_finish f) {
    return f == KILN_FINISH_LENGTH ? "length" : "stop";
}

static int shown_top(const srv_reply_meta *m, const srv_piece *p) {
    return p->n_top < m->top_logprobs ? p->n_top : m->top_logprobs;
}

/* {"token", "logprob", "bytes"} (chat) for one token id. */
static json_t *token_logprob(const srv_reply_meta *m, int32_t token, float logprob) {
    size_t len = 0;
    const char *t = m->token_text ? m->token_text(m->token_ctx, token, &len) : NULL;
    if (!t) len = 0;
    json_t *bytes = json_array();
    for (size_t i = 0; i < len; i++) json_array_append_new(bytes, json_integer((unsigned char)t[i]));
    return json_pack("{s:o, s:f, s:o}", "token", text_json(t ? t : "", len), "logprob", (double)logprob, "bytes",
                     bytes);
}

static json_t *chat_piece_logprob(const srv_reply_meta *m, const srv_piece *p) {
    json_t *o = token_logprob(m, p->token, p->logprob);
    json_t *top = json_array();
    for (int k = 0; k < shown_top(m, p); k++)
        json_array_append_new(top, token_logprob(m, p->top_tokens[k], p->top_logprobs[k]));
    json_object_set_new(o, "top_logprobs", top);
    return o;
}

/* Chat: {"content": [per token]}. Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}. */
static json_t *logprobs_json(const srv_reply_meta *m, const srv_piece *pieces, int n) {
    if (!m->logprobs) return json_null();
    if (m->endpoint == SRV_CHAT) {
        json_t *content = json_array();
        for (int i = 0; i < n; i++)
            if (pieces[i].token >= 0) json_array_append_new(content, chat_piece_logprob(m, &pieces[i]));
        return json_pack("{s:o}", "content", content);
    }
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (int i = 0; i < n; i++) {
        const srv_piece *p = &pieces[i];
        if (p->token < 0) continue;
        size_t len = 0;
        const char *t = m->token_text ? m->token_text(m->token_ctx, p->token, &len) : NULL;
        json_array_append_new(tokens, text_json(t ? t : "", t ? len : 0));
        json_array_append_new(lps, json_real(p->logprob));
        json_t *top = json_object();
        for (int k = 0; k < shown_top(m, p); k++) {
            const char *tt = m->token_text ? m->token_text(m->token_ctx, p->top_tokens[k], &len) : NULL;
            json_t *key = text_json(tt ? tt : "", tt ? len : 0);
            if (key) json_object_set_new(top, json_string_value(key), json_real(p->top_logprobs[k]));
            json_decref(key);
        }
        json_array_append_new(tops, top);
        json_array_append_new(offs, json_integer((json_int_t)p->off));
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offs);
}

static json_t *usage_json(const srv_usage *u) {
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", u->prompt_tokens, "completion_tokens",
                     u->completion_tokens, "total_tokens", u->prompt_tokens + u->completion_tokens);
}

static json_t *envelope(const srv_reply_meta *m, const char *object, json_t *choices) {
    return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", m->id, "object", object, "created", (json_int_t)m->created,
                     "model", m->model, "choices", choices);
}

static json_t *reply_choice(const srv_reply_meta *m, const srv_choice *c) {
    json_t *text = text_json(c->text ? c->text : "", c->len);
    json_t *lp = logprobs_json(m, c->pieces, c->n_pieces);
    const char *finish = srv_finish_reason(c->result.finish);
    if (m->endpoint == SRV_CHAT)
        return json_pack("{s:i, s:{s:s, s:o}, s:o, s:s}", "index", c->index, "message", "role", "assistant",
                         "content", text, "logprobs", lp, "finish_reason", finish);
    return json_pack("{s:i, s:o, s:o, s:s}", "index", c->index, "text", text, "logprobs", lp, "finish_reason",
                     finish);
}

char *srv_reply_json(const srv_reply_meta *m, const srv_choice *choices, int n, const srv_usage *u) {
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(arr, reply_choice(m, &choices[i]));
    json_t *o = envelope(m, m->endpoint == SRV_CHAT ? "chat.completion" : "text_completion", arr);
    if (o) json_object_set_new(o, "usage", usage_json(u));
    return dump(o);
}

/* "data: <json>\n\n", one Server-Sent Event. */
static char *sse_frame(json_t *o) {
    char *body = dump(o);
    if (!body) return NULL;
    size_t n = strlen(body);
    char *out = malloc(n + 9);
    if (out) {
        memcpy(out, "data: ", 6);
        memcpy(out + 6, body, n);
        memcpy(out + 6 + n, "\n\n", 3);
    }
    free(body);
    return out;
}

static const char *chunk_object(const srv_reply_meta *m) {
    return m->endpoint == SRV_CHAT ? "chat.completion.chunk" : "text_completion";
}

/* A chunk with one choice. */
static char *sse(const srv_reply_meta *m, json_t *choice, bool usage_null) {
    json_t *choices = json_array();
    if (choice) json_array_append_new(choices, choice);
    json_t *o = envelope(m, chunk_object(m), choices);
    if (o && usage_null) json_object_set_new(o, "usage", json_null());
    return sse_frame(o);
}

static json_t *chunk_choice(const srv_reply_meta *m, int index, json_t *delta_or_text, json_t *lp, const char *finish) {
    json_t *fin = finish ? json_string(finish) : json_null();
    if (m->endpoint == SRV_CHAT)
        return json_pack("{s:i, s:o, s:o, s:o}", "index", index, "delta", delta_or_text, "logprobs", lp,
                         "finish_reason", fin);
    return json_pack("{s:i, s:o, s:o, s:o}", "index", index, "text", delta_or_text, "logprobs", lp, "finish_reason",
                     fin);
}

char *srv_chunk_role(const srv_reply_meta *m, int index, bool usage_null) {
    json_t *delta = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
    return sse(m, chunk_choice(m, index, delta, json_null(), NULL), usage_null);
}

char *srv_chunk_piece(const srv_reply_meta *m, int index, const char *text, const srv_piece *p, bool usage_null) {
    json_t *t = text_json(text, p->len);
    json_t *body = m->endpoint == SRV_CHAT ? json_pack("{s:o}", "content", t) : t;
    json_t *lp = p->token >= 0 ? logprobs_json(m, p, 1) : json_null();
    return sse(m, chunk_choice(m, index, body, lp, NULL), usage_null);
}

char *srv_chunk_finish(const srv_reply_meta *m, int index, const char *finish, bool usage_null) {
    json_t *body = m->endpoint == SRV_CHAT ? json_object() : json_string("");
    return sse(m, chunk_choice(m, index, body, json_null(), finish), usage_null);
}

char *srv_chunk_usage(const srv_reply_meta *m, const srv_usage *u) {
    json_t *o = envelope(m, chunk_object(m), json_array());
    if (o) json_object_set_new(o, "usage", usage_json(u));
    return sse_frame(o);
}

char *srv_models_json(const char *model, long long created) {
    return dump(json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id", model, "object",
                          "model", "created", (json_int_t)created, "owned_by", "kiln"));
}

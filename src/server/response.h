/* Response bodies in OpenAI's shapes: errors, chat.completion / text_completion objects, their streamed chunks
 * (Server-Sent Events, "data: {...}\n\n"), and the model list. Every function returns a malloc'd string (NULL when
 * out of memory). Text that is not valid UTF-8 (a byte-level token alone) has the bad bytes replaced by U+FFFD. */
#ifndef KILN_SERVER_RESPONSE_H
#define KILN_SERVER_RESPONSE_H

#include <stdbool.h>
#include <stddef.h>

#include "server/api_error.h"
#include "server/job.h"
#include "server/request.h"

/* A token's text, for log-probabilities (NULL for an unknown id). */
typedef const char *(*srv_token_text_fn)(void *ctx, int32_t token, size_t *len);

typedef struct srv_reply_meta {
    srv_endpoint endpoint;
    const char *id;    /* "chatcmpl-..." or "cmpl-..." */
    long long created; /* Unix seconds */
    const char *model;
    bool logprobs;
    int top_logprobs; /* alternatives shown per token */
    srv_token_text_fn token_text;
    void *token_ctx;
} srv_reply_meta;

typedef struct srv_usage {
    int prompt_tokens, completion_tokens;
} srv_usage;

char *srv_error_json(const srv_error *e);

/* "stop" or "length" for a finished choice. */
const char *srv_finish_reason(kiln_finish f);

/* The whole non-streamed answer over n choices (each done). */
char *srv_reply_json(const srv_reply_meta *m, const srv_choice *choices, int n, const srv_usage *u);

/* Streamed chunks. usage_null: the chunk carries "usage": null (stream_options.include_usage asks for it). */
char *srv_chunk_role(const srv_reply_meta *m, int index, bool usage_null);
char *srv_chunk_piece(const srv_reply_meta *m, int index, const char *text, const srv_piece *p, bool usage_null);
char *srv_chunk_finish(const srv_reply_meta *m, int index, const char *finish, bool usage_null);
char *srv_chunk_usage(const srv_reply_meta *m, const srv_usage *u);
#define SRV_SSE_DONE "data: [DONE]\n\n"

char *srv_models_json(const char *model, long long created);

#endif

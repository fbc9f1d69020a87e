/* A generation request's JSON body, parsed and checked: /v1/chat/completions or /v1/completions in OpenAI's shape
 * (plus kiln's top_k, min_p, repeat_penalty). Every error names the field at fault. Needs no model: what depends on
 * the model (the chat template, the prompt's length in tokens) is checked when the request is tokenized. */
#ifndef KILN_SERVER_REQUEST_H
#define KILN_SERVER_REQUEST_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "kiln.h"
#include "server/api_error.h"

#define SRV_MAX_STOP 16
#define SRV_MAX_PROMPTS 64

typedef enum srv_endpoint { SRV_CHAT, SRV_COMPLETION } srv_endpoint;

typedef struct srv_request {
    srv_endpoint endpoint;
    json_t *root;           /* owns the strings below */
    kiln_message *messages; /* chat */
    char **owned;           /* per message: content joined from text parts, or NULL when borrowed from root */
    int n_messages;
    const char *prompts[SRV_MAX_PROMPTS]; /* completions: each prompt is one choice */
    int n_prompts;
    bool stream, include_usage;
    int max_tokens;         /* -1: until the model stops or the context is full */
    bool logprobs;
    int top_logprobs;
    kiln_sampling_params sampling;
    const char *stop[SRV_MAX_STOP];
    int n_stop;
} srv_request;

/* Parses body. max_tokens_limit bounds max_tokens (the context size). Returns 0, or -1 with e filled (status 400);
 * r needs srv_request_free either way. */
int srv_request_parse(srv_request *r, srv_endpoint ep, const char *body, size_t len, int max_tokens_limit,
                      srv_error *e);
void srv_request_free(srv_request *r);

#endif

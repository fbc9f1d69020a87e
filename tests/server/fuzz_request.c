/* libFuzzer target for what a client controls: the method, the path and the body. Any input either routes or gets
 * 404/405, and either parses into a request or fails with status 400, a param and a message; a parsed request's
 * strings then go through the response builders (text not valid UTF-8 included), all without a crash, a leak or
 * undefined behaviour, and every body built is valid JSON.
 *
 * Input: byte 0 = flags (bit 0: completions instead of chat, bit 1: logprobs in the replies), then "METHOD PATH\n",
 * then the body. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "server/request.h"
#include "server/response.h"
#include "server/route.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *token_text(void *ctx, int32_t token, size_t *len) {
    const srv_request *r = ctx;
    const char *s = r->n_stop ? r->stop[token % r->n_stop] : "\xc3";
    *len = strlen(s);
    return s;
}

static void check_json(char *s, bool sse) {
    if (!s) abort();
    const char *body = sse ? s + 6 : s;
    size_t n = strlen(body) - (sse ? 2 : 0);
    json_t *j = json_loadb(body, n, 0, NULL);
    if (!j) abort();
    json_decref(j);
    free(s);
}

static void route(const char *line) {
    char method[32] = "", path[256] = "";
    const char *sp = strchr(line, ' ');
    if (!sp || (size_t)(sp - line) >= sizeof method) return;
    memcpy(method, line, (size_t)(sp - line));
    strncpy(path, sp + 1, sizeof path - 1);
    srv_error e;
    memset(&e, 0, sizeof e);
    if (!srv_route_find(method, path, &e) && e.status != 404 && e.status != 405) abort();
    srv_bearer_matches(path, method);
}

/* Builds every kind of reply from the parsed request's own strings. */
static void respond(const srv_request *r, bool logprobs) {
    const char *text = r->endpoint == SRV_CHAT ? r->messages[r->n_messages - 1].content : r->prompts[0];
    srv_piece p = {.token = 1, .off = 0, .len = strlen(text), .logprob = -1, .n_top = 2, .top_tokens = {0, 3}};
    srv_choice c = {.text = (char *)text, .len = p.len, .pieces = &p, .n_pieces = 1, .done = true};
    srv_reply_meta m = {r->endpoint, "id-1", 1, text, logprobs, 2, token_text, (void *)r};
    srv_usage u = {1, 2};
    check_json(srv_reply_json(&m, &c, 1, &u), false);
    check_json(srv_chunk_role(&m, 0, r->include_usage), true);
    check_json(srv_chunk_piece(&m, 0, text, &p, r->include_usage), true);
    check_json(srv_chunk_finish(&m, 0, "stop", false), true);
    check_json(srv_chunk_usage(&m, &u), true);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *rest = (const char *)data + 1;
    size_t n = size - 1;
    const char *nl = memchr(rest, '\n', n);
    if (nl) {
        char *line = strndup(rest, (size_t)(nl - rest));
        route(line);
        free(line);
        n -= (size_t)(nl - rest) + 1;
        rest = nl + 1;
    }
    srv_request r;
    srv_error e;
    memset(&e, 0, sizeof e);
    if (srv_request_parse(&r, (data[0] & 1) ? SRV_COMPLETION : SRV_CHAT, rest, n, 4096, &e) == 0) {
        respond(&r, data[0] & 2);
    } else {
        if (e.status != 400 && e.status != 500) abort();
        if (!e.message[0]) abort();
        check_json(srv_error_json(&e), false);
    }
    srv_request_free(&r);
    return 0;
}

#include "server/route.h"

#include <stddef.h>
#include <string.h>
#include <strings.h>

static const srv_route ROUTES[] = {
    {"/v1/chat/completions", "POST", SRV_H_CHAT, false},
    {"/v1/completions", "POST", SRV_H_COMPLETION, false},
    {"/v1/models", "GET", SRV_H_MODELS, false},
    {"/metrics", "GET", SRV_H_METRICS, false},
    {"/health", "GET", SRV_H_HEALTH, true},
    {"/", "GET", SRV_H_PAGE, true},
};
#define N_ROUTES (sizeof ROUTES / sizeof ROUTES[0])

const srv_route *srv_route_of_path(const char *path) {
    for (size_t i = 0; i < N_ROUTES; i++)
        if (!strcmp(path, ROUTES[i].path)) return &ROUTES[i];
    return NULL;
}

const srv_route *srv_route_find(const char *method, const char *path, srv_error *e) {
    const srv_route *r = srv_route_of_path(path);
    if (r && !strcmp(method, r->method)) return r;
    if (r)
        srv_fail(e, 405, NULL, "method_not_allowed", "%.16s %s is not supported; use %s", method, path, r->method);
    else
        srv_fail(e, 404, NULL, "unknown_url", "unknown URL: %.16s %.200s", method, path);
    return NULL;
}

bool srv_bearer_matches(const char *header, const char *key) {
    if (!header || strncasecmp(header, "Bearer ", 7)) return false;
    const char *given = header + 7;
    while (*given == ' ') given++;
    size_t a = strlen(given), b = strlen(key);
    unsigned diff = a != b;
    for (size_t i = 0; i < b; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < a ? given[i] : 0);
    return diff == 0;
}

/* The URL table and the API-key check: which handler a method and path reach, and who may. No sockets here, so the
 * fuzzer drives it with the request parser. */
#ifndef KILN_SERVER_ROUTE_H
#define KILN_SERVER_ROUTE_H

#include <stdbool.h>

#include "server/api_error.h"

typedef enum srv_handler {
    SRV_H_CHAT,
    SRV_H_COMPLETION,
    SRV_H_MODELS,
    SRV_H_METRICS,
    SRV_H_HEALTH,
    SRV_H_PAGE,
} srv_handler;

typedef struct srv_route {
    const char *path;
    const char *method;
    srv_handler handler;
    bool public_route; /* answered without the API key */
} srv_route;

/* The route for path alone (NULL if none): the label its requests are counted under. */
const srv_route *srv_route_of_path(const char *path);
/* The route for method and path, or NULL with e filled: 404 for an unknown path, 405 for a known one asked with
 * another method. */
const srv_route *srv_route_find(const char *method, const char *path, srv_error *e);

/* Whether an Authorization header value ("Bearer KEY") carries key; compares in time that depends only on the
 * key's length, not on where the first difference is. header may be NULL. */
bool srv_bearer_matches(const char *header, const char *key);

#endif

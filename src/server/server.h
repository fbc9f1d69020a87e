/* kiln's HTTP server: the OpenAI-compatible API over one model, requests batched by the scheduler. */
#ifndef KILN_SERVER_SERVER_H
#define KILN_SERVER_SERVER_H

#include <stddef.h>

#include "engine/scheduler.h"
#include "kiln.h"
#include "util/error.h"

typedef struct srv_options {
    const char *host;        /* address to bind; NULL: 127.0.0.1 */
    int port;                /* 0: any free port (srv_port says which) */
    const char *api_key;     /* NULL: no authentication */
    const char *cors_origin; /* NULL: no CORS headers */
    const char *model_id;    /* the model's name in responses and /v1/models */
    size_t max_body;         /* bytes; larger bodies get 413 */
} srv_options;

typedef struct srv_server srv_server;

/* Starts the scheduler over m (which must outlive the server) and the HTTP daemon. */
srv_server *srv_start(kiln_model *m, const kiln_sched_params *sp, const srv_options *o, kiln_error *err);
int srv_port(const srv_server *s);
/* Where the scheduler runs and the memory it holds there (for the start-up line). */
void srv_info(srv_server *s, kiln_sched_info *out);
/* Stops accepting connections, cancels what is queued or running (their clients get what was generated so far),
 * waits for the connections to end, and frees everything. */
void srv_stop(srv_server *s);

#endif

/* The server's shared state, for its own files (server.c, get_routes.c, generate.c, stream.c). */
#ifndef KILN_SERVER_SERVER_IMPL_H
#define KILN_SERVER_SERVER_IMPL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdbool.h>

#include "server/api_error.h"
#include "server/job.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/response.h"
#include "server/route.h"
#include "server/server.h"

struct srv_server {
    kiln_model *model;
    srv_options opt;
    int n_ctx;
    struct MHD_Daemon *daemon;
    int port;
    /* Guards sched: connection threads submit and cancel under the read lock; srv_stop frees it under the write
     * lock and leaves NULL, so no call reaches a freed scheduler. */
    pthread_rwlock_t sched_lock;
    kiln_sched *sched;
    srv_metrics metrics;
    /* Generation requests whose response is not yet sent: srv_stop lets them finish before closing connections. */
    pthread_mutex_t active_mu;
    pthread_cond_t active_cv;
    int active;
};

/* One connection's request while its body arrives. */
typedef struct srv_conn {
    char *body;
    size_t len, cap;
    bool too_large;
    const char *route; /* for metrics */
    bool active;       /* counted in srv_server.active until the response is sent */
} srv_conn;

/* Queues a response with the standard headers (JSON or the given type, CORS) and counts it. */
enum MHD_Result srv_send(srv_server *s, struct MHD_Connection *c, srv_conn *cc, int status, const char *type,
                         char *body_owned);
enum MHD_Result srv_send_error(srv_server *s, struct MHD_Connection *c, srv_conn *cc, const srv_error *e);
void srv_add_common_headers(srv_server *s, struct MHD_Response *r);

/* True once the client closed its end of the connection. */
bool srv_client_gone(struct MHD_Connection *c);

/* POST /v1/chat/completions and /v1/completions with the body complete. */
enum MHD_Result srv_handle_generate(srv_server *s, struct MHD_Connection *c, srv_conn *cc, srv_endpoint ep);
/* The GET routes: /health, /v1/models, /metrics, / */
enum MHD_Result srv_handle_get(srv_server *s, struct MHD_Connection *c, srv_conn *cc, srv_handler h);

/* Submits a job's choices (prompts[i] → choice i); -1 with e filled (and the job's choices abandoned). */
int srv_submit(srv_server *s, srv_job *j, int32_t *const *prompts, const int *n_prompts, const srv_request *r,
               srv_error *e);
/* Cancels every choice of a job (the client went away). */
void srv_cancel(srv_server *s, srv_job *j);

/* Starts the SSE response of a submitted job; takes over the job and request. */
enum MHD_Result srv_stream(srv_server *s, struct MHD_Connection *c, srv_conn *cc, srv_job *j, srv_request *r,
                           const srv_reply_meta *meta);

/* Fills id with "<prefix>-" and 24 random hex digits. */
void srv_make_id(char *id, size_t size, const char *prefix);

#endif

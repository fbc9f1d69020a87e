/* libmicrohttpd set-up, routing, authentication and the response helpers. One thread per connection: a request
 * that waits for generation blocks only its own thread. */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/server_impl.h"

void srv_add_common_headers(srv_server *s, struct MHD_Response *r) {
    if (!s->opt.cors_origin) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", s->opt.cors_origin);
    MHD_add_response_header(r, "Vary", "Origin");
}

enum MHD_Result srv_send(srv_server *s, struct MHD_Connection *c, srv_conn *cc, int status, const char *type,
                         char *body_owned) {
    if (!body_owned) {
        srv_error e;
        srv_fail(&e, 500, NULL, NULL, "out of memory");
        return srv_send_error(s, c, cc, &e);
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body_owned), body_owned, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body_owned);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type ? type : "application/json");
    srv_add_common_headers(s, r);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    srv_metrics_count_request(&s->metrics, cc->route, status);
    return ret;
}

enum MHD_Result srv_send_error(srv_server *s, struct MHD_Connection *c, srv_conn *cc, const srv_error *e) {
    char *body = srv_error_json(e);
    if (!body) body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}");
    if (!body) return MHD_NO;
    return srv_send(s, c, cc, e->status, NULL, body);
}

bool srv_client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return true;
    char byte;
    ssize_t n = recv(ci->connect_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static bool authorized(const srv_server *s, struct MHD_Connection *c) {
    if (!s->opt.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    return srv_bearer_matches(h, s->opt.api_key);
}

static enum MHD_Result preflight(srv_server *s, struct MHD_Connection *c, srv_conn *cc) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    srv_add_common_headers(s, r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    enum MHD_Result ret = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    srv_metrics_count_request(&s->metrics, cc->route, 204);
    return ret;
}

static void set_active(srv_server *s, srv_conn *cc, bool active) {
    if (cc->active == active) return;
    cc->active = active;
    pthread_mutex_lock(&s->active_mu);
    s->active += active ? 1 : -1;
    pthread_cond_broadcast(&s->active_cv);
    pthread_mutex_unlock(&s->active_mu);
}

static enum MHD_Result dispatch(srv_server *s, struct MHD_Connection *c, srv_conn *cc, const char *url,
                                const char *method) {
    srv_error e;
    if (!strcmp(method, "OPTIONS") && s->opt.cors_origin) return preflight(s, c, cc);
    const srv_route *r = srv_route_find(method, url, &e);
    if (!r) return srv_send_error(s, c, cc, &e);
    if (!r->public_route && !authorized(s, c)) {
        srv_fail(&e, 401, NULL, "invalid_api_key", "missing or wrong API key (send 'Authorization: Bearer KEY')");
        return srv_send_error(s, c, cc, &e);
    }
    if (cc->too_large) {
        srv_fail(&e, 413, NULL, "request_too_large", "the request body is over the limit of %zu bytes",
                 s->opt.max_body);
        return srv_send_error(s, c, cc, &e);
    }
    if (r->handler == SRV_H_CHAT || r->handler == SRV_H_COMPLETION) {
        set_active(s, cc, true);
        return srv_handle_generate(s, c, cc, r->handler == SRV_H_CHAT ? SRV_CHAT : SRV_COMPLETION);
    }
    return srv_handle_get(s, c, cc, r->handler);
}

static void append_body(srv_server *s, srv_conn *cc, const char *data, size_t n) {
    if (cc->too_large || cc->len + n > s->opt.max_body) {
        cc->too_large = true;
        return;
    }
    if (cc->len + n + 1 > cc->cap) {
        size_t cap = (cc->cap ? cc->cap * 2 : 4096) + n + 1;
        if (cap > s->opt.max_body + 1) cap = s->opt.max_body + 1;
        char *b = realloc(cc->body, cap);
        if (!b) {
            cc->too_large = true;
            return;
        }
        cc->body = b;
        cc->cap = cap;
    }
    memcpy(cc->body + cc->len, data, n);
    cc->len += n;
    cc->body[cc->len] = '\0';
}

/* A body declared too large is refused before it is sent when the client waits for "100 Continue"; other clients
 * send it whole before they read any answer, so it is read and dropped and refused at its end. */
static bool refuse_early(const srv_server *s, struct MHD_Connection *c) {
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char *expect = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    return cl && expect && !strcasecmp(expect, "100-continue") && strtoull(cl, NULL, 10) > s->opt.max_body;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    srv_server *s = cls;
    srv_conn *cc = *con_cls;
    if (!cc) {
        if (!(cc = calloc(1, sizeof *cc))) return MHD_NO;
        const srv_route *r = srv_route_of_path(url);
        cc->route = r ? r->path : "other";
        *con_cls = cc;
        if (!refuse_early(s, c)) return MHD_YES;
        srv_error e;
        srv_fail(&e, 413, NULL, "request_too_large", "the request body is over the limit of %zu bytes",
                 s->opt.max_body);
        return srv_send_error(s, c, cc, &e);
    }
    if (*upload_data_size) {
        append_body(s, cc, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    return dispatch(s, c, cc, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv_conn *cc = *con_cls;
    if (!cc) return;
    set_active(cls, cc, false);
    free(cc->body);
    free(cc);
    *con_cls = NULL;
}

static int start_daemon(srv_server *s, kiln_error *err) {
    const char *host = s->opt.host ? s->opt.host : "127.0.0.1";
    char port[16];
    snprintf(port, sizeof port, "%d", s->opt.port);
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc) return kiln_fail(err, "cannot resolve host '%s': %s", host, gai_strerror(rc));
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    s->daemon = MHD_start_daemon(flags, (uint16_t)s->opt.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
                                 ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                 MHD_OPTION_CONNECTION_LIMIT, 512u, MHD_OPTION_CONNECTION_TIMEOUT, 300u,
                                 MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon) return kiln_fail(err, "cannot listen on %s port %d (in use, or not an address here?)", host,
                                     s->opt.port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->opt.port;
    return 0;
}

static void destroy(srv_server *s) {
    pthread_cond_destroy(&s->active_cv);
    pthread_mutex_destroy(&s->active_mu);
    pthread_rwlock_destroy(&s->sched_lock);
    srv_metrics_destroy(&s->metrics);
    free(s);
}

/* Waits, a bounded time, for the responses of cancelled requests to go out. */
static void drain_active(srv_server *s) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&s->active_mu);
    while (s->active > 0)
        if (pthread_cond_timedwait(&s->active_cv, &s->active_mu, &until)) break;
    pthread_mutex_unlock(&s->active_mu);
}

srv_server *srv_start(kiln_model *m, const kiln_sched_params *sp, const srv_options *o, kiln_error *err) {
    srv_server *s = calloc(1, sizeof *s);
    if (!s) {
        kiln_fail(err, "out of memory");
        return NULL;
    }
    s->model = m;
    s->opt = *o;
    int train = kiln_model_n_ctx_train(m);
    s->n_ctx = sp->n_ctx ? sp->n_ctx : train > 0 && train < 4096 ? train : 4096; /* the scheduler's default */
    srv_metrics_init(&s->metrics);
    pthread_rwlock_init(&s->sched_lock, NULL);
    pthread_mutex_init(&s->active_mu, NULL);
    pthread_cond_init(&s->active_cv, NULL);
    if (!(s->sched = kiln_sched_new(m, sp, err)) || start_daemon(s, err)) {
        if (s->sched) kiln_sched_free(s->sched);
        destroy(s);
        return NULL;
    }
    return s;
}

int srv_port(const srv_server *s) {
    return s->port;
}

void srv_info(srv_server *s, kiln_sched_info *out) {
    pthread_rwlock_rdlock(&s->sched_lock);
    kiln_sched_get_info(s->sched, out);
    pthread_rwlock_unlock(&s->sched_lock);
}

void srv_stop(srv_server *s) {
    MHD_socket listener = MHD_quiesce_daemon(s->daemon);
    pthread_rwlock_wrlock(&s->sched_lock);
    kiln_sched_free(s->sched);
    s->sched = NULL;
    pthread_rwlock_unlock(&s->sched_lock);
    drain_active(s);
    MHD_stop_daemon(s->daemon);
    if (listener != MHD_INVALID_SOCKET) close(listener);
    destroy(s);
}

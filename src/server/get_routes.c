/* The GET routes: health, the model list, metrics, and the web chat page. */
#include <string.h>
#include <time.h>

#include "server/server_impl.h"
#include "server/web_asset.h"

static enum MHD_Result send_static(srv_server *s, struct MHD_Connection *c, srv_conn *cc, const char *type,
                                   const char *body, size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    srv_add_common_headers(s, r);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    srv_metrics_count_request(&s->metrics, cc->route, 200);
    return ret;
}

static char *metrics_text(srv_server *s) {
    kiln_sched_stats st;
    bool have = false;
    pthread_rwlock_rdlock(&s->sched_lock);
    if (s->sched) {
        kiln_sched_get_stats(s->sched, &st);
        have = true;
    }
    pthread_rwlock_unlock(&s->sched_lock);
    return srv_metrics_render(&s->metrics, have ? &st : NULL);
}

enum MHD_Result srv_handle_get(srv_server *s, struct MHD_Connection *c, srv_conn *cc, srv_handler h) {
    if (h == SRV_H_HEALTH) return send_static(s, c, cc, "application/json", "{\"status\":\"ok\"}", 15);
    if (h == SRV_H_MODELS) return srv_send(s, c, cc, 200, NULL, srv_models_json(s->opt.model_id, time(NULL)));
    if (h == SRV_H_METRICS) return srv_send(s, c, cc, 200, "text/plain; version=0.0.4", metrics_text(s));
    size_t len;
    const char *page = kiln_web_index_html(&len);
    return send_static(s, c, cc, "text/html; charset=utf-8", page, len);
}

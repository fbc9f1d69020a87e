/* Metrics in Prometheus text (counters, cumulative histogram buckets, scheduler gauges), and the job the scheduler
 * callbacks fill: pieces with their text offsets, the flush, done, cancel, reference counting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/job.h"
#include "server/metrics.h"

static void has_line(const char *text, const char *line) {
    const char *p = strstr(text, line);
    if (!p || (p != text && p[-1] != '\n') || (p[strlen(line)] != '\n')) fail_msg("no line '%s' in:\n%s", line, text);
}

static void test_metrics_text(void **state) {
    (void)state;
    srv_metrics m;
    srv_metrics_init(&m);
    srv_metrics_count_request(&m, "/v1/chat/completions", 200);
    srv_metrics_count_request(&m, "/v1/chat/completions", 200);
    srv_metrics_count_request(&m, "/v1/chat/completions", 400);
    srv_metrics_count_request(&m, "other", 404);
    srv_metrics_count_tokens(&m, 12, 5);
    srv_metrics_observe_ttft(&m, 0.003);
    srv_metrics_observe_ttft(&m, 0.2);
    srv_metrics_observe_ttft(&m, 100);
    srv_metrics_observe_itl(&m, 0.02);
    kiln_sched_stats st = {.queued = 3, .running = 2, .kv_blocks_used = 10, .kv_blocks_total = 40};
    char *text = srv_metrics_render(&m, &st);
    assert_non_null(text);
    has_line(text, "# TYPE kiln_requests_total counter");
    has_line(text, "kiln_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2");
    has_line(text, "kiln_requests_total{route=\"/v1/chat/completions\",status=\"400\"} 1");
    has_line(text, "kiln_requests_total{route=\"other\",status=\"404\"} 1");
    has_line(text, "kiln_prompt_tokens_total 12");
    has_line(text, "kiln_completion_tokens_total 5");
    has_line(text, "# TYPE kiln_time_to_first_token_seconds histogram");
    has_line(text, "kiln_time_to_first_token_seconds_bucket{le=\"0.005\"} 1");
    has_line(text, "kiln_time_to_first_token_seconds_bucket{le=\"0.1\"} 1");
    has_line(text, "kiln_time_to_first_token_seconds_bucket{le=\"0.25\"} 2");
    has_line(text, "kiln_time_to_first_token_seconds_bucket{le=\"20\"} 2");
    has_line(text, "kiln_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3");
    has_line(text, "kiln_time_to_first_token_seconds_count 3");
    has_line(text, "kiln_inter_token_latency_seconds_bucket{le=\"0.025\"} 1");
    has_line(text, "kiln_queue_depth 3");
    has_line(text, "kiln_running_sequences 2");
    has_line(text, "kiln_kv_blocks_used 10");
    has_line(text, "kiln_kv_cache_usage_ratio 0.25");
    free(text);
    text = srv_metrics_render(&m, NULL);
    assert_null(strstr(text, "kiln_queue_depth"));
    free(text);
    srv_metrics_destroy(&m);
}

static int send_token(srv_choice *c, int32_t token, const char *text) {
    kiln_token_event ev = {token, text, strlen(text), -1.5f, 0, NULL, NULL};
    return srv_job_on_token(&ev, c);
}

static void test_job_collects_pieces(void **state) {
    (void)state;
    srv_metrics m;
    srv_metrics_init(&m);
    srv_job *j = srv_job_new(2, &m);
    srv_choice *c = &j->choices[1];
    assert_int_equal(c->index, 1);
    srv_job_ref(j); /* the scheduler's reference, dropped by on_done */
    assert_int_equal(send_token(c, 7, "Hi"), 0);
    assert_int_equal(send_token(c, 8, ""), 0); /* held back: still a piece, for its logprob */
    assert_int_equal(send_token(c, -1, " there"), 0);
    assert_int_equal(c->n_pieces, 3);
    assert_string_equal(c->text, "Hi there");
    assert_int_equal(c->pieces[2].off, 2);
    assert_int_equal(c->pieces[2].len, 6);
    assert_int_equal(c->pieces[1].token, 8);
    kiln_generate_result res = {KILN_FINISH_EOG, 4, 0, 2, 0, 0};
    srv_job_on_done(&res, NULL, c);
    assert_true(c->done && !c->failed);
    assert_int_equal(j->n_done, 1);
    srv_job_abandon(j, 0, "queue full");
    assert_true(j->choices[0].failed);
    assert_string_equal(j->choices[0].err, "queue full");
    assert_int_equal(j->n_done, 2);
    char *text = srv_metrics_render(&m, NULL);
    assert_non_null(strstr(text, "kiln_time_to_first_token_seconds_count 1\n"));
    assert_non_null(strstr(text, "kiln_inter_token_latency_seconds_count 1\n"));
    free(text);
    srv_job_unref(j);
    srv_metrics_destroy(&m);
}

static void test_job_cancel_and_error(void **state) {
    (void)state;
    srv_job *j = srv_job_new(1, NULL);
    srv_choice *c = &j->choices[0];
    srv_job_ref(j);
    j->cancel = true;
    assert_int_not_equal(send_token(c, 1, "x"), 0);
    assert_int_equal(c->n_pieces, 0);
    srv_job_unref(j); /* the connection leaves first; on_done frees */
    kiln_generate_result res = {KILN_FINISH_CALLBACK, 1, 0, 0, 0, 0};
    srv_job_on_done(&res, "device lost", c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_text),
        cmocka_unit_test(test_job_collects_pieces),
        cmocka_unit_test(test_job_cancel_and_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

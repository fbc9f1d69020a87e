/* Request bodies to srv_request: every field read, every kind of bad input refused with status 400, the field at
 * fault and a code, as OpenAI's API answers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "server/request.h"
#include "server/route.h"

#define CTX 2048

static int parse(srv_request *r, srv_endpoint ep, const char *body, srv_error *e) {
    return srv_request_parse(r, ep, body, strlen(body), CTX, e);
}

/* body must fail with status 400 naming param (NULL: none) and code. */
static void refused(srv_endpoint ep, const char *body, const char *param, const char *code) {
    srv_request r;
    srv_error e;
    memset(&e, 0, sizeof e);
    if (parse(&r, ep, body, &e) == 0) fail_msg("accepted: %s", body);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, param ? param : "");
    assert_non_null(e.code);
    assert_string_equal(e.code, code);
    assert_true(strlen(e.message) > 0);
    srv_request_free(&r);
}

static void test_chat_fields(void **state) {
    (void)state;
    srv_request r;
    srv_error e;
    const char *body = "{\"model\":\"x\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hel\"},"
                       "{\"type\":\"text\",\"text\":\"lo\"}]}],"
                       "\"max_tokens\":7,\"temperature\":0,\"top_p\":0.5,\"seed\":42,\"stop\":[\"a\",\"bc\"],"
                       "\"presence_penalty\":0.5,\"frequency_penalty\":-1,\"logprobs\":true,\"top_logprobs\":3,"
                       "\"top_k\":5,\"min_p\":0.1,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                       "\"user\":\"someone\",\"n\":1,\"logit_bias\":{}}";
    assert_int_equal(parse(&r, SRV_CHAT, body, &e), 0);
    assert_int_equal(r.n_messages, 2);
    assert_string_equal(r.messages[0].role, "system");
    assert_string_equal(r.messages[1].content, "Hello");
    assert_int_equal(r.max_tokens, 7);
    assert_true(r.sampling.temperature == 0.0f);
    assert_true(r.sampling.top_p == 0.5f);
    assert_true(r.sampling.seed == 42);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[1], "bc");
    assert_true(r.sampling.presence_penalty == 0.5f && r.sampling.frequency_penalty == -1.0f);
    assert_true(r.logprobs);
    assert_int_equal(r.sampling.n_top_logprobs, 3);
    assert_int_equal(r.sampling.top_k, 5);
    assert_true(r.sampling.min_p == 0.1f);
    assert_true(r.stream && r.include_usage);
    srv_request_free(&r);
}

static void test_chat_defaults(void **state) {
    (void)state;
    srv_request r;
    srv_error e;
    assert_int_equal(parse(&r, SRV_CHAT, "{\"messages\":[{\"role\":\"developer\",\"content\":\"x\"}],"
                                         "\"max_tokens\":null,\"stop\":\"\"}",
                           &e),
                     0);
    assert_string_equal(r.messages[0].role, "system"); /* developer is the newer name of system */
    assert_int_equal(r.max_tokens, -1);
    assert_int_equal(r.n_stop, 0);
    assert_false(r.stream);
    assert_false(r.logprobs);
    assert_true(r.sampling.seed == KILN_SEED_RANDOM);
    srv_request_free(&r);
}

static void test_max_completion_tokens_wins(void **state) {
    (void)state;
    srv_request r;
    srv_error e;
    assert_int_equal(parse(&r, SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":5,"
                                         "\"max_completion_tokens\":9}",
                           &e),
                     0);
    assert_int_equal(r.max_tokens, 9);
    srv_request_free(&r);
}

static void test_completion_prompts(void **state) {
    (void)state;
    srv_request r;
    srv_error e;
    assert_int_equal(parse(&r, SRV_COMPLETION, "{\"prompt\":\"Once\",\"logprobs\":2,\"stop\":\"\\n\"}", &e), 0);
    assert_int_equal(r.n_prompts, 1);
    assert_string_equal(r.prompts[0], "Once");
    assert_true(r.logprobs);
    assert_int_equal(r.sampling.n_top_logprobs, 2);
    assert_string_equal(r.stop[0], "\n");
    srv_request_free(&r);
    assert_int_equal(parse(&r, SRV_COMPLETION, "{\"prompt\":[\"a\",\"b\",\"c\"]}", &e), 0);
    assert_int_equal(r.n_prompts, 3);
    assert_string_equal(r.prompts[2], "c");
    srv_request_free(&r);
}

static void test_bad_bodies(void **state) {
    (void)state;
    refused(SRV_CHAT, "", NULL, "invalid_json");
    refused(SRV_CHAT, "{\"messages\":", NULL, "invalid_json");
    refused(SRV_CHAT, "[1,2]", NULL, "invalid_json");
    refused(SRV_CHAT, "{\"messages\":[],\"messages\":[]}", NULL, "invalid_json");
    refused(SRV_CHAT, "{}", "messages", "missing_field");
    refused(SRV_CHAT, "{\"messages\":\"hi\"}", "messages", "invalid_type");
    refused(SRV_CHAT, "{\"messages\":[]}", "messages", "invalid_value");
    refused(SRV_CHAT, "{\"messages\":[3]}", "messages", "invalid_type");
    refused(SRV_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", "messages", "invalid_type");
    refused(SRV_CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages", "invalid_value");
    refused(SRV_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", "messages", "missing_field");
    refused(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages", "invalid_type");
    refused(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", "messages",
            "invalid_value");
    refused(SRV_COMPLETION, "{}", "prompt", "missing_field");
    refused(SRV_COMPLETION, "{\"prompt\":7}", "prompt", "invalid_type");
    refused(SRV_COMPLETION, "{\"prompt\":[]}", "prompt", "invalid_value");
    refused(SRV_COMPLETION, "{\"prompt\":[\"a\",1]}", "prompt", "invalid_type");
    refused(SRV_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":true}", "logprobs", "invalid_type");
    refused(SRV_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":6}", "logprobs", "invalid_value");
    refused(SRV_COMPLETION, "{\"prompt\":\"a\",\"echo\":true}", "echo", "unsupported_value");
    refused(SRV_COMPLETION, "{\"prompt\":\"a\",\"best_of\":3}", "best_of", "unsupported_value");
    refused(SRV_COMPLETION, "{\"prompt\":\"a\",\"suffix\":\"z\"}", "suffix", "unsupported_value");
}

#define MSG "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"

static void test_bad_fields(void **state) {
    (void)state;
    refused(SRV_CHAT, MSG "\"temperature\":\"hot\"}", "temperature", "invalid_type");
    refused(SRV_CHAT, MSG "\"temperature\":2.5}", "temperature", "invalid_value");
    refused(SRV_CHAT, MSG "\"top_p\":-0.1}", "top_p", "invalid_value");
    refused(SRV_CHAT, MSG "\"top_k\":1.5}", "top_k", "invalid_type");
    refused(SRV_CHAT, MSG "\"top_k\":-1}", "top_k", "invalid_value");
    refused(SRV_CHAT, MSG "\"min_p\":2}", "min_p", "invalid_value");
    refused(SRV_CHAT, MSG "\"presence_penalty\":3}", "presence_penalty", "invalid_value");
    refused(SRV_CHAT, MSG "\"seed\":\"1\"}", "seed", "invalid_type");
    refused(SRV_CHAT, MSG "\"max_tokens\":0}", "max_tokens", "invalid_value");
    refused(SRV_CHAT, MSG "\"max_tokens\":-5}", "max_tokens", "invalid_value");
    refused(SRV_CHAT, MSG "\"max_tokens\":1000000000000}", "max_tokens", "invalid_value");
    refused(SRV_CHAT, MSG "\"max_tokens\":\"10\"}", "max_tokens", "invalid_type");
    refused(SRV_CHAT, MSG "\"max_completion_tokens\":0}", "max_completion_tokens", "invalid_value");
    refused(SRV_CHAT, MSG "\"stop\":5}", "stop", "invalid_type");
    refused(SRV_CHAT, MSG "\"stop\":[\"a\",5]}", "stop", "invalid_type");
    refused(SRV_CHAT, MSG "\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\","
                          "\"13\",\"14\",\"15\",\"16\",\"17\"]}",
            "stop", "invalid_value");
    refused(SRV_CHAT, MSG "\"stream\":\"yes\"}", "stream", "invalid_type");
    refused(SRV_CHAT, MSG "\"stream_options\":{\"include_usage\":true}}", "stream_options", "invalid_value");
    refused(SRV_CHAT, MSG "\"stream\":true,\"stream_options\":[]}", "stream_options", "invalid_type");
    refused(SRV_CHAT, MSG "\"stream\":true,\"stream_options\":{\"include_usage\":1}}", "include_usage",
            "invalid_type");
    refused(SRV_CHAT, MSG "\"logprobs\":1}", "logprobs", "invalid_type");
    refused(SRV_CHAT, MSG "\"top_logprobs\":2}", "top_logprobs", "invalid_value");
    refused(SRV_CHAT, MSG "\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs", "invalid_value");
    refused(SRV_CHAT, MSG "\"n\":2}", "n", "unsupported_value");
    refused(SRV_CHAT, MSG "\"logit_bias\":{\"5\":1}}", "logit_bias", "unsupported_value");
    refused(SRV_CHAT, MSG "\"model\":5}", "model", "invalid_type");
}

static void test_routes(void **state) {
    (void)state;
    srv_error e;
    const srv_route *r = srv_route_find("POST", "/v1/chat/completions", &e);
    assert_non_null(r);
    assert_int_equal(r->handler, SRV_H_CHAT);
    assert_false(r->public_route);
    assert_true(srv_route_find("GET", "/health", &e)->public_route);
    assert_null(srv_route_find("GET", "/v1/chat/completions", &e));
    assert_int_equal(e.status, 405);
    assert_null(srv_route_find("POST", "/v1/chat/completions/", &e));
    assert_int_equal(e.status, 404);
    assert_string_equal(e.code, "unknown_url");
    assert_null(srv_route_of_path("/nope"));
}

static void test_bearer(void **state) {
    (void)state;
    assert_true(srv_bearer_matches("Bearer k3y", "k3y"));
    assert_true(srv_bearer_matches("bearer  k3y", "k3y"));
    assert_false(srv_bearer_matches(NULL, "k3y"));
    assert_false(srv_bearer_matches("k3y", "k3y"));
    assert_false(srv_bearer_matches("Bearer k3", "k3y"));
    assert_false(srv_bearer_matches("Bearer k3yy", "k3y"));
    assert_false(srv_bearer_matches("Bearer K3y", "k3y"));
    assert_false(srv_bearer_matches("Bearer ", "k3y"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_fields),      cmocka_unit_test(test_chat_defaults),
        cmocka_unit_test(test_max_completion_tokens_wins), cmocka_unit_test(test_completion_prompts),
        cmocka_unit_test(test_bad_bodies),       cmocka_unit_test(test_bad_fields),
        cmocka_unit_test(test_routes),           cmocka_unit_test(test_bearer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

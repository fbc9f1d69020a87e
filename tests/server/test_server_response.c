/* Response bodies in OpenAI's shapes, read back with jansson: errors, whole replies with usage and logprobs, the
 * streamed chunks, the model list; text that is not valid UTF-8 still makes valid JSON. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "server/response.h"

static const char *fake_token_text(void *ctx, int32_t token, size_t *len) {
    static const char *const texts[] = {"Hel", "lo", "\xff", "!"};
    if (token < 0 || token > 3) return NULL;
    *len = strlen(texts[token]);
    return texts[token];
}

static json_t *load(char *s) {
    assert_non_null(s);
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    if (!j) fail_msg("not JSON (%s): %s", je.text, s);
    free(s);
    return j;
}

/* An SSE event "data: {...}\n\n" parsed. */
static json_t *load_event(char *s) {
    assert_non_null(s);
    assert_memory_equal(s, "data: ", 6);
    size_t n = strlen(s);
    assert_true(n > 8 && s[n - 1] == '\n' && s[n - 2] == '\n');
    json_t *j = json_loadb(s + 6, n - 8, 0, NULL);
    assert_non_null(j);
    free(s);
    return j;
}

static const char *str_at(json_t *j, const char *path) {
    json_t *v = json_object_get(j, path);
    assert_true(json_is_string(v));
    return json_string_value(v);
}

static void test_error_shape(void **state) {
    (void)state;
    srv_error e;
    srv_fail(&e, 400, "temperature", "invalid_type", "'temperature' must be a number");
    json_t *j = load(srv_error_json(&e));
    json_t *err = json_object_get(j, "error");
    assert_string_equal(str_at(err, "message"), "'temperature' must be a number");
    assert_string_equal(str_at(err, "type"), "invalid_request_error");
    assert_string_equal(str_at(err, "param"), "temperature");
    assert_string_equal(str_at(err, "code"), "invalid_type");
    json_decref(j);
    srv_fail(&e, 503, NULL, NULL, "busy");
    j = load(srv_error_json(&e));
    err = json_object_get(j, "error");
    assert_string_equal(str_at(err, "type"), "server_error");
    assert_true(json_is_null(json_object_get(err, "param")) && json_is_null(json_object_get(err, "code")));
    json_decref(j);
    srv_fail(&e, 400, NULL, "invalid_json", "near '\xcd\x9b\xa3'"); /* the client's broken bytes, quoted */
    j = load(srv_error_json(&e));
    assert_string_equal(str_at(json_object_get(j, "error"), "message"), "near '\xcd\x9b\xef\xbf\xbd'");
    json_decref(j);
}

/* A finished choice "Hello!" made of tokens 0, 1, 3 and a last flush. */
static srv_choice make_choice(srv_piece *pieces) {
    srv_choice c;
    memset(&c, 0, sizeof c);
    memset(pieces, 0, 4 * sizeof *pieces);
    c.text = "Hello!";
    c.len = 6;
    int32_t tokens[4] = {0, 1, 3, -1};
    size_t offs[4] = {0, 3, 5, 6};
    for (int i = 0; i < 4; i++) {
        pieces[i].token = tokens[i];
        pieces[i].off = offs[i];
        pieces[i].len = i < 3 ? (i == 0 ? 3 : i == 1 ? 2 : 1) : 0;
        pieces[i].logprob = -0.5f * (float)i;
        pieces[i].n_top = 2;
        pieces[i].top_tokens[0] = tokens[i] < 0 ? 0 : tokens[i];
        pieces[i].top_tokens[1] = 2;
        pieces[i].top_logprobs[0] = -0.1f;
        pieces[i].top_logprobs[1] = -3.0f;
    }
    c.pieces = pieces;
    c.n_pieces = 4;
    c.done = true;
    c.result.finish = KILN_FINISH_LENGTH;
    c.result.n_prompt = 10;
    c.result.n_generated = 3;
    return c;
}

static srv_reply_meta meta(srv_endpoint ep, bool logprobs) {
    srv_reply_meta m = {ep, ep == SRV_CHAT ? "chatcmpl-1" : "cmpl-1", 1700000000, "smol.gguf", logprobs, 2,
                        fake_token_text, NULL};
    return m;
}

static void test_chat_reply(void **state) {
    (void)state;
    srv_piece pieces[4];
    srv_choice c = make_choice(pieces);
    srv_reply_meta m = meta(SRV_CHAT, true);
    srv_usage u = {10, 3};
    json_t *j = load(srv_reply_json(&m, &c, 1, &u));
    assert_string_equal(str_at(j, "object"), "chat.completion");
    assert_string_equal(str_at(j, "id"), "chatcmpl-1");
    assert_string_equal(str_at(j, "model"), "smol.gguf");
    assert_int_equal(json_integer_value(json_object_get(j, "created")), 1700000000);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_int_equal(json_integer_value(json_object_get(ch, "index")), 0);
    assert_string_equal(str_at(ch, "finish_reason"), "length");
    json_t *msg = json_object_get(ch, "message");
    assert_string_equal(str_at(msg, "role"), "assistant");
    assert_string_equal(str_at(msg, "content"), "Hello!");
    json_t *content = json_object_get(json_object_get(ch, "logprobs"), "content");
    assert_int_equal(json_array_size(content), 3); /* the flush is no token */
    json_t *t1 = json_array_get(content, 1);
    assert_string_equal(str_at(t1, "token"), "lo");
    assert_true(json_real_value(json_object_get(t1, "logprob")) == -0.5);
    assert_int_equal(json_array_size(json_object_get(t1, "bytes")), 2);
    json_t *alt = json_array_get(json_object_get(t1, "top_logprobs"), 1);
    assert_string_equal(str_at(alt, "token"), "\xef\xbf\xbd"); /* a lone byte becomes U+FFFD; bytes keep it */
    assert_int_equal(json_integer_value(json_array_get(json_object_get(alt, "bytes"), 0)), 255);
    json_t *usage = json_object_get(j, "usage");
    assert_int_equal(json_integer_value(json_object_get(usage, "prompt_tokens")), 10);
    assert_int_equal(json_integer_value(json_object_get(usage, "completion_tokens")), 3);
    assert_int_equal(json_integer_value(json_object_get(usage, "total_tokens")), 13);
    json_decref(j);
}

static void test_completion_reply(void **state) {
    (void)state;
    srv_piece pieces[4];
    srv_choice c[2] = {make_choice(pieces), make_choice(pieces)};
    c[1].index = 1;
    c[1].result.finish = KILN_FINISH_EOG;
    srv_reply_meta m = meta(SRV_COMPLETION, true);
    srv_usage u = {20, 6};
    json_t *j = load(srv_reply_json(&m, c, 2, &u));
    assert_string_equal(str_at(j, "object"), "text_completion");
    json_t *ch = json_array_get(json_object_get(j, "choices"), 1);
    assert_int_equal(json_integer_value(json_object_get(ch, "index")), 1);
    assert_string_equal(str_at(ch, "text"), "Hello!");
    assert_string_equal(str_at(ch, "finish_reason"), "stop");
    json_t *lp = json_object_get(ch, "logprobs");
    assert_int_equal(json_array_size(json_object_get(lp, "tokens")), 3);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(lp, "text_offset"), 2)), 5);
    assert_true(json_is_object(json_array_get(json_object_get(lp, "top_logprobs"), 0)));
    json_decref(j);
    m.logprobs = false;
    j = load(srv_reply_json(&m, c, 1, &u));
    assert_true(json_is_null(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs")));
    json_decref(j);
}

static void test_chat_chunks(void **state) {
    (void)state;
    srv_piece pieces[4];
    srv_choice c = make_choice(pieces);
    srv_reply_meta m = meta(SRV_CHAT, false);
    json_t *j = load_event(srv_chunk_role(&m, 0, true));
    assert_string_equal(str_at(j, "object"), "chat.completion.chunk");
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(str_at(json_object_get(ch, "delta"), "role"), "assistant");
    assert_true(json_is_null(json_object_get(ch, "finish_reason")));
    assert_true(json_is_null(json_object_get(j, "usage")) && json_object_get(j, "usage"));
    json_decref(j);
    j = load_event(srv_chunk_piece(&m, 0, c.text + pieces[1].off, &pieces[1], false));
    ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(str_at(json_object_get(ch, "delta"), "content"), "lo");
    assert_null(json_object_get(j, "usage"));
    json_decref(j);
    j = load_event(srv_chunk_finish(&m, 0, "stop", false));
    ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_int_equal(json_object_size(json_object_get(ch, "delta")), 0);
    assert_string_equal(str_at(ch, "finish_reason"), "stop");
    json_decref(j);
    srv_usage u = {4, 2};
    j = load_event(srv_chunk_usage(&m, &u));
    assert_int_equal(json_array_size(json_object_get(j, "choices")), 0);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "total_tokens")), 6);
    json_decref(j);
    assert_string_equal(SRV_SSE_DONE, "data: [DONE]\n\n");
}

static void test_completion_chunk_with_logprobs(void **state) {
    (void)state;
    srv_piece pieces[4];
    srv_choice c = make_choice(pieces);
    srv_reply_meta m = meta(SRV_COMPLETION, true);
    json_t *j = load_event(srv_chunk_piece(&m, 2, c.text, &pieces[0], false));
    assert_string_equal(str_at(j, "object"), "text_completion");
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_int_equal(json_integer_value(json_object_get(ch, "index")), 2);
    assert_string_equal(str_at(ch, "text"), "Hel");
    json_t *tokens = json_object_get(json_object_get(ch, "logprobs"), "tokens");
    assert_string_equal(json_string_value(json_array_get(tokens, 0)), "Hel");
    json_decref(j);
}

static void test_invalid_utf8_text(void **state) {
    (void)state;
    srv_piece p;
    memset(&p, 0, sizeof p);
    p.token = 2;
    p.len = 4;
    srv_reply_meta m = meta(SRV_CHAT, false);
    json_t *j = load_event(srv_chunk_piece(&m, 0, "a\xc3(b", &p, false));
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(str_at(json_object_get(ch, "delta"), "content"), "a\xef\xbf\xbd(b");
    json_decref(j);
}

static void test_models(void **state) {
    (void)state;
    json_t *j = load(srv_models_json("smol.gguf", 5));
    assert_string_equal(str_at(j, "object"), "list");
    json_t *d = json_array_get(json_object_get(j, "data"), 0);
    assert_string_equal(str_at(d, "id"), "smol.gguf");
    assert_string_equal(str_at(d, "object"), "model");
    assert_string_equal(str_at(d, "owned_by"), "kiln");
    json_decref(j);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_shape),    cmocka_unit_test(test_chat_reply),
        cmocka_unit_test(test_completion_reply), cmocka_unit_test(test_chat_chunks),
        cmocka_unit_test(test_completion_chunk_with_logprobs), cmocka_unit_test(test_invalid_utf8_text),
        cmocka_unit_test(test_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

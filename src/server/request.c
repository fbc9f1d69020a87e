#include "server/request.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sample/sample.h"

/* A field that is absent or JSON null counts as not given, as in OpenAI's API. */
static json_t *field(const json_t *o, const char *name) {
    json_t *v = json_object_get(o, name);
    return json_is_null(v) ? NULL : v;
}

static int get_bool(const json_t *o, const char *name, bool *out, srv_error *e) {
    json_t *v = field(o, name);
    if (!v) return 0;
    if (!json_is_boolean(v)) return srv_fail(e, 400, name, "invalid_type", "'%s' must be a boolean", name);
    *out = json_is_true(v);
    return 0;
}

static int get_number(const json_t *o, const char *name, double lo, double hi, float *out, srv_error *e) {
    json_t *v = field(o, name);
    if (!v) return 0;
    if (!json_is_number(v)) return srv_fail(e, 400, name, "invalid_type", "'%s' must be a number", name);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return srv_fail(e, 400, name, "invalid_value", "'%s' must be between %g and %g, got %g", name, lo, hi, d);
    *out = (float)d;
    return 0;
}

static int get_int(const json_t *o, const char *name, long long lo, long long hi, long long *out, srv_error *e) {
    json_t *v = field(o, name);
    if (!v) return 0;
    if (!json_is_integer(v)) return srv_fail(e, 400, name, "invalid_type", "'%s' must be an integer", name);
    long long n = json_integer_value(v);
    if (n < lo || n > hi)
        return srv_fail(e, 400, name, "invalid_value", "'%s' must be between %lld and %lld, got %lld", name, lo, hi,
                        n);
    *out = n;
    return 0;
}

static int parse_sampling(srv_request *r, const json_t *o, srv_error *e) {
    kiln_sampling_params *s = &r->sampling;
    long long top_k = s->top_k, last_n = s->repeat_last_n, seed;
    if (get_number(o, "temperature", 0, 2, &s->temperature, e) || get_number(o, "top_p", 0, 1, &s->top_p, e) ||
        get_number(o, "min_p", 0, 1, &s->min_p, e) ||
        get_number(o, "presence_penalty", -2, 2, &s->presence_penalty, e) ||
        get_number(o, "frequency_penalty", -2, 2, &s->frequency_penalty, e) ||
        get_number(o, "repeat_penalty", 1e-3, 100, &s->repeat_penalty, e) ||
        get_int(o, "top_k", 0, 1 << 24, &top_k, e) || get_int(o, "repeat_last_n", -1, 1 << 24, &last_n, e))
        return -1;
    if (s->top_p < 1e-6f) s->top_p = 1e-6f; /* top_p 0 keeps only the most likely token, as 1e-6 does */
    s->top_k = (int)top_k;
    s->repeat_last_n = (int)last_n;
    if (field(o, "seed")) {
        if (get_int(o, "seed", INT64_MIN, INT64_MAX, &seed, e)) return -1;
        s->seed = (uint64_t)seed;
    }
    return 0;
}

static int parse_stop(srv_request *r, const json_t *o, srv_error *e) {
    json_t *v = field(o, "stop");
    if (!v) return 0;
    if (json_is_string(v)) {
        if (json_string_length(v)) r->stop[r->n_stop++] = json_string_value(v);
        return 0;
    }
    if (!json_is_array(v)) return srv_fail(e, 400, "stop", "invalid_type", "'stop' must be a string or an array");
    if (json_array_size(v) > SRV_MAX_STOP)
        return srv_fail(e, 400, "stop", "invalid_value", "'stop' holds at most %d strings", SRV_MAX_STOP);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s)) return srv_fail(e, 400, "stop", "invalid_type", "'stop' must hold only strings");
        if (json_string_length(s)) r->stop[r->n_stop++] = json_string_value(s);
    }
    return 0;
}

static int parse_max_tokens(srv_request *r, const json_t *o, int limit, srv_error *e) {
    /* max_completion_tokens is the newer name; it wins when both are given */
    const char *name = field(o, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    long long n = -1;
    if (get_int(o, name, 1, limit, &n, e)) return -1;
    r->max_tokens = (int)n;
    return 0;
}

static int parse_stream(srv_request *r, const json_t *o, srv_error *e) {
    if (get_bool(o, "stream", &r->stream, e)) return -1;
    json_t *so = field(o, "stream_options");
    if (!so) return 0;
    if (!json_is_object(so))
        return srv_fail(e, 400, "stream_options", "invalid_type", "'stream_options' must be an object");
    if (!r->stream)
        return srv_fail(e, 400, "stream_options", "invalid_value",
                        "'stream_options' is only allowed when 'stream' is true");
    return get_bool(so, "include_usage", &r->include_usage, e);
}

/* Content as a string, or as an array of {"type": "text", "text": ...} parts joined into one string. */
static int parse_content(srv_request *r, int k, const json_t *c, srv_error *e) {
    if (json_is_string(c)) {
        r->messages[k].content = json_string_value(c);
        return 0;
    }
    if (!json_is_array(c))
        return srv_fail(e, 400, "messages", "invalid_type", "messages[%d].content must be a string or an array", k);
    size_t total = 1, i;
    json_t *part;
    json_array_foreach(c, i, part) {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") || !json_is_string(text))
            return srv_fail(e, 400, "messages", "invalid_value",
                            "messages[%d].content[%zu] must be a {\"type\": \"text\", \"text\": string} part", k, i);
        total += json_string_length(text);
    }
    char *joined = malloc(total);
    if (!joined) return srv_fail(e, 500, NULL, NULL, "out of memory");
    size_t len = 0;
    json_array_foreach(c, i, part) {
        json_t *text = json_object_get(part, "text");
        memcpy(joined + len, json_string_value(text), json_string_length(text));
        len += json_string_length(text);
    }
    joined[len] = '\0';
    r->owned[k] = joined;
    r->messages[k].content = joined;
    return 0;
}

static int parse_message(srv_request *r, int k, const json_t *m, srv_error *e) {
    static const char *const roles[] = {"system", "user", "assistant", "developer"};
    if (!json_is_object(m)) return srv_fail(e, 400, "messages", "invalid_type", "messages[%d] must be an object", k);
    json_t *role = json_object_get(m, "role"), *content = field(m, "content");
    if (!json_is_string(role))
        return srv_fail(e, 400, "messages", "invalid_type", "messages[%d].role must be a string", k);
    const char *rs = json_string_value(role);
    size_t known = 0;
    while (known < 4 && strcmp(rs, roles[known])) known++;
    if (known == 4)
        return srv_fail(e, 400, "messages", "invalid_value",
                        "messages[%d].role must be system, user, assistant or developer, got '%.64s'", k, rs);
    /* a developer message is the newer name for a system message */
    r->messages[k].role = known == 3 ? "system" : rs;
    if (!content) return srv_fail(e, 400, "messages", "missing_field", "messages[%d].content is missing", k);
    return parse_content(r, k, content, e);
}

static int parse_messages(srv_request *r, const json_t *o, srv_error *e) {
    json_t *msgs = field(o, "messages");
    if (!msgs) return srv_fail(e, 400, "messages", "missing_field", "'messages' is required");
    if (!json_is_array(msgs)) return srv_fail(e, 400, "messages", "invalid_type", "'messages' must be an array");
    size_t n = json_array_size(msgs);
    if (n == 0) return srv_fail(e, 400, "messages", "invalid_value", "'messages' must not be empty");
    r->messages = calloc(n, sizeof *r->messages);
    r->owned = calloc(n, sizeof *r->owned);
    if (!r->messages || !r->owned) return srv_fail(e, 500, NULL, NULL, "out of memory");
    r->n_messages = (int)n;
    for (int k = 0; k < r->n_messages; k++)
        if (parse_message(r, k, json_array_get(msgs, (size_t)k), e)) return -1;
    return 0;
}

static int parse_prompt(srv_request *r, const json_t *o, srv_error *e) {
    json_t *p = field(o, "prompt");
    if (!p) return srv_fail(e, 400, "prompt", "missing_field", "'prompt' is required");
    if (json_is_string(p)) {
        r->prompts[r->n_prompts++] = json_string_value(p);
        return 0;
    }
    if (!json_is_array(p))
        return srv_fail(e, 400, "prompt", "invalid_type", "'prompt' must be a string or an array of strings");
    size_t n = json_array_size(p), i;
    if (n == 0 || n > SRV_MAX_PROMPTS)
        return srv_fail(e, 400, "prompt", "invalid_value", "'prompt' must hold 1 to %d strings", SRV_MAX_PROMPTS);
    json_t *s;
    json_array_foreach(p, i, s) {
        if (!json_is_string(s))
            return srv_fail(e, 400, "prompt", "invalid_type", "'prompt' must be a string or an array of strings");
        r->prompts[r->n_prompts++] = json_string_value(s);
    }
    return 0;
}

/* Chat: "logprobs": bool with "top_logprobs": 0..20. Completions: "logprobs": 0..5 alternatives. */
static int parse_logprobs(srv_request *r, const json_t *o, srv_error *e) {
    long long top = 0;
    if (r->endpoint == SRV_COMPLETION) {
        if (!field(o, "logprobs")) return 0;
        if (get_int(o, "logprobs", 0, 5, &top, e)) return -1;
        r->logprobs = true;
    } else {
        if (get_bool(o, "logprobs", &r->logprobs, e) || get_int(o, "top_logprobs", 0, KILN_MAX_TOP_LOGPROBS, &top, e))
            return -1;
        if (top > 0 && !r->logprobs)
            return srv_fail(e, 400, "top_logprobs", "invalid_value", "'top_logprobs' needs 'logprobs' set to true");
    }
    r->top_logprobs = (int)top;
    /* the engine reports a token's own logprob only along with at least one alternative */
    r->sampling.n_top_logprobs = r->logprobs && top == 0 ? 1 : (int)top;
    return 0;
}

/* Fields kiln does not implement are refused rather than silently ignored when they would change the result. */
static int refuse_unsupported(const json_t *o, srv_error *e) {
    long long n = 1;
    if (get_int(o, "n", 1, 1, &n, e)) return srv_fail(e, 400, "n", "unsupported_value", "only 'n': 1 is supported");
    json_t *bias = field(o, "logit_bias");
    if (bias && (!json_is_object(bias) || json_object_size(bias)))
        return srv_fail(e, 400, "logit_bias", "unsupported_value", "'logit_bias' is not supported");
    bool echo = false;
    if (get_bool(o, "echo", &echo, e)) return -1;
    if (echo) return srv_fail(e, 400, "echo", "unsupported_value", "'echo' is not supported");
    long long best_of = 1;
    if (get_int(o, "best_of", 1, 1, &best_of, e))
        return srv_fail(e, 400, "best_of", "unsupported_value", "only 'best_of': 1 is supported");
    json_t *suffix = field(o, "suffix");
    if (suffix && (!json_is_string(suffix) || json_string_length(suffix)))
        return srv_fail(e, 400, "suffix", "unsupported_value", "'suffix' is not supported");
    if (field(o, "model") && !json_is_string(field(o, "model")))
        return srv_fail(e, 400, "model", "invalid_type", "'model' must be a string");
    return 0;
}

int srv_request_parse(srv_request *r, srv_endpoint ep, const char *body, size_t len, int max_tokens_limit,
                      srv_error *e) {
    memset(r, 0, sizeof *r);
    r->endpoint = ep;
    r->max_tokens = -1;
    r->sampling = kiln_sampler_default_params();
    json_error_t je;
    r->root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!r->root)
        return srv_fail(e, 400, NULL, "invalid_json", "the body is not valid JSON: %s (line %d, column %d)", je.text,
                        je.line, je.column);
    if (!json_is_object(r->root)) return srv_fail(e, 400, NULL, "invalid_json", "the body must be a JSON object");
    const json_t *o = r->root;
    if (ep == SRV_CHAT ? parse_messages(r, o, e) : parse_prompt(r, o, e)) return -1;
    if (refuse_unsupported(o, e) || parse_sampling(r, o, e) || parse_stop(r, o, e) ||
        parse_max_tokens(r, o, max_tokens_limit, e) || parse_stream(r, o, e) || parse_logprobs(r, o, e))
        return -1;
    return 0;
}

void srv_request_free(srv_request *r) {
    for (int k = 0; k < r->n_messages; k++) free(r->owned ? r->owned[k] : NULL);
    free(r->owned);
    free(r->messages);
    json_decref(r->root);
    memset(r, 0, sizeof *r);
}

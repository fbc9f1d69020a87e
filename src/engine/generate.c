/* The generation loop: reuse the cached prefix, prefill the rest, then sample, decode and stream until the model
 * ends its turn, a stop string appears, max_tokens is reached or the callback says stop. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "sample/sample.h"
#include "tokenizer/tokenizer.h"

kiln_sampling_params kiln_sampling_default_params(void) { return kiln_sampler_default_params(); }

kiln_generate_params kiln_generate_default_params(void) {
    return (kiln_generate_params){.max_tokens = -1, .sampling = kiln_sampler_default_params()};
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Tokens shared with the cache, keeping at least one prompt token to evaluate (its logits start generation). */
static int reusable_prefix(const kiln_context *c, const int32_t *prompt, int n_prompt) {
    int n = 0;
    while (n < c->n_past && n < n_prompt - 1 && c->tokens[n] == prompt[n]) n++;
    return n;
}

typedef struct gen_state {
    kiln_context *c;
    kiln_sampler *sampler;
    kiln_stop_scan scan;
    kiln_detok detok;
    kiln_token_callback cb;
    void *user;
} gen_state;

/* Sends released text (and the token's logprobs) to the callback; returns nonzero when it asks to stop. */
static int emit(gen_state *g, int32_t token, const kiln_sample_info *info, size_t release) {
    kiln_token_event ev = {.token = token, .text = g->scan.buf ? g->scan.buf : "", .len = release};
    if (info) {
        ev.logprob = info->logprob;
        ev.n_top = info->n_top;
        ev.top_tokens = info->top_tokens;
        ev.top_logprobs = info->top_logprobs;
    }
    int stop = g->cb ? g->cb(&ev, g->user) : 0;
    kiln_stop_scan_consume(&g->scan, release);
    return stop;
}

/* Decodes a token's bytes into the scan; *hit on a stop string. Returns -1 on error, else 0 and *stop from cb. */
static int push_token(gen_state *g, int32_t token, const kiln_sample_info *info, bool *hit, int *stop,
                      kiln_error *err) {
    char text[256];
    size_t n = kiln_detok_push(&g->detok, g->c->model->tok, token, text, sizeof text), release;
    if (kiln_stop_scan_push(&g->scan, text, n, &release, hit, err)) return -1;
    *stop = emit(g, token, info, release);
    return 0;
}

/* Flushes what the detokenizer and the stop scan still hold (not after a stop string: the rest is dropped). */
static int finish_text(gen_state *g, bool hit, kiln_error *err) {
    if (hit) return 0;
    char text[16];
    size_t n = kiln_detok_flush(&g->detok, text, sizeof text), release;
    bool late_hit;
    if (kiln_stop_scan_push(&g->scan, text, n, &release, &late_hit, err)) return -1;
    if (!late_hit) release = g->scan.len;
    if (release) emit(g, -1, NULL, release);
    return 0;
}

static int check_fit(const kiln_context *c, int n_prompt, int max_tokens, kiln_error *err) {
    int n_ctx = c->params.n_ctx;
    if (n_prompt < 1) return kiln_fail(err, "empty prompt: nothing to continue");
    if (n_prompt > n_ctx)
        return kiln_fail(err, "the prompt has %d tokens but the context holds %d (raise --ctx)", n_prompt, n_ctx);
    if (max_tokens > 0 && (int64_t)n_prompt + max_tokens > n_ctx)
        return kiln_fail(err,
                         "prompt (%d tokens) + max tokens (%d) exceed the context of %d tokens (raise --ctx or lower -n)",
                         n_prompt, max_tokens, n_ctx);
    return 0;
}

static int run(gen_state *g, const int32_t *prompt, int n_prompt, const kiln_generate_params *p,
               kiln_generate_result *res, kiln_error *err) {
    kiln_context *c = g->c;
    const kiln_sampler_params *sp = &p->sampling;
    double t0 = now_ms();
    res->n_prompt = n_prompt;
    res->n_cached = reusable_prefix(c, prompt, n_prompt);
    if (kiln_ctx_eval(c, prompt + res->n_cached, n_prompt - res->n_cached, res->n_cached, NULL, false, err))
        return -1;
    double t1 = now_ms();
    res->prefill_ms = t1 - t0;
    for (int i = 0; i < n_prompt; i++) kiln_sampler_accept(g->sampler, prompt[i]);

    bool hit = false;
    kiln_sample_info info;
    for (;;) {
        if (p->max_tokens >= 0 && res->n_generated >= p->max_tokens) {
            res->finish = KILN_FINISH_LENGTH;
            break;
        }
        int32_t tok = kiln_sampler_sample(g->sampler, c->logits, sp->n_top_logprobs ? &info : NULL);
        if (kiln_token_is_eog(c->model->tok, tok)) {
            res->finish = KILN_FINISH_EOG;
            break;
        }
        res->n_generated++;
        kiln_sampler_accept(g->sampler, tok);
        int stop;
        if (push_token(g, tok, sp->n_top_logprobs ? &info : NULL, &hit, &stop, err)) return -1;
        if (hit || stop) {
            res->finish = hit ? KILN_FINISH_STOP : KILN_FINISH_CALLBACK;
            break;
        }
        if (c->n_past >= c->params.n_ctx) {
            res->finish = KILN_FINISH_LENGTH; /* unlimited max_tokens ran into the end of the context */
            break;
        }
        if (kiln_ctx_eval(c, &tok, 1, c->n_past, NULL, false, err)) return -1;
    }
    res->decode_ms = now_ms() - t1;
    return finish_text(g, hit, err);
}

int kiln_generate(kiln_context *c, const int32_t *prompt, int n_prompt, const kiln_generate_params *p,
                  kiln_token_callback cb, void *user, kiln_generate_result *result, char *err, size_t err_size) {
    kiln_error e = {{0}};
    kiln_generate_result res = {0};
    gen_state g = {.c = c, .cb = cb, .user = user};
    kiln_detok_init(&g.detok);
    int rc = -1;
    if (check_fit(c, n_prompt, p->max_tokens, &e) ||
        kiln_sampler_new(&p->sampling, c->model->cfg.n_vocab, &g.sampler, &e) ||
        kiln_stop_scan_init(&g.scan, p->stop, p->n_stop, &e))
        goto done;
    rc = run(&g, prompt, n_prompt, p, &res, &e);
done:
    if (rc) kiln_error_export(&e, err, err_size);
    if (result) *result = res;
    kiln_sampler_free(g.sampler);
    kiln_stop_scan_free(&g.scan);
    return rc;
}

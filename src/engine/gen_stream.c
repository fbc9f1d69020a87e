/* One request's output side: sample from its logits, stream the text (whole UTF-8 characters, stop strings held
 * back), and decide when it ends. kiln_generate and the scheduler both drive generation through here. */
#include <string.h>

#include "engine/engine.h"

/* Sends released text (and the token's logprobs) to the callback; returns nonzero when it asks to stop. */
static int emit(kiln_gen *g, int32_t token, const kiln_sample_info *info, size_t release) {
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

/* Decodes a token's bytes into the scan; sets stop_hit on a stop string. Returns -1 on error, else 0 and *stop
 * from the callback. */
static int push_token(kiln_gen *g, int32_t token, const kiln_sample_info *info, int *stop, kiln_error *err) {
    char text[256];
    size_t n = kiln_detok_push(&g->detok, g->model->tok, token, text, sizeof text), release;
    if (kiln_stop_scan_push(&g->scan, text, n, &release, &g->stop_hit, err)) return -1;
    *stop = emit(g, token, info, release);
    return 0;
}

/* Flushes what the detokenizer and the stop scan still hold (not after a stop string: the rest is dropped). */
static int finish_text(kiln_gen *g, kiln_error *err) {
    if (g->stop_hit) return 0;
    char text[16];
    size_t n = kiln_detok_flush(&g->detok, text, sizeof text), release;
    bool late_hit;
    if (kiln_stop_scan_push(&g->scan, text, n, &release, &late_hit, err)) return -1;
    if (!late_hit) release = g->scan.len;
    if (release) emit(g, -1, NULL, release);
    return 0;
}

int kiln_gen_check_fit(int n_ctx, int n_prompt, int max_tokens, kiln_error *err) {
    if (n_prompt < 1) return kiln_fail(err, "empty prompt: nothing to continue");
    if (n_prompt > n_ctx)
        return kiln_fail(err, "the prompt has %d tokens but the context holds %d (raise --ctx)", n_prompt, n_ctx);
    if (max_tokens > 0 && (int64_t)n_prompt + max_tokens > n_ctx)
        return kiln_fail(err,
                         "prompt (%d tokens) + max tokens (%d) exceed the context of %d tokens (raise --ctx or lower -n)",
                         n_prompt, max_tokens, n_ctx);
    return 0;
}

int kiln_gen_init(kiln_gen *g, const kiln_model *m, const kiln_generate_params *p, int n_ctx, const int32_t *prompt,
                  int n_prompt, kiln_token_callback cb, void *user, kiln_error *err) {
    memset(g, 0, sizeof *g);
    g->model = m;
    g->params = p;
    g->n_ctx = n_ctx;
    g->cb = cb;
    g->user = user;
    kiln_detok_init(&g->detok);
    if (kiln_model_need_tokenizer(m, err) || kiln_gen_check_fit(n_ctx, n_prompt, p->max_tokens, err) ||
        kiln_sampler_new(&p->sampling, m->cfg.n_vocab, &g->sampler, err) ||
        kiln_stop_scan_init(&g->scan, p->stop, p->n_stop, err))
        return -1;
    g->res.n_prompt = n_prompt;
    for (int i = 0; i < n_prompt; i++) kiln_sampler_accept(g->sampler, prompt[i]);
    return 0;
}

void kiln_gen_free(kiln_gen *g) {
    kiln_sampler_free(g->sampler);
    kiln_stop_scan_free(&g->scan);
    g->sampler = NULL;
}

static int finish(kiln_gen *g, kiln_finish why, kiln_error *err) {
    g->res.finish = why;
    return finish_text(g, err) ? -1 : 1;
}

int kiln_gen_next(kiln_gen *g, const float *logits, int n_past, int32_t *next, kiln_error *err) {
    const kiln_generate_params *p = g->params;
    bool want_info = p->sampling.n_top_logprobs > 0;
    if (p->max_tokens >= 0 && g->res.n_generated >= p->max_tokens) return finish(g, KILN_FINISH_LENGTH, err);
    kiln_sample_info info;
    int32_t tok = kiln_sampler_sample(g->sampler, logits, want_info ? &info : NULL);
    return kiln_gen_take(g, tok, want_info ? &info : NULL, n_past, next, err);
}

int kiln_gen_take(kiln_gen *g, int32_t tok, const kiln_sample_info *info, int n_past, int32_t *next, kiln_error *err) {
    const kiln_generate_params *p = g->params;
    if (p->max_tokens >= 0 && g->res.n_generated >= p->max_tokens) return finish(g, KILN_FINISH_LENGTH, err);
    if (kiln_token_is_eog(g->model->tok, tok)) return finish(g, KILN_FINISH_EOG, err);
    g->res.n_generated++;
    kiln_sampler_accept(g->sampler, tok);
    int stop;
    if (push_token(g, tok, info, &stop, err)) return -1;
    if (g->stop_hit) return finish(g, KILN_FINISH_STOP, err);
    if (stop) return finish(g, KILN_FINISH_CALLBACK, err);
    /* unlimited max_tokens ran into the end of the context */
    if (n_past >= g->n_ctx) return finish(g, KILN_FINISH_LENGTH, err);
    *next = tok;
    return 0;
}

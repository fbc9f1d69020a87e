/* The generation loop: reuse the cached prefix, prefill the rest, then sample, decode and stream (gen_stream.c)
 * until the request ends. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"

kiln_sampling_params kiln_sampling_default_params(void) { return kiln_sampler_default_params(); }

kiln_generate_params kiln_generate_default_params(void) {
    return (kiln_generate_params){.max_tokens = -1, .sampling = kiln_sampler_default_params()};
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int kiln_ctx_reusable_prefix(const kiln_context *c, const int32_t *prompt, int n_prompt) {
    int n = 0;
    while (n < c->n_past && n < n_prompt - 1 && c->tokens[n] == prompt[n]) n++;
    return n;
}

/* Evaluates tok and samples the next token from the best of its logits, ranked on the GPU (kiln_ctx_eval_best): the
 * token sampling the whole row gives. 1: the sampler needs the whole row (or there is no GPU), nothing done. */
static int sample_best_on_device(kiln_gen *g, kiln_context *c, int32_t tok, int32_t *chosen, kiln_error *err) {
    int32_t ids[KILN_CUDA_TOP_K_MAX], window[KILN_CUDA_TOP_K_MAX];
    float logits[KILN_CUDA_TOP_K_MAX], window_logits[KILN_CUDA_TOP_K_MAX];
    int n_window = 0;
    int k = c->cuda ? kiln_sampler_candidates_wanted(g->sampler, KILN_CUDA_TOP_K_MAX, window, &n_window) : 0;
    if (!k) return 1;
    if (kiln_ctx_eval_best(c, tok, k, ids, logits, window, n_window, window_logits, err)) return -1;
    *chosen = kiln_sampler_sample_candidates(g->sampler, ids, logits, k, window, window_logits, n_window);
    return 0;
}

static int run(kiln_gen *g, kiln_context *c, const int32_t *prompt, int n_prompt, kiln_error *err) {
    double t0 = now_ms();
    g->res.n_cached = kiln_ctx_reusable_prefix(c, prompt, n_prompt);
    if (kiln_ctx_eval(c, prompt + g->res.n_cached, n_prompt - g->res.n_cached, g->res.n_cached, NULL, false, err))
        return -1;
    double t1 = now_ms();
    g->res.prefill_ms = t1 - t0;
    /* on the GPU: greedy, each step's argmax stays on the device and only its id comes back; a sampler that needs
     * only the best k logits and its PRNG, the draw too (its id and PRNG state come back); other samplers, only the
     * best logits come back */
    bool device_greedy = kiln_ctx_greedy_on_device(c, &g->params->sampling);
    kiln_draw_params draw;
    int draw_k = device_greedy ? 0 : kiln_ctx_sampled_on_device(c, g->sampler, &draw);
    int32_t tok, chosen = -1;
    int rc;
    while ((rc = chosen >= 0 ? kiln_gen_take(g, chosen, NULL, c->n_past, &tok, err)
                             : kiln_gen_next(g, c->logits, c->n_past, &tok, err)) == 0) {
        chosen = -1;
        int r = device_greedy ? kiln_ctx_decode_greedy(c, tok, &chosen, err)
                : draw_k      ? kiln_ctx_decode_sampled(c, tok, g->sampler, draw_k, &draw, &chosen, err)
                              : sample_best_on_device(g, c, tok, &chosen, err);
        if (r == 1) r = kiln_ctx_eval(c, &tok, 1, c->n_past, NULL, false, err);
        if (r) return -1;
    }
    g->res.decode_ms = now_ms() - t1;
    return rc < 0 ? -1 : 0;
}

int kiln_generate(kiln_context *c, const int32_t *prompt, int n_prompt, const kiln_generate_params *p,
                  kiln_token_callback cb, void *user, kiln_generate_result *result, char *err, size_t err_size) {
    kiln_error e = {{0}};
    kiln_gen g;
    int rc = kiln_gen_init(&g, c->model, p, c->params.n_ctx, prompt, n_prompt, cb, user, &e);
    if (!rc) rc = run(&g, c, prompt, n_prompt, &e);
    if (rc) kiln_error_export(&e, err, err_size);
    if (result) *result = g.res;
    kiln_gen_free(&g);
    return rc;
}

/* Contexts: an executor (fast or reference), the tokens its KV cache holds, and the last logits. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

kiln_context_params kiln_context_default_params(void) {
    return (kiln_context_params){.n_ctx = 0, .n_threads = 0, .n_batch = 0};
}

/* Prompt tokens a batched step takes unless the caller says (n_batch 0). On the GPU every batch dequantizes each
 * weight to F16 once for its GEMMs, so a prompt in fewer batches is read fewer times. Measured on H100 (kiln bench
 * -p 4096, kiln synth Q4_K_M): qwen2-1.5b 89,305 tok/s in batches of 2048 against 52,461-54,703 in batches of 512
 * (72,943 at 1024, 98,345 in one batch of 4096), llama3-8b 26,382 against 19,214-19,328 (23,808; 27,957); a batch
 * of 4096 would take twice the activation memory (about 1 GB for llama3-8b) for the last 6-10%. */
#define CPU_BATCH 512
#define GPU_BATCH 2048

static void set_batch(kiln_context *c, int fallback) {
    if (c->params.n_batch <= 0) c->params.n_batch = fallback;
    if (c->params.n_batch > c->params.n_ctx) c->params.n_batch = c->params.n_ctx;
}

/* The GPU executor when the device asks for it (AUTO: when a GPU answers). Returns 1 when it was not wanted or
 * not found under AUTO, so the caller goes on with the CPU. */
static int make_cuda_executor(kiln_context *c, kiln_error *err) {
    if (c->params.device == KILN_DEVICE_CPU) return 1;
    const kiln_arch *arch = c->model->cfg.arch;
    if (!arch->gpu) {
        if (c->params.device == KILN_DEVICE_AUTO) return 1;
        return kiln_fail(err, "--device cuda: the CUDA executor does not run %s models yet (--device cpu does)",
                         arch->name);
    }
    kiln_error probe = {{0}};
    if (kiln_cuda_probe(NULL, 0, &probe)) {
        if (c->params.device == KILN_DEVICE_AUTO) return 1;
        return kiln_fail(err, "--device cuda: %s", probe.msg);
    }
    set_batch(c, GPU_BATCH);
    if (kiln_model_gpu_acquire(c->model, &c->cuda_model, err)) return -1;
    if (kiln_cuda_context_new(c->cuda_model, c->params.n_ctx, c->params.n_batch, &c->cuda, err)) return -1;
    return 0;
}

static int make_executor(kiln_context *c, kiln_error *err) {
    const kiln_model *m = c->model;
    if (c->params.reference) return kiln_ref_init(&c->ref, &m->cfg, &m->w, c->params.n_ctx, err);
    int rc = make_cuda_executor(c, err);
    if (rc <= 0) return rc;
    set_batch(c, CPU_BATCH);
    kiln_cpu_params cp = {.n_ctx = c->params.n_ctx, .n_batch = c->params.n_batch, .n_threads = c->params.n_threads,
                          .kv_type = c->params.kv_f32 ? KILN_TYPE_F32 : KILN_TYPE_F16};
    return kiln_cpu_new(&m->cfg, &m->w, &cp, &c->cpu, err);
}

kiln_context *kiln_context_new(kiln_model *m, const kiln_context_params *p, char *err, size_t err_size) {
    kiln_error e = {{0}};
    kiln_context *c = calloc(1, sizeof *c);
    if (!c) {
        kiln_fail(&e, "out of memory");
        kiln_error_export(&e, err, err_size);
        return NULL;
    }
    kiln_model_retain(m);
    c->model = m;
    c->params = p ? *p : kiln_context_default_params();
    if (c->params.n_ctx <= 0) c->params.n_ctx = m->cfg.n_ctx_train < 4096 ? m->cfg.n_ctx_train : 4096;
    if (make_executor(c, &e)) goto fail;
    c->tokens = malloc(sizeof *c->tokens * (size_t)c->params.n_ctx);
    c->logits = malloc(sizeof *c->logits * (size_t)m->cfg.n_vocab);
    if (!c->tokens || !c->logits) {
        kiln_fail(&e, "out of memory for a context of %d tokens", c->params.n_ctx);
        goto fail;
    }
    return c;
fail:
    kiln_error_export(&e, err, err_size);
    kiln_context_free(c);
    return NULL;
}

void kiln_context_free(kiln_context *c) {
    if (!c) return;
    if (c->params.reference) kiln_ref_free(&c->ref);
    else kiln_cpu_free(c->cpu);
    kiln_cuda_context_free(c->cuda);
    if (c->cuda_model) kiln_model_gpu_release(c->model);
    kiln_model_release(c->model);
    free(c->tokens);
    free(c->logits);
    free(c);
}

int kiln_context_n_ctx(const kiln_context *c) { return c->params.n_ctx; }
int kiln_context_n_threads(const kiln_context *c) {
    return c->params.reference || c->cuda ? 1 : kiln_cpu_n_threads(c->cpu);
}
kiln_device kiln_context_device(const kiln_context *c) { return c->cuda ? KILN_DEVICE_CUDA : KILN_DEVICE_CPU; }
const kiln_model *kiln_context_model(const kiln_context *c) { return c->model; }

kiln_memory kiln_context_memory(const kiln_context *c) {
    kiln_memory m = {0};
    if (c->cuda) {
        m.weights = kiln_cuda_model_bytes(c->cuda_model);
        kiln_cuda_context_memory(c->cuda, &m.kv_cache, &m.workspace);
        return m;
    }
    m.weights = kiln_weights_bytes(&c->model->w);
    if (c->params.reference) kiln_ref_memory(&c->ref, &m.kv_cache, &m.workspace);
    else kiln_cpu_memory(c->cpu, &m.kv_cache, &m.workspace);
    return m;
}

static int ref_eval(kiln_context *c, const int32_t *ids, int n, int pos, float *logits, bool all_logits,
                    kiln_error *err) {
    int V = c->model->cfg.n_vocab;
    if (pos < 0 || (int64_t)pos + n > c->params.n_ctx)
        return kiln_fail(err, "context full: %d tokens at position %d exceed the context of %d tokens (raise --ctx)", n,
                         pos, c->params.n_ctx);
    for (int i = 0; i < n; i++) {
        float *out = all_logits ? logits + (size_t)i * V : logits;
        if (kiln_ref_forward(&c->ref, ids[i], pos + i, out, err)) return -1;
    }
    return 0;
}

/* The GPU returns the last token's logits; every token's (perplexity) takes one step per token. */
static int cuda_eval(kiln_context *c, const int32_t *ids, int n, int pos, float *logits, bool all_logits,
                     kiln_error *err) {
    if (!all_logits) return kiln_cuda_eval(c->cuda, ids, n, pos, logits, err);
    size_t V = (size_t)c->model->cfg.n_vocab;
    for (int i = 0; i < n; i++)
        if (kiln_cuda_eval(c->cuda, ids + i, 1, pos + i, logits + i * V, err)) return -1;
    return 0;
}

int kiln_ctx_eval(kiln_context *c, const int32_t *ids, int n, int pos, float *logits, bool all_logits,
                  kiln_error *err) {
    if (pos > c->n_past) return kiln_fail(err, "evaluation at position %d leaves a gap after %d cached tokens", pos,
                                          c->n_past);
    float *out = logits ? logits : c->logits;
    bool all = logits && all_logits;
    int rc = c->params.reference ? ref_eval(c, ids, n, pos, out, all, err)
             : c->cuda            ? cuda_eval(c, ids, n, pos, out, all, err)
                                  : kiln_cpu_forward(c->cpu, ids, n, pos, out, all, err);
    if (rc) return -1;
    memcpy(c->tokens + pos, ids, sizeof *ids * (size_t)n);
    c->n_past = pos + n;
    if (out != c->logits) {
        size_t V = (size_t)c->model->cfg.n_vocab;
        memcpy(c->logits, out + (all ? (size_t)(n - 1) * V : 0), sizeof(float) * V);
    }
    return 0;
}

int kiln_eval(kiln_context *c, const int32_t *ids, int n, int pos, float *logits, bool all_logits, char *err,
              size_t err_size) {
    kiln_error e = {{0}};
    if (kiln_ctx_eval(c, ids, n, pos, logits, all_logits, &e)) {
        kiln_error_export(&e, err, err_size);
        return -1;
    }
    return 0;
}

bool kiln_ctx_greedy_on_device(const kiln_context *c, const kiln_sampling_params *p) {
    return c->cuda && p->temperature <= 0 && p->n_top_logprobs == 0 && p->repeat_penalty == 1.0f &&
           p->presence_penalty == 0 && p->frequency_penalty == 0;
}

int kiln_ctx_decode_greedy(kiln_context *c, int32_t token, int32_t *next, kiln_error *err) {
    if (kiln_cuda_decode_greedy(c->cuda, token, c->n_past, next, err)) return -1;
    c->tokens[c->n_past++] = token;
    return 0;
}

int kiln_ctx_sampled_on_device(const kiln_context *c, const kiln_sampler *s, kiln_draw_params *p) {
    return c->cuda ? kiln_sampler_device_draw(s, KILN_CUDA_TOP_K_MAX, p) : 0;
}

int kiln_ctx_decode_sampled(kiln_context *c, int32_t token, kiln_sampler *s, int k, const kiln_draw_params *p,
                            int32_t *next, kiln_error *err) {
    uint64_t rng[4];
    kiln_sampler_get_rng(s, rng);
    if (kiln_cuda_decode_sampled(c->cuda, token, c->n_past, k, p, rng, next, err)) return -1;
    kiln_sampler_set_rng(s, rng);
    c->tokens[c->n_past++] = token;
    return 0;
}

int kiln_ctx_eval_best(kiln_context *c, int32_t token, int k, int32_t *ids, float *logits, const int32_t *window,
                       int n_window, float *window_logits, kiln_error *err) {
    if (kiln_cuda_eval_best(c->cuda, &token, 1, c->n_past, k, ids, logits, window, n_window, window_logits, err))
        return -1;
    c->tokens[c->n_past++] = token;
    return 0;
}

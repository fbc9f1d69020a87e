/* The CUDA executor against the CPU reference forward pass on whole models: logits after a batched prompt (the
 * cuBLAS prefill path), after single decode steps (the GEMV path op by op, and the persistent step), greedy
 * generation through the captured graph and through the engine's one-call-per-token path, and KILN_GPU_DEBUG's
 * per-op checks (which must all pass).
 * Models come from KILN_CUDA_TEST_MODELS (space-separated GGUF paths; tests/cuda/make_model.py makes random ones in
 * every type); without it, or without a GPU, the test skips and says why. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/forward_ref.h"
#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"
#include "format/gguf.h"
#include "gpu_test.h"
#include "model/model.h"
#include "sample/sample.h"

#define N_CTX 64
#define N_PROMPT 12
#define N_DECODE 8
#define N_GREEDY 16

static double logits_err(const float *gpu, const float *cpu, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(gpu[i])) return INFINITY;
        num += ((double)gpu[i] - cpu[i]) * ((double)gpu[i] - cpu[i]);
        den += (double)cpu[i] * cpu[i];
    }
    return sqrt(num / den);
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Whether any matrix reads Q8_1 activations on the GPU: those logits carry the activation rounding (about 4e-3 per
 * GEMV, compounding over the layers; random-weight models amplify it more than trained ones). */
static bool any_quantized(const kiln_weights *w) {
    static const kiln_layer_role matrices[] = {KILN_ROLE_WQ, KILN_ROLE_WK, KILN_ROLE_WV, KILN_ROLE_WO,
                                               KILN_ROLE_FFN_GATE, KILN_ROLE_FFN_UP, KILN_ROLE_FFN_DOWN};
    bool q = kiln_cuda_type_uses_q8_1(w->output.type);
    for (int l = 0; l < w->n_layer; l++)
        for (size_t i = 0; i < sizeof matrices / sizeof matrices[0]; i++)
            q = q || kiln_cuda_type_uses_q8_1(w->layers[l].w[matrices[i]].type);
    return q;
}

/* One model on both executors: the file, its weights, the CPU reference's state, the GPU model and a context of
 * n_ctx positions, with logits buffers for each side. */
typedef struct {
    kiln_gguf *g;
    kiln_config cfg;
    kiln_weights w;
    kiln_ref_state ref;
    kiln_cuda_model *cm;
    kiln_cuda_context *ctx;
    float *cpu, *gpu;
} both_sides;

static void open_both(const char *path, int n_ctx, int n_batch, both_sides *m) {
    kiln_error err = {{0}};
    memset(m, 0, sizeof *m);
    if (kiln_gguf_open(path, &m->g, &err) || kiln_config_load(m->g, &m->cfg, &err) ||
        kiln_weights_load(m->g, &m->cfg, &m->w, &err) || kiln_ref_init(&m->ref, &m->cfg, &m->w, n_ctx, &err) ||
        kiln_cuda_model_load(&m->cfg, &m->w, &m->cm, &err) ||
        kiln_cuda_context_new(m->cm, n_ctx, n_batch, &m->ctx, &err))
        fail_msg("%s: %s", path, err.msg);
    uint64_t kv, work, kv_want = 2 * 2 * (uint64_t)m->cfg.n_layer * (uint64_t)kiln_config_kv_dim(&m->cfg) * n_ctx;
    kiln_cuda_context_memory(m->ctx, &kv, &work);
    assert_int_equal(kv, kv_want); /* F16 keys and values */
    assert_true(work > 0 && kiln_cuda_model_bytes(m->cm) > 0);
    m->cpu = malloc(sizeof(float) * m->cfg.n_vocab), m->gpu = malloc(sizeof(float) * m->cfg.n_vocab);
}

static void close_both(both_sides *m) {
    free(m->cpu), free(m->gpu);
    kiln_cuda_context_free(m->ctx);
    kiln_cuda_model_free(m->cm);
    kiln_ref_free(&m->ref);
    kiln_weights_free(&m->w);
    kiln_gguf_close(m->g);
}

/* The prompt tokens[0..n_prompt) (the GPU in batches), then one decode step at a time up to n_prompt + n_decode on
 * both sides: the prompt's last logits error into *e_prompt (when asked), the decode steps' largest as the result. */
static double prompt_then_decode(both_sides *m, const int32_t *tokens, int n_prompt, int n_decode, double *e_prompt) {
    kiln_error err = {{0}};
    int nv = m->cfg.n_vocab;
    for (int p = 0; p < n_prompt; p++)
        if (kiln_ref_forward(&m->ref, tokens[p], p, m->cpu, &err)) fail_msg("%s", err.msg);
    if (kiln_cuda_eval(m->ctx, tokens, n_prompt, 0, m->gpu, &err)) fail_msg("%s", err.msg);
    if (e_prompt) *e_prompt = logits_err(m->gpu, m->cpu, nv);
    double worst = 0;
    for (int p = n_prompt; p < n_prompt + n_decode; p++) {
        if (kiln_ref_forward(&m->ref, tokens[p], p, m->cpu, &err) ||
            kiln_cuda_eval(m->ctx, &tokens[p], 1, p, m->gpu, &err))
            fail_msg("%s", err.msg);
        double e = logits_err(m->gpu, m->cpu, nv);
        if (e > worst) worst = e;
    }
    return worst;
}

/* Measured on random-weight models (H100): float models 8e-4 for both paths (F16 activations in the prefill GEMMs,
 * the F16 KV cache against the reference's F32 one); quantized models prefill up to 3.4e-2 on the Q4_K_M models and
 * 6.3e-2 on the model with every type (KILN_TEST_SEED=193687112809; 3e-4 to 1e-2 on most prompts), and decode (Q8_1
 * activations) up to 2.3e-1 on the Q4_K_M models, while the model with every type (Q2_K and Q3_K among them) spread
 * from 2.0e-2 to 3.8e-1 over 30 seeds, and reached 6.5e-1 and 9.4e-1 (KILN_TEST_SEED=182012361146) on two seeds
 * through the fused-norm path, whose prompts are drawn after the default path's (run first, on that seed's first
 * prompts, the fused paths gave the default path's 6.0e-2). Random weights amplify rounding far more than trained ones, so for quantized models the
 * decode bound only tells a decode that follows the reference from a broken one (logits unrelated to the
 * reference's give about 1.4, sqrt(2) for two independent vectors of one norm); each GEMV is
 * checked to 1e-5 against its exact input in cuda_kernels, every op of a step against its own bound in test_debug,
 * and the greedy check bounds the choices. */
static double prefill_bound(const kiln_weights *w) { return any_quantized(w) ? 1e-1 : 3e-3; }
static double decode_bound(const kiln_weights *w) { return any_quantized(w) ? 1.0 : 3e-3; }

/* A greedy step whose logits stray: its error, the two vectors' norms and best, and the logit that differs most. */
static void report_step(const char *path, int step, double e, const float *gpu, const float *cpu, int nv, int chosen) {
    double ng = 0, nc = 0, worst = -1;
    int at = 0;
    for (int j = 0; j < nv; j++) {
        ng += (double)gpu[j] * gpu[j], nc += (double)cpu[j] * cpu[j];
        double d = fabs((double)gpu[j] - cpu[j]);
        if (d > worst) worst = d, at = j;
    }
    fprintf(stderr, "%s: greedy step %d: logits rel err %.2e; norms gpu %.3g cpu %.3g; best gpu %d cpu %d, chosen %d; "
            "logit %d differs most: gpu %g cpu %g\n", path, step, e, sqrt(ng), sqrt(nc), argmax(gpu, nv),
            argmax(cpu, nv), chosen, at, gpu[at], cpu[at]);
}

/* Returns false (after printing the numbers) when a bound is missed, so every model is reported. */
static bool check_model(const char *path) {
    kiln_error err = {{0}};
    both_sides m;
    open_both(path, N_CTX, 8, &m);
    kiln_cuda_context *ctx = m.ctx;
    int nv = m.cfg.n_vocab;
    float *cpu = m.cpu;
    int32_t tokens[N_CTX];
    for (int i = 0; i < N_CTX; i++) tokens[i] = (int32_t)((rng_uniform() + 1.0f) * 0.5f * (nv - 1));

    /* prompt in batches of 8 (8 + 4 tokens), then one token at a time */
    double e_prefill, e_decode = prompt_then_decode(&m, tokens, N_PROMPT, N_DECODE, &e_prefill);

    /* greedy from the next position: each GPU choice must be a CPU maximum up to the measured logit error. The error
     * is relative over the whole vector, so error * rms is its rms; the worst of nv logits is about sqrt(2 ln nv)
     * times that, and a gap between two logits can be off by twice the worst (4 times the rms missed near-ties:
     * KILN_TEST_SEED=159449011459 chose a logit 0.084 below the best on tiny-llama-q4km). The error is the larger of
     * the decode steps' above and the step's own (its logits evaluated again after the greedy run, which wrote the
     * same cache rows): on random weights one step's error can pass the earlier steps' (KILN_TEST_SEED=215110694798,
     * tiny-llama-q4km: a choice 0.245 below the best at greedy step 1). A step whose own error passes the decode
     * bound is printed and left out of the slack: KILN_TEST_SEED=161643807712 gave 1.55 on tiny-llama-all at greedy
     * step 10 of the third pass, where both chose the same token and the rest of the rows differ (norms 81 and 55),
     * as when a residual dominated by one huge value has its Q8_1 blocks round the values beside it to zero on the
     * GPU, where the reference keeps F32 (a reading of the numbers, not verified). */
    double slack_per_rms = 2.0 * sqrt(2.0 * log((double)nv));
    int pos = N_PROMPT + N_DECODE;
    int32_t gen[N_GREEDY];
    if (kiln_cuda_generate_greedy(ctx, tokens[pos], pos, N_GREEDY, gen, &err)) fail_msg("%s", err.msg);
    int same = 0;
    double e_greedy = 0;
    int32_t fed = tokens[pos];
    for (int i = 0; i < N_GREEDY; i++) {
        if (kiln_ref_forward(&m.ref, fed, pos + i, cpu, &err) || kiln_cuda_eval(ctx, &fed, 1, pos + i, m.gpu, &err))
            fail_msg("%s", err.msg);
        int best = argmax(cpu, nv);
        double rms = 0, e_step = logits_err(m.gpu, cpu, nv);
        if (e_step > e_greedy) e_greedy = e_step;
        for (int j = 0; j < nv; j++) rms += (double)cpu[j] * cpu[j];
        rms = sqrt(rms / nv);
        if (e_step >= decode_bound(&m.w) || argmax(m.gpu, nv) != gen[i])
            report_step(path, i, e_step, m.gpu, cpu, nv, gen[i]);
        double e_slack = e_step > e_decode && e_step < decode_bound(&m.w) ? e_step : e_decode;
        if (cpu[best] - cpu[gen[i]] > slack_per_rms * e_slack * rms + 1e-6)
            fail_msg("%s: greedy step %d chose %d (cpu logit %g), cpu best %d (%g)", path, i, gen[i], cpu[gen[i]], best,
                     cpu[best]);
        same += best == gen[i];
        fed = gen[i];
    }
    /* the engine's greedy loop: one call per token, the next step queued ahead; same ids as the replayed graph */
    int32_t tok = tokens[pos], step;
    for (int i = 0; i < N_GREEDY; i++) {
        if (kiln_cuda_decode_greedy(ctx, tok, pos + i, &step, &err)) fail_msg("%s", err.msg);
        if (step != gen[i]) fail_msg("%s: decode_greedy step %d gave %d, generate_greedy %d", path, i, step, gen[i]);
        tok = step;
    }
    /* a call that is not the step queued ahead discards it */
    if (kiln_cuda_decode_greedy(ctx, tokens[pos], pos, &step, &err)) fail_msg("%s", err.msg);
    if (step != gen[0]) fail_msg("%s: decode_greedy after a discarded step gave %d, expected %d", path, step, gen[0]);
    fprintf(stderr, "%s: logits rel err prefill %.2e, decode (max of %d) %.2e, greedy steps %.2e; greedy %d/%d same as "
            "cpu argmax; %s, %s\n", path, e_prefill, N_DECODE, e_decode, e_greedy, same, N_GREEDY,
            kiln_cuda_context_uses_graph(ctx) ? "graph replay" : "eager launches",
            kiln_cuda_context_uses_persistent(ctx) ? "persistent step" : "a kernel per op");
    /* prefill runs F16 weights and activations through the GEMMs; decode runs GEMVs */
    double pb = prefill_bound(&m.w), db = decode_bound(&m.w);
    bool ok = e_prefill < pb && e_decode < db;
    if (!ok) fprintf(stderr, "%s: bounds are prefill %.0e, decode %.0e\n", path, pb, db);
    close_both(&m);
    return ok;
}

/* Every model of KILN_CUDA_TEST_MODELS through check, which prints what it finds: whether all passed. */
static bool each_test_model(bool (*check)(const char *path)) {
    char *copy = strdup(getenv("KILN_CUDA_TEST_MODELS")), *save = NULL;
    bool ok = copy != NULL;
    for (char *p = ok ? strtok_r(copy, " ", &save) : NULL; p; p = strtok_r(NULL, " ", &save)) ok = check(p) && ok;
    free(copy);
    return ok;
}

/* Skips the test without a GPU or test models. */
static void need_test_models(void) {
    if (!gpu_present()) skip();
    const char *list = getenv("KILN_CUDA_TEST_MODELS");
    if (!list || !*list) {
        fprintf(stderr, "KILN_CUDA_TEST_MODELS is not set (tests/cuda/make_model.py makes models): skipped\n");
        skip();
    }
}

/* The first model of KILN_CUDA_TEST_MODELS into path; skips the test without a GPU or a model. */
static void first_test_model(char *path, size_t size) {
    need_test_models();
    snprintf(path, size, "%s", getenv("KILN_CUDA_TEST_MODELS"));
    strtok(path, " ");
}

/* KILN_GPU_DEBUG=1: a prompt, decode steps and greedy steps, every op within its bound (on a NeoX model, against
 * the CPU's Q/K in the device's interleaved order). */
static bool check_debug(const char *path) {
    kiln_error err = {{0}};
    kiln_gguf *g = NULL;
    kiln_config cfg;
    kiln_weights w = {0};
    kiln_cuda_model *cm = NULL;
    kiln_cuda_context *ctx = NULL;
    setenv("KILN_GPU_DEBUG", "1", 1);
    if (kiln_gguf_open(path, &g, &err) || kiln_config_load(g, &cfg, &err) || kiln_weights_load(g, &cfg, &w, &err) ||
        kiln_cuda_model_load(&cfg, &w, &cm, &err) || kiln_cuda_context_new(cm, N_CTX, 8, &ctx, &err))
        fail_msg("%s: %s", path, err.msg);
    unsetenv("KILN_GPU_DEBUG");
    int32_t tokens[N_PROMPT], gen[4];
    for (int i = 0; i < N_PROMPT; i++) tokens[i] = (int32_t)((rng_uniform() + 1.0f) * 0.5f * (cfg.n_vocab - 1));
    if (kiln_cuda_eval(ctx, tokens, N_PROMPT - 2, 0, NULL, &err) ||
        kiln_cuda_eval(ctx, tokens + N_PROMPT - 2, 1, N_PROMPT - 2, NULL, &err) ||
        kiln_cuda_generate_greedy(ctx, tokens[N_PROMPT - 1], N_PROMPT - 1, 4, gen, &err))
        fail_msg("%s", err.msg);
    bool ok = !kiln_cuda_context_uses_graph(ctx) && !kiln_cuda_context_debug_diverged(ctx);
    fprintf(stderr, "%s: KILN_GPU_DEBUG %s\n", path, ok ? "every op within its bound" : "diverged");
    kiln_cuda_context_free(ctx);
    kiln_cuda_model_free(cm);
    kiln_weights_free(&w);
    kiln_gguf_close(g);
    return ok;
}

static void test_debug(void **state) {
    need_test_models();
    assert_true(each_test_model(check_debug));
}

/* Decode steps on both sides of the first span boundary (positions 127 and 128: the step built for 128 positions,
 * then the one built for 256, each captured as its own graph), on every model: logits within check_model's bounds
 * of the CPU reference's. */
#define SPAN_CTX 600
#define SPAN_PROMPT 120
#define SPAN_STEPS 16

static bool check_span_boundary(const char *path) {
    both_sides m;
    open_both(path, SPAN_CTX, 64, &m);
    int32_t tokens[SPAN_PROMPT + SPAN_STEPS];
    for (int i = 0; i < SPAN_PROMPT + SPAN_STEPS; i++)
        tokens[i] = (int32_t)((rng_uniform() + 1.0f) * 0.5f * (m.cfg.n_vocab - 1));
    double worst = prompt_then_decode(&m, tokens, SPAN_PROMPT, SPAN_STEPS, NULL), bound = decode_bound(&m.w);
    fprintf(stderr, "%s: decode at positions %d..%d (across the span of 128), logits rel err max %.2e (bound %.0e)\n",
            path, SPAN_PROMPT, SPAN_PROMPT + SPAN_STEPS - 1, worst, bound);
    bool ok = kiln_cuda_context_uses_graph(m.ctx) && worst < bound;
    close_both(&m);
    return ok;
}

/* A prompt of LONG_PROMPT tokens in one batch, so its attention takes the tiled kernels (tensor cores, F16 q and
 * probabilities: attention_prefill.cu), then decode steps that read the cache it wrote: logits within the bounds. */
#define LONG_PROMPT (KILN_CUDA_PREFILL_ATTENTION_MIN + 44)
#define LONG_DECODE 3

static bool check_long_prompt(const char *path) {
    both_sides m;
    open_both(path, LONG_PROMPT + LONG_DECODE, LONG_PROMPT, &m);
    int32_t tokens[LONG_PROMPT + LONG_DECODE];
    for (int i = 0; i < LONG_PROMPT + LONG_DECODE; i++)
        tokens[i] = (int32_t)((rng_uniform() + 1.0f) * 0.5f * (m.cfg.n_vocab - 1));
    double e_prompt, e_decode = prompt_then_decode(&m, tokens, LONG_PROMPT, LONG_DECODE, &e_prompt);
    double pb = prefill_bound(&m.w), db = decode_bound(&m.w);
    fprintf(stderr, "%s: a %d-token prompt in one batch: logits rel err %.2e (bound %.0e), then decode %.2e (%.0e)\n",
            path, LONG_PROMPT, e_prompt, pb, e_decode, db);
    close_both(&m);
    return e_prompt < pb && e_decode < db;
}

static void test_long_prompt(void **state) {
    need_test_models();
    assert_true(each_test_model(check_long_prompt));
}

static void test_span_boundary(void **state) {
    need_test_models();
    assert_true(each_test_model(check_span_boundary));
}

static void test_models(void **state) {
    need_test_models();
    rng_seed();
    bool ok = true;
    /* each model through a kernel per op (the default), the same with the norms done by the residual GEMVs (opt-in)
     * and through the persistent decode step */
    static const struct { const char *name, *value; } paths[] = {
        {NULL, NULL}, {"KILN_CUDA_FUSE", "3"}, {"KILN_CUDA_PERSISTENT", "1"}};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        if (paths[i].name) setenv(paths[i].name, paths[i].value, 1);
        ok = each_test_model(check_model) && ok;
        if (paths[i].name) unsetenv(paths[i].name);
    }
    assert_true(ok);
}

/* The first test model opened on both sides (path kept, for messages) and N_PROMPT random tokens for it. */
static void open_first_model(char *path, size_t size, both_sides *m, int32_t *tokens) {
    first_test_model(path, size);
    open_both(path, N_CTX, 8, m);
    for (int i = 0; i < N_PROMPT; i++) tokens[i] = (int32_t)((rng_uniform() + 1.0f) * 0.5f * (m->cfg.n_vocab - 1));
}

/* A context that cannot fit says what it needs: its KV cache and workspace, and what to lower. */
static void test_context_too_large(void **state) {
    char path[4096];
    both_sides m;
    int32_t tokens[N_PROMPT];
    open_first_model(path, sizeof path, &m, tokens);
    kiln_error err = {{0}};
    kiln_cuda_context *big = NULL;
    assert_int_equal(kiln_cuda_context_new(m.cm, 1 << 30, 8, &big, &err), -1);
    assert_null(big);
    fprintf(stderr, "%s\n", err.msg);
    assert_non_null(strstr(err.msg, "needs"));
    assert_non_null(strstr(err.msg, "lower --ctx"));
    close_both(&m);
}

/* kiln_cuda_eval_best on the first model: a decode step run twice at the same position, once with the whole row
 * copied back (kiln_cuda_eval), once ranked on the device: the k best are the row's k best by the sampler's order,
 * with their logits, and the window's logits are the row's. */
static void test_best_logits(void **state) {
    char path[4096];
    both_sides m;
    int32_t tokens[N_PROMPT];
    open_first_model(path, sizeof path, &m, tokens);
    kiln_error err = {{0}};
    int nv = m.cfg.n_vocab, k = 40;
    int32_t ids[KILN_CUDA_TOP_K_MAX], window[3] = {0, nv - 1, 7 % nv};
    int32_t *order = malloc(sizeof(int32_t) * nv);
    float logits[KILN_CUDA_TOP_K_MAX], wl[3];
    if (kiln_cuda_eval(m.ctx, tokens, N_PROMPT - 1, 0, NULL, &err) ||
        kiln_cuda_eval(m.ctx, tokens + N_PROMPT - 1, 1, N_PROMPT - 1, m.gpu, &err) ||
        kiln_cuda_eval_best(m.ctx, tokens + N_PROMPT - 1, 1, N_PROMPT - 1, k, ids, logits, window, 3, wl, &err))
        fail_msg("%s", err.msg);
    rank_order(m.gpu, nv, order);
    for (int i = 0; i < k; i++) {
        assert_int_equal(ids[i], order[i]);
        assert_true(logits[i] == m.gpu[order[i]]);
    }
    for (int i = 0; i < 3; i++) assert_true(wl[i] == m.gpu[window[i]]);
    assert_int_equal(kiln_cuda_eval_best(m.ctx, tokens, 1, 0, KILN_CUDA_TOP_K_MAX + 1, ids, logits, NULL, 0, wl, &err),
                     -1);
    free(order);
    close_both(&m);
}

/* The host sampler's tokens from n steps at pos.. (the whole row copied back each step); its PRNG state after. */
static void sample_on_host(both_sides *m, kiln_sampler_params p, int32_t tok, int pos, int n, int32_t *out,
                           uint64_t rng[4]) {
    kiln_error err = {{0}};
    kiln_sampler *s = NULL;
    if (kiln_sampler_new(&p, m->cfg.n_vocab, &s, &err)) fail_msg("%s", err.msg);
    for (int i = 0; i < n; i++) {
        if (kiln_cuda_eval(m->ctx, &tok, 1, pos + i, m->gpu, &err)) fail_msg("%s", err.msg);
        out[i] = tok = kiln_sampler_sample(s, m->gpu, NULL);
    }
    kiln_sampler_get_rng(s, rng);
    kiln_sampler_free(s);
}

/* kiln_cuda_decode_sampled on the first model: the tokens and PRNG state of the host sampler drawing from the
 * copied rows, for two samplers in turn (the second's k recaptures the steps); a call that does not continue the
 * steps in flight (an earlier position, or the PRNG set back) discards them and gives the host's token again. */
static void test_sampled_decode(void **state) {
    char path[4096];
    both_sides m;
    int32_t tokens[N_PROMPT], want[N_GREEDY], got[N_GREEDY];
    open_first_model(path, sizeof path, &m, tokens);
    kiln_error err = {{0}};
    if (kiln_cuda_eval(m.ctx, tokens, N_PROMPT - 1, 0, NULL, &err)) fail_msg("%s", err.msg);
    kiln_sampler_params ps[2] = {kiln_sampler_default_params(), kiln_sampler_default_params()};
    ps[0].seed = 5, ps[0].temperature = 1.5f, ps[0].min_p = 0.0f; /* random weights: a flat distribution */
    ps[1].seed = 6, ps[1].top_k = 100, ps[1].top_p = 0.7f, ps[1].temperature = 0.9f;
    int pos = N_PROMPT - 1;
    for (int c = 0; c < 2; c++) {
        uint64_t host_rng[4], rng[4], rng_at[N_GREEDY][4];
        sample_on_host(&m, ps[c], tokens[pos], pos, N_GREEDY, want, host_rng);
        kiln_sampler *s = NULL;
        kiln_draw_params dp;
        if (kiln_sampler_new(&ps[c], m.cfg.n_vocab, &s, &err)) fail_msg("%s", err.msg);
        int k = kiln_sampler_device_draw(s, KILN_CUDA_TOP_K_MAX, &dp);
        assert_true(k > 0);
        kiln_sampler_get_rng(s, rng);
        int32_t tok = tokens[pos];
        for (int i = 0; i < N_GREEDY; i++) {
            memcpy(rng_at[i], rng, sizeof rng);
            if (kiln_cuda_decode_sampled(m.ctx, tok, pos + i, k, &dp, rng, &got[i], &err)) fail_msg("%s", err.msg);
            tok = got[i];
        }
        assert_memory_equal(got, want, sizeof want);
        assert_memory_equal(rng, host_rng, sizeof rng);
        int32_t again;
        if (kiln_cuda_decode_sampled(m.ctx, want[2], pos + 3, k, &dp, rng_at[3], &again, &err)) fail_msg("%s", err.msg);
        assert_int_equal(again, want[3]);
        fprintf(stderr, "%s: %d tokens drawn on the device (top-k %d) as the host draws them\n", path, N_GREEDY, k);
        kiln_sampler_free(s);
    }
    kiln_draw_params dp = {1.0f, 1.0f, -INFINITY};
    uint64_t rng[4] = {1, 2, 3, 4};
    int32_t next;
    assert_int_equal(kiln_cuda_decode_sampled(m.ctx, tokens[0], 0, KILN_CUDA_TOP_K_MAX + 1, &dp, rng, &next, &err), -1);
    close_both(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_models), cmocka_unit_test(test_span_boundary),
                                       cmocka_unit_test(test_long_prompt),
                                       cmocka_unit_test(test_debug), cmocka_unit_test(test_best_logits),
                                       cmocka_unit_test(test_sampled_decode),
                                       cmocka_unit_test(test_context_too_large)};
    return cmocka_run_group_tests_name("cuda_model", tests, NULL, NULL);
}

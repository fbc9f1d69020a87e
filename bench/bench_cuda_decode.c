/* Whole-model speed on the GPU, as llama-bench reports it: pp (prompt tokens per second, one batch), TTFT of a
 * 128-token prompt, and tg (greedy tokens per second from an empty context through the captured decode step), with
 * tg as a share of the roofline: copy bandwidth measured in the same run / weight bytes read per token; tg again
 * against contexts made under other settings (without the decode fusions; the persistent step). Then a per-op
 * profile (eager launches timed with events) of 16 decode steps and of one prompt batch, and the persistent step's
 * profile (its stages timed inside the kernel).
 * usage: bench_cuda_decode MODEL.gguf [n_prompt=512] [n_gen=128] [NAME=VALUE...]
 * Each further argument, NAME=VALUE[,NAME=VALUE...] (environment variables), is a setting compared in place of the
 * default list. The first pair of a run ran 1.3% slower than the later ones on both sides (H100, sessions 38-39),
 * so a comparison starts with a setting that changes nothing (one that is the default already). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"
#include "format/gguf.h"
#include "model/model.h"
#include "sample/sample.h"
#include "util/error.h"

#define RUNS 3

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *t) {
    qsort(t, RUNS, sizeof *t, cmp_double);
    return t[RUNS / 2];
}

enum { PROFILED_STEPS = 16 };

/* Profiles PROFILED_STEPS greedy decode steps of ctx and prints the mean per op; 0, or -1 with err said. */
static int print_step_profile(kiln_cuda_context *ctx, int32_t *tokens, double bw, kiln_error *err) {
    if (kiln_cuda_context_set_profile(ctx, true, err) ||
        kiln_cuda_generate_greedy(ctx, tokens[0], 0, PROFILED_STEPS, tokens, err)) {
        fprintf(stderr, "%s\n", err->msg);
        return -1;
    }
    kiln_cuda_profile_print(ctx, PROFILED_STEPS, bw, stdout);
    return 0;
}

/* The environment a compared setting changed, to put back once its context has captured its step. */
#define MAX_SETTINGS 4
typedef struct {
    char *name[MAX_SETTINGS], *old[MAX_SETTINGS];
    int n;
} saved_env;

/* Microseconds of one top-k (k best of n random values) on the device, the mean of 100 back to back; with draw, the
 * default sampler's draw among them too (kiln_cuda_top_k_draw). */
static double top_k_us(int n, int k, bool draw) {
    float *h = malloc(sizeof(float) * (size_t)n), *d = NULL, *out_v = NULL, ms = 0;
    int32_t *out_id = NULL;
    void *scratch = NULL;
    cudaEvent_t e0, e1;
    for (int i = 0; i < n; i++) h[i] = (float)rand() / (float)RAND_MAX;
    cudaMalloc((void **)&d, sizeof(float) * (size_t)n);
    cudaMalloc((void **)&out_v, sizeof(float) * (size_t)k);
    cudaMalloc((void **)&out_id, sizeof(int32_t) * (size_t)k);
    cudaMalloc(&scratch, kiln_cuda_top_k_scratch_bytes(n, 1, k));
    cudaMemcpy(d, h, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice);
    kiln_cuda_draw one = {{1.0f / 0.8f, 0.95f, logf(0.05f)}, 0, {{1, 2, 3, 4}}}, *dd = NULL;
    int32_t *token = NULL;
    cudaMalloc((void **)&dd, sizeof one);
    cudaMalloc((void **)&token, sizeof(int32_t));
    cudaMemcpy(dd, &one, sizeof one, cudaMemcpyHostToDevice);
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    for (int i = 0; i <= 100; i++) {
        if (i == 1) cudaEventRecord(e0, 0);
        if (draw) kiln_cuda_top_k_draw(d, n, k, scratch, out_v, out_id, dd, token, NULL, 0);
        else kiln_cuda_top_k(d, n, 1, k, scratch, out_v, out_id, 0);
    }
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(d), cudaFree(out_v), cudaFree(out_id), cudaFree(scratch), cudaFree(dd), cudaFree(token);
    free(h);
    return ms * 10.0;
}

/* How tg_sampled samples: each step's whole row copied to the host and sampled there; its best logits ranked on the
 * device (kiln_cuda_eval_best) and sampled from on the host; or the draw on the device too (kiln_cuda_decode_sampled,
 * the next step queued behind each): the engine's three paths, which choose the same tokens. */
enum { SAMPLE_ROW, SAMPLE_BEST, SAMPLE_DRAW };

/* tok/s of n_gen steps from position 0 with the default sampler (seeded), its tokens into out. */
static double tg_sampled(kiln_cuda_context *ctx, int n_vocab, int n_gen, int how, float *row, int32_t *out,
                         kiln_error *err) {
    kiln_sampler_params p = kiln_sampler_default_params();
    p.seed = 42;
    kiln_sampler *s = NULL;
    if (kiln_sampler_new(&p, n_vocab, &s, err)) return -1;
    int32_t tok = 1, ids[KILN_CUDA_TOP_K_MAX], window[KILN_CUDA_TOP_K_MAX];
    float best[KILN_CUDA_TOP_K_MAX], window_logits[KILN_CUDA_TOP_K_MAX];
    kiln_draw_params dp;
    uint64_t rng[4];
    int draw_k = kiln_sampler_device_draw(s, KILN_CUDA_TOP_K_MAX, &dp);
    kiln_sampler_get_rng(s, rng);
    double t0 = now();
    for (int i = 0; i < n_gen && !err->msg[0]; i++) {
        int n_window = 0;
        int k = how == SAMPLE_BEST ? kiln_sampler_candidates_wanted(s, KILN_CUDA_TOP_K_MAX, window, &n_window) : 0;
        if (how == SAMPLE_DRAW) {
            if (kiln_cuda_decode_sampled(ctx, tok, i, draw_k, &dp, rng, &tok, err)) break;
        } else if (k) {
            if (kiln_cuda_eval_best(ctx, &tok, 1, i, k, ids, best, window, n_window, window_logits, err)) break;
            tok = kiln_sampler_sample_candidates(s, ids, best, k, window, window_logits, n_window);
        } else {
            if (kiln_cuda_eval(ctx, &tok, 1, i, row, err)) break;
            tok = kiln_sampler_sample(s, row, NULL);
        }
        kiln_sampler_accept(s, tok);
        out[i] = tok;
    }
    double t = now() - t0;
    kiln_sampler_free(s);
    return err->msg[0] ? -1 : n_gen / t;
}

static void restore_env(saved_env *s) {
    for (int i = s->n - 1; i >= 0; i--) {
        if (s->old[i]) setenv(s->name[i], s->old[i], 1);
        else unsetenv(s->name[i]);
        free(s->name[i]), free(s->old[i]);
    }
    s->n = 0;
}

/* Sets each NAME=VALUE of spec (comma-separated), saving the old values; -1 (nothing left changed) if malformed. */
static int set_variant(const char *spec, saved_env *s) {
    char *copy = strdup(spec), *rest = NULL;
    s->n = 0;
    for (char *tok = strtok_r(copy, ",", &rest); tok; tok = strtok_r(NULL, ",", &rest)) {
        char *eq = strchr(tok, '=');
        if (!eq || eq == tok || s->n == MAX_SETTINGS) {
            restore_env(s);
            free(copy);
            return -1;
        }
        *eq = 0;
        const char *old = getenv(tok);
        s->name[s->n] = strdup(tok);
        s->old[s->n] = old ? strdup(old) : NULL; /* setenv may free it */
        s->n++;
        setenv(tok, eq + 1, 1);
    }
    free(copy);
    return s->n > 0 ? 0 : -1;
}

/* The prompt on ctx under a setting spec and under the default, alternating: for settings read at each launch. */
static int prompt_variant(kiln_cuda_context *ctx, const int32_t *tokens, int n_prompt, float *logits,
                          const char *spec, kiln_error *err) {
    double pp_default[RUNS], pp_other[RUNS];
    for (int r = -1; r < RUNS; r++) {
        saved_env saved;
        set_variant(spec, &saved);
        double t0 = now();
        int rc = kiln_cuda_eval(ctx, tokens, n_prompt, 0, logits, err);
        double t1 = now();
        restore_env(&saved);
        if (rc || kiln_cuda_eval(ctx, tokens, n_prompt, 0, logits, err)) return -1;
        if (r >= 0) pp_other[r] = n_prompt / (t1 - t0), pp_default[r] = n_prompt / (now() - t1);
    }
    printf("pp%d default %.0f tok/s, %s %.0f tok/s (alternating runs)\n", n_prompt, median(pp_default), spec,
           median(pp_other));
    return 0;
}

/* One decode step's logits for `token` at position 0 */
static int step_logits(kiln_cuda_context *ctx, int32_t token, float *out, kiln_error *err) {
    return kiln_cuda_eval(ctx, &token, 1, 0, out, err);
}

/* How far a variant's step is from the default's: the largest difference over the largest magnitude (the variants
 * must compute the same step); infinite where either row holds a NaN (fmax would drop it and report none). */
static double max_rel_difference(const float *a, const float *b, int n) {
    double diff = 0.0, scale = 0.0;
    for (int i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) diff = INFINITY;
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)a[i]));
    }
    return scale > 0.0 ? diff / scale : diff;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [n_prompt] [n_gen] [NAME=VALUE...]\n", argv[0]);
        return 2;
    }
    int n_prompt = argc > 2 ? atoi(argv[2]) : 512, n_gen = argc > 3 ? atoi(argv[3]) : 128;
    kiln_error err = {{0}};
    char desc[256];
    if (kiln_cuda_probe(desc, sizeof desc, &err)) {
        printf("bench_cuda_decode: skipped: %s\n", err.msg);
        return 0;
    }
    double bw;
    kiln_gguf *g = NULL;
    kiln_config cfg;
    kiln_weights w = {0};
    kiln_cuda_model *cm = NULL;
    kiln_cuda_context *ctx = NULL;
    if (kiln_cuda_measure_copy_bandwidth(&bw, &err) || kiln_gguf_open(argv[1], &g, &err) ||
        kiln_config_load(g, &cfg, &err) || kiln_weights_load(g, &cfg, &w, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    double t0 = now();
    if (kiln_cuda_model_load(&cfg, &w, &cm, &err) || kiln_cuda_context_new(cm, n_prompt + n_gen + 1, n_prompt, &ctx, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    double t_load = now() - t0;
    int32_t *tokens = malloc(sizeof(int32_t) * (n_prompt > n_gen ? n_prompt : n_gen));
    float *logits = malloc(sizeof(float) * cfg.n_vocab), *other_logits = malloc(sizeof(float) * cfg.n_vocab);
    if (!tokens || !logits || !other_logits) {
        fprintf(stderr, "bench_cuda_decode: out of memory\n");
        return 1;
    }
    for (int i = 0; i < n_prompt; i++) tokens[i] = rand() % cfg.n_vocab;
    double pp[RUNS], ttft[RUNS], tg[RUNS];
    int ttft_n = n_prompt < 128 ? n_prompt : 128;
    for (int r = -1; r < RUNS; r++) { /* run -1 warms up: module load, cuBLAS heuristics, graph capture */
        t0 = now();
        if (kiln_cuda_eval(ctx, tokens, n_prompt, 0, logits, &err)) break;
        double t1 = now();
        if (kiln_cuda_eval(ctx, tokens, ttft_n, 0, logits, &err)) break;
        double t2 = now();
        if (kiln_cuda_generate_greedy(ctx, tokens[0], 0, n_gen, tokens, &err)) break;
        double t3 = now();
        if (r >= 0) pp[r] = n_prompt / (t1 - t0), ttft[r] = (t2 - t1) * 1e3, tg[r] = n_gen / (t3 - t2);
    }
    if (err.msg[0]) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    uint64_t bpt = kiln_weights_bytes_per_token(&w);
    double roof = bw / (double)bpt, tgm = median(tg);
    printf("device: %s; copy bandwidth %.0f GB/s\n", desc, bw / 1e9);
    printf("model: %s (%s, %d layers, n_embd %d, vocab %d), %.1f MiB on the GPU, %.1f MiB read per token, load %.2f s\n",
           argv[1], cfg.arch->name, cfg.n_layer, cfg.n_embd, cfg.n_vocab, kiln_cuda_model_bytes(cm) / 1048576.0,
           bpt / 1048576.0, t_load);
    printf("pp%d %.0f tok/s | TTFT(%d) %.2f ms | tg%d %.1f tok/s = %.1f%% of roofline %.0f tok/s | %s\n", n_prompt,
           median(pp), ttft_n, median(ttft), n_gen, tgm, 100 * tgm / roof, roof,
           kiln_cuda_context_uses_graph(ctx) ? "graph" : "eager");
    double tg_row[RUNS], tg_best[RUNS], tg_halving[RUNS], tg_draw[RUNS];
    size_t ids_bytes = sizeof(int32_t) * (size_t)n_gen;
    int32_t *by_row = malloc(ids_bytes), *by_best = malloc(ids_bytes), *by_halving = malloc(ids_bytes);
    int32_t *by_draw = malloc(ids_bytes);
    for (int r = -1; r < RUNS && !err.msg[0]; r++) {
        double a = tg_sampled(ctx, cfg.n_vocab, n_gen, SAMPLE_ROW, logits, by_row, &err);
        double b = tg_sampled(ctx, cfg.n_vocab, n_gen, SAMPLE_BEST, logits, by_best, &err);
        setenv("KILN_CUDA_TOPK", "2", 1); /* read at each ranking */
        double c = tg_sampled(ctx, cfg.n_vocab, n_gen, SAMPLE_BEST, logits, by_halving, &err);
        unsetenv("KILN_CUDA_TOPK");
        double d = tg_sampled(ctx, cfg.n_vocab, n_gen, SAMPLE_DRAW, logits, by_draw, &err);
        if (r >= 0) tg_row[r] = a, tg_best[r] = b, tg_halving[r] = c, tg_draw[r] = d;
    }
    if (err.msg[0]) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("tg%d sampled (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05): the row to the host %.1f tok/s, the "
           "best 40 ranked on the device %.1f tok/s (by halving, KILN_CUDA_TOPK=2: %.1f), drawn on the device too "
           "%.1f tok/s, same tokens: %s\n",
           n_gen, median(tg_row), median(tg_best), median(tg_halving), median(tg_draw),
           memcmp(by_row, by_best, ids_bytes) || memcmp(by_row, by_halving, ids_bytes) ||
                   memcmp(by_row, by_draw, ids_bytes)
               ? "no"
               : "yes");
    free(by_row), free(by_best), free(by_halving), free(by_draw);
    double threshold_40 = top_k_us(cfg.n_vocab, 40, false), threshold_256 = top_k_us(cfg.n_vocab, 256, false);
    double draw_40 = top_k_us(cfg.n_vocab, 40, true), draw_256 = top_k_us(cfg.n_vocab, 256, true);
    setenv("KILN_CUDA_TOPK", "2", 1);
    double halving_40 = top_k_us(cfg.n_vocab, 40, false), halving_256 = top_k_us(cfg.n_vocab, 256, false);
    unsetenv("KILN_CUDA_TOPK");
    printf("top-k on the device, %d logits: k 40 %.1f us, k 256 %.1f us (threshold); with the draw %.1f / %.1f us; "
           "tiles reduced by halving (KILN_CUDA_TOPK=2) %.1f / %.1f us\n", cfg.n_vocab, threshold_40, threshold_256,
           draw_40, draw_256, halving_40, halving_256);
    /* the same greedy decode on contexts made under other settings, each alternating with the default context so
     * that drift of the machine touches both alike; a setting holds until the context's graph has been captured
     * (some are read at launch); every run and the logits' comparison start from the same token, so the two sides
     * of a pair decode the same sequence and every variant's difference is taken on the same step */
    const int32_t start = tokens[0];
    static const char *defaults[] = {"KILN_CUDA_FUSE=0", "KILN_CUDA_GEMV_BATCH=2", "KILN_CUDA_GEMV_BATCH=4",
                                     "KILN_CUDA_PERSISTENT=1"};
    const char *const *variants = argc > 4 ? (const char *const *)argv + 4 : defaults;
    int n_variants = argc > 4 ? argc - 4 : (int)(sizeof defaults / sizeof defaults[0]);
    for (int v = 0; v < n_variants; v++) {
        saved_env saved;
        if (set_variant(variants[v], &saved)) {
            fprintf(stderr, "bench_cuda_decode: '%s' is not NAME=VALUE[,NAME=VALUE...] (at most %d)\n", variants[v],
                    MAX_SETTINGS);
            return 2;
        }
        kiln_cuda_context *other = NULL;
        if (kiln_cuda_context_new(cm, n_gen + 1, 1, &other, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        double tg_default[RUNS], tg_other[RUNS];
        for (int r = -1; r < RUNS && !err.msg[0]; r++) {
            t0 = now();
            if (kiln_cuda_generate_greedy(other, start, 0, n_gen, tokens, &err)) break;
            double t1 = now();
            /* the variant's greedy and logits steps are both captured under its settings before they go */
            if (r < 0 && step_logits(other, start, other_logits, &err)) break;
            if (r < 0) restore_env(&saved);
            if (kiln_cuda_generate_greedy(ctx, start, 0, n_gen, tokens, &err)) break;
            if (r >= 0) tg_other[r] = n_gen / (t1 - t0), tg_default[r] = n_gen / (now() - t1);
        }
        double rel = 0.0;
        if (!err.msg[0] && !step_logits(ctx, start, logits, &err))
            rel = max_rel_difference(logits, other_logits, cfg.n_vocab);
        kiln_cuda_context_free(other);
        if (err.msg[0]) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        printf("tg%d default %.1f tok/s, %s %.1f tok/s (alternating runs); a step's logits %.2e apart\n", n_gen,
               median(tg_default), variants[v], median(tg_other), rel);
        if (n_prompt > 1 && prompt_variant(ctx, tokens, n_prompt, logits, variants[v], &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
    }
    printf("profile of a decode step (eager, mean of %d):\n", PROFILED_STEPS);
    if (print_step_profile(ctx, tokens, bw, &err)) return 1;
    printf("profile of a %d-token prompt:\n", n_prompt);
    for (int i = 0; i < n_prompt; i++) tokens[i] = rand() % cfg.n_vocab;
    if (kiln_cuda_context_set_profile(ctx, true, &err) || kiln_cuda_eval(ctx, tokens, n_prompt, 0, logits, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    kiln_cuda_profile_print(ctx, 1, bw, stdout);
    setenv("KILN_CUDA_PERSISTENT", "1", 1);
    kiln_cuda_context *pers = NULL;
    if (kiln_cuda_context_new(cm, n_gen + 1, 1, &pers, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    unsetenv("KILN_CUDA_PERSISTENT");
    if (kiln_cuda_context_uses_persistent(pers)) {
        printf("profile of a persistent decode step (stages timed in the kernel, mean of %d):\n", PROFILED_STEPS);
        if (print_step_profile(pers, tokens, bw, &err)) return 1;
    }
    kiln_cuda_context_free(pers);
    free(tokens), free(logits), free(other_logits);
    kiln_cuda_context_free(ctx);
    kiln_cuda_model_free(cm);
    kiln_weights_free(&w);
    kiln_gguf_close(g);
    return 0;
}

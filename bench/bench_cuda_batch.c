/* Aggregate generation speed of the batched GPU step (kiln_cuda_forward_batch) with M sequences at once, as the
 * reference's parallel-sequence figures are taken (/work/shared/perf/anchors.md): each sequence has a prompt of
 * n_prompt random tokens, processed first (whole prompts, up to 512 tokens a step), then n_gen decode steps of one
 * token per sequence, fed back greedily from the logits on the host as the server's scheduler does. Prints, per M:
 * prompt tok/s, generated tok/s over the decode steps (all sequences), the step time, the host argmax's share and
 * the rate without it (the reference's batched bench samples nothing); then the same decode steps with each
 * sequence's best logit picked on the device (kiln_cuda_seq.best = 1, as the scheduler asks for its samplers'
 * candidates), so that no row crosses to the host. With KILN_BATCH_PROFILE=1, then the per-op profile of those
 * device-ranked decode steps (eager launches timed with events, so small ops carry their launch gaps). With
 * KILN_CUDA_BATCH_HALF=1, all of it in half mode (kiln serve --gpu-f16 on; the header line says so).
 * usage: bench_cuda_batch MODEL.gguf [n_prompt=128] [n_gen=128] [M...=1 8 32 64] */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_backend.h"
#include "cuda/kernels_batch.h"
#include "format/gguf.h"
#include "model/model.h"

#define BLOCK 16
#define PREFILL_TOKENS 512

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

typedef struct run {
    int M, n_prompt, n_gen, n_vocab;
    int32_t *tokens; /* [M][n_prompt + n_gen] */
    int32_t *blocks; /* [M][blocks per sequence] */
    kiln_cuda_seq *seqs;
} run;

static int32_t *seq_tokens(const run *r, int i) { return r->tokens + (size_t)i * (r->n_prompt + r->n_gen); }

/* Every prompt, several per step; the first generated token of each comes from its prompt's logits. */
static int prefill(kiln_cuda_batch *b, run *r, int per_block, kiln_error *err) {
    int per_step = PREFILL_TOKENS / r->n_prompt > 0 ? PREFILL_TOKENS / r->n_prompt : 1;
    for (int i0 = 0; i0 < r->M; i0 += per_step) {
        int n = r->M - i0 < per_step ? r->M - i0 : per_step;
        for (int i = 0; i < n; i++)
            r->seqs[i] = (kiln_cuda_seq){seq_tokens(r, i0 + i), r->n_prompt, 0,
                                         r->blocks + (size_t)(i0 + i) * per_block, true, 0, NULL, 0};
        const float *logits;
        if (kiln_cuda_forward_batch(b, r->seqs, n, &logits, err)) return -1;
        for (int i = 0; i < n; i++)
            seq_tokens(r, i0 + i)[r->n_prompt] = argmax(logits + (size_t)i * r->n_vocab, r->n_vocab);
    }
    return 0;
}

/* Decode step s of every sequence: the token at n_prompt + s, whose argmax becomes the next (on the host, or with
 * on_device the device's best). */
static int decode_step(kiln_cuda_batch *b, run *r, int per_block, int s, bool on_device, double *argmax_ms,
                       kiln_error *err) {
    for (int i = 0; i < r->M; i++)
        r->seqs[i] = (kiln_cuda_seq){seq_tokens(r, i) + r->n_prompt + s, 1, r->n_prompt + s,
                                     r->blocks + (size_t)i * per_block, true, on_device ? 1 : 0, NULL, 0};
    const float *logits;
    if (kiln_cuda_forward_batch(b, r->seqs, r->M, &logits, err)) return -1;
    double t = now_ms();
    for (int i = 0; i < r->M; i++) {
        const int32_t *best;
        const float *best_logit, *window_logits;
        if (on_device) kiln_cuda_batch_best(b, i, &best, &best_logit, &window_logits);
        int next = on_device ? best[0] : argmax(logits + (size_t)i * r->n_vocab, r->n_vocab);
        if (s + 1 < r->n_gen) seq_tokens(r, i)[r->n_prompt + s + 1] = next;
    }
    *argmax_ms += now_ms() - t;
    return 0;
}

/* With KILN_BATCH_PROFILE=1: the decode steps once more, device-ranked, each op timed. */
static int profile_steps(kiln_cuda_batch *b, run *r, int per_block, kiln_error *err) {
    const char *e = getenv("KILN_BATCH_PROFILE");
    if (!e || atoi(e) != 1) return 0;
    double bw = 0, ignored = 0;
    if (kiln_cuda_measure_copy_bandwidth(&bw, err) || kiln_cuda_batch_set_profile(b, true, err)) return -1;
    for (int s = 0; s < r->n_gen; s++)
        if (decode_step(b, r, per_block, s, true, &ignored, err)) return -1;
    printf("       profile of a decode step (M=%d, eager, mean of %d):\n", r->M, r->n_gen);
    kiln_cuda_batch_profile_print(b, r->n_gen, bw, stdout);
    return kiln_cuda_batch_set_profile(b, false, err);
}

static int bench_m(kiln_cuda_model *cm, const kiln_config *cfg, int M, int n_prompt, int n_gen) {
    int n_ctx = n_prompt + n_gen, per_block = (n_ctx + BLOCK - 1) / BLOCK;
    kiln_cuda_batch_params bp = {BLOCK, n_ctx, PREFILL_TOKENS > M ? PREFILL_TOKENS : M, M, M * per_block,
                                 M * per_block, false}; /* half mode: KILN_CUDA_BATCH_HALF=1 */
    kiln_error err = {{0}};
    kiln_cuda_batch *b = NULL;
    run r = {M, n_prompt, n_gen, cfg->n_vocab, malloc(sizeof(int32_t) * (size_t)M * n_ctx),
             malloc(sizeof(int32_t) * (size_t)M * per_block), malloc(sizeof(kiln_cuda_seq) * (size_t)M)};
    srand(1);
    for (size_t i = 0; i < (size_t)M * n_ctx; i++) r.tokens[i] = rand() % cfg->n_vocab;
    for (int i = 0; i < M * per_block; i++) r.blocks[i] = i;
    int rc = -1;
    double argmax_ms = 0;
    if (kiln_cuda_batch_new(cm, &bp, &b, &err)) goto done;
    /* warm-up: one prompt step and one decode step, rewritten below */
    if (prefill(b, &r, per_block, &err) || decode_step(b, &r, per_block, 0, false, &argmax_ms, &err) ||
        decode_step(b, &r, per_block, 0, true, &argmax_ms, &err))
        goto done;
    double t0 = now_ms();
    if (prefill(b, &r, per_block, &err)) goto done;
    double t1 = now_ms();
    argmax_ms = 0;
    for (int s = 0; s < n_gen; s++)
        if (decode_step(b, &r, per_block, s, false, &argmax_ms, &err)) goto done;
    double t2 = now_ms(), device_ms = 0;
    for (int s = 0; s < n_gen; s++)
        if (decode_step(b, &r, per_block, s, true, &device_ms, &err)) goto done;
    double t3 = now_ms();
    double tg = (double)M * n_gen / ((t2 - t1) / 1e3), tg_gpu = (double)M * n_gen / ((t2 - t1 - argmax_ms) / 1e3);
    printf("M=%-3d  prompts %6.0f tok/s  generated %8.1f tok/s  (%.2f ms a step, host argmax %.2f ms; without it "
           "%8.1f tok/s)  prompt+generation %8.1f tok/s\n", M, (double)M * n_prompt / ((t1 - t0) / 1e3), tg,
           (t2 - t1) / n_gen, argmax_ms / n_gen, tg_gpu, (double)M * n_gen / ((t2 - t0) / 1e3));
    printf("       best logit on the device: generated %8.1f tok/s (%.2f ms a step)\n",
           (double)M * n_gen / ((t3 - t2) / 1e3), (t3 - t2) / n_gen);
    if (profile_steps(b, &r, per_block, &err)) goto done;
    fflush(stdout);
    rc = 0;
done:
    if (rc) fprintf(stderr, "M=%d: %s\n", M, err.msg);
    kiln_cuda_batch_free(b);
    free(r.tokens), free(r.blocks), free(r.seqs);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [n_prompt=128] [n_gen=128] [M...=1 8 32 64]\n", argv[0]);
        return 2;
    }
    int n_prompt = argc > 2 ? atoi(argv[2]) : 128, n_gen = argc > 3 ? atoi(argv[3]) : 128;
    int ms[16] = {1, 8, 32, 64}, n_m = 4;
    if (argc > 4) {
        n_m = 0;
        for (int i = 4; i < argc && n_m < 16; i++) ms[n_m++] = atoi(argv[i]);
    }
    kiln_error err = {{0}};
    kiln_gguf *g = NULL;
    kiln_config cfg;
    kiln_weights w = {0};
    kiln_cuda_model *cm = NULL;
    if (kiln_gguf_open(argv[1], &g, &err) || kiln_config_load(g, &cfg, &err) || kiln_weights_load(g, &cfg, &w, &err) ||
        kiln_cuda_model_load(&cfg, &w, &cm, &err)) {
        fprintf(stderr, "%s: %s\n", argv[1], err.msg);
        return 1;
    }
    printf("%s: %d prompt + %d generated tokens a sequence%s\n", argv[1], n_prompt, n_gen,
           kiln_cuda_batch_half() ? " (half mode)" : "");
    int rc = 0;
    for (int i = 0; i < n_m && !rc; i++) rc = bench_m(cm, &cfg, ms[i], n_prompt, n_gen);
    kiln_cuda_model_free(cm);
    kiln_weights_free(&w);
    kiln_gguf_close(g);
    return rc ? 1 : 0;
}

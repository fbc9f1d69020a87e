/* Decode attention (one query token) over the F16 KV cache at context lengths 128..8192, split into 1..32 slices
 * per head, at two real shapes (llama3-8b: 32 heads over 8 KV heads; qwen2-1.5b: 12 over 2; head_dim 128): where
 * split-K flash decoding starts to pay, and how many positions a slice should hold at least. Median of many calls
 * (split + merge launches), timed with events; cache and queries random. The last column is the decode step's
 * setting (KILN_CUDA_DECODE_SPLITS slices of at least KILN_CUDA_DECODE_CHUNK positions; blocks of
 * KILN_CUDA_DECODE_WARPS warps throughout).
 * Then prompt batches of 64..4096 tokens from position 0 (causal): the per-token kernels (one slice a token, and
 * the merge), the tiled FMA kernel and the tiled tensor-core kernel (attention_prefill.cu), with the tensor cores'
 * rate in TFLOP/s (4 head_dim flops a query and position it sees).
 * usage: bench_cuda_attention */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"

#define N_CTX 8192
#define N_CALLS 50
#define MAX_SPLIT 32
#define MAX_PROMPT 4096

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static int check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    return -1;
}

typedef struct shape {
    const char *name;
    int n_head, n_head_kv, head_dim;
} shape;

typedef struct buffers {
    float *q, *part, *out;
    void *kc, *vc, *out_q;
    int32_t *pos;
} buffers;

/* Random halves in [-1, 1) as raw bits: exponents 14 and below only. */
static void fill_halves(uint16_t *h, size_t n) {
    for (size_t i = 0; i < n; i++) h[i] = (uint16_t)((rand() & 0x3bff) | ((rand() & 1) << 15));
}

static int alloc_buffers(const shape *s, buffers *b) {
    size_t cache = (size_t)s->n_head_kv * N_CTX * s->head_dim, qd = (size_t)s->n_head * s->head_dim * MAX_PROMPT;
    uint16_t *h = malloc(2 * cache);
    float *hq = malloc(sizeof(float) * qd);
    if (!h || !hq) return -1;
    fill_halves(h, cache);
    for (size_t i = 0; i < qd; i++) hq[i] = (float)rand() / RAND_MAX - 0.5f;
    int rc = check(cudaMalloc((void **)&b->q, sizeof(float) * qd), "cudaMalloc q") ||
             check(cudaMalloc((void **)&b->out, sizeof(float) * qd), "cudaMalloc out") ||
             check(cudaMalloc(&b->out_q, qd / 32 * 36), "cudaMalloc out_q") ||
             check(cudaMalloc((void **)&b->part, sizeof(float) * MAX_PROMPT * s->n_head * (s->head_dim + 2)), "part") ||
             check(cudaMalloc(&b->kc, 2 * cache), "cudaMalloc k") || check(cudaMalloc(&b->vc, 2 * cache), "cudaMalloc v") ||
             check(cudaMalloc((void **)&b->pos, sizeof(int32_t)), "cudaMalloc pos");
    if (!rc) {
        cudaMemcpy(b->q, hq, sizeof(float) * qd, cudaMemcpyHostToDevice);
        cudaMemcpy(b->kc, h, 2 * cache, cudaMemcpyHostToDevice);
        fill_halves(h, cache);
        cudaMemcpy(b->vc, h, 2 * cache, cudaMemcpyHostToDevice);
    }
    free(h), free(hq);
    return rc ? -1 : 0;
}

static void free_buffers(buffers *b) {
    cudaFree(b->q), cudaFree(b->out), cudaFree(b->out_q), cudaFree(b->part), cudaFree(b->kc), cudaFree(b->vc);
    cudaFree(b->pos);
}

/* How a prompt batch's attention is run: the per-token kernels (asked for by passing a Q8_1 output), or the tiled
 * ones. */
enum { PER_TOKEN, TILED_FMA, TILED_MMA, N_WAYS };

static int run_attention(const kiln_cuda_attn_args *a, const buffers *b, int n_tokens, int how) {
    if (how == PER_TOKEN)
        return kiln_cuda_attention(a, b->q, b->kc, b->vc, b->pos, n_tokens, b->part, b->out, n_tokens > 1 ? b->out_q : NULL, 0);
    setenv("KILN_CUDA_PREFILL_MMA", how == TILED_FMA ? "0" : "1", 1);
    return kiln_cuda_attention_prefill(a, b->q, b->kc, b->vc, b->pos, n_tokens, b->out, 0);
}

/* Median microseconds of one attention call for n_tokens tokens, the last at position n_pos - 1. */
static double time_attention(const shape *s, const buffers *b, int n_pos, int n_tokens, int n_split, int min_chunk,
                             int how) {
    int32_t p = n_pos - n_tokens;
    cudaMemcpy(b->pos, &p, sizeof p, cudaMemcpyHostToDevice);
    kiln_cuda_attn_args a = {s->n_head, s->n_head_kv, s->head_dim, N_CTX, n_split, min_chunk, 0};
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    float t[N_CALLS];
    for (int i = -3; i < N_CALLS; i++) {
        cudaEventRecord(e0, 0);
        if (run_attention(&a, b, n_tokens, how)) return -1;
        cudaEventRecord(e1, 0);
        if (check(cudaEventSynchronize(e1), "attention")) return -1;
        if (i >= 0) cudaEventElapsedTime(&t[i], e0, e1);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    qsort(t, N_CALLS, sizeof *t, cmp_float);
    return t[N_CALLS / 2] * 1e3;
}

/* Prompt batches from position 0: us per call each way, and the tensor-core kernel's rate (the per-token kernels
 * are what batches below KILN_CUDA_PREFILL_ATTENTION_MIN take). */
static int prompt_table(const shape *s, const buffers *b) {
    printf("%s prompt batches from position 0 (causal): us per call\n%8s %10s %10s %10s %8s\n", s->name, "tokens",
           "per-token", "tiled FMA", "tiled mma", "TFLOP/s");
    for (int T = 16; T <= MAX_PROMPT; T *= 2) {
        double us[N_WAYS];
        for (int how = 0; how < N_WAYS; how++)
            if ((us[how] = time_attention(s, b, T, T, 1, 1, how)) < 0) return -1;
        double flops = 4.0 * s->head_dim * s->n_head * (double)T * (T + 1) / 2;
        printf("%8d %10.1f %10.1f %10.1f %8.1f\n", T, us[PER_TOKEN], us[TILED_FMA], us[TILED_MMA],
               flops / us[TILED_MMA] * 1e-6);
    }
    unsetenv("KILN_CUDA_PREFILL_MMA");
    return 0;
}

int main(void) {
    kiln_error err = {{0}};
    char desc[256];
    if (kiln_cuda_probe(desc, sizeof desc, &err)) {
        printf("bench_cuda_attention: skipped: %s\n", err.msg);
        return 0;
    }
    printf("device: %s\n", desc);
    static const shape shapes[] = {{"llama3-8b", 32, 8, 128}, {"qwen2-1.5b", 12, 2, 128}};
    static const int splits[] = {1, 2, 4, 8, 16, 32};
    enum { N_SPLITS = sizeof splits / sizeof splits[0] };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *s = &shapes[si];
        buffers b = {0};
        if (alloc_buffers(s, &b)) return 1;
        printf("%s (%d heads, %d KV heads, head_dim %d): us per call by slices per head\n", s->name, s->n_head,
               s->n_head_kv, s->head_dim);
        printf("%8s", "context");
        for (int j = 0; j < N_SPLITS; j++) printf(" %7d", splits[j]);
        printf(" %8s\n", "default");
        for (int n_pos = 128; n_pos <= N_CTX; n_pos *= 2) {
            printf("%8d", n_pos);
            for (int j = 0; j < N_SPLITS; j++) {
                double us = time_attention(s, &b, n_pos, 1, splits[j], 1, PER_TOKEN);
                if (us < 0) return 1;
                printf(" %7.1f", us);
            }
            double us = time_attention(s, &b, n_pos, 1, KILN_CUDA_DECODE_SPLITS, KILN_CUDA_DECODE_CHUNK, PER_TOKEN);
            if (us < 0) return 1;
            printf(" %8.1f\n", us);
        }
        if (prompt_table(s, &b)) return 1;
        free_buffers(&b);
    }
    return 0;
}

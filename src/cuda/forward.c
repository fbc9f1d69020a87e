/* Contexts and the forward pass on the GPU, in the op order model/model.h states. A decode step (one token) is
 * GEMVs over Q8_1 activations, quantized once per input vector by the norm that produces them; the residual adds
 * ride on the GEMVs that feed the residual stream (y += W x). A batch of tokens (prefill) goes through cuBLAS GEMMs
 * on F16 copies of each weight, dequantized on the fly into one staging buffer. The decode step is captured once as
 * a CUDA graph that reads the token and position from device memory, writes its argmax back as the next token and
 * advances the position: greedy generation replays it, and only the id crosses to the host. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/executor.h"

#define Q8_1_BYTES 36    /* one block_q8_1 per 32 activations */

enum { FUSE_ATTENTION = 1, FUSE_NORM = 2, FUSE_QKV_ROPE = 4 };

/* Spans (KILN_CUDA_FIRST_SPAN): a decode step at position pos is built for the first span above pos. The attention
 * launch's blocks are all scheduled whether their slice holds positions or not, and a grid sized for the whole
 * context cost 5% of qwen2-1.5b's tg128 (H100). A captured graph per span; the last one takes the rest of the
 * context. */
#define MAX_SPANS 16

/* What a decode step ends with: logits only; the argmax fed back (greedy); a draw among the best logits fed back
 * (kiln_cuda_decode_sampled). Each mode has its captured graphs. */
enum { STEP_LOGITS, STEP_GREEDY, STEP_SAMPLED, STEP_MODES };

/* The default: FUSE_QKV_ROPE, the rope stage done by the Q/K/V GEMV's blocks where rotation pairs are neighbouring
 * rows (kiln_cuda_gemv_qkv_rope; NeoX models' Q/K rows are uploaded so, executor.h). FUSE_ATTENTION (KILN_CUDA_FUSE=1) runs the rope stage, the attention
 * and the merge in one launch; since the split kernel loads its K/V rows before waiting for the rope kernel and
 * scores eight positions a warp at once, the three launches are faster. FUSE_NORM (KILN_CUDA_FUSE=3) has the last
 * block of a residual GEMV do the next norm, a serial tail the whole launch waits for. Measured on H100 (tg128,
 * alternating): docs/cuda-measured.md, sessions 7, 8 and 16. KILN_CUDA_FUSE=0: none, for comparisons. */
#define FUSE_DEFAULT FUSE_QKV_ROPE

struct kiln_cuda_context {
    kiln_cuda_model *cm;
    int n_ctx, n_batch;
    uint64_t kv_bytes, work_bytes; /* device memory alloc_buffers asks for: the KV cache, the rest */
    cudaStream_t stream;
    cublasHandle_t blas;
    int32_t *d_io;     /* the position, then the tokens of a batch: one copy sets both */
    int32_t *d_tokens, *d_pos;
    int32_t *h_io;     /* pinned staging of d_io */
    int32_t *h_tokens; /* pinned: two slots, so one step's id is read while the next step runs */
    cudaEvent_t token_ready[2];
    /* the steps of kiln_cuda_decode_greedy or _sampled (ahead_mode) in flight (0..2), the oldest at ahead_pos, fed
     * ahead_token (the next one is fed the oldest's token on the device); the step at position p leaves its id in
     * h_tokens[p & 1] (greedy) or h_draw[p & 1] (sampled, with the PRNG state after its draw) */
    int n_ahead, ahead_mode;
    int32_t ahead_token, ahead_pos;
    kiln_cuda_draw *d_draw;  /* the sampled steps' draw: parameters, PRNG state, token */
    kiln_cuda_draw *h_draw;  /* pinned: the draw to upload, then two slots of what steps left */
    kiln_rng ahead_rng;      /* the PRNG state the oldest sampled step in flight starts from */
    int draw_k;              /* the best logits a sampled step draws among (its graphs are captured for it) */
    float *x, *h, *q, *k, *v, *attn, *ff, *ff2, *logits, *part;
    void *argmax_scratch;
    void *top_scratch; /* kiln_cuda_eval_best: the top-k's scratch (kiln_cuda_top_k_scratch_bytes) */
    int32_t *d_best;   /* ... and its results: KILN_CUDA_TOP_K_MAX each of ids, logits, window ids, window logits */
    int32_t *h_best;   /* pinned staging of d_best */
    void *act_q;       /* Q8_1 of the current GEMV input (one token) */
    void *act_f16;     /* F16 of the current GEMM input (a batch) */
    void *w_f16;       /* F16 staging of one weight matrix (a batch) */
    void *k_cache, *v_cache; /* [n_layer][n_head_kv][n_ctx][head_dim] halves */
    unsigned *counters;      /* zeroed once; the last-block steps of the fused decode kernels count on them */
    unsigned fuse;           /* FUSE_* bits: decode work done in the kernel before it (see residual_matmul) */
    int attn_chunk;          /* KILN_CUDA_DECODE_CHUNK: positions a decode slice at least (0: the default) */
    int attn_warps;          /* KILN_CUDA_ATTN_WARPS: warps a block of one token's attention (0: the default) */
    unsigned skip;           /* KILN_CUDA_SKIP: decode-step launches left out, for pricing them (SKIP_* bits) */
    bool normed;             /* h and its Q8_1 already hold the next block's normed input (done in that GEMV) */
    /* the decode step of each mode (STEP_*), captured per span */
    cudaGraphExec_t graph[STEP_MODES][MAX_SPANS];
    bool graph_tried[STEP_MODES][MAX_SPANS], graph_ok[STEP_MODES][MAX_SPANS];
    int span; /* positions the step being launched or captured is built for (span_of) */
    kiln_cuda_profile *prof; /* while profiling: every op timed, no graph */
    kiln_cuda_debug *debug;  /* KILN_GPU_DEBUG=1: every op of a decode step checked on the CPU, no graph */
    kiln_cuda_decode_layer *d_layers; /* the persistent decode step's layers (device copy), NULL when it is off */
    kiln_cuda_decode_args persistent;
    unsigned long long *d_stamps; /* while profiling the persistent step: its stages' end times */
    bool debug_pass;         /* the pass running now is checked (one token) */
};

/* The start of op in layer: a profile boundary, and a checkpoint under KILN_GPU_DEBUG. */
static void mark(kiln_cuda_context *c, kiln_cuda_op op, int layer, uint64_t bytes, bool greedy) {
    kiln_cuda_profile_mark(c->prof, op, bytes, c->stream);
    if (c->debug_pass) kiln_cuda_debug_mark(c->debug, op, layer, greedy);
}

#define MARK(c, op, l, bytes) mark(c, op, l, bytes, false)

static int cuda_error(kiln_error *err, const char *what, cudaError_t e) {
    return kiln_fail(err, "CUDA %s: %s", what, cudaGetErrorString(e));
}

static size_t max3(size_t a, size_t b, size_t c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

#define BEST_BYTES (4 * KILN_CUDA_TOP_K_MAX * sizeof(int32_t))

/* Every buffer of a context, sized for n_batch tokens. Returns the first allocation error. */
static cudaError_t alloc_buffers(kiln_cuda_context *c) {
    const kiln_config *cfg = &c->cm->cfg;
    size_t T = (size_t)c->n_batch, qd = (size_t)kiln_config_q_dim(cfg), kvd = (size_t)kiln_config_kv_dim(cfg);
    size_t widest = max3((size_t)cfg->n_embd, qd, (size_t)cfg->n_ff);
    size_t splits_x_tokens = T > KILN_CUDA_DECODE_SPLITS ? T : KILN_CUDA_DECODE_SPLITS;
    size_t cache = (size_t)cfg->n_layer * kvd * (size_t)c->n_ctx * 2;
    /* one per head for the attention (the first also for the norms), two for the persistent step's barriers */
    size_t counters = (size_t)cfg->n_head + 2;
    struct { void **p; size_t bytes; } bufs[] = {
        {(void **)&c->d_io, sizeof(int32_t) * (T + 1)},
        {(void **)&c->x, sizeof(float) * T * cfg->n_embd},
        {(void **)&c->h, sizeof(float) * T * cfg->n_embd},
        {(void **)&c->q, sizeof(float) * T * qd},
        {(void **)&c->k, sizeof(float) * T * kvd},
        {(void **)&c->v, sizeof(float) * T * kvd},
        {(void **)&c->attn, sizeof(float) * T * qd},
        {(void **)&c->ff, sizeof(float) * T * cfg->n_ff},
        {(void **)&c->ff2, sizeof(float) * T * cfg->n_ff},
        {(void **)&c->logits, sizeof(float) * cfg->n_vocab},
        {&c->argmax_scratch, kiln_cuda_argmax_scratch_bytes(cfg->n_vocab)},
        {&c->top_scratch, kiln_cuda_top_k_scratch_bytes(cfg->n_vocab, 1, KILN_CUDA_TOP_K_MAX)},
        {(void **)&c->d_best, BEST_BYTES},
        {(void **)&c->part, sizeof(float) * splits_x_tokens * cfg->n_head * (cfg->head_dim + 2)},
        {&c->act_q, widest / 32 * Q8_1_BYTES},
        {&c->act_f16, T > 1 ? 2 * T * widest : 0},
        {&c->w_f16, T > 1 ? 2 * c->cm->max_matrix_elems : 0},
        {&c->k_cache, cache},
        {&c->v_cache, cache},
        {(void **)&c->counters, sizeof(unsigned) * counters},
        {(void **)&c->d_draw, sizeof(kiln_cuda_draw)},
    };
    size_t n_bufs = sizeof bufs / sizeof bufs[0];
    for (size_t i = 0; i < n_bufs; i++) /* the totals first: a failed allocation says what the context needs */
        if (bufs[i].p == &c->k_cache || bufs[i].p == &c->v_cache) c->kv_bytes += bufs[i].bytes;
        else c->work_bytes += bufs[i].bytes;
    size_t free_b = 0, total_b = 0; /* more than is free fails before any allocation */
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess && c->kv_bytes + c->work_bytes > free_b)
        return cudaErrorMemoryAllocation;
    for (size_t i = 0; i < n_bufs; i++) {
        if (!bufs[i].bytes) continue;
        cudaError_t e = cudaMalloc(bufs[i].p, bufs[i].bytes);
        if (e != cudaSuccess) return e;
    }
    c->d_pos = c->d_io;
    c->d_tokens = c->d_io + 1;
    cudaError_t e = cudaMemset(c->counters, 0, sizeof(unsigned) * counters);
    if (e == cudaSuccess) e = cudaHostAlloc((void **)&c->h_best, BEST_BYTES, cudaHostAllocDefault);
    if (e == cudaSuccess) e = cudaHostAlloc((void **)&c->h_draw, 3 * sizeof(kiln_cuda_draw), cudaHostAllocDefault);
    if (e != cudaSuccess) return e;
    return cudaHostAlloc((void **)&c->h_io, sizeof(int32_t) * (T + 1), cudaHostAllocDefault);
}

/* The rope stage's arguments for this context: the same for every layer and every path. */
static kiln_cuda_rope_args rope_args(const kiln_cuda_context *c) {
    const kiln_config *cfg = &c->cm->cfg;
    return (kiln_cuda_rope_args){cfg->n_head, cfg->n_head_kv, cfg->head_dim, cfg->rope_dim, c->n_ctx,
                                 cfg->rope_style == KILN_ROPE_NEOX, 1.0f / sqrtf((float)cfg->head_dim),
                                 c->cm->rope_freq};
}

/* KILN_CUDA_SKIP=op+op+...: a timing tool. The decode step (one token) leaves those launches out, so a bench of the
 * step against the full one prices each kernel inside the replayed graph, where launches overlap and ncu's per-kernel
 * times do not apply (docs/cuda-measured.md, session 14). The logits are then wrong: never for generation. */
enum { SKIP_NORM = 1, SKIP_ROPE = 2, SKIP_ATTENTION = 4, SKIP_QUANTIZE = 8, SKIP_QKV = 16, SKIP_WO = 32,
       SKIP_GATE_UP = 64, SKIP_DOWN = 128, SKIP_HEAD = 256 };

static unsigned skip_ops(const char *list) {
    static const struct { const char *name; unsigned bit; } ops[] = {
        {"norm", SKIP_NORM}, {"rope", SKIP_ROPE}, {"attention", SKIP_ATTENTION}, {"quantize", SKIP_QUANTIZE},
        {"qkv", SKIP_QKV}, {"wo", SKIP_WO}, {"gate_up", SKIP_GATE_UP}, {"down", SKIP_DOWN}, {"head", SKIP_HEAD}};
    unsigned bits = 0;
    for (const char *p = list; p && *p; p += strcspn(p, "+") + (p[strcspn(p, "+")] == '+')) {
        size_t len = strcspn(p, "+");
        for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
            if (strlen(ops[i].name) == len && !strncmp(p, ops[i].name, len)) bits |= ops[i].bit;
    }
    if (bits) fprintf(stderr, "kiln: KILN_CUDA_SKIP=%s: decode steps leave launches out (timing only)\n", list);
    return bits;
}

static int env_int(const char *name, int fallback) {
    const char *e = getenv(name);
    return e && *e ? atoi(e) : fallback;
}

/* The persistent decode step (kiln_cuda_decode_layers) when KILN_CUDA_PERSISTENT=1 and the model's layers allow it.
 * Off by default (docs/cuda-measured.md, "The persistent step"). */
static cudaError_t setup_persistent(kiln_cuda_context *c) {
    const kiln_cuda_model *cm = c->cm;
    const kiln_config *cfg = &cm->cfg;
    if (env_int("KILN_CUDA_PERSISTENT", 0) != 1 || cm->host) return cudaSuccess; /* KILN_GPU_DEBUG checks op by op */
    size_t bytes = sizeof(kiln_cuda_decode_layer) * (size_t)cfg->n_layer;
    kiln_cuda_decode_layer *layers = calloc(1, bytes);
    if (!layers) return cudaErrorMemoryAllocation;
    size_t layer_cache = (size_t)kiln_config_kv_dim(cfg) * c->n_ctx;
    for (int l = 0; l < cfg->n_layer; l++) {
        const kiln_cuda_layer *L = &cm->layers[l];
        layers[l] = (kiln_cuda_decode_layer){L->wq, L->wk, L->wv, L->wo, L->gate, L->up, L->down,
                                             L->attn_norm, L->ffn_norm, L->bq, L->bk, L->bv,
                                             (uint16_t *)c->k_cache + (size_t)l * layer_cache,
                                             (uint16_t *)c->v_cache + (size_t)l * layer_cache};
    }
    cudaError_t e = cudaSuccess;
    if (kiln_cuda_decode_layers_supported(layers, cfg->n_layer, cfg->head_dim)) {
        e = cudaMalloc((void **)&c->d_layers, bytes);
        if (e == cudaSuccess) e = cudaMemcpy(c->d_layers, layers, bytes, cudaMemcpyHostToDevice);
    }
    free(layers);
    kiln_cuda_attn_args aa = {cfg->n_head, cfg->n_head_kv, cfg->head_dim, c->n_ctx, KILN_CUDA_DECODE_SPLITS,
                              KILN_CUDA_DECODE_MIN_CHUNK, 0};
    c->persistent = (kiln_cuda_decode_args){c->d_layers, cfg->n_layer, cfg->n_embd, cfg->n_ff, cfg->rms_eps,
                                            rope_args(c), aa,
                                            c->x, c->q, c->k, c->v, c->attn, c->ff, c->part, c->counters,
                                            c->counters + cfg->n_head, c->d_pos, NULL};
    return e;
}

int kiln_cuda_context_new(kiln_cuda_model *cm, int n_ctx, int n_batch, kiln_cuda_context **out, kiln_error *err) {
    *out = NULL;
    const kiln_config *cfg = &cm->cfg;
    if (cfg->head_dim != 64 && cfg->head_dim != 128 && cfg->head_dim != 256)
        return kiln_fail(err, "CUDA attention supports head_dim 64, 128 and 256, not %d", cfg->head_dim);
    if (cfg->n_embd % 32 || kiln_config_q_dim(cfg) % 32 || cfg->n_ff % 32)
        return kiln_fail(err, "CUDA backend needs widths that are multiples of 32");
    if (n_ctx < 1 || n_batch < 1) return kiln_fail(err, "context of %d positions, batches of %d: both must be positive", n_ctx, n_batch);
    kiln_cuda_context *c = calloc(1, sizeof *c);
    if (!c) return kiln_fail(err, "out of memory");
    c->cm = cm, c->n_ctx = n_ctx, c->n_batch = n_batch, c->span = n_ctx;
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaHostAlloc((void **)&c->h_tokens, 2 * sizeof(int32_t), cudaHostAllocDefault);
    for (int i = 0; i < 2 && e == cudaSuccess; i++) e = cudaEventCreateWithFlags(&c->token_ready[i], cudaEventDisableTiming);
    if (e == cudaSuccess) e = alloc_buffers(c);
    if (e == cudaSuccess) e = setup_persistent(c);
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_b, &total_b);
        double kv = c->kv_bytes / 1048576.0, work = c->work_bytes / 1048576.0;
        kiln_cuda_context_free(c);
        return kiln_fail(err,
                         "CUDA context of %d positions needs %.1f MiB (KV cache %.1f MiB, workspace %.1f MiB for "
                         "batches of %d): %s, %.1f MiB free (lower --ctx or --batch)",
                         n_ctx, kv + work, kv, work, n_batch, cudaGetErrorString(e), free_b / 1048576.0);
    }
    if (n_batch > 1) {
        if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS) {
            kiln_cuda_context_free(c);
            return kiln_fail(err, "cuBLAS could not start");
        }
    }
    if (cm->host) {
        kiln_cuda_debug_view v = {c->x, c->h, c->q, c->k, c->v, c->attn, c->ff, c->logits, c->act_q,
                                  c->k_cache, c->v_cache, c->d_tokens, c->d_pos, n_ctx};
        if (!(c->debug = kiln_cuda_debug_new(cm, &v, c->stream))) {
            kiln_cuda_context_free(c);
            return kiln_fail(err, "out of memory for KILN_GPU_DEBUG");
        }
        fprintf(stderr, "kiln: KILN_GPU_DEBUG=1: each decode step runs op by op and is checked against the CPU (slow)\n");
    }
    const char *fuse = getenv("KILN_CUDA_FUSE");
    c->fuse = c->debug ? 0 : fuse ? (unsigned)strtoul(fuse, NULL, 0) : FUSE_DEFAULT;
    c->attn_chunk = env_int("KILN_CUDA_DECODE_CHUNK", 0);
    c->attn_warps = env_int("KILN_CUDA_ATTN_WARPS", 0);
    c->skip = skip_ops(getenv("KILN_CUDA_SKIP"));
    if (c->attn_warps != 2 && c->attn_warps != 4 && c->attn_warps != 8 && c->attn_warps != 16) c->attn_warps = 0;
    *out = c;
    return 0;
}

kiln_cuda_profile *kiln_cuda_context_profile(kiln_cuda_context *c) { return c->prof; }

static void free_profile(kiln_cuda_context *c) {
    cudaFree(c->d_stamps);
    c->d_stamps = NULL;
    kiln_cuda_profile_free(c->prof);
    c->prof = NULL;
}

int kiln_cuda_context_set_profile(kiln_cuda_context *c, bool on, kiln_error *err) {
    free_profile(c);
    if (!on) return 0;
    if (!(c->prof = kiln_cuda_profile_new(err))) return -1;
    if (c->d_layers) {
        size_t n = 1 + (size_t)KILN_CUDA_DECODE_STAGES * c->cm->cfg.n_layer;
        cudaError_t e = cudaMalloc((void **)&c->d_stamps, sizeof(unsigned long long) * n);
        if (e != cudaSuccess) {
            free_profile(c);
            return cuda_error(err, "allocating profile stamps", e);
        }
    }
    return 0;
}

void kiln_cuda_context_free(kiln_cuda_context *c) {
    if (!c) return;
    free_profile(c);
    for (int i = 0; i < STEP_MODES; i++)
        for (int s = 0; s < MAX_SPANS; s++)
            if (c->graph[i][s]) cudaGraphExecDestroy(c->graph[i][s]);
    if (c->blas) cublasDestroy(c->blas);
    kiln_cuda_debug_free(c->debug);
    void *bufs[] = {c->d_io, c->x, c->h, c->q, c->k, c->v, c->attn, c->ff, c->ff2, c->logits, c->argmax_scratch,
                    c->top_scratch, c->d_best, c->part, c->act_q, c->act_f16, c->w_f16, c->k_cache, c->v_cache,
                    c->counters, c->d_layers, c->d_draw};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    for (int i = 0; i < 2; i++)
        if (c->token_ready[i]) cudaEventDestroy(c->token_ready[i]);
    if (c->h_tokens) cudaFreeHost(c->h_tokens);
    if (c->h_io) cudaFreeHost(c->h_io);
    if (c->h_best) cudaFreeHost(c->h_best);
    if (c->h_draw) cudaFreeHost(c->h_draw);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}

void kiln_cuda_context_memory(const kiln_cuda_context *c, uint64_t *kv_cache, uint64_t *workspace) {
    *kv_cache = c->kv_bytes;
    *workspace = c->work_bytes;
}

int kiln_cuda_context_debug_diverged(const kiln_cuda_context *c) {
    return c->debug ? kiln_cuda_debug_diverged(c->debug) : -1;
}

bool kiln_cuda_context_uses_graph(const kiln_cuda_context *c) {
    for (int m = 0; m < STEP_MODES; m++)
        for (int s = 0; s < MAX_SPANS; s++)
            if (c->graph_ok[m][s]) return true;
    return false;
}

bool kiln_cuda_context_uses_persistent(const kiln_cuda_context *c) { return c->d_layers != NULL; }

/* out (+)= in W^T for T tokens. One token: GEMV (in_q: in already quantized to Q8_1, or NULL to quantize here;
 * float weights read in itself);
 * a batch: one tensor-core GEMM on F16 copies of the weight and the input, accumulating in F32. */
static int matmul(kiln_cuda_context *c, const kiln_cuda_matrix *m, const float *in, const void *in_q, int T,
                  float *out, bool accumulate) {
    if (T == 1) {
        if (kiln_cuda_type_uses_q8_1(m->type) && !in_q) {
            kiln_cuda_quantize_q8_1(in, c->act_q, m->k, 1, c->stream);
            in_q = c->act_q;
        }
        return kiln_cuda_gemv(m, in_q, in, out, accumulate, c->stream);
    }
    const void *w16 = m->data;
    if (m->type != KILN_TYPE_F16) {
        if (kiln_cuda_dequantize_f16(m, c->w_f16, c->stream)) return -1;
        w16 = c->w_f16;
    }
    kiln_cuda_f32_to_f16(in, c->act_f16, (int64_t)T * m->k, c->stream);
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m->n, T, m->k, &one, w16, CUDA_R_16F, m->k,
                                    c->act_f16, CUDA_R_16F, m->k, accumulate ? &one : &zero, out, CUDA_R_32F, m->n,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? 0 : -1;
}

/* Where the norm before m should put Q8_1 activations: only for one token and quantized weights. */
static void *quantized_input(const kiln_cuda_context *c, const kiln_cuda_matrix *m, int T) {
    return T == 1 && kiln_cuda_type_uses_q8_1(m->type) ? c->act_q : NULL;
}

/* Decode-step fusion (c->fuse): work that needs a whole vector is done by the last block of the kernel before it,
 * instead of a launch of its own. FUSE_ATTENTION: the rope stage and the merge of the attention slices in the
 * attention kernel; FUSE_NORM: the RMSNorm (and its Q8_1) by the residual GEMV before it. KILN_CUDA_FUSE picks the
 * bits (0: none, for comparisons); none under KILN_GPU_DEBUG, so each op is checked alone. */

/* x += W in (the residual add). Fused, for one token with quantized weights and a quantized next matrix reading
 * RMSNorm(x; g): that norm and its Q8_1 run in the same launch and c->normed tells the next block to skip its own. */
static int residual_matmul(kiln_cuda_context *c, const kiln_cuda_matrix *m, const float *in, const void *in_q, int T,
                           const float *g, const kiln_cuda_matrix *next) {
    void *hq = quantized_input(c, next, T);
    c->normed = false;
    if (!hq || !kiln_cuda_type_uses_q8_1(m->type) || !(c->fuse & FUSE_NORM))
        return matmul(c, m, in, in_q, T, c->x, true);
    if (!in_q) {
        kiln_cuda_quantize_q8_1(in, c->act_q, m->k, 1, c->stream);
        in_q = c->act_q;
    }
    kiln_cuda_norm_args na = {g, c->h, hq, c->cm->cfg.rms_eps, c->counters};
    if (kiln_cuda_gemv_norm(m, in_q, c->x, &na, c->stream)) return -1;
    c->normed = true;
    return 0;
}

/* Q, K and V from the normed h. For one token, one launch where their types allow (kiln_cuda_gemv_multi). */
static int qkv(kiln_cuda_context *c, const kiln_cuda_layer *L, const void *hq, int T) {
    const kiln_cuda_matrix *ms[3] = {&L->wq, &L->wk, &L->wv};
    float *ys[3] = {c->q, c->k, c->v};
    if (T > 1 || !hq || !kiln_cuda_type_uses_q8_1(L->wk.type) || !kiln_cuda_type_uses_q8_1(L->wv.type)) {
        for (int i = 0; i < 3; i++)
            if (matmul(c, ms[i], c->h, hq, T, ys[i], false)) return -1;
        return 0;
    }
    return kiln_cuda_gemv_multi(ms, ys, 3, hq, c->h, c->stream);
}

static bool skipped(const kiln_cuda_context *c, int T, unsigned op) { return T == 1 && (c->skip & op); }

/* h = RMSNorm(x; g) for T rows, and its Q8_1 into hq when not NULL; one row over several blocks. */
static void norm(kiln_cuda_context *c, const float *g, float *x, void *hq, int T) {
    const kiln_config *cfg = &c->cm->cfg;
    if (T == 1) kiln_cuda_rmsnorm_rows(x, g, c->h, hq, cfg->n_embd, 1, cfg->rms_eps, c->stream);
    else kiln_cuda_rmsnorm(x, NULL, g, c->h, hq, cfg->n_embd, T, cfg->rms_eps, c->stream);
}

static int attention_block(kiln_cuda_context *c, int l, int T) {
    const kiln_config *cfg = &c->cm->cfg;
    const kiln_cuda_layer *L = &c->cm->layers[l];
    /* the norm quantizes h for the Q/K/V GEMVs when one token runs and the weights are quantized */
    void *hq = quantized_input(c, &L->wq, T);
    if (!c->normed && !skipped(c, T, SKIP_NORM)) {
        MARK(c, KILN_OP_NORM, l, 0);
        norm(c, L->attn_norm, c->x, hq, T);
    }
    size_t layer_cache = (size_t)kiln_config_kv_dim(cfg) * c->n_ctx;
    void *kc = (uint16_t *)c->k_cache + (size_t)l * layer_cache, *vc = (uint16_t *)c->v_cache + (size_t)l * layer_cache;
    kiln_cuda_rope_args ra = rope_args(c);
    bool fused = T == 1 && (c->fuse & FUSE_ATTENTION);
    MARK(c, KILN_OP_QKV, l, mbytes(&L->wq) + mbytes(&L->wk) + mbytes(&L->wv));
    /* with the rope stage where the weights allow it (one token; else the rope kernel below) */
    const kiln_cuda_matrix *ms[3] = {&L->wq, &L->wk, &L->wv};
    bool roped = T == 1 && hq && !fused && (c->fuse & FUSE_QKV_ROPE) && !skipped(c, T, SKIP_QKV) &&
                 !kiln_cuda_gemv_qkv_rope(ms, c->q, hq, &ra, L->bq, L->bk, L->bv, kc, vc, c->d_pos, c->stream);
    if (!roped && !skipped(c, T, SKIP_QKV) && qkv(c, L, hq, T)) return -1;
    int splits = T >= KILN_CUDA_DECODE_SPLITS ? 1 : KILN_CUDA_DECODE_SPLITS / T;
    int chunk = KILN_CUDA_DECODE_CHUNK;
    if (T > 1) chunk = 1;
    else if (c->attn_chunk > 0) chunk = c->attn_chunk;
    /* no more slices than the context can fill: every block of the launch is scheduled, used or not */
    if (T == 1 && splits > (c->span + chunk - 1) / chunk) splits = (c->span + chunk - 1) / chunk;
    kiln_cuda_attn_args aa = {cfg->n_head, cfg->n_head_kv, cfg->head_dim, c->n_ctx, splits, chunk,
                              T == 1 ? c->attn_warps : 0};
    void *attn_q = quantized_input(c, &L->wo, T);
    if (fused) {
        MARK(c, KILN_OP_ATTENTION, l, 0);
        kiln_cuda_attn_decode_args da = {ra, c->q, c->k, c->v, L->bq, L->bk, L->bv, kc, vc, c->attn, attn_q,
                                         c->attn_warps};
        if (kiln_cuda_attention_decode(&aa, &da, c->d_pos, c->part, c->counters, c->stream)) return -1;
    } else {
        if (!roped) { /* else the Q/K/V GEMV did it, and the profile's q/k/v row holds it */
            MARK(c, KILN_OP_ROPE, l, 0);
            if (!skipped(c, T, SKIP_ROPE))
                kiln_cuda_rope_store(&ra, c->q, c->k, c->v, L->bq, L->bk, L->bv, kc, vc, c->d_pos, T, c->stream);
        }
        MARK(c, KILN_OP_ATTENTION, l, 0);
        if (!skipped(c, T, SKIP_ATTENTION) &&
            kiln_cuda_attention(&aa, c->q, kc, vc, c->d_pos, T, c->part, c->attn, attn_q, c->stream))
            return -1;
    }
    MARK(c, KILN_OP_WO, l, mbytes(&L->wo));
    if (skipped(c, T, SKIP_WO)) return 0;
    return residual_matmul(c, &L->wo, c->attn, attn_q, T, L->ffn_norm, &L->gate);
}

/* ff = SwiGLU(gate h, up h): one launch for one token when the two matrices match. */
static int gate_up(kiln_cuda_context *c, const kiln_cuda_layer *L, const void *hq, int T) {
    if (T == 1 && L->gate.type == L->up.type && L->gate.row_bytes == L->up.row_bytes)
        return kiln_cuda_gemv_swiglu(&L->gate, &L->up, hq, c->h, c->ff, c->stream);
    if (matmul(c, &L->gate, c->h, hq, T, c->ff, false) || matmul(c, &L->up, c->h, hq, T, c->ff2, false)) return -1;
    kiln_cuda_swiglu(c->ff, c->ff2, c->ff, (int64_t)T * c->cm->cfg.n_ff, c->stream);
    return 0;
}

static int ffn_block(kiln_cuda_context *c, int l, int T) {
    const kiln_config *cfg = &c->cm->cfg;
    const kiln_cuda_layer *L = &c->cm->layers[l];
    void *hq = quantized_input(c, &L->gate, T);
    if (!c->normed && !skipped(c, T, SKIP_NORM)) {
        MARK(c, KILN_OP_NORM, l, 0);
        norm(c, L->ffn_norm, c->x, hq, T);
    }
    MARK(c, KILN_OP_GATE_UP, l, mbytes(&L->gate) + mbytes(&L->up));
    if (!skipped(c, T, SKIP_GATE_UP) && gate_up(c, L, hq, T)) return -1;
    MARK(c, KILN_OP_DOWN, l, mbytes(&L->down));
    bool last = l + 1 == cfg->n_layer;
    const kiln_cuda_model *cm = c->cm;
    if (skipped(c, T, SKIP_DOWN)) {
        if (!skipped(c, T, SKIP_QUANTIZE)) kiln_cuda_quantize_q8_1(c->ff, c->act_q, L->down.k, 1, c->stream);
        return 0;
    }
    if (skipped(c, T, SKIP_QUANTIZE)) /* the down projection reads whatever Q8_1 act_q holds */
        return kiln_cuda_gemv(&L->down, c->act_q, c->ff, c->x, true, c->stream);
    return residual_matmul(c, &L->down, c->ff, NULL, T, last ? cm->output_norm : cm->layers[l + 1].attn_norm,
                           last ? &cm->output : &cm->layers[l + 1].wq);
}

/* T tokens from d_tokens at positions *d_pos..; logits of the last one into c->logits. With STEP_GREEDY the argmax,
 * with STEP_SAMPLED a draw among the draw_k best, replaces d_tokens[0] and the position advances: the self-feeding
 * step a graph replays. */
static int forward(kiln_cuda_context *c, int T, int mode) {
    bool greedy = mode == STEP_GREEDY;
    kiln_cuda_model *cm = c->cm;
    const kiln_config *cfg = &cm->cfg;
    c->debug_pass = c->debug && T == 1;
    c->normed = false;
    MARK(c, KILN_OP_EMBED, 0, (uint64_t)T * cm->token_embd.row_bytes);
    if (kiln_cuda_get_rows(&cm->token_embd, c->d_tokens, T, c->x, c->stream)) return -1;
    if (T == 1 && c->d_layers) {
        c->persistent.stamps = c->prof ? c->d_stamps : NULL;
        MARK(c, KILN_OP_COUNT, 0, 0); /* the stages' times come from the kernel's stamps (collect_stamps) */
        if (kiln_cuda_decode_layers(&c->persistent, c->stream)) return -1;
    } else {
        for (int l = 0; l < cfg->n_layer; l++)
            if (attention_block(c, l, T) || ffn_block(c, l, T)) return -1;
    }
    float *last = c->x + (size_t)(T - 1) * cfg->n_embd;
    void *hq = kiln_cuda_type_uses_q8_1(cm->output.type) ? c->act_q : NULL;
    int top = cfg->n_layer; /* the final norm and the head, as a layer past the last */
    if (!c->normed) {
        MARK(c, KILN_OP_NORM, top, 0);
        norm(c, cm->output_norm, last, hq, 1);
    }
    MARK(c, KILN_OP_HEAD, top, mbytes(&cm->output));
    if (!skipped(c, T, SKIP_HEAD) && kiln_cuda_gemv(&cm->output, hq, c->h, c->logits, false, c->stream)) return -1;
    mark(c, KILN_OP_ARGMAX, top, 0, greedy);
    if (greedy) kiln_cuda_argmax(c->logits, cfg->n_vocab, c->argmax_scratch, c->d_tokens, c->d_pos, c->stream);
    if (mode == STEP_SAMPLED && kiln_cuda_top_k_draw(c->logits, cfg->n_vocab, c->draw_k, c->top_scratch,
                                                     (float *)(c->d_best + KILN_CUDA_TOP_K_MAX), c->d_best, c->d_draw,
                                                     c->d_tokens, c->d_pos, c->stream))
        return -1;
    mark(c, KILN_OP_COUNT, top, 0, greedy);
    return 0;
}

static int check_launches(kiln_cuda_context *c, kiln_error *err) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) return cuda_error(err, "forward pass", e);
    kiln_cuda_profile_collect(c->prof);
    return 0;
}

/* Queues the copy of pos and tokens; the pinned staging is reused only after the pass that reads it has ended. */
static int set_inputs(kiln_cuda_context *c, const int32_t *tokens, int n, int pos, kiln_error *err) {
    c->h_io[0] = pos;
    memcpy(c->h_io + 1, tokens, sizeof(int32_t) * n);
    cudaError_t e = cudaMemcpyAsync(c->d_io, c->h_io, sizeof(int32_t) * (n + 1), cudaMemcpyHostToDevice, c->stream);
    return e == cudaSuccess ? 0 : cuda_error(err, "copying inputs", e);
}

static void capture_decode_graph(kiln_cuda_context *c, int mode, int s);

/* The persistent step's stage times, from the stamps of the pass that has just ended, into the profile. */
static void collect_stamps(kiln_cuda_context *c) {
    if (!c->prof || !c->d_stamps) return;
    int n = 1 + KILN_CUDA_DECODE_STAGES * c->cm->cfg.n_layer;
    unsigned long long *t = malloc(sizeof *t * n);
    if (!t || cudaMemcpy(t, c->d_stamps, sizeof *t * n, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(t);
        return;
    }
    static const kiln_cuda_op stage_op[KILN_CUDA_DECODE_STAGES] = {KILN_OP_QKV, KILN_OP_ATTENTION, KILN_OP_WO,
                                                                   KILN_OP_GATE_UP, KILN_OP_DOWN};
    for (int l = 0; l < c->cm->cfg.n_layer; l++) {
        const kiln_cuda_layer *L = &c->cm->layers[l];
        uint64_t bytes[KILN_CUDA_DECODE_STAGES] = {mbytes(&L->wq) + mbytes(&L->wk) + mbytes(&L->wv), 0, mbytes(&L->wo),
                             mbytes(&L->gate) + mbytes(&L->up), mbytes(&L->down)};
        for (int s = 0; s < KILN_CUDA_DECODE_STAGES; s++) {
            const unsigned long long *end = t + 1 + KILN_CUDA_DECODE_STAGES * l + s;
            kiln_cuda_profile_add(c->prof, stage_op[s], (double)(end[0] - end[-1]) * 1e-6, bytes[s]);
        }
    }
    free(t);
}

/* The span of a step at pos: its index, and the positions it holds. */
static int span_index(const kiln_cuda_context *c, int pos) {
    int i = 0;
    for (int span = KILN_CUDA_FIRST_SPAN; span < c->n_ctx && span <= pos && i + 1 < MAX_SPANS; span *= 2) i++;
    return i;
}

static int span_of(const kiln_cuda_context *c, int index) {
    int64_t span = KILN_CUDA_FIRST_SPAN;
    for (int i = 0; i < index; i++) span *= 2;
    return index + 1 == MAX_SPANS || span > c->n_ctx ? c->n_ctx : (int)span;
}

/* One decode step at pos: the graph captured for its span when there is one, else eager launches (timed ones while
 * profiling). */
static int decode_step(kiln_cuda_context *c, int mode, int pos) {
    int s = span_index(c, pos);
    c->span = span_of(c, s);
    if (!c->graph_tried[mode][s] && !c->prof && !c->debug) capture_decode_graph(c, mode, s);
    if (c->prof || c->debug) {
        int rc = forward(c, 1, mode);
        cudaStreamSynchronize(c->stream);
        kiln_cuda_profile_collect(c->prof);
        collect_stamps(c);
        return rc;
    }
    if (c->graph_ok[mode][s]) return cudaGraphLaunch(c->graph[mode][s], c->stream) == cudaSuccess ? 0 : -1;
    return forward(c, 1, mode);
}

/* Queues tokens[0..n) at pos.. in batches; waits for each batch but the last, which wait_last says. */
static int run_tokens(kiln_cuda_context *c, const int32_t *tokens, int n, int pos, bool wait_last, kiln_error *err) {
    c->n_ahead = 0; /* steps queued ahead by kiln_cuda_decode_greedy run first; their KV rows are rewritten */
    if (n < 1 || pos < 0 || pos + n > c->n_ctx)
        return kiln_fail(err, "tokens %d..%d do not fit the context of %d positions", pos, pos + n - 1, c->n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->cm->cfg.n_vocab)
            return kiln_fail(err, "token id %d at %d is outside the vocabulary (%d)", tokens[i], i, c->cm->cfg.n_vocab);
    for (int done = 0; done < n;) {
        int T = n - done < c->n_batch ? n - done : c->n_batch;
        if (set_inputs(c, tokens + done, T, pos + done, err)) return -1;
        if (T == 1 ? decode_step(c, STEP_LOGITS, pos + done) : forward(c, T, STEP_LOGITS))
            return kiln_fail(err, "CUDA forward pass: a kernel rejected its arguments");
        done += T;
        if ((done < n || wait_last) && check_launches(c, err)) return -1;
    }
    return 0;
}

int kiln_cuda_eval(kiln_cuda_context *c, const int32_t *tokens, int n, int pos, float *logits, kiln_error *err) {
    if (run_tokens(c, tokens, n, pos, true, err)) return -1;
    if (logits) {
        cudaError_t e = cudaMemcpy(logits, c->logits, sizeof(float) * c->cm->cfg.n_vocab, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) return cuda_error(err, "copying logits", e);
    }
    return 0;
}

int kiln_cuda_eval_best(kiln_cuda_context *c, const int32_t *tokens, int n, int pos, int k, int32_t *ids,
                        float *logits, const int32_t *window, int n_window, float *window_logits, kiln_error *err) {
    int n_vocab = c->cm->cfg.n_vocab;
    if (k < 1 || k > KILN_CUDA_TOP_K_MAX || k > n_vocab)
        return kiln_fail(err, "%d best logits asked for: 1 to %d of a vocabulary of %d", k, KILN_CUDA_TOP_K_MAX,
                         n_vocab);
    if (n_window < 0 || n_window > KILN_CUDA_TOP_K_MAX)
        return kiln_fail(err, "%d window logits asked for: at most %d", n_window, KILN_CUDA_TOP_K_MAX);
    for (int i = 0; i < n_window; i++)
        if (window[i] < 0 || window[i] >= n_vocab)
            return kiln_fail(err, "token id %d is outside the vocabulary", window[i]);
    if (run_tokens(c, tokens, n, pos, false, err)) return -1;
    const int K = KILN_CUDA_TOP_K_MAX;
    int32_t *d = c->d_best, *h = c->h_best;
    memcpy(h + 2 * K, window, sizeof(int32_t) * (size_t)n_window);
    cudaError_t e = cudaMemcpyAsync(d + 2 * K, h + 2 * K, sizeof(int32_t) * (size_t)n_window, cudaMemcpyHostToDevice,
                                    c->stream);
    if (e == cudaSuccess && kiln_cuda_top_k(c->logits, n_vocab, 1, k, c->top_scratch, (float *)(d + K), d, c->stream))
        e = cudaErrorInvalidValue;
    if (e == cudaSuccess) {
        kiln_cuda_gather_f32(c->logits, d + 2 * K, n_window, (float *)(d + 3 * K), c->stream);
        e = cudaMemcpyAsync(h, d, BEST_BYTES, cudaMemcpyDeviceToHost, c->stream);
    }
    if (e != cudaSuccess) return cuda_error(err, "ranking the logits", e);
    if (check_launches(c, err)) return -1;
    memcpy(ids, h, sizeof(int32_t) * (size_t)k);
    memcpy(logits, h + K, sizeof(float) * (size_t)k);
    memcpy(window_logits, h + 3 * K, sizeof(float) * (size_t)n_window);
    return 0;
}

/* Captures the decode step of span s once (c->span set); on failure says so and leaves eager launches in charge. */
static void capture_decode_graph(kiln_cuda_context *c, int mode, int s) {
    c->graph_tried[mode][s] = true;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    int rc = e == cudaSuccess ? forward(c, 1, mode) : -1;
    cudaError_t end = e == cudaSuccess ? cudaStreamEndCapture(c->stream, &g) : e;
    if (e == cudaSuccess) e = end;
    if (e == cudaSuccess && rc == 0) e = cudaGraphInstantiate(&c->graph[mode][s], g, 0);
    if (g) cudaGraphDestroy(g);
    c->graph_ok[mode][s] = e == cudaSuccess && rc == 0;
    if (!c->graph_ok[mode][s]) {
        fprintf(stderr, "kiln: CUDA graph capture failed (%s): decoding with eager launches\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "a kernel rejected its arguments");
        cudaGetLastError();
        c->graph[mode][s] = NULL;
    }
}

/* Queues the step of mode (greedy or sampled) at pos; what it leaves for the host, its id or its draw, is copied to
 * slot pos & 1 (h_tokens or h_draw[1..2]) and token_ready[pos & 1] fires once it is there. */
static int queue_step(kiln_cuda_context *c, int mode, int pos) {
    int slot = pos & 1;
    if (decode_step(c, mode, pos)) return -1;
    cudaError_t e = mode == STEP_GREEDY ? cudaMemcpyAsync(&c->h_tokens[slot], c->d_tokens, sizeof(int32_t),
                                                          cudaMemcpyDeviceToHost, c->stream)
                                        : cudaMemcpyAsync(&c->h_draw[1 + slot], c->d_draw, sizeof(kiln_cuda_draw),
                                                          cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess) e = cudaEventRecord(c->token_ready[slot], c->stream);
    return e == cudaSuccess ? 0 : -1;
}

int kiln_cuda_generate_greedy(kiln_cuda_context *c, int32_t token, int pos, int n_gen, int32_t *out,
                              kiln_error *err) {
    if (pos < 0 || pos + n_gen > c->n_ctx)
        return kiln_fail(err, "generating %d tokens from position %d overflows the context of %d", n_gen, pos, c->n_ctx);
    if (token < 0 || token >= c->cm->cfg.n_vocab) return kiln_fail(err, "token id %d is outside the vocabulary", token);
    c->n_ahead = 0;
    if (set_inputs(c, &token, 1, pos, err)) return -1;
    /* two steps in flight: step i+1 is queued before step i's id is read, hiding the launch behind the GPU work */
    for (int i = 0; i <= n_gen; i++) {
        if (i < n_gen && queue_step(c, STEP_GREEDY, pos + i))
            return kiln_fail(err, "CUDA decode step %d failed to launch", i);
        if (i > 0) {
            int slot = (pos + i - 1) & 1;
            cudaError_t e = cudaEventSynchronize(c->token_ready[slot]);
            if (e != cudaSuccess) return cuda_error(err, "decode step", e);
            out[i - 1] = c->h_tokens[slot];
        }
    }
    return check_launches(c, err);
}

/* kiln_cuda_decode_greedy and _sampled: the step at pos fed token, the next one queued behind it before waiting.
 * A sampled step's draw (parameters and PRNG state) goes up from h_draw[0] whenever the queue starts again. */
static int decode_ahead(kiln_cuda_context *c, int mode, int32_t token, int pos, int32_t *next, kiln_error *err) {
    if (pos < 0 || pos >= c->n_ctx) return kiln_fail(err, "position %d is outside the context of %d", pos, c->n_ctx);
    if (token < 0 || token >= c->cm->cfg.n_vocab) return kiln_fail(err, "token id %d is outside the vocabulary", token);
    if (!(c->n_ahead > 0 && c->ahead_mode == mode && c->ahead_pos == pos && c->ahead_token == token)) {
        c->n_ahead = 0; /* not what was guessed: those steps run first, and their KV rows are rewritten */
        bool failed = set_inputs(c, &token, 1, pos, err);
        if (!failed && mode == STEP_SAMPLED)
            failed = cudaMemcpyAsync(c->d_draw, c->h_draw, sizeof(kiln_cuda_draw), cudaMemcpyHostToDevice,
                                     c->stream) != cudaSuccess;
        if (failed || queue_step(c, mode, pos)) return kiln_fail(err, "CUDA decode step failed to launch");
        c->n_ahead = 1, c->ahead_mode = mode, c->ahead_pos = pos, c->ahead_token = token;
    }
    /* two steps in flight: the next one, fed by this one's token on the device, is queued before waiting, so the
     * GPU never waits for the host between steps (eager passes under profiling or debugging go one at a time) */
    if (c->n_ahead == 1 && pos + 1 < c->n_ctx && !c->prof && !c->debug) {
        if (queue_step(c, mode, pos + 1)) return kiln_fail(err, "CUDA decode step failed to launch");
        c->n_ahead = 2;
    }
    cudaError_t e = cudaEventSynchronize(c->token_ready[pos & 1]);
    if (e != cudaSuccess) return cuda_error(err, "decode step", e);
    *next = mode == STEP_GREEDY ? c->h_tokens[pos & 1] : c->h_draw[1 + (pos & 1)].token;
    c->n_ahead--, c->ahead_pos = pos + 1, c->ahead_token = *next;
    e = cudaGetLastError();
    return e == cudaSuccess ? 0 : cuda_error(err, "decode step", e);
}

int kiln_cuda_decode_greedy(kiln_cuda_context *c, int32_t token, int pos, int32_t *next, kiln_error *err) {
    return decode_ahead(c, STEP_GREEDY, token, pos, next, err);
}

/* The sampled steps' graphs captured again for draws among k best (their top-k launches are shaped by k). */
static void set_draw_k(kiln_cuda_context *c, int k) {
    if (c->draw_k == k) return;
    cudaStreamSynchronize(c->stream); /* no replay of the graphs to go is still queued */
    for (int s = 0; s < MAX_SPANS; s++) {
        if (c->graph[STEP_SAMPLED][s]) cudaGraphExecDestroy(c->graph[STEP_SAMPLED][s]);
        c->graph[STEP_SAMPLED][s] = NULL;
        c->graph_tried[STEP_SAMPLED][s] = c->graph_ok[STEP_SAMPLED][s] = false;
    }
    c->draw_k = k;
    if (c->ahead_mode == STEP_SAMPLED) c->n_ahead = 0;
}

int kiln_cuda_decode_sampled(kiln_cuda_context *c, int32_t token, int pos, int k, const kiln_draw_params *p,
                             uint64_t rng[4], int32_t *next, kiln_error *err) {
    if (k < 1 || k > KILN_CUDA_TOP_K_MAX || k >= c->cm->cfg.n_vocab)
        return kiln_fail(err, "a draw among the %d best logits: 1 to %d, below the vocabulary of %d", k,
                         KILN_CUDA_TOP_K_MAX, c->cm->cfg.n_vocab);
    set_draw_k(c, k);
    /* the step in flight was fed this token and draws with these parameters from this state, or the queue starts
     * again from them (the upload of h_draw[0] before has been done: the step after it was waited for) */
    bool in_flight = c->n_ahead > 0 && c->ahead_mode == STEP_SAMPLED && c->ahead_pos == pos &&
                     c->ahead_token == token && !memcmp(&c->h_draw[0].p, p, sizeof *p) &&
                     !memcmp(c->ahead_rng.s, rng, sizeof c->ahead_rng.s);
    if (!in_flight) {
        c->n_ahead = 0;
        c->h_draw[0].p = *p;
        memcpy(c->h_draw[0].rng.s, rng, sizeof c->h_draw[0].rng.s);
    }
    if (decode_ahead(c, STEP_SAMPLED, token, pos, next, err)) return -1;
    memcpy(rng, c->h_draw[1 + (pos & 1)].rng.s, sizeof c->ahead_rng.s);
    memcpy(c->ahead_rng.s, rng, sizeof c->ahead_rng.s);
    return 0;
}

/* One forward step over many sequences on the GPU, for the server's continuous batching: every token of the step
 * (each running sequence's next token, and the tokens of at most a prompt chunk or two) is a row of the same
 * activations, and each matrix is read once per step for all of them (kiln_cuda_gemv_batch). K/V rows live in a
 * paged cache shared by all sequences: blocks of block_size positions named by each sequence's block table, which
 * the host owns (engine/kv_pool.c) and sends with the step.
 *
 * Prompt chunks take the same kernels as decode tokens (a chunk of n tokens is n more vectors of the batched GEMV).
 * That keeps one path, makes every token's result independent of the rest of the step, and costs little at the
 * scheduler's 64-token chunks: a tensor-core GEMM would first need every weight dequantized to F16, and that copy
 * costs about as much as the chunk's dp4a work. Long prompts alone go faster through kiln_cuda_eval's GEMMs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/executor.h"
#include "cuda/kernels_batch.h"

#define Q8_1_BYTES 36 /* one Q8_1 block per 32 activations */

/* Steps of decode tokens alone (one a sequence, each wanting its logits), up to GRAPH_MAX_TOKENS of them, replay a
 * CUDA graph of the step captured for their count, without the gaps of ~340 eager launches a step: H100,
 * qwen2-1.5b at 1 and 8 sequences 474-479 and 3,453-3,479 tok/s against 446-448 and 2,820-3,284 eager. The
 * attention's grid follows the step's longest token; a graph is built for its span (KILN_CUDA_FIRST_SPAN) instead
 * and captured again when the span grows. Each token's own slices do not depend on the grid, so a graph gives the
 * bits eager launches give. KILN_CUDA_BATCH_GRAPH=0 (read when a batch is made) keeps every step eager. */
#define GRAPH_MAX_TOKENS 64

typedef struct step_graph {
    cudaGraphExec_t exec;
    int span; /* the positions it was captured for */
} step_graph;

struct kiln_cuda_batch {
    kiln_cuda_model *cm;
    int n_blocks, block_size, n_ctx, max_tokens, max_seqs, max_table;
    cudaStream_t stream;
    void *k_cache, *v_cache; /* [n_layer][n_blocks][n_head_kv][block_size][head_dim] halves */
    float *x, *h, *q, *k, *v, *attn, *ff, *ff2, *logits, *part;
    void *act_q;             /* Q8_1 of the current GEMV input, every row of the step */
    /* a step's inputs, one copy: tokens, positions, cache slots, table offsets (max_tokens each), logit rows
     * (max_seqs), then the block tables */
    int32_t *d_io, *h_io;
    size_t io_len;
    float *h_logits;         /* pinned: [max_seqs][n_vocab] */
    /* rows that ask for their best logits only (kiln_cuda_seq.best): the top-k's scratch, and the results:
     * ids and logits [max_seqs][best of the step], the windows' rows * n_vocab + id in, their logits out
     * (max_seqs * KILN_CUDA_TOP_K_MAX each), on the device and pinned */
    void *top_scratch;
    int32_t *d_best, *h_best;
    int step_best;           /* the largest best of the step (the rows' stride in the results) */
    int step_positions;      /* the most positions a token of the step sees */
    int *window_at;          /* [max_seqs]: where each row's window logits start */
    kiln_cuda_profile *prof; /* while profiling: every op of a step timed, no graph */
    step_graph graphs[GRAPH_MAX_TOKENS + 1]; /* by the step's token count */
    bool graphs_off;         /* eager launches only: asked for, or a capture failed */
    uint64_t kv_bytes, work_bytes; /* device memory of the paged KV cache and of the rest */
};

/* The start of op, which reads `bytes` of weights: a profile boundary (no-op while not profiling). */
static void mark(kiln_cuda_batch *b, kiln_cuda_op op, uint64_t bytes) {
    kiln_cuda_profile_mark(b->prof, op, bytes, b->stream);
}

#define BATCH_BEST_INTS(b) (4 * (size_t)(b)->max_seqs * KILN_CUDA_TOP_K_MAX)

static int cuda_error(kiln_error *err, const char *what, cudaError_t e) {
    return kiln_fail(err, "CUDA %s: %s", what, cudaGetErrorString(e));
}

static size_t max3(size_t a, size_t b, size_t c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

static size_t block_bytes(const kiln_config *cfg, int block_size) {
    return (size_t)cfg->n_layer * (size_t)kiln_config_kv_dim(cfg) * (size_t)block_size * 2;
}

/* Everything but the KV cache. */
static cudaError_t alloc_buffers(kiln_cuda_batch *b) {
    const kiln_config *cfg = &b->cm->cfg;
    size_t T = (size_t)b->max_tokens, qd = (size_t)kiln_config_q_dim(cfg), kvd = (size_t)kiln_config_kv_dim(cfg);
    size_t widest = max3((size_t)cfg->n_embd, qd, (size_t)cfg->n_ff);
    b->io_len = 4 * T + (size_t)b->max_seqs + (size_t)b->max_seqs * (size_t)b->max_table;
    struct { void **p; size_t bytes; } bufs[] = {
        {(void **)&b->d_io, sizeof(int32_t) * b->io_len},
        {(void **)&b->x, sizeof(float) * T * cfg->n_embd},
        {(void **)&b->h, sizeof(float) * T * cfg->n_embd},
        {(void **)&b->q, sizeof(float) * T * qd},
        {(void **)&b->k, sizeof(float) * T * kvd},
        {(void **)&b->v, sizeof(float) * T * kvd},
        {(void **)&b->attn, sizeof(float) * T * qd},
        {(void **)&b->ff, sizeof(float) * T * widest}, /* also the packed rows for the LM head */
        {(void **)&b->ff2, sizeof(float) * T * cfg->n_ff},
        {(void **)&b->logits, sizeof(float) * (size_t)b->max_seqs * cfg->n_vocab},
        {(void **)&b->part, sizeof(float) * T * cfg->n_head * KILN_CUDA_DECODE_SPLITS * (cfg->head_dim + 2)},
        {&b->act_q, T * widest * 2}, /* F16 in half mode, more than Q8_1's 36 bytes a 32 */
        {&b->top_scratch, kiln_cuda_top_k_scratch_bytes(cfg->n_vocab, b->max_seqs, KILN_CUDA_TOP_K_MAX)},
        {(void **)&b->d_best, sizeof(int32_t) * BATCH_BEST_INTS(b)},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        cudaError_t e = cudaMalloc(bufs[i].p, bufs[i].bytes);
        if (e != cudaSuccess) return e;
        b->work_bytes += bufs[i].bytes;
    }
    cudaError_t e = cudaHostAlloc((void **)&b->h_io, sizeof(int32_t) * b->io_len, cudaHostAllocDefault);
    if (e == cudaSuccess)
        e = cudaHostAlloc((void **)&b->h_best, sizeof(int32_t) * BATCH_BEST_INTS(b), cudaHostAllocDefault);
    if (e == cudaSuccess && !(b->window_at = malloc(sizeof(int) * (size_t)b->max_seqs))) e = cudaErrorMemoryAllocation;
    if (e != cudaSuccess) return e;
    return cudaHostAlloc((void **)&b->h_logits, sizeof(float) * (size_t)b->max_seqs * cfg->n_vocab,
                         cudaHostAllocDefault);
}

/* As many blocks as were asked for, or as fit in 95% of the memory left (at least min_blocks). */
static int alloc_cache(kiln_cuda_batch *b, int max_blocks, int min_blocks, kiln_error *err) {
    size_t per_block = block_bytes(&b->cm->cfg, b->block_size), free_b = 0, total_b = 0;
    cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess) return cuda_error(err, "memory info", e);
    size_t fit = (size_t)(0.95 * (double)free_b) / (2 * per_block);
    b->n_blocks = fit < (size_t)max_blocks ? (int)fit : max_blocks;
    if (b->n_blocks < min_blocks)
        return kiln_fail(err, "a paged KV cache of %d blocks (%.1f MiB) does not fit: %.1f MiB free", min_blocks,
                         2.0 * per_block * min_blocks / 1048576.0, free_b / 1048576.0);
    size_t bytes = per_block * (size_t)b->n_blocks;
    if ((e = cudaMalloc(&b->k_cache, bytes)) != cudaSuccess || (e = cudaMalloc(&b->v_cache, bytes)) != cudaSuccess)
        return cuda_error(err, "allocating the paged KV cache", e);
    b->kv_bytes = 2 * (uint64_t)bytes;
    return 0;
}

int kiln_cuda_batch_new(kiln_cuda_model *cm, const kiln_cuda_batch_params *p, kiln_cuda_batch **out,
                        kiln_error *err) {
    *out = NULL;
    const kiln_config *cfg = &cm->cfg;
    if (cfg->head_dim != 64 && cfg->head_dim != 128 && cfg->head_dim != 256)
        return kiln_fail(err, "CUDA attention supports head_dim 64, 128 and 256, not %d", cfg->head_dim);
    if (cfg->n_embd % 32 || kiln_config_q_dim(cfg) % 32 || cfg->n_ff % 32)
        return kiln_fail(err, "CUDA backend needs widths that are multiples of 32");
    if (p->block_size < 1 || p->n_ctx < 1 || p->max_tokens < 1 || p->max_seqs < 1 || p->min_blocks < 1 ||
        p->max_blocks < p->min_blocks)
        return kiln_fail(err, "batched GPU step: blocks of %d, context %d, %d tokens, %d sequences, %d..%d blocks",
                         p->block_size, p->n_ctx, p->max_tokens, p->max_seqs, p->min_blocks, p->max_blocks);
    kiln_cuda_batch *b = calloc(1, sizeof *b);
    if (!b) return kiln_fail(err, "out of memory");
    b->cm = cm;
    b->block_size = p->block_size, b->n_ctx = p->n_ctx, b->max_tokens = p->max_tokens, b->max_seqs = p->max_seqs;
    b->max_table = (p->n_ctx + p->block_size - 1) / p->block_size;
    const char *graph_env = getenv("KILN_CUDA_BATCH_GRAPH");
    b->graphs_off = graph_env && atoi(graph_env) == 0;
    if (p->half) kiln_cuda_batch_half_set(true);
    cudaError_t e = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = alloc_buffers(b);
    if (e != cudaSuccess) {
        cudaGetLastError();
        kiln_cuda_batch_free(b);
        return cuda_error(err, "buffers of a batched step", e);
    }
    if (alloc_cache(b, p->max_blocks, p->min_blocks, err)) {
        kiln_cuda_batch_free(b);
        return -1;
    }
    *out = b;
    return 0;
}

int kiln_cuda_batch_blocks(const kiln_cuda_batch *b) { return b->n_blocks; }

void kiln_cuda_batch_memory(const kiln_cuda_batch *b, uint64_t *kv_cache, uint64_t *workspace) {
    *kv_cache = b->kv_bytes;
    *workspace = b->work_bytes;
}

void kiln_cuda_batch_free(kiln_cuda_batch *b) {
    if (!b) return;
    void *bufs[] = {b->d_io, b->x, b->h, b->q, b->k, b->v, b->attn, b->ff, b->ff2, b->logits, b->part, b->act_q,
                    b->top_scratch, b->d_best, b->k_cache, b->v_cache};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    if (b->h_io) cudaFreeHost(b->h_io);
    if (b->h_best) cudaFreeHost(b->h_best);
    free(b->window_at);
    if (b->h_logits) cudaFreeHost(b->h_logits);
    if (b->stream) cudaStreamDestroy(b->stream);
    kiln_cuda_profile_free(b->prof);
    for (int t = 0; t <= GRAPH_MAX_TOKENS; t++)
        if (b->graphs[t].exec) cudaGraphExecDestroy(b->graphs[t].exec);
    free(b);
}

void kiln_cuda_batch_set_graphs(kiln_cuda_batch *b, bool on) { b->graphs_off = !on; }

int kiln_cuda_batch_set_profile(kiln_cuda_batch *b, bool on, kiln_error *err) {
    kiln_cuda_profile_free(b->prof);
    b->prof = on ? kiln_cuda_profile_new(err) : NULL;
    return on && !b->prof ? -1 : 0;
}

void kiln_cuda_batch_profile_print(const kiln_cuda_batch *b, int n_steps, double copy_bw, FILE *out) {
    kiln_cuda_profile_write(b->prof, n_steps, copy_bw, out);
}

/* Where the inputs of a step sit in d_io / h_io. */
typedef struct step_io {
    int32_t *tokens, *pos, *slot, *table_off, *rows, *tables;
} step_io;

static step_io io_at(const kiln_cuda_batch *b, int32_t *base) {
    size_t T = (size_t)b->max_tokens;
    return (step_io){base, base + T, base + 2 * T, base + 3 * T, base + 4 * T, base + 4 * T + b->max_seqs};
}

/* Fills h_io from the sequences; returns the number of table entries, or -1 with err set. */
static int pack_inputs(kiln_cuda_batch *b, const kiln_cuda_seq *seqs, int n_seqs, int *n_tokens, int *n_rows,
                       kiln_error *err) {
    step_io h = io_at(b, b->h_io);
    int T = 0, R = 0, n_tab = 0, bs = b->block_size;
    b->step_positions = 0;
    for (int s = 0; s < n_seqs; s++) {
        const kiln_cuda_seq *q = &seqs[s];
        if (q->n < 1 || q->pos < 0 || q->pos + q->n > b->n_ctx)
            return kiln_fail(err, "sequence %d: tokens %d..%d do not fit the context of %d", s, q->pos,
                             q->pos + q->n - 1, b->n_ctx);
        if (T + q->n > b->max_tokens)
            return kiln_fail(err, "a step of more than %d tokens", b->max_tokens);
        int n_blk = (q->pos + q->n + bs - 1) / bs;
        for (int i = 0; i < n_blk; i++) {
            if (q->blocks[i] < 0 || q->blocks[i] >= b->n_blocks)
                return kiln_fail(err, "sequence %d: block %d is outside the cache (%d blocks)", s, q->blocks[i],
                                 b->n_blocks);
            h.tables[n_tab + i] = q->blocks[i];
        }
        for (int i = 0; i < q->n; i++, T++) {
            int p = q->pos + i;
            if (q->tokens[i] < 0 || q->tokens[i] >= b->cm->cfg.n_vocab)
                return kiln_fail(err, "token id %d is outside the vocabulary (%d)", q->tokens[i], b->cm->cfg.n_vocab);
            h.tokens[T] = q->tokens[i];
            h.pos[T] = p;
            h.slot[T] = q->blocks[p / bs] * bs + p % bs;
            h.table_off[T] = n_tab;
        }
        if (q->logits) h.rows[R++] = T - 1;
        if (q->pos + q->n > b->step_positions) b->step_positions = q->pos + q->n;
        n_tab += n_blk;
    }
    *n_tokens = T, *n_rows = R;
    return n_tab;
}

/* Where a kernel that makes a GEMV's input may also write its tensor-core form (Q8_1, or half mode's F16): act_q
 * for the matrices that take it, NULL for the others (float weights outside half mode). */
static const void *input_or_null(const kiln_cuda_batch *b, const kiln_cuda_matrix *m) {
    return kiln_cuda_gemv_batch_takes_act(m) ? b->act_q : NULL;
}

/* act_q from T rows of k values: their Q8_1, or in half mode their F16 form. */
static void prepare_input(kiln_cuda_batch *b, const float *in, int k, int T) {
    if (kiln_cuda_batch_half()) kiln_cuda_batch_to_half(in, b->act_q, k, T, b->stream);
    else kiln_cuda_quantize_q8_1(in, b->act_q, k, T, b->stream);
}

/* RMSNorm of T rows of src into b->h, and act_q from them where want_q. */
static void norm_input(kiln_cuda_batch *b, float *src, const float *w, bool want_q, int T) {
    const kiln_config *cfg = &b->cm->cfg;
    if (want_q && kiln_cuda_batch_half())
        kiln_cuda_rmsnorm_rows_half(src, w, b->h, b->act_q, cfg->n_embd, T, cfg->rms_eps, b->stream);
    else kiln_cuda_rmsnorm_rows(src, w, b->h, want_q ? b->act_q : NULL, cfg->n_embd, T, cfg->rms_eps, b->stream);
}

/* x += W in for T rows: the tensor-core GEMV's input xq where the kernel before made it, else act_q made here from
 * in (float weights outside half mode take in itself). */
static int residual(kiln_cuda_batch *b, const kiln_cuda_matrix *m, const float *in, const void *xq, int T) {
    if (kiln_cuda_gemv_batch_takes_act(m) && !xq) prepare_input(b, in, m->k, T);
    return kiln_cuda_gemv_batch(m, xq ? xq : b->act_q, in, T, b->x, true, b->stream);
}

/* The feed-forward block of T rows from b->h (and act_q where gate_q): x += down(silu(gate h) * (up h)). In half
 * mode the SwiGLU launch writes the down projection's F16 input itself, into ff (act_q still holds its own input). */
static int feed_forward(kiln_cuda_batch *b, const kiln_cuda_layer *L, bool gate_q, int T) {
    const kiln_config *cfg = &b->cm->cfg;
    const void *hq = gate_q ? b->act_q : NULL;
    mark(b, KILN_OP_GATE_UP, mbytes(&L->gate) + mbytes(&L->up));
    if (kiln_cuda_batch_half() && kiln_cuda_gemv_batch_takes_act(&L->down) &&
        kiln_cuda_gemv_batch_swiglu_half(&L->gate, &L->up, hq, T, b->ff, b->stream) == 0) {
        mark(b, KILN_OP_DOWN, mbytes(&L->down));
        return residual(b, &L->down, NULL, b->ff, T);
    }
    if (L->gate.type == L->up.type && L->gate.row_bytes == L->up.row_bytes) {
        if (kiln_cuda_gemv_batch_swiglu(&L->gate, &L->up, hq, b->h, T, b->ff, b->stream)) return -1;
    } else {
        if (!gate_q && kiln_cuda_gemv_batch_takes_act(&L->up)) prepare_input(b, b->h, cfg->n_embd, T);
        if (kiln_cuda_gemv_batch(&L->gate, b->act_q, b->h, T, b->ff, false, b->stream) ||
            kiln_cuda_gemv_batch(&L->up, b->act_q, b->h, T, b->ff2, false, b->stream))
            return -1;
        kiln_cuda_swiglu(b->ff, b->ff2, b->ff, (int64_t)T * cfg->n_ff, b->stream);
    }
    mark(b, KILN_OP_DOWN, mbytes(&L->down));
    return residual(b, &L->down, b->ff, NULL, T);
}

static int layer(kiln_cuda_batch *b, int l, const step_io *d, int T) {
    const kiln_config *cfg = &b->cm->cfg;
    const kiln_cuda_layer *L = &b->cm->layers[l];
    bool any_q = kiln_cuda_gemv_batch_takes_act(&L->wq) || kiln_cuda_gemv_batch_takes_act(&L->wk) ||
                 kiln_cuda_gemv_batch_takes_act(&L->wv);
    mark(b, KILN_OP_NORM, 0);
    norm_input(b, b->x, L->attn_norm, any_q, T);
    const kiln_cuda_matrix *ms[3] = {&L->wq, &L->wk, &L->wv};
    float *ys[3] = {b->q, b->k, b->v};
    size_t layer_cache = block_bytes(cfg, b->block_size) / (size_t)cfg->n_layer * (size_t)b->n_blocks;
    uint8_t *kc = (uint8_t *)b->k_cache + (size_t)l * layer_cache;
    uint8_t *vc = (uint8_t *)b->v_cache + (size_t)l * layer_cache;
    kiln_cuda_paged_args pa = {cfg->n_head, cfg->n_head_kv, cfg->head_dim, cfg->rope_dim, b->block_size,
                               cfg->rope_style == KILN_ROPE_NEOX, 1.0f / sqrtf((float)cfg->head_dim),
                               b->cm->rope_freq};
    mark(b, KILN_OP_QKV, mbytes(&L->wq) + mbytes(&L->wk) + mbytes(&L->wv));
    if (kiln_cuda_gemv_batch_rope_fits(ms, &pa)) { /* the rope stage in the GEMV's blocks: one launch fewer */
        if (kiln_cuda_gemv_batch_qkv_rope(ms, b->act_q, T, &pa, b->q, L->bq, L->bk, L->bv, kc, vc, d->pos, d->slot,
                                          b->stream))
            return -1;
    } else {
        if (kiln_cuda_gemv_batch_multi(ms, ys, 3, b->act_q, b->h, T, b->stream)) return -1;
        mark(b, KILN_OP_ROPE, 0);
        kiln_cuda_rope_store_paged(&pa, b->q, b->k, b->v, L->bq, L->bk, L->bv, kc, vc, d->pos, d->slot, T,
                                   b->stream);
    }
    const void *attn_q = input_or_null(b, &L->wo);
    mark(b, KILN_OP_ATTENTION, 0);
    if (kiln_cuda_attention_paged(&pa, b->q, kc, vc, d->pos, d->tables, d->table_off, T, b->step_positions,
                                  b->part, b->attn, (void *)attn_q, b->stream))
        return -1;
    mark(b, KILN_OP_WO, mbytes(&L->wo));
    if (residual(b, &L->wo, b->attn, attn_q, T)) return -1;

    bool gate_q = kiln_cuda_gemv_batch_takes_act(&L->gate);
    mark(b, KILN_OP_NORM, 0);
    norm_input(b, b->x, L->ffn_norm, gate_q, T);
    return feed_forward(b, L, gate_q, T);
}

static int forward(kiln_cuda_batch *b, const step_io *d, int T, int R) {
    kiln_cuda_model *cm = b->cm;
    const kiln_config *cfg = &cm->cfg;
    mark(b, KILN_OP_EMBED, 0);
    if (kiln_cuda_get_rows(&cm->token_embd, d->tokens, T, b->x, b->stream)) return -1;
    for (int l = 0; l < cfg->n_layer; l++)
        if (layer(b, l, d, T)) return -1;
    if (!R) return 0;
    mark(b, KILN_OP_HEAD, mbytes(&cm->output));
    float *last = b->ff; /* the rows that want logits, packed */
    kiln_cuda_gather_rows(b->x, d->rows, R, cfg->n_embd, last, b->stream);
    bool head_q = kiln_cuda_gemv_batch_takes_act(&cm->output);
    norm_input(b, last, cm->output_norm, head_q, R);
    return kiln_cuda_gemv_batch(&cm->output, head_q ? b->act_q : NULL, b->h, R, b->logits, false, b->stream);
}

/* The span (KILN_CUDA_FIRST_SPAN) that holds n positions. */
static int span_of(const kiln_cuda_batch *b, int n) {
    int64_t span = KILN_CUDA_FIRST_SPAN;
    while (span < n) span *= 2;
    return span < b->n_ctx ? (int)span : b->n_ctx;
}

/* Captures the step of T decode tokens for span (b->step_positions set to it) into graphs[T]; false (said once,
 * graphs off from then on) when capture fails. */
static bool capture_step(kiln_cuda_batch *b, const step_io *d, int T, int span) {
    step_graph *sg = &b->graphs[T];
    if (sg->exec) cudaGraphExecDestroy(sg->exec);
    sg->exec = NULL;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal);
    int rc = e == cudaSuccess ? forward(b, d, T, T) : -1;
    cudaError_t end = e == cudaSuccess ? cudaStreamEndCapture(b->stream, &g) : e;
    if (e == cudaSuccess) e = end;
    if (e == cudaSuccess && rc == 0) e = cudaGraphInstantiate(&sg->exec, g, 0);
    if (g) cudaGraphDestroy(g);
    if (e == cudaSuccess && rc == 0) {
        sg->span = span;
        return true;
    }
    fprintf(stderr, "kiln: CUDA graph capture of a batched step failed (%s): eager launches from now on\n",
            e != cudaSuccess ? cudaGetErrorString(e) : "a kernel rejected its arguments");
    cudaGetLastError();
    sg->exec = NULL;
    b->graphs_off = true;
    return false;
}

/* The step's launches: its graph where it takes one (GRAPH_MAX_TOKENS), else eager. */
static int run_step(kiln_cuda_batch *b, const step_io *d, int n_seqs, int T, int R) {
    if (b->prof || b->graphs_off || T != n_seqs || R != T || T > GRAPH_MAX_TOKENS) return forward(b, d, T, R);
    int span = span_of(b, b->step_positions);
    step_graph *sg = &b->graphs[T];
    b->step_positions = span;
    if ((!sg->exec || sg->span != span) && !capture_step(b, d, T, span)) return forward(b, d, T, R);
    return cudaGraphLaunch(sg->exec, b->stream) == cudaSuccess ? 0 : -1;
}

/* The rows' best logits and window logits (kiln_cuda_seq.best), queued: ranked over every row at the step's largest
 * best, the windows gathered by row * n_vocab + id, both copied to h_best. */
static int queue_best(kiln_cuda_batch *b, const kiln_cuda_seq *seqs, int n_seqs, int R, kiln_error *err) {
    int n_vocab = b->cm->cfg.n_vocab, K = KILN_CUDA_TOP_K_MAX, n_win = 0, r = 0;
    size_t rows = (size_t)b->max_seqs * K;
    int32_t *win = b->h_best + 2 * rows;
    b->step_best = 0;
    for (int s = 0; s < n_seqs; s++) {
        const kiln_cuda_seq *q = &seqs[s];
        if (!q->logits) continue;
        if (q->best < 0 || q->best > K || q->best > n_vocab || q->n_window < 0 || q->n_window > K ||
            (!q->best && q->n_window))
            return kiln_fail(err, "sequence %d: %d best logits and a window of %d (at most %d)", s, q->best,
                             q->n_window, K);
        if (q->best > b->step_best) b->step_best = q->best;
        b->window_at[r] = n_win;
        for (int i = 0; i < q->n_window; i++) {
            if (q->window[i] < 0 || q->window[i] >= n_vocab)
                return kiln_fail(err, "sequence %d: window token %d is outside the vocabulary", s, q->window[i]);
            win[n_win++] = r * n_vocab + q->window[i];
        }
        r++;
    }
    if (!b->step_best) return 0;
    cudaError_t e = cudaMemcpyAsync(b->d_best + 2 * rows, win, sizeof(int32_t) * (size_t)n_win, cudaMemcpyHostToDevice,
                                    b->stream);
    if (e == cudaSuccess && kiln_cuda_top_k(b->logits, n_vocab, R, b->step_best, b->top_scratch,
                                            (float *)(b->d_best + rows), b->d_best, b->stream))
        e = cudaErrorInvalidValue;
    if (e == cudaSuccess) {
        kiln_cuda_gather_f32(b->logits, b->d_best + 2 * rows, n_win, (float *)(b->d_best + 3 * rows), b->stream);
        size_t n_best = (size_t)R * (size_t)b->step_best;
        e = cudaMemcpyAsync(b->h_best, b->d_best, sizeof(int32_t) * n_best, cudaMemcpyDeviceToHost, b->stream);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(b->h_best + rows, b->d_best + rows, sizeof(float) * n_best, cudaMemcpyDeviceToHost,
                                b->stream);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(b->h_best + 3 * rows, b->d_best + 3 * rows, sizeof(float) * (size_t)n_win,
                                cudaMemcpyDeviceToHost, b->stream);
    }
    return e == cudaSuccess ? 0 : cuda_error(err, "ranking the logits", e);
}

/* The whole rows of the sequences that want them (no best), each to its place in h_logits. */
static cudaError_t queue_rows(kiln_cuda_batch *b, const kiln_cuda_seq *seqs, int n_seqs) {
    size_t V = (size_t)b->cm->cfg.n_vocab;
    cudaError_t e = cudaSuccess;
    for (int s = 0, r = 0; s < n_seqs && e == cudaSuccess; s++) {
        if (!seqs[s].logits) continue;
        if (!seqs[s].best)
            e = cudaMemcpyAsync(b->h_logits + r * V, b->logits + r * V, sizeof(float) * V, cudaMemcpyDeviceToHost,
                                b->stream);
        r++;
    }
    return e;
}

void kiln_cuda_batch_best(const kiln_cuda_batch *b, int row, const int32_t **ids, const float **logits,
                          const float **window_logits) {
    size_t rows = (size_t)b->max_seqs * KILN_CUDA_TOP_K_MAX, at = (size_t)row * (size_t)b->step_best;
    *ids = b->h_best + at;
    *logits = (const float *)(b->h_best + rows) + at;
    *window_logits = (const float *)(b->h_best + 3 * rows) + b->window_at[row];
}

int kiln_cuda_forward_batch(kiln_cuda_batch *b, const kiln_cuda_seq *seqs, int n_seqs, const float **logits,
                            kiln_error *err) {
    if (n_seqs < 1 || n_seqs > b->max_seqs)
        return kiln_fail(err, "a step of %d sequences (1..%d)", n_seqs, b->max_seqs);
    int T = 0, R = 0;
    int n_tab = pack_inputs(b, seqs, n_seqs, &T, &R, err);
    if (n_tab < 0) return -1;
    size_t used = 4 * (size_t)b->max_tokens + (size_t)b->max_seqs + (size_t)n_tab;
    cudaError_t e = cudaMemcpyAsync(b->d_io, b->h_io, sizeof(int32_t) * used, cudaMemcpyHostToDevice, b->stream);
    if (e != cudaSuccess) return cuda_error(err, "copying a step's inputs", e);
    step_io d = io_at(b, b->d_io);
    if (run_step(b, &d, n_seqs, T, R)) return kiln_fail(err, "batched GPU step: a kernel rejected its arguments");
    mark(b, KILN_OP_ARGMAX, 0); /* the ranking and the copies back */
    if (queue_best(b, seqs, n_seqs, R, err)) return -1;
    e = queue_rows(b, seqs, n_seqs);
    mark(b, KILN_OP_COUNT, 0);
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaStreamSynchronize(b->stream);
    if (e != cudaSuccess) return cuda_error(err, "batched GPU step", e);
    kiln_cuda_profile_collect(b->prof);
    if (logits) *logits = b->h_logits;
    return 0;
}

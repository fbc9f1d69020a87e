/* The fast forward pass: the op order of model.h over a batch of tokens, matmuls on the pool, the small per-token
 * steps (norms, rope, activation) split over tokens on the same pool. The tokens of a step may belong to several
 * sequences: each token carries its position and its sequence's block table, which maps positions to cache rows
 * (one sequence alone has one block covering its whole context). */
#include "cpu/forward.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kv_ops.h"
#include "cpu/matmul.h"
#include "quant/quant.h"

struct kiln_cpu_state {
    const kiln_config *cfg;
    const kiln_weights *w;
    int n_ctx, n_batch, n_kv_rows;
    kiln_pool *pool;
    const kiln_kv_ops *kv;
    size_t kv_elem;           /* bytes of one cached key or value element */
    size_t kv_row_bytes;      /* one position's keys (or values) of one layer */
    char *k_cache, *v_cache;  /* [n_layer][n_kv_rows][kv_dim] */
    float *x, *xb, *q, *k, *v, *att_out, *hb, *hb2; /* [n_batch][width] */
    float *scores;            /* [n_threads][KILN_KV_ROWS][n_ctx] */
    float *rope_cos, *rope_sin; /* [n_batch][rope_dim / 2] */
    float *rope_cos_swa, *rope_sin_swa; /* the same for the sliding-window layers' frequencies */
    void *scratch;            /* quantized matmul inputs */
    /* the step's tokens, laid out by stage() */
    int32_t *tok_id;          /* [n_batch] */
    int *tok_pos;             /* [n_batch] */
    const int32_t **tok_blocks; /* [n_batch] the block table of each token's sequence */
    int *out_rows;            /* [n_batch] the tokens whose logits are wanted */
    /* attention's query groups: up to KILN_KV_ROWS consecutive tokens of one sequence, group g from token
     * grp_first[g] to grp_first[g + 1] */
    int *grp_first;           /* [n_batch + 1] */
    int n_groups;
    int block_size;
    int n_multi;              /* leading tokens that may use the multi-token kernels */
    int64_t attn_work;        /* (token, position) pairs attention visits, per head */
    uint64_t kv_bytes, work_bytes; /* what alloc_buffers took: the KV cache, the rest */
};

/* ---- per-token steps, run over the batch on the pool ---- */

typedef struct token_job {
    kiln_cpu_state *s;
    void (*step)(struct token_job *j, int t);
    int n, layer;
    const float *post_norm; /* step_residual: the block output's own norm, NULL where the architecture has none */
    atomic_int next;
} token_job;

static void token_job_run(void *arg, int ith, int nth) {
    token_job *j = arg;
    (void)ith;
    (void)nth;
    int t;
    while ((t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n) j->step(j, t);
}

static void for_tokens(kiln_cpu_state *s, token_job *j, void (*step)(token_job *j, int t)) {
    j->step = step;
    if (j->n == 1) {
        step(j, 0);
        return;
    }
    atomic_store_explicit(&j->next, 0, memory_order_relaxed);
    kiln_pool_run(s->pool, token_job_run, j);
}

static void rmsnorm(float *out, const float *x, const float *g, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * g[i];
}

static void step_attn_norm(token_job *j, int t) {
    const kiln_config *c = j->s->cfg;
    size_t o = (size_t)t * c->n_embd;
    rmsnorm(j->s->xb + o, j->s->x + o, j->s->w->layers[j->layer].w[KILN_ROLE_ATTN_NORM].data, c->n_embd, c->rms_eps);
}

static void step_ffn_norm(token_job *j, int t) {
    const kiln_config *c = j->s->cfg;
    size_t o = (size_t)t * c->n_embd;
    rmsnorm(j->s->xb + o, j->s->x + o, j->s->w->layers[j->layer].w[KILN_ROLE_FFN_NORM].data, c->n_embd, c->rms_eps);
}

/* x += xb: a block's output into the residual stream, through post_norm first where there is one */
static void step_residual(token_job *j, int t) {
    int n = j->s->cfg->n_embd;
    float *x = j->s->x + (size_t)t * n, *d = j->s->xb + (size_t)t * n;
    if (j->post_norm) rmsnorm(d, d, j->post_norm, n, j->s->cfg->rms_eps);
    for (int i = 0; i < n; i++) x[i] += d[i];
}

/* hb = act(gate) * up */
static void step_glu(token_job *j, int t) {
    int n = j->s->cfg->n_ff;
    float *g = j->s->hb + (size_t)t * n;
    const float *u = j->s->hb2 + (size_t)t * n;
    if (j->s->cfg->arch->act == KILN_ACT_GELU) {
        const float sqrt_2_over_pi = 0.7978845608f;
        for (int i = 0; i < n; i++)
            g[i] = 0.5f * g[i] * (1.0f + tanhf(sqrt_2_over_pi * (g[i] + 0.044715f * g[i] * g[i] * g[i]))) * u[i];
    } else {
        for (int i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

static void add_bias(float *v, const kiln_weight *b, int n) {
    if (!b->data) return;
    const float *bf = b->data;
    for (int i = 0; i < n; i++) v[i] += bf[i];
}

static void rope(float *vec, int n_heads, const kiln_config *c, const float *cs, const float *sn) {
    int half = c->rope_dim / 2;
    bool neox = c->rope_style == KILN_ROPE_NEOX;
    for (int h = 0; h < n_heads; h++) {
        float *hv = vec + h * c->head_dim;
        for (int i = 0; i < half; i++) {
            int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            float x0 = hv[a], x1 = hv[b];
            hv[a] = x0 * cs[i] - x1 * sn[i];
            hv[b] = x0 * sn[i] + x1 * cs[i];
        }
    }
}

static void rmsnorm_heads(float *vec, int n_heads, const kiln_weight *w, const kiln_config *c) {
    for (int h = 0; h < n_heads; h++) {
        float *hv = vec + (size_t)h * c->head_dim;
        rmsnorm(hv, hv, w->data, c->head_dim, c->rms_eps);
    }
}

/* Biases, the heads' norms, rope, and this token's keys/values into the cache. */
static void step_qkv_post(token_job *j, int t) {
    kiln_cpu_state *s = j->s;
    const kiln_config *c = s->cfg;
    const kiln_weight *w = s->w->layers[j->layer].w;
    int q_dim = kiln_config_q_dim(c), kv_dim = kiln_config_kv_dim(c), half = c->rope_dim / 2;
    float *q = s->q + (size_t)t * q_dim, *k = s->k + (size_t)t * kv_dim, *v = s->v + (size_t)t * kv_dim;
    add_bias(q, &w[KILN_ROLE_BQ], q_dim);
    add_bias(k, &w[KILN_ROLE_BK], kv_dim);
    add_bias(v, &w[KILN_ROLE_BV], kv_dim);
    if (c->arch->qk_norm) {
        rmsnorm_heads(q, c->n_head, &w[KILN_ROLE_Q_NORM], c);
        rmsnorm_heads(k, c->n_head_kv, &w[KILN_ROLE_K_NORM], c);
    }
    bool swa = kiln_config_layer_swa(c, j->layer);
    const float *cs = (swa ? s->rope_cos_swa : s->rope_cos) + (size_t)t * half;
    const float *sn = (swa ? s->rope_sin_swa : s->rope_sin) + (size_t)t * half;
    rope(q, c->n_head, c, cs, sn);
    rope(k, c->n_head_kv, c, cs, sn);
    int p = s->tok_pos[t];
    size_t row = (size_t)s->tok_blocks[t][p / s->block_size] * (size_t)s->block_size + (size_t)(p % s->block_size);
    size_t at = ((size_t)j->layer * s->n_kv_rows + row) * s->kv_row_bytes;
    s->kv->store(s->k_cache + at, k, kv_dim);
    s->kv->store(s->v_cache + at, v, kv_dim);
}

/* ---- attention: one (query group, head) pair per item, taken in turn by the threads ---- */

/* (token, head, position) triples below which attention runs on the calling thread alone */
#define ATTN_INLINE_WORK 2048

typedef struct attn_job {
    kiln_cpu_state *s;
    int layer;
    atomic_int next;
} attn_job;

/* Cache row of position p of a sequence with the given block table: each block's rows are contiguous. */
static const char *cache_row(const kiln_cpu_state *s, const char *layer_base, const int32_t *blocks, int p) {
    int bs = s->block_size;
    return layer_base + ((size_t)blocks[p / bs] * (size_t)bs + (size_t)(p % bs)) * s->kv_row_bytes;
}

/* The queries of a group: nq consecutive tokens of one sequence, token g attending to positions first[g]..last[g]
 * (first: 0, or the start of a sliding window). Both ends grow with g, so the queries that see a position form a
 * range [lo, hi), moved along as the positions go up. */
typedef struct query_group {
    int nq, first[KILN_KV_ROWS], last[KILN_KV_ROWS];
    int lo, hi;
} query_group;

static void group_seek(query_group *g, int p) {
    while (g->lo < g->nq && g->last[g->lo] < p) g->lo++;
    while (g->hi < g->nq && g->first[g->hi] <= p) g->hi++;
}

/* Head h of the group of nq tokens from t0, over their sequence's cache block by block: each key row is read once
 * for all the queries that see it (kv dot_rows), each query's output is held in registers over a block's run of
 * value rows (kv mix), and every query gets the bits it would get alone. */
static void attend(kiln_cpu_state *s, int layer, int t0, int nq, int h, float *scores) {
    const kiln_config *c = s->cfg;
    int hd = c->head_dim, kv_group = c->n_head / c->n_head_kv, bs = s->block_size, q_dim = kiln_config_q_dim(c);
    const int32_t *blocks = s->tok_blocks[t0];
    size_t kv_off = (size_t)(h / kv_group) * hd * s->kv_elem; /* the KV head this query head reads */
    const char *kc = s->k_cache + (size_t)layer * s->n_kv_rows * s->kv_row_bytes + kv_off;
    const char *vc = s->v_cache + (size_t)layer * s->n_kv_rows * s->kv_row_bytes + kv_off;
    query_group g = {.nq = nq};
    const float *q[KILN_KV_ROWS];
    float *o[KILN_KV_ROWS], *sc[KILN_KV_ROWS], max[KILN_KV_ROWS], sum[KILN_KV_ROWS], d[KILN_KV_ROWS];
    for (int i = 0; i < nq; i++) {
        q[i] = s->q + (size_t)(t0 + i) * q_dim + h * hd;
        o[i] = s->att_out + (size_t)(t0 + i) * q_dim + h * hd;
        sc[i] = scores + (size_t)i * s->n_ctx;
        g.last[i] = s->tok_pos[t0 + i];
        g.first[i] = kiln_config_layer_first_pos(c, layer, g.last[i]);
        max[i] = -INFINITY;
        sum[i] = 0.0f;
        memset(o[i], 0, sizeof(float) * (size_t)hd);
    }
    int start = g.first[0], end = g.last[nq - 1] + 1;
    for (int p = start; p < end;) {
        const char *k = cache_row(s, kc, blocks, p);
        for (int stop = p - p % bs + bs; p < end && p < stop; p++, k += s->kv_row_bytes) {
            group_seek(&g, p);
            s->kv->dot_rows(q + g.lo, g.hi - g.lo, k, hd, d);
            for (int i = g.lo; i < g.hi; i++) {
                sc[i][p] = d[i - g.lo] * c->attn_scale;
                if (sc[i][p] > max[i]) max[i] = sc[i][p];
            }
        }
    }
    for (int i = 0; i < nq; i++)
        for (int p = g.first[i]; p <= g.last[i]; p++) {
            sc[i][p] = expf(sc[i][p] - max[i]);
            sum[i] += sc[i][p];
        }
    /* the values query by query, a block's run of rows at a time, the output in registers over the run */
    for (int i = 0; i < nq; i++) {
        for (int p = g.first[i]; p <= g.last[i]; p++) sc[i][p] /= sum[i];
        for (int p = g.first[i], stop; p <= g.last[i]; p = stop) {
            stop = p - p % bs + bs; /* the end of p's block, or of the query's positions */
            if (stop > g.last[i] + 1) stop = g.last[i] + 1;
            s->kv->mix(o[i], sc[i] + p, cache_row(s, vc, blocks, p), s->kv_row_bytes, stop - p, hd);
        }
    }
}

static void attn_job_run(void *arg, int ith, int nth) {
    attn_job *j = arg;
    (void)nth;
    kiln_cpu_state *s = j->s;
    int n_head = s->cfg->n_head, items = s->n_groups * n_head, i;
    float *scores = s->scores + (size_t)ith * KILN_KV_ROWS * s->n_ctx;
    while ((i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < items) {
        int grp = i / n_head, t0 = s->grp_first[grp];
        attend(s, j->layer, t0, s->grp_first[grp + 1] - t0, i % n_head, scores);
    }
}

/* ---- matmuls: weights sharing an input and a vec_dot_type go in one call ---- */

static void matmuls(kiln_cpu_state *s, const kiln_weight **ws, float **outs, int n_w, const float *in, int n,
                    int n_multi) {
    bool done[KILN_MATMUL_MAX_WEIGHTS] = {false};
    for (int i = 0; i < n_w; i++) {
        if (done[i]) continue;
        kiln_type vt = kiln_quant_ops_best(ws[i]->type)->vec_dot_type;
        const kiln_weight *group[KILN_MATMUL_MAX_WEIGHTS];
        float *group_out[KILN_MATMUL_MAX_WEIGHTS];
        int n_group = 0;
        for (int k = i; k < n_w; k++) {
            if (done[k] || kiln_quant_ops_best(ws[k]->type)->vec_dot_type != vt) continue;
            group[n_group] = ws[k];
            group_out[n_group++] = outs[k];
            done[k] = true;
        }
        kiln_matmul_split(s->pool, group, group_out, n_group, in, n, n_multi, s->scratch);
    }
}

static void layer(kiln_cpu_state *s, int l, int n) {
    const kiln_weight *w = s->w->layers[l].w;
    int m = s->n_multi;
    token_job tj = {.s = s, .n = n, .layer = l};

    for_tokens(s, &tj, step_attn_norm);
    const kiln_weight *qkv[3] = {&w[KILN_ROLE_WQ], &w[KILN_ROLE_WK], &w[KILN_ROLE_WV]};
    float *qkv_out[3] = {s->q, s->k, s->v};
    matmuls(s, qkv, qkv_out, 3, s->xb, n, m);
    for_tokens(s, &tj, step_qkv_post);

    attn_job aj = {.s = s, .layer = l};
    atomic_init(&aj.next, 0);
    /* a short decode step's attention is less work than waking the workers for it */
    if (s->attn_work * s->cfg->n_head < ATTN_INLINE_WORK) attn_job_run(&aj, 0, 1);
    else kiln_pool_run(s->pool, attn_job_run, &aj);

    const kiln_weight *wo[1] = {&w[KILN_ROLE_WO]};
    float *wo_out[1] = {s->xb};
    matmuls(s, wo, wo_out, 1, s->att_out, n, m);
    tj.post_norm = w[KILN_ROLE_ATTN_POST_NORM].data;
    for_tokens(s, &tj, step_residual);

    for_tokens(s, &tj, step_ffn_norm);
    const kiln_weight *gate_up[2] = {&w[KILN_ROLE_FFN_GATE], &w[KILN_ROLE_FFN_UP]};
    float *gate_up_out[2] = {s->hb, s->hb2};
    matmuls(s, gate_up, gate_up_out, 2, s->xb, n, m);
    for_tokens(s, &tj, step_glu);
    const kiln_weight *down[1] = {&w[KILN_ROLE_FFN_DOWN]};
    float *down_out[1] = {s->xb};
    matmuls(s, down, down_out, 1, s->hb, n, m);
    tj.post_norm = w[KILN_ROLE_FFN_POST_NORM].data;
    for_tokens(s, &tj, step_residual);
}

static void step_output_norm(token_job *j, int t) {
    const kiln_config *c = j->s->cfg;
    size_t o = (size_t)t * c->n_embd;
    rmsnorm(j->s->xb + o, j->s->x + o, j->s->w->output_norm.data, c->n_embd, c->rms_eps);
}

/* Lays out the step's tokens (ids, positions, block tables); returns how many there are. */
static int stage(kiln_cpu_state *s, const kiln_cpu_seq *seqs, int n_seq, int block_size) {
    int n = 0;
    s->block_size = block_size;
    s->n_multi = seqs[0].n;
    s->attn_work = 0;
    s->n_groups = 0;
    for (int i = 0; i < n_seq; i++)
        for (int t = 0; t < seqs[i].n; t++, n++) {
            if (t % KILN_KV_ROWS == 0) s->grp_first[s->n_groups++] = n;
            s->tok_id[n] = seqs[i].tokens[t];
            s->tok_pos[n] = seqs[i].pos + t;
            s->tok_blocks[n] = seqs[i].blocks;
            s->attn_work += s->tok_pos[n] + 1;
        }
    s->grp_first[s->n_groups] = n;
    return n;
}

/* cos and sin of n tokens' angles at frequencies freq, [n][rope_dim / 2] */
static void rope_table(const kiln_cpu_state *s, int n, const float *freq, float *cs, float *sn) {
    int half = s->cfg->rope_dim / 2;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < half; i++) {
            float angle = (float)s->tok_pos[t] * freq[i];
            cs[(size_t)t * half + i] = cosf(angle);
            sn[(size_t)t * half + i] = sinf(angle);
        }
}

/* Embedding rows and rope angles of the staged tokens, then every layer. */
static void run_layers(kiln_cpu_state *s, int n) {
    const kiln_config *c = s->cfg;
    const kiln_weight *e = &s->w->token_embd;
    kiln_dequantize_fn dequantize = kiln_quant_ops_best(e->type)->dequantize;
    float scale = c->arch->embd_scale ? sqrtf((float)c->n_embd) : 1.0f;
    for (int t = 0; t < n; t++) {
        float *x = s->x + (size_t)t * c->n_embd;
        dequantize((const char *)e->data + (size_t)s->tok_id[t] * e->row_bytes, x, c->n_embd);
        if (scale != 1.0f)
            for (int i = 0; i < c->n_embd; i++) x[i] *= scale;
    }
    rope_table(s, n, c->rope_freq, s->rope_cos, s->rope_sin);
    if (c->n_swa > 0) rope_table(s, n, c->rope_freq_swa, s->rope_cos_swa, s->rope_sin_swa);
    for (int l = 0; l < c->n_layer; l++) layer(s, l, n);
}

/* Logits of the n_rows tokens listed in rows (ascending; NULL: the first n_rows) into out; n_multi of them may use
 * the multi-token kernels. */
static void output(kiln_cpu_state *s, const int *rows, int n_rows, float *out, int n_multi) {
    size_t d = (size_t)s->cfg->n_embd;
    for (int k = 0; rows && k < n_rows; k++)
        if (rows[k] != k) memmove(s->x + k * d, s->x + (size_t)rows[k] * d, sizeof(float) * d);
    token_job tj = {.s = s, .n = n_rows};
    for_tokens(s, &tj, step_output_norm);
    const kiln_weight *head[1] = {&s->w->output};
    float *head_out[1] = {out};
    matmuls(s, head, head_out, 1, s->xb, n_rows, n_multi);
}

static int check_tokens(const kiln_cpu_state *s, const int32_t *tokens, int n, kiln_error *err) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= s->cfg->n_vocab)
            return kiln_fail(err, "token id %d is outside the vocabulary (%d)", tokens[i], s->cfg->n_vocab);
    return 0;
}

int kiln_cpu_forward(kiln_cpu_state *s, const int32_t *tokens, int n, int pos, float *logits, bool all_logits,
                     kiln_error *err) {
    static const int32_t one_block[1] = {0}; /* the whole context is one block */
    if (n < 1) return kiln_fail(err, "nothing to evaluate (0 tokens)");
    if (pos < 0 || (int64_t)pos + n > s->n_ctx)
        return kiln_fail(err, "context full: %d tokens at position %d exceed the context of %d tokens (raise --ctx)", n,
                         pos, s->n_ctx);
    if (s->n_kv_rows < s->n_ctx) return kiln_fail(err, "this state's cache is paged: use kiln_cpu_forward_batch");
    if (check_tokens(s, tokens, n, err)) return -1;
    for (int done = 0; done < n;) {
        int chunk = n - done < s->n_batch ? n - done : s->n_batch;
        kiln_cpu_seq seq = {.tokens = tokens + done, .n = chunk, .pos = pos + done, .blocks = one_block};
        run_layers(s, stage(s, &seq, 1, s->n_ctx));
        done += chunk;
        /* a chunk before the last needs no logits unless every token's are wanted */
        if (all_logits) output(s, NULL, chunk, logits + (size_t)(done - chunk) * s->cfg->n_vocab, chunk);
        else if (done == n) output(s, (int[]){chunk - 1}, 1, logits, 0);
    }
    return 0;
}

/* Each sequence's tokens fit its context, and the blocks they reach lie inside the cache. */
static int check_seq(const kiln_cpu_state *s, const kiln_cpu_seq *q, int block_size, kiln_error *err) {
    if (q->n < 1 || !q->tokens || !q->blocks) return kiln_fail(err, "a sequence of the batch has no tokens or blocks");
    if (q->pos < 0 || (int64_t)q->pos + q->n > s->n_ctx)
        return kiln_fail(err, "context full: %d tokens at position %d exceed the context of %d tokens", q->n, q->pos,
                         s->n_ctx);
    for (int b = 0; b <= (q->pos + q->n - 1) / block_size; b++)
        if (q->blocks[b] < 0 || ((int64_t)q->blocks[b] + 1) * block_size > s->n_kv_rows)
            return kiln_fail(err, "KV block %d is outside the cache of %d rows", q->blocks[b], s->n_kv_rows);
    return check_tokens(s, q->tokens, q->n, err);
}

int kiln_cpu_forward_batch(kiln_cpu_state *s, const kiln_cpu_seq *seqs, int n_seq, int block_size, float *logits,
                           kiln_error *err) {
    if (n_seq < 1) return kiln_fail(err, "nothing to evaluate (no sequences)");
    if (block_size < 1) return kiln_fail(err, "KV block size %d is out of range", block_size);
    int64_t total = 0;
    for (int i = 0; i < n_seq; i++) {
        if (check_seq(s, &seqs[i], block_size, err)) return -1;
        total += seqs[i].n;
    }
    if (total > s->n_batch)
        return kiln_fail(err, "a step of %lld tokens exceeds the batch of %d", (long long)total, s->n_batch);
    int n = stage(s, seqs, n_seq, block_size), n_rows = 0;
    run_layers(s, n);
    int end = 0;
    for (int i = 0; i < n_seq; i++) {
        end += seqs[i].n;
        if (seqs[i].logits) s->out_rows[n_rows++] = end - 1;
    }
    if (n_rows) output(s, s->out_rows, n_rows, logits, 0);
    return 0;
}

/* ---- state ---- */

/* Every weight needs CPU kernels: a vec_dot and a quantizer for its vec_dot_type. */
static int check_kernels(const kiln_weight *w, kiln_error *err) {
    if (!w->data || w->ne[1] == 1) return 0;
    const kiln_quant_ops *ops = kiln_quant_ops_best(w->type);
    const kiln_quant_ops *in = ops ? kiln_quant_ops_best(ops->vec_dot_type) : NULL;
    if (!ops || !ops->vec_dot || !ops->dequantize || !in || !in->quantize)
        return kiln_fail(err, "tensor %s: type %s has no CPU kernels", w->name, kiln_type_name(w->type));
    return 0;
}

static size_t scratch_size(const kiln_weights *w, int n_batch) {
    size_t max = kiln_matmul_scratch_size(&w->output, n_batch);
    for (int l = 0; l < w->n_layer; l++)
        for (int r = 0; r < KILN_LAYER_ROLE_COUNT; r++) {
            const kiln_weight *t = &w->layers[l].w[r];
            if (!t->data || t->ne[1] == 1) continue;
            size_t sz = kiln_matmul_scratch_size(t, n_batch);
            if (sz > max) max = sz;
        }
    return max;
}

static int check_all_kernels(const kiln_weights *w, kiln_error *err) {
    if (check_kernels(&w->token_embd, err) || check_kernels(&w->output, err)) return -1;
    for (int l = 0; l < w->n_layer; l++)
        for (int r = 0; r < KILN_LAYER_ROLE_COUNT; r++)
            if (check_kernels(&w->layers[l].w[r], err)) return -1;
    return 0;
}

static int alloc_buffers(kiln_cpu_state *s, kiln_error *err) {
    const kiln_config *c = s->cfg;
    size_t B = (size_t)s->n_batch, q_dim = (size_t)kiln_config_q_dim(c), kv_dim = (size_t)kiln_config_kv_dim(c);
    size_t cache = (size_t)c->n_layer * (size_t)s->n_kv_rows * s->kv_row_bytes;
    size_t rope = sizeof(float) * B * (size_t)(c->rope_dim / 2 + 1);
    struct { void **p; size_t bytes; } bufs[] = {
        {(void **)&s->x, sizeof(float) * B * (size_t)c->n_embd},
        {(void **)&s->xb, sizeof(float) * B * (size_t)c->n_embd},
        {(void **)&s->q, sizeof(float) * B * q_dim},
        {(void **)&s->k, sizeof(float) * B * kv_dim},
        {(void **)&s->v, sizeof(float) * B * kv_dim},
        {(void **)&s->att_out, sizeof(float) * B * q_dim},
        {(void **)&s->hb, sizeof(float) * B * (size_t)c->n_ff},
        {(void **)&s->hb2, sizeof(float) * B * (size_t)c->n_ff},
        {(void **)&s->scores, sizeof(float) * (size_t)kiln_pool_size(s->pool) * KILN_KV_ROWS * (size_t)s->n_ctx},
        {(void **)&s->rope_cos, rope},
        {(void **)&s->rope_sin, rope},
        {(void **)&s->rope_cos_swa, c->n_swa > 0 ? rope : 0},
        {(void **)&s->rope_sin_swa, c->n_swa > 0 ? rope : 0},
        {&s->scratch, scratch_size(s->w, s->n_batch)},
        {(void **)&s->tok_id, sizeof *s->tok_id * B},
        {(void **)&s->tok_pos, sizeof *s->tok_pos * B},
        {(void **)&s->tok_blocks, sizeof *s->tok_blocks * B},
        {(void **)&s->out_rows, sizeof *s->out_rows * B},
        {(void **)&s->grp_first, sizeof *s->grp_first * (B + 1)},
    };
    s->k_cache = malloc(cache);
    s->v_cache = malloc(cache);
    bool ok = s->k_cache && s->v_cache;
    s->kv_bytes = 2 * (uint64_t)cache;
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i].p = malloc(bufs[i].bytes ? bufs[i].bytes : 1);
        ok = ok && *bufs[i].p;
        s->work_bytes += bufs[i].bytes;
    }
    if (!ok)
        return kiln_fail(err, "out of memory for a KV cache of %d positions (%.1f MiB)", s->n_kv_rows,
                         2.0 * (double)cache / 1048576.0);
    return 0;
}

int kiln_cpu_new(const kiln_config *cfg, const kiln_weights *w, const kiln_cpu_params *params, kiln_cpu_state **out,
                 kiln_error *err) {
    *out = NULL;
    if (params->n_ctx < 1 || params->n_ctx > (1 << 24))
        return kiln_fail(err, "context size %d is out of range (1..%d)", params->n_ctx, 1 << 24);
    if (params->n_kv_rows < 0 || params->n_kv_rows > (1 << 26))
        return kiln_fail(err, "KV cache of %d positions is out of range", params->n_kv_rows);
    if (params->n_batch < 1 || params->n_batch > 65536)
        return kiln_fail(err, "batch size %d is out of range (1..65536)", params->n_batch);
    const kiln_kv_ops *kv = kiln_kv_ops_get(params->kv_type, kiln_cpu_isa());
    if (!kv) return kiln_fail(err, "KV-cache type %s is not supported (f16, f32)", kiln_type_name(params->kv_type));
    if (check_all_kernels(w, err)) return -1;

    kiln_cpu_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_fail(err, "out of memory");
    s->cfg = cfg;
    s->w = w;
    s->n_ctx = params->n_ctx;
    s->n_batch = params->n_batch;
    s->n_kv_rows = params->n_kv_rows > 0 ? params->n_kv_rows : params->n_ctx;
    s->kv = kv;
    s->kv_elem = kiln_row_size(params->kv_type, 1);
    s->kv_row_bytes = s->kv_elem * (size_t)kiln_config_kv_dim(cfg);
    int n_threads = params->n_threads > 0 ? params->n_threads : kiln_physical_cores();
    if (kiln_pool_new(n_threads, &s->pool, err) || alloc_buffers(s, err)) {
        kiln_cpu_free(s);
        return -1;
    }
    *out = s;
    return 0;
}

void kiln_cpu_free(kiln_cpu_state *s) {
    if (!s) return;
    kiln_pool_free(s->pool);
    void *bufs[] = {s->k_cache, s->v_cache, s->x, s->xb, s->q, s->k, s->v, s->att_out, s->hb, s->hb2, s->scores,
                    s->rope_cos, s->rope_sin, s->rope_cos_swa, s->rope_sin_swa, s->scratch, s->tok_id, s->tok_pos,
                    (void *)s->tok_blocks, s->out_rows, s->grp_first};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(s);
}

int kiln_cpu_n_threads(const kiln_cpu_state *s) { return kiln_pool_size(s->pool); }

void kiln_cpu_memory(const kiln_cpu_state *s, uint64_t *kv_cache, uint64_t *workspace) {
    *kv_cache = s->kv_bytes;
    *workspace = s->work_bytes;
}

/* The fast forward pass: the op order of model.h over a batch of tokens, matmuls on the pool, the small per-token
 * steps (norms, rope, activation) split over tokens on the same pool. */
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
    int n_ctx, n_batch;
    kiln_pool *pool;
    const kiln_kv_ops *kv;
    size_t kv_elem;           /* bytes of one cached key or value element */
    size_t kv_row_bytes;      /* one position's keys (or values) of one layer */
    char *k_cache, *v_cache;  /* [n_layer][n_ctx][kv_dim] */
    float *x, *xb, *q, *k, *v, *att_out, *hb, *hb2; /* [n_batch][width] */
    float *scores;            /* [n_threads][n_ctx] */
    float *rope_cos, *rope_sin; /* [n_batch][rope_dim / 2] */
    void *scratch;            /* quantized matmul inputs */
};

/* ---- per-token steps, run over the batch on the pool ---- */

typedef struct token_job {
    kiln_cpu_state *s;
    void (*step)(struct token_job *j, int t);
    int n, layer, pos;
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

static void step_residual(token_job *j, int t) {
    int n = j->s->cfg->n_embd;
    float *x = j->s->x + (size_t)t * n;
    const float *d = j->s->xb + (size_t)t * n;
    for (int i = 0; i < n; i++) x[i] += d[i];
}

static void step_swiglu(token_job *j, int t) {
    int n = j->s->cfg->n_ff;
    float *g = j->s->hb + (size_t)t * n;
    const float *u = j->s->hb2 + (size_t)t * n;
    for (int i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
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

/* Biases, rope, and this token's keys/values into the cache. */
static void step_qkv_post(token_job *j, int t) {
    kiln_cpu_state *s = j->s;
    const kiln_config *c = s->cfg;
    const kiln_weight *w = s->w->layers[j->layer].w;
    int q_dim = kiln_config_q_dim(c), kv_dim = kiln_config_kv_dim(c), half = c->rope_dim / 2;
    float *q = s->q + (size_t)t * q_dim, *k = s->k + (size_t)t * kv_dim, *v = s->v + (size_t)t * kv_dim;
    add_bias(q, &w[KILN_ROLE_BQ], q_dim);
    add_bias(k, &w[KILN_ROLE_BK], kv_dim);
    add_bias(v, &w[KILN_ROLE_BV], kv_dim);
    const float *cs = s->rope_cos + (size_t)t * half, *sn = s->rope_sin + (size_t)t * half;
    rope(q, c->n_head, c, cs, sn);
    rope(k, c->n_head_kv, c, cs, sn);
    size_t at = ((size_t)j->layer * s->n_ctx + (size_t)(j->pos + t)) * s->kv_row_bytes;
    s->kv->store(s->k_cache + at, k, kv_dim);
    s->kv->store(s->v_cache + at, v, kv_dim);
}

/* ---- attention: one (token, head) pair per item, taken in turn by the threads ---- */

/* (token, head, position) triples below which attention runs on the calling thread alone */
#define ATTN_INLINE_WORK 2048

typedef struct attn_job {
    kiln_cpu_state *s;
    int n, layer, pos;
    atomic_int next;
} attn_job;

static void attend(kiln_cpu_state *s, int layer, int t, int h, int n_pos, float *scores) {
    const kiln_config *c = s->cfg;
    int hd = c->head_dim, group = c->n_head / c->n_head_kv;
    const float *q = s->q + (size_t)t * kiln_config_q_dim(c) + h * hd;
    size_t kv_off = (size_t)(h / group) * hd * s->kv_elem; /* the KV head this query head reads */
    const char *kc = s->k_cache + (size_t)layer * s->n_ctx * s->kv_row_bytes + kv_off;
    const char *vc = s->v_cache + (size_t)layer * s->n_ctx * s->kv_row_bytes + kv_off;
    float scale = 1.0f / sqrtf((float)hd), max = -INFINITY;
    for (int p = 0; p < n_pos; p++) {
        scores[p] = s->kv->dot(q, kc + (size_t)p * s->kv_row_bytes, hd) * scale;
        if (scores[p] > max) max = scores[p];
    }
    float sum = 0.0f;
    for (int p = 0; p < n_pos; p++) {
        scores[p] = expf(scores[p] - max);
        sum += scores[p];
    }
    float *o = s->att_out + (size_t)t * kiln_config_q_dim(c) + h * hd;
    memset(o, 0, sizeof(float) * (size_t)hd);
    for (int p = 0; p < n_pos; p++) s->kv->axpy(o, scores[p] / sum, vc + (size_t)p * s->kv_row_bytes, hd);
}

static void attn_job_run(void *arg, int ith, int nth) {
    attn_job *j = arg;
    (void)nth;
    kiln_cpu_state *s = j->s;
    int n_head = s->cfg->n_head, items = j->n * n_head, i;
    float *scores = s->scores + (size_t)ith * s->n_ctx;
    while ((i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < items) {
        int t = i / n_head;
        attend(s, j->layer, t, i % n_head, j->pos + t + 1, scores);
    }
}

/* ---- matmuls: weights sharing an input and a vec_dot_type go in one call ---- */

static void matmuls(kiln_cpu_state *s, const kiln_weight **ws, float **outs, int n_w, const float *in, int n) {
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
        kiln_matmul(s->pool, group, group_out, n_group, in, n, s->scratch);
    }
}

static void layer(kiln_cpu_state *s, int l, int n, int pos) {
    const kiln_weight *w = s->w->layers[l].w;
    token_job tj = {.s = s, .n = n, .layer = l, .pos = pos};

    for_tokens(s, &tj, step_attn_norm);
    const kiln_weight *qkv[3] = {&w[KILN_ROLE_WQ], &w[KILN_ROLE_WK], &w[KILN_ROLE_WV]};
    float *qkv_out[3] = {s->q, s->k, s->v};
    matmuls(s, qkv, qkv_out, 3, s->xb, n);
    for_tokens(s, &tj, step_qkv_post);

    attn_job aj = {.s = s, .n = n, .layer = l, .pos = pos};
    atomic_init(&aj.next, 0);
    /* a short decode step's attention is less work than waking the workers for it */
    if ((int64_t)n * s->cfg->n_head * (pos + n) < ATTN_INLINE_WORK) attn_job_run(&aj, 0, 1);
    else kiln_pool_run(s->pool, attn_job_run, &aj);

    const kiln_weight *wo[1] = {&w[KILN_ROLE_WO]};
    float *wo_out[1] = {s->xb};
    matmuls(s, wo, wo_out, 1, s->att_out, n);
    for_tokens(s, &tj, step_residual);

    for_tokens(s, &tj, step_ffn_norm);
    const kiln_weight *gate_up[2] = {&w[KILN_ROLE_FFN_GATE], &w[KILN_ROLE_FFN_UP]};
    float *gate_up_out[2] = {s->hb, s->hb2};
    matmuls(s, gate_up, gate_up_out, 2, s->xb, n);
    for_tokens(s, &tj, step_swiglu);
    const kiln_weight *down[1] = {&w[KILN_ROLE_FFN_DOWN]};
    float *down_out[1] = {s->xb};
    matmuls(s, down, down_out, 1, s->hb, n);
    for_tokens(s, &tj, step_residual);
}

static void step_output_norm(token_job *j, int t) {
    const kiln_config *c = j->s->cfg;
    size_t o = (size_t)t * c->n_embd;
    rmsnorm(j->s->xb + o, j->s->x + o, j->s->w->output_norm.data, c->n_embd, c->rms_eps);
}

/* Embedding rows and the rope angles of positions pos..pos+n-1. */
static void embed(kiln_cpu_state *s, const int32_t *tokens, int n, int pos) {
    const kiln_config *c = s->cfg;
    const kiln_weight *e = &s->w->token_embd;
    kiln_dequantize_fn dequantize = kiln_quant_ops_best(e->type)->dequantize;
    int half = c->rope_dim / 2;
    for (int t = 0; t < n; t++) {
        dequantize((const char *)e->data + (size_t)tokens[t] * e->row_bytes, s->x + (size_t)t * c->n_embd, c->n_embd);
        for (int i = 0; i < half; i++) {
            float angle = (float)(pos + t) * c->rope_freq[i];
            s->rope_cos[(size_t)t * half + i] = cosf(angle);
            s->rope_sin[(size_t)t * half + i] = sinf(angle);
        }
    }
}

/* One chunk of at most n_batch tokens; logits of the last (or every) token go to out. */
static void forward_chunk(kiln_cpu_state *s, const int32_t *tokens, int n, int pos, float *out, bool all_logits) {
    const kiln_config *c = s->cfg;
    embed(s, tokens, n, pos);
    for (int l = 0; l < c->n_layer; l++) layer(s, l, n, pos);

    int first = all_logits ? 0 : n - 1;
    token_job tj = {.s = s, .n = n - first};
    if (first > 0) memmove(s->x, s->x + (size_t)first * c->n_embd, sizeof(float) * (size_t)c->n_embd);
    for_tokens(s, &tj, step_output_norm);
    const kiln_weight *head[1] = {&s->w->output};
    float *head_out[1] = {out};
    matmuls(s, head, head_out, 1, s->xb, n - first);
}

int kiln_cpu_forward(kiln_cpu_state *s, const int32_t *tokens, int n, int pos, float *logits, bool all_logits,
                     kiln_error *err) {
    const kiln_config *c = s->cfg;
    if (n < 1) return kiln_fail(err, "nothing to evaluate (0 tokens)");
    if (pos < 0 || (int64_t)pos + n > s->n_ctx)
        return kiln_fail(err, "context full: %d tokens at position %d exceed the context of %d tokens (raise --ctx)", n,
                         pos, s->n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->n_vocab)
            return kiln_fail(err, "token id %d is outside the vocabulary (%d)", tokens[i], c->n_vocab);
    for (int done = 0; done < n;) {
        int chunk = n - done < s->n_batch ? n - done : s->n_batch;
        bool last = done + chunk == n;
        float *out = all_logits ? logits + (size_t)done * c->n_vocab : logits;
        /* a chunk before the last needs no logits unless every token's are wanted */
        if (all_logits || last) forward_chunk(s, tokens + done, chunk, pos + done, out, all_logits);
        else {
            embed(s, tokens + done, chunk, pos + done);
            for (int l = 0; l < c->n_layer; l++) layer(s, l, chunk, pos + done);
        }
        done += chunk;
    }
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
    size_t cache = (size_t)c->n_layer * (size_t)s->n_ctx * s->kv_row_bytes;
    s->k_cache = malloc(cache);
    s->v_cache = malloc(cache);
    s->x = malloc(sizeof(float) * B * (size_t)c->n_embd);
    s->xb = malloc(sizeof(float) * B * (size_t)c->n_embd);
    s->q = malloc(sizeof(float) * B * q_dim);
    s->k = malloc(sizeof(float) * B * kv_dim);
    s->v = malloc(sizeof(float) * B * kv_dim);
    s->att_out = malloc(sizeof(float) * B * q_dim);
    s->hb = malloc(sizeof(float) * B * (size_t)c->n_ff);
    s->hb2 = malloc(sizeof(float) * B * (size_t)c->n_ff);
    s->scores = malloc(sizeof(float) * (size_t)kiln_pool_size(s->pool) * (size_t)s->n_ctx);
    s->rope_cos = malloc(sizeof(float) * B * (size_t)(c->rope_dim / 2 + 1));
    s->rope_sin = malloc(sizeof(float) * B * (size_t)(c->rope_dim / 2 + 1));
    s->scratch = malloc(scratch_size(s->w, s->n_batch));
    if (!s->k_cache || !s->v_cache || !s->x || !s->xb || !s->q || !s->k || !s->v || !s->att_out || !s->hb ||
        !s->hb2 || !s->scores || !s->rope_cos || !s->rope_sin || !s->scratch)
        return kiln_fail(err, "out of memory for a context of %d tokens (KV cache %.1f MiB)", s->n_ctx,
                         2.0 * (double)cache / 1048576.0);
    return 0;
}

int kiln_cpu_new(const kiln_config *cfg, const kiln_weights *w, const kiln_cpu_params *params, kiln_cpu_state **out,
                 kiln_error *err) {
    *out = NULL;
    if (params->n_ctx < 1 || params->n_ctx > (1 << 24))
        return kiln_fail(err, "context size %d is out of range (1..%d)", params->n_ctx, 1 << 24);
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
                    s->rope_cos, s->rope_sin, s->scratch};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(s);
}

int kiln_cpu_n_threads(const kiln_cpu_state *s) { return kiln_pool_size(s->pool); }

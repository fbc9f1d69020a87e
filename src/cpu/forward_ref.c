/* The reference forward pass, in the spirit of llama2.c's run.c: every step written out as plain loops. */
#include "cpu/forward_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"

static int max3(int a, int b, int c) {
    int m = a > b ? a : b;
    return m > c ? m : c;
}

int kiln_ref_init(kiln_ref_state *s, const kiln_config *cfg, const kiln_weights *w, int n_ctx, kiln_error *err) {
    memset(s, 0, sizeof *s);
    s->cfg = cfg;
    s->w = w;
    s->n_ctx = n_ctx;
    size_t q_dim = (size_t)kiln_config_q_dim(cfg), kv_dim = (size_t)kiln_config_kv_dim(cfg);
    size_t cache = (size_t)cfg->n_layer * (size_t)n_ctx * kv_dim;
    struct { float **p; size_t n; } bufs[] = {
        {&s->x, (size_t)cfg->n_embd}, {&s->xb, (size_t)cfg->n_embd}, {&s->q, q_dim}, {&s->k, kv_dim},
        {&s->v, kv_dim}, {&s->att_out, q_dim}, {&s->att, (size_t)n_ctx}, {&s->hb, (size_t)cfg->n_ff},
        {&s->hb2, (size_t)cfg->n_ff}, {&s->row, (size_t)max3(cfg->n_embd, (int)q_dim, cfg->n_ff)},
        {&s->key_cache, cache}, {&s->value_cache, cache},
    };
    bool ok = true;
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i].p = calloc(bufs[i].n, sizeof(float));
        ok = ok && *bufs[i].p;
        if (bufs[i].p == &s->key_cache || bufs[i].p == &s->value_cache) s->kv_bytes += sizeof(float) * bufs[i].n;
        else s->work_bytes += sizeof(float) * bufs[i].n;
    }
    if (!ok) {
        kiln_ref_free(s);
        return kiln_fail(err, "out of memory for the reference state (context %d)", n_ctx);
    }
    return 0;
}

void kiln_ref_free(kiln_ref_state *s) {
    float *bufs[] = {s->x, s->xb, s->q, s->k, s->v, s->att_out, s->att, s->hb, s->hb2, s->row, s->key_cache,
                     s->value_cache};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    memset(s, 0, sizeof *s);
}

void kiln_ref_memory(const kiln_ref_state *s, uint64_t *kv_cache, uint64_t *workspace) {
    *kv_cache = s->kv_bytes;
    *workspace = s->work_bytes;
}

/* Row r of a weight as F32. */
static void weight_row(const kiln_weight *w, int64_t r, float *out) {
    const kiln_quant_ops *ops = kiln_quant_ops_get(w->type, KILN_ISA_SCALAR);
    ops->dequantize((const char *)w->data + (size_t)r * w->row_bytes, out, w->ne[0]);
}

/* out[r] = dot(row r of w, in), plus bias[r] when a bias is given. */
static void matvec(const kiln_weight *w, const kiln_weight *bias, const float *in, float *out, float *row) {
    for (int64_t r = 0; r < w->ne[1]; r++) {
        weight_row(w, r, row);
        float sum = 0.0f;
        for (int64_t i = 0; i < w->ne[0]; i++) sum += row[i] * in[i];
        out[r] = sum + (bias && bias->data ? ((const float *)bias->data)[r] : 0.0f);
    }
}

static void rmsnorm(float *out, const float *x, const kiln_weight *weight, int n, float eps) {
    const float *g = weight->data;
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * g[i];
}

/* Each head of vec normalized on its own, in place. */
static void rmsnorm_heads(float *vec, int n_heads, const kiln_weight *weight, const kiln_config *c) {
    for (int h = 0; h < n_heads; h++) {
        float *hv = vec + h * c->head_dim;
        rmsnorm(hv, hv, weight, c->head_dim, c->rms_eps);
    }
}

/* Rotates each head's first rope_dim dims by pos * freq[i]; NORMAL pairs (2i, 2i+1), NEOX pairs (i, i + rope_dim/2). */
static void rope(float *vec, int n_heads, const kiln_config *c, const float *freq, int pos) {
    int half = c->rope_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *hv = vec + h * c->head_dim;
        for (int i = 0; i < half; i++) {
            float angle = (float)pos * freq[i];
            float cs = cosf(angle), sn = sinf(angle);
            int a = c->rope_style == KILN_ROPE_NEOX ? i : 2 * i;
            int b = c->rope_style == KILN_ROPE_NEOX ? i + half : 2 * i + 1;
            float x0 = hv[a], x1 = hv[b];
            hv[a] = x0 * cs - x1 * sn;
            hv[b] = x0 * sn + x1 * cs;
        }
    }
}

static void softmax(float *x, int n) {
    float max = x[0];
    for (int i = 1; i < n; i++) max = x[i] > max ? x[i] : max;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] /= sum;
}

/* Grouped-query attention of this position's queries over the cached keys/values of layer l: positions 0..pos, or
 * the last n_swa of them in a sliding-window layer. */
static void attention(kiln_ref_state *s, int l, int pos) {
    const kiln_config *c = s->cfg;
    int kv_dim = kiln_config_kv_dim(c), group = c->n_head / c->n_head_kv;
    int first = kiln_config_layer_first_pos(c, l, pos);
    const float *kc = s->key_cache + (size_t)l * s->n_ctx * kv_dim;
    const float *vc = s->value_cache + (size_t)l * s->n_ctx * kv_dim;
    for (int h = 0; h < c->n_head; h++) {
        const float *q = s->q + h * c->head_dim;
        int kv_off = (h / group) * c->head_dim;
        for (int t = first; t <= pos; t++) {
            const float *k = kc + (size_t)t * kv_dim + kv_off;
            float score = 0.0f;
            for (int i = 0; i < c->head_dim; i++) score += q[i] * k[i];
            s->att[t] = score * c->attn_scale;
        }
        softmax(s->att + first, pos + 1 - first);
        float *o = s->att_out + h * c->head_dim;
        memset(o, 0, sizeof(float) * (size_t)c->head_dim);
        for (int t = first; t <= pos; t++) {
            const float *v = vc + (size_t)t * kv_dim + kv_off;
            for (int i = 0; i < c->head_dim; i++) o[i] += s->att[t] * v[i];
        }
    }
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

static float gelu(float x) {
    const float sqrt_2_over_pi = 0.7978845608f;
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * (x + 0.044715f * x * x * x)));
}

/* A block's output (attention or feed-forward) into the residual stream, through its own norm where the
 * architecture has one. */
static void add_block(kiln_ref_state *s, const kiln_weight *post_norm, float *out) {
    const kiln_config *c = s->cfg;
    if (c->arch->post_norms) rmsnorm(out, out, post_norm, c->n_embd, c->rms_eps);
    for (int i = 0; i < c->n_embd; i++) s->x[i] += out[i];
}

static void layer(kiln_ref_state *s, int l, int pos) {
    const kiln_config *c = s->cfg;
    const kiln_weight *w = s->w->layers[l].w;
    int kv_dim = kiln_config_kv_dim(c);

    rmsnorm(s->xb, s->x, &w[KILN_ROLE_ATTN_NORM], c->n_embd, c->rms_eps);
    matvec(&w[KILN_ROLE_WQ], &w[KILN_ROLE_BQ], s->xb, s->q, s->row);
    matvec(&w[KILN_ROLE_WK], &w[KILN_ROLE_BK], s->xb, s->k, s->row);
    matvec(&w[KILN_ROLE_WV], &w[KILN_ROLE_BV], s->xb, s->v, s->row);
    if (c->arch->qk_norm) {
        rmsnorm_heads(s->q, c->n_head, &w[KILN_ROLE_Q_NORM], c);
        rmsnorm_heads(s->k, c->n_head_kv, &w[KILN_ROLE_K_NORM], c);
    }
    rope(s->q, c->n_head, c, kiln_config_layer_rope(c, l), pos);
    rope(s->k, c->n_head_kv, c, kiln_config_layer_rope(c, l), pos);
    size_t at = ((size_t)l * s->n_ctx + (size_t)pos) * kv_dim;
    memcpy(s->key_cache + at, s->k, sizeof(float) * (size_t)kv_dim);
    memcpy(s->value_cache + at, s->v, sizeof(float) * (size_t)kv_dim);

    attention(s, l, pos);
    matvec(&w[KILN_ROLE_WO], NULL, s->att_out, s->xb, s->row);
    add_block(s, &w[KILN_ROLE_ATTN_POST_NORM], s->xb);

    rmsnorm(s->xb, s->x, &w[KILN_ROLE_FFN_NORM], c->n_embd, c->rms_eps);
    matvec(&w[KILN_ROLE_FFN_GATE], NULL, s->xb, s->hb, s->row);
    matvec(&w[KILN_ROLE_FFN_UP], NULL, s->xb, s->hb2, s->row);
    float (*act)(float) = c->arch->act == KILN_ACT_GELU ? gelu : silu;
    for (int i = 0; i < c->n_ff; i++) s->hb[i] = act(s->hb[i]) * s->hb2[i];
    matvec(&w[KILN_ROLE_FFN_DOWN], NULL, s->hb, s->xb, s->row);
    add_block(s, &w[KILN_ROLE_FFN_POST_NORM], s->xb);
}

int kiln_ref_forward(kiln_ref_state *s, int32_t token, int pos, float *logits, kiln_error *err) {
    const kiln_config *c = s->cfg;
    if (token < 0 || token >= c->n_vocab) return kiln_fail(err, "token id %d is outside the vocabulary (%d)", token,
                                                           c->n_vocab);
    if (pos < 0 || pos >= s->n_ctx) return kiln_fail(err, "position %d is outside the context (%d)", pos, s->n_ctx);
    weight_row(&s->w->token_embd, token, s->x);
    if (c->arch->embd_scale)
        for (int i = 0; i < c->n_embd; i++) s->x[i] *= sqrtf((float)c->n_embd);
    for (int l = 0; l < c->n_layer; l++) layer(s, l, pos);
    rmsnorm(s->xb, s->x, &s->w->output_norm, c->n_embd, c->rms_eps);
    matvec(&s->w->output, NULL, s->xb, logits, s->row);
    return 0;
}

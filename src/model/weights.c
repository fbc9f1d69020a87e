/* Tensor roles → tensors in the mapping, with their shapes checked against the config. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

typedef enum dim_kind { DIM_ONE, DIM_EMBD, DIM_Q, DIM_KV, DIM_FF, DIM_HEAD } dim_kind;

/* Which architectures have a role: all, or those with the table flag it names. */
typedef enum role_need { NEED_ALWAYS, NEED_QKV_BIAS, NEED_QK_NORM, NEED_POST_NORMS } role_need;

/* How each layer role is named in GGUF and what shape it has: ne = {in, out}. */
typedef struct role_spec {
    const char *suffix;
    dim_kind in, out;
    role_need need;
} role_spec;

static const role_spec ROLES[KILN_LAYER_ROLE_COUNT] = {
    [KILN_ROLE_ATTN_NORM] = {"attn_norm.weight", DIM_EMBD, DIM_ONE, NEED_ALWAYS},
    [KILN_ROLE_WQ] = {"attn_q.weight", DIM_EMBD, DIM_Q, NEED_ALWAYS},
    [KILN_ROLE_WK] = {"attn_k.weight", DIM_EMBD, DIM_KV, NEED_ALWAYS},
    [KILN_ROLE_WV] = {"attn_v.weight", DIM_EMBD, DIM_KV, NEED_ALWAYS},
    [KILN_ROLE_BQ] = {"attn_q.bias", DIM_Q, DIM_ONE, NEED_QKV_BIAS},
    [KILN_ROLE_BK] = {"attn_k.bias", DIM_KV, DIM_ONE, NEED_QKV_BIAS},
    [KILN_ROLE_BV] = {"attn_v.bias", DIM_KV, DIM_ONE, NEED_QKV_BIAS},
    [KILN_ROLE_Q_NORM] = {"attn_q_norm.weight", DIM_HEAD, DIM_ONE, NEED_QK_NORM},
    [KILN_ROLE_K_NORM] = {"attn_k_norm.weight", DIM_HEAD, DIM_ONE, NEED_QK_NORM},
    [KILN_ROLE_WO] = {"attn_output.weight", DIM_Q, DIM_EMBD, NEED_ALWAYS},
    [KILN_ROLE_ATTN_POST_NORM] = {"post_attention_norm.weight", DIM_EMBD, DIM_ONE, NEED_POST_NORMS},
    [KILN_ROLE_FFN_NORM] = {"ffn_norm.weight", DIM_EMBD, DIM_ONE, NEED_ALWAYS},
    [KILN_ROLE_FFN_GATE] = {"ffn_gate.weight", DIM_EMBD, DIM_FF, NEED_ALWAYS},
    [KILN_ROLE_FFN_UP] = {"ffn_up.weight", DIM_EMBD, DIM_FF, NEED_ALWAYS},
    [KILN_ROLE_FFN_DOWN] = {"ffn_down.weight", DIM_FF, DIM_EMBD, NEED_ALWAYS},
    [KILN_ROLE_FFN_POST_NORM] = {"post_ffw_norm.weight", DIM_EMBD, DIM_ONE, NEED_POST_NORMS},
};

static bool arch_has(const kiln_arch *a, role_need need) {
    switch (need) {
    case NEED_ALWAYS: return true;
    case NEED_QKV_BIAS: return a->qkv_bias;
    case NEED_QK_NORM: return a->qk_norm;
    case NEED_POST_NORMS: return a->post_norms;
    }
    return false;
}

static int64_t dim_size(const kiln_config *c, dim_kind k) {
    switch (k) {
    case DIM_ONE: return 1;
    case DIM_EMBD: return c->n_embd;
    case DIM_Q: return kiln_config_q_dim(c);
    case DIM_KV: return kiln_config_kv_dim(c);
    case DIM_FF: return c->n_ff;
    case DIM_HEAD: return c->head_dim;
    }
    return 0;
}

/* Binds one tensor: shape must be {in, out}; vectors (out == 1) must be F32, matrices of a type kiln can decode. */
static int bind(const kiln_gguf *g, const char *name, int64_t in, int64_t out, kiln_weight *w, kiln_error *err) {
    const kiln_gguf_tensor *t = kiln_gguf_find_tensor(g, name);
    if (!t) return kiln_fail(err, "missing tensor %s", name);
    int64_t rows = t->n_dims >= 2 ? t->ne[1] : 1;
    if (t->ne[0] != in || rows != out || t->ne[2] != 1 || t->ne[3] != 1)
        return kiln_fail(err, "tensor %s: shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]", name,
                         (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                         (long long)in, (long long)out);
    const kiln_type_traits *tr = kiln_type_get(t->type);
    if (out == 1 && t->type != KILN_TYPE_F32)
        return kiln_fail(err, "tensor %s: type %s, expected f32 for a vector", name, kiln_type_name(t->type));
    if (!tr || !tr->supported)
        return kiln_fail(err, "tensor %s: type %s is not supported", name, kiln_type_name(t->type));
    if (in % tr->block_size)
        return kiln_fail(err, "tensor %s: row length %lld is not a multiple of the %s block size %d", name,
                         (long long)in, tr->name, tr->block_size);
    w->data = t->data;
    w->type = t->type;
    w->ne[0] = in;
    w->ne[1] = out;
    w->row_bytes = kiln_row_size(t->type, in);
    w->name = t->name.ptr;
    return 0;
}

static int bind_layer(const kiln_gguf *g, const kiln_config *cfg, int l, kiln_layer_weights *lw, kiln_error *err) {
    char name[96];
    for (int r = 0; r < KILN_LAYER_ROLE_COUNT; r++) {
        const role_spec *s = &ROLES[r];
        if (!arch_has(cfg->arch, s->need)) continue;
        snprintf(name, sizeof name, "blk.%d.%s", l, s->suffix);
        if (bind(g, name, dim_size(cfg, s->in), dim_size(cfg, s->out), &lw->w[r], err)) return -1;
    }
    return 0;
}

int kiln_weights_load(const kiln_gguf *g, const kiln_config *cfg, kiln_weights *w, kiln_error *err) {
    memset(w, 0, sizeof *w);
    if (bind(g, "token_embd.weight", cfg->n_embd, cfg->n_vocab, &w->token_embd, err) ||
        bind(g, "output_norm.weight", cfg->n_embd, 1, &w->output_norm, err))
        return -1;
    if (kiln_gguf_find_tensor(g, "output.weight") || !cfg->arch->output_may_be_tied) {
        if (bind(g, "output.weight", cfg->n_embd, cfg->n_vocab, &w->output, err)) return -1;
    } else {
        w->output = w->token_embd;
        w->tied = true;
    }
    w->layers = calloc((size_t)cfg->n_layer, sizeof *w->layers);
    if (!w->layers) return kiln_fail(err, "out of memory for %d layers", cfg->n_layer);
    w->n_layer = cfg->n_layer;
    for (int l = 0; l < cfg->n_layer; l++) {
        if (bind_layer(g, cfg, l, &w->layers[l], err)) {
            kiln_weights_free(w);
            return -1;
        }
    }
    return 0;
}

void kiln_weights_free(kiln_weights *w) {
    free(w->layers);
    w->layers = NULL;
    w->n_layer = 0;
}

static uint64_t weight_bytes(const kiln_weight *w) { return w->data ? (uint64_t)w->row_bytes * (uint64_t)w->ne[1] : 0; }

static uint64_t layer_bytes(const kiln_weights *w) {
    uint64_t n = 0;
    for (int l = 0; l < w->n_layer; l++)
        for (int r = 0; r < KILN_LAYER_ROLE_COUNT; r++) n += weight_bytes(&w->layers[l].w[r]);
    return n;
}

uint64_t kiln_weights_bytes_per_token(const kiln_weights *w) {
    return layer_bytes(w) + weight_bytes(&w->output_norm) + weight_bytes(&w->output) + w->token_embd.row_bytes;
}

uint64_t kiln_weights_bytes(const kiln_weights *w) {
    uint64_t head = w->tied ? 0 : weight_bytes(&w->output);
    return layer_bytes(w) + weight_bytes(&w->output_norm) + head + weight_bytes(&w->token_embd);
}

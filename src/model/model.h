/* The model description as data. An architecture is a row of a table (which tensors a layer has, rope style, QKV
 * bias, whether the output head may be tied to the embedding, ...); kiln_config holds the hyperparameters read from
 * the GGUF keys "<arch>.*"; kiln_weights points every tensor role at its bytes inside the file mapping, in the file's
 * own types, with shapes checked against the config.
 *
 * Every executor (cpu/, cuda/) runs the same llama-family op order from this description, one token at position pos;
 * the steps marked [flag] run only for architectures whose table row sets that flag (Gemma 3 sets them all):
 *
 *   x = token_embd[token]                                        (row dequantized to F32)
 *   [embd_scale] x *= sqrt(n_embd)
 *   for each layer l:
 *       h = rmsnorm(x) * attn_norm
 *       q = Wq h (+ bq)   k = Wk h (+ bk)   v = Wv h (+ bv)        q: n_head heads, k/v: n_head_kv heads of head_dim
 *       [qk_norm] each head of q = rmsnorm(head) * attn_q_norm, of k = rmsnorm(head) * attn_k_norm
 *       rope(q, k, pos)                                          first rope_dim dims of each head, see kiln_rope_style;
 *                                                                a sliding-window layer takes rope_freq_swa
 *       store k, v in the KV cache at pos
 *       per head hd: a = softmax(q_hd . K_kvh * attn_scale) over positions 0..pos (a sliding-window layer: the last
 *                    n_swa of them);  o_hd = a V_kvh  (kvh = hd / (n_head / n_head_kv): grouped-query attention)
 *       o = Wo o   [post_norms] o = rmsnorm(o) * attn_post_norm
 *       x += o
 *       h = rmsnorm(x) * ffn_norm
 *       f = Wdown (act(Wgate h) * (Wup h))                         act: silu, or gelu (tanh form) for KILN_ACT_GELU
 *       [post_norms] f = rmsnorm(f) * ffn_post_norm
 *       x += f
 *   logits = output (rmsnorm(x) * output_norm)                   output = token_embd when tied
 *
 * rmsnorm(x) = x / sqrt(mean(x^2) + rms_eps). A weight W with ne = {n_in, n_out} maps n_in inputs to n_out outputs:
 * out[r] = dot(row r of W, in). Norm weights are used as stored: Gemma's (1 + w) is already in GGUF files. */
#ifndef KILN_MODEL_MODEL_H
#define KILN_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "quant/types.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

#define KILN_MAX_HEAD_DIM 512

/* How rope pairs the dimensions of a head. Both rotate pair i by angle pos * rope_freq[i]. */
typedef enum kiln_rope_style {
    KILN_ROPE_NORMAL = 0, /* pairs (2i, 2i+1): llama (the GGUF converter permutes Wq/Wk rows to fit this) */
    KILN_ROPE_NEOX = 2,   /* pairs (i, i + rope_dim/2): qwen2 */
} kiln_rope_style;

/* The tensors of one layer. KILN_LAYER_ROLE_COUNT sizes tables indexed by role. */
typedef enum kiln_layer_role {
    KILN_ROLE_ATTN_NORM,
    KILN_ROLE_WQ,
    KILN_ROLE_WK,
    KILN_ROLE_WV,
    KILN_ROLE_BQ,
    KILN_ROLE_BK,
    KILN_ROLE_BV,
    KILN_ROLE_Q_NORM,
    KILN_ROLE_K_NORM,
    KILN_ROLE_WO,
    KILN_ROLE_ATTN_POST_NORM,
    KILN_ROLE_FFN_NORM,
    KILN_ROLE_FFN_GATE,
    KILN_ROLE_FFN_UP,
    KILN_ROLE_FFN_DOWN,
    KILN_ROLE_FFN_POST_NORM,
    KILN_LAYER_ROLE_COUNT
} kiln_layer_role;

/* The feed-forward gate's activation. */
typedef enum kiln_act {
    KILN_ACT_SILU = 0, /* x / (1 + e^-x): SwiGLU */
    KILN_ACT_GELU,     /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): GeGLU, as llama.cpp computes GELU */
} kiln_act;

/* One row of the architecture table. */
typedef struct kiln_arch {
    const char *name;          /* general.architecture, also the prefix of its hyperparameter keys */
    kiln_rope_style rope_style;
    bool qkv_bias;             /* blk.N.attn_{q,k,v}.bias present (and required) */
    bool output_may_be_tied;   /* output.weight may be absent: the head is token_embd */
    bool qk_norm;              /* blk.N.attn_{q,k}_norm: RMSNorm of each query and key head before rope */
    bool post_norms;           /* blk.N.post_attention_norm, post_ffw_norm: RMSNorm of each block's output */
    bool embd_scale;           /* the embedding row times sqrt(n_embd) */
    kiln_act act;
    /* Sliding-window layers (with <arch>.attention.sliding_window > 0): every layer but each swa_pattern-th, which
     * attends to the whole context; they rotate by rope_base_swa, unscaled. 0: no such layers. */
    int swa_pattern;
    float rope_base_swa;
    bool gpu;                  /* the CUDA executor runs it */
} kiln_arch;

/* The architecture table row for a general.architecture value, or NULL. */
const kiln_arch *kiln_arch_find(const char *name);

typedef struct kiln_config {
    const kiln_arch *arch;
    int n_embd;      /* residual stream width */
    int n_layer;
    int n_head;      /* query heads */
    int n_head_kv;   /* key/value heads (n_head is a multiple of it) */
    int head_dim;    /* <arch>.attention.key_length, else n_embd / n_head */
    int n_ff;        /* FFN hidden width */
    int n_vocab;     /* rows of token_embd */
    int n_ctx_train; /* <arch>.context_length */
    float rms_eps;
    kiln_rope_style rope_style;
    int rope_dim;    /* leading dims of each head that rope rotates (even, <= head_dim) */
    float rope_base;
    /* Angle per position of each rotated pair, rope_dim/2 entries: base^(-2i/rope_dim) * linear scale, divided by
     * the Llama-3 frequency factor (from rope.scaling.* keys or a rope_freqs.weight tensor), as llama.cpp does. */
    float rope_freq[KILN_MAX_HEAD_DIM / 2];
    float attn_scale; /* the query-key product's scale: 1/sqrt(head_dim), except Gemma 3 27B's 1/sqrt(n_embd/n_head) */
    int n_swa;        /* <arch>.attention.sliding_window: positions a sliding-window layer sees; 0: none */
    float rope_freq_swa[KILN_MAX_HEAD_DIM / 2]; /* rope_freq of the sliding-window layers */
} kiln_config;

/* Reads and checks the hyperparameters. Errors name the missing or bad key. */
int kiln_config_load(const kiln_gguf *g, kiln_config *cfg, kiln_error *err);

static inline int kiln_config_q_dim(const kiln_config *c) { return c->n_head * c->head_dim; }
/* Whether layer l attends through a sliding window (of n_swa positions) */
static inline bool kiln_config_layer_swa(const kiln_config *c, int l) {
    return c->n_swa > 0 && c->arch->swa_pattern > 0 && (l + 1) % c->arch->swa_pattern != 0;
}
/* The rope angles per position of layer l's pairs */
static inline const float *kiln_config_layer_rope(const kiln_config *c, int l) {
    return kiln_config_layer_swa(c, l) ? c->rope_freq_swa : c->rope_freq;
}
/* The first position a token at pos attends to in layer l */
static inline int kiln_config_layer_first_pos(const kiln_config *c, int l, int pos) {
    return kiln_config_layer_swa(c, l) && pos >= c->n_swa ? pos - c->n_swa + 1 : 0;
}
static inline int kiln_config_kv_dim(const kiln_config *c) { return c->n_head_kv * c->head_dim; }

/* A tensor used in place: ne[0] elements per row (the input dimension), ne[1] rows. data is NULL for an absent
 * optional role. 1-D tensors (norms, biases) have ne[1] == 1. */
typedef struct kiln_weight {
    const void *data;
    kiln_type type;
    int64_t ne[2];
    size_t row_bytes;
    const char *name; /* the GGUF tensor name, for messages */
} kiln_weight;

typedef struct kiln_layer_weights {
    kiln_weight w[KILN_LAYER_ROLE_COUNT]; /* indexed by kiln_layer_role */
} kiln_layer_weights;

typedef struct kiln_weights {
    kiln_weight token_embd;  /* ne = {n_embd, n_vocab} */
    kiln_weight output_norm; /* {n_embd} */
    kiln_weight output;      /* {n_embd, n_vocab}; a copy of token_embd when tied */
    bool tied;
    kiln_layer_weights *layers; /* n_layer entries */
    int n_layer;
} kiln_weights;

/* Points every role at its tensor and checks presence, shape and type (norms and biases F32; matrices of a type the
 * quant module can dot). Errors name the tensor and what was expected. */
int kiln_weights_load(const kiln_gguf *g, const kiln_config *cfg, kiln_weights *w, kiln_error *err);
void kiln_weights_free(kiln_weights *w);

/* Bytes of weights one decoded token reads: every layer tensor, the final norm, the head, and one embedding row. */
uint64_t kiln_weights_bytes_per_token(const kiln_weights *w);
/* Bytes of all the weights (a tied head counted once, with the embedding). */
uint64_t kiln_weights_bytes(const kiln_weights *w);

/* A loaded model: the container (kept mapped), its description, and its tokenizer. */
typedef struct kiln_model {
    kiln_gguf *file;
    kiln_config cfg;
    kiln_weights w;
    kiln_tokenizer *tok; /* NULL for a file without one: it runs on token ids only */
    bool add_bos; /* tokenizer.ggml.add_bos_token (default: true for SentencePiece vocabularies) */
    /* The weights on the GPU: uploaded for the first executor that runs there, shared by the later ones, freed with
     * the last (engine/model_share.c) */
    struct kiln_cuda_model *gpu;
    int gpu_users;
    /* References: the opener's and one per context or scheduler on the model; the last frees it
     * (engine/model_share.c) */
    int users;
} kiln_model;

/* Opens a GGUF file or safetensors folder and loads all of the above. */
int kiln_model_load(const char *path, kiln_model **out, kiln_error *err);
void kiln_model_free(kiln_model *m);
/* 0 when the model has a tokenizer, else -1 and an error naming the file. */
int kiln_model_need_tokenizer(const kiln_model *m, kiln_error *err);

#endif

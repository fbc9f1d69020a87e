/* The reference forward pass: one token at a time, plain loops, F32 everywhere (weights dequantized row by row,
 * F32 KV cache). It defines what the fast path must compute; tests hold both to it. */
#ifndef KILN_CPU_FORWARD_REF_H
#define KILN_CPU_FORWARD_REF_H

#include "model/model.h"

typedef struct kiln_ref_state {
    const kiln_config *cfg;
    const kiln_weights *w;
    int n_ctx;
    float *x;        /* residual stream, n_embd */
    float *xb;       /* normed input of a block, n_embd */
    float *q;        /* queries, q_dim */
    float *k, *v;    /* this token's keys and values, kv_dim */
    float *att_out;  /* attention output, q_dim */
    float *att;      /* scores of one head, n_ctx */
    float *hb, *hb2; /* FFN gate and up, n_ff */
    float *row;      /* one dequantized weight row, max(n_embd, q_dim, n_ff) */
    float *key_cache, *value_cache; /* [n_layer][n_ctx][kv_dim] */
    uint64_t kv_bytes, work_bytes;  /* what kiln_ref_init allocated: the cache, the rest */
} kiln_ref_state;

int kiln_ref_init(kiln_ref_state *s, const kiln_config *cfg, const kiln_weights *w, int n_ctx, kiln_error *err);
void kiln_ref_free(kiln_ref_state *s);
/* Bytes the state allocated: its F32 KV cache, and its activations. */
void kiln_ref_memory(const kiln_ref_state *s, uint64_t *kv_cache, uint64_t *workspace);

/* Runs token at position pos (0 <= pos < n_ctx; positions 0..pos-1 must have been run before) and writes n_vocab
 * logits. */
int kiln_ref_forward(kiln_ref_state *s, int32_t token, int pos, float *logits, kiln_error *err);

#endif

/* The CUDA executor's internal state, shared by weights.c (upload) and forward.c (contexts and the forward pass). */
#ifndef KILN_CUDA_EXECUTOR_H
#define KILN_CUDA_EXECUTOR_H

#include <stdio.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"

typedef struct kiln_cuda_layer {
    const float *attn_norm, *ffn_norm;
    const float *bq, *bk, *bv; /* NULL when the architecture has no QKV bias */
    kiln_cuda_matrix wq, wk, wv, wo, gate, up, down;
} kiln_cuda_layer;

/* NeoX models (rotation pairs i, i + rope_dim/2 of a head) are uploaded with their Q and K rows and biases
 * interleaved, head dim 2i holding the file's dim i and 2i + 1 dim i + rope_dim/2 (kiln_cuda_qk_source), so that
 * pairs are neighbouring dims as in llama's GGUF layout and the Q/K/V GEMV's blocks do the rope stage too: one
 * launch a layer fewer. q.k is the same sum in another order, so attention is unchanged; the K cache holds the
 * interleaved order. */
struct kiln_cuda_model {
    kiln_config cfg; /* the model's, but rope_style NORMAL where qk_interleaved */
    bool qk_interleaved;
    void *arena; /* every weight, in one allocation */
    uint64_t arena_bytes;
    kiln_cuda_matrix token_embd, output;
    const float *output_norm;
    const float *rope_freq; /* rope_dim / 2 angles per position */
    kiln_cuda_layer *layers;
    size_t max_matrix_elems; /* the largest layer matrix: the F16 staging size for prefill GEMMs */
    const kiln_weights *host; /* KILN_GPU_DEBUG=1 at load: the host weights, kept for the per-op checks */
};

/* Decode steps are built for a span of positions, the first of KILN_CUDA_FIRST_SPAN, twice that, ... (up to n_ctx)
 * that holds the step's longest token, so the attention's grid launches no more slices than the span fills and a
 * captured graph serves every step of its span (forward.c, forward_batch.c). */
#define KILN_CUDA_FIRST_SPAN 128

/* Bytes of m's weights: what a pass over it reads (the profiles' bandwidth figures). */
static inline uint64_t mbytes(const kiln_cuda_matrix *m) { return (uint64_t)m->row_bytes * (uint64_t)m->n; }

/* The file's index of the Q or K vector element that is element e in the device's order (e unless qk_interleaved). */
int kiln_cuda_qk_source(const kiln_cuda_model *cm, int e);

/* Ops as the profile groups them. */
typedef enum kiln_cuda_op {
    KILN_OP_EMBED,
    KILN_OP_NORM,
    KILN_OP_QKV,
    KILN_OP_ROPE,
    KILN_OP_ATTENTION,
    KILN_OP_WO,
    KILN_OP_GATE_UP,
    KILN_OP_DOWN,
    KILN_OP_HEAD,
    KILN_OP_ARGMAX,
    KILN_OP_COUNT
} kiln_cuda_op;

#define KILN_PROFILE_MARKS 1024

/* One event per op boundary in a forward pass; op i ran between mark i and mark i + 1. */
typedef struct kiln_cuda_profile {
    cudaEvent_t ev[KILN_PROFILE_MARKS];
    int op[KILN_PROFILE_MARKS];
    uint64_t bytes[KILN_PROFILE_MARKS];
    int n;
    double ms[KILN_OP_COUNT];
    double total_bytes[KILN_OP_COUNT];
} kiln_cuda_profile;

/* The context's profile while profiling is on, else NULL. */
kiln_cuda_profile *kiln_cuda_context_profile(kiln_cuda_context *ctx);

/* A profile with its events created (NULL and err set on failure); freeing takes NULL. */
kiln_cuda_profile *kiln_cuda_profile_new(kiln_error *err);
void kiln_cuda_profile_free(kiln_cuda_profile *p);

/* Time, weight bytes and share of copy_bw per op of p, over n_steps passes (what kiln_cuda_profile_print writes). */
void kiln_cuda_profile_write(const kiln_cuda_profile *p, int n_steps, double copy_bw, FILE *out);

/* Marks the start of op (the end of the previous one); KILN_OP_COUNT closes the pass. No-op without a profile. */
void kiln_cuda_profile_mark(kiln_cuda_profile *p, kiln_cuda_op op, uint64_t bytes, cudaStream_t stream);
/* Adds the closed pass's times to the sums (after the stream has finished). */
void kiln_cuda_profile_collect(kiln_cuda_profile *p);
/* Adds time measured another way (the persistent step's stages) to op. No-op without a profile. */
void kiln_cuda_profile_add(kiln_cuda_profile *p, kiln_cuda_op op, double ms, uint64_t bytes);

/* KILN_GPU_DEBUG=1 (debug.c): each op of a one-token pass checked against the CPU from the GPU's inputs. */
typedef struct kiln_cuda_debug kiln_cuda_debug;

/* The device buffers the ops of a one-token pass read and write. */
typedef struct kiln_cuda_debug_view {
    const float *x, *h, *q, *k, *v, *attn, *ff, *logits;
    const void *act_q, *k_cache, *v_cache;
    const int32_t *d_tokens, *d_pos;
    int n_ctx;
} kiln_cuda_debug_view;

kiln_cuda_debug *kiln_cuda_debug_new(const kiln_cuda_model *cm, const kiln_cuda_debug_view *view, cudaStream_t stream);
void kiln_cuda_debug_free(kiln_cuda_debug *d);
/* At the start of op in layer (KILN_OP_COUNT: the pass has ended): waits for the stream, checks the op that just
 * ended against the CPU, saves the inputs of the next. The first divergence of a pass and a summary go to stderr. */
void kiln_cuda_debug_mark(kiln_cuda_debug *d, kiln_cuda_op op, int layer, bool greedy);
int kiln_cuda_debug_diverged(const kiln_cuda_debug *d);

#endif

/* Launchers of the batched step over many sequences (gemv_batch.cu, attention_paged.cu, gather.cu, norm.cu), for
 * forward_batch.c: the conventions of kernels.h (device pointers, enqueue only, Q8_1 activations field by field). */
#ifndef KILN_CUDA_KERNELS_BATCH_H
#define KILN_CUDA_KERNELS_BATCH_H

#include "cuda/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[j][r] (+)= dot(row r of m, x_j) for j < n_vec: rows of y m->n apart. xq: Q8_1 of the n_vec rows of m->k
 * values (kiln_cuda_quantize_q8_1 with n_rows = n_vec), or in half mode their F16 form, for the matrices that take
 * it (kiln_cuda_gemv_batch_takes_act), xf: the F32 rows for the others. Each vector's sum runs in the same order
 * whatever n_vec is (batch invariance). */
int kiln_cuda_gemv_batch(const kiln_cuda_matrix *m, const void *xq, const float *xf, int n_vec, float *y,
                         bool accumulate, cudaStream_t stream);
/* Half mode: the batched GEMVs of quantized weights take F16 activations (kiln_cuda_batch_to_half's layout, in the
 * place of Q8_1) and run F16 tensor-core products of weights turned into F16 in registers, for every batch size (a
 * vector's result keeps one order of operations); so do those of F16 and BF16 weights whose rows are whole parts
 * of 32, which otherwise (and F32 weights always) take F32 activations and FMA. On with KILN_CUDA_BATCH_HALF=1 (read once), or as
 * set. */
bool kiln_cuda_batch_half(void);
void kiln_cuda_batch_half_set(bool on);
/* Whether m's batched GEMV takes xq (Q8_1, or half mode's F16) rather than the F32 rows. */
bool kiln_cuda_gemv_batch_takes_act(const kiln_cuda_matrix *m);
/* The half mode's GEMV input from n_rows F32 rows of k values (k a multiple of 32): k * n_rows halves. */
void kiln_cuda_batch_to_half(const float *x, void *xh, int k, int n_rows, cudaStream_t stream);
/* kiln_cuda_rmsnorm_rows (no Q8_1) that also writes its rows as half-mode input into xh, the same halves as
 * kiln_cuda_batch_to_half of out (n a multiple of 32): one launch where the split form applies. */
void kiln_cuda_rmsnorm_rows_half(float *x, const float *w, float *out, void *xh, int n, int n_rows, float eps,
                                 cudaStream_t stream);
/* Q, K and V of n_vec vectors: one launch when the matrices share type and width, else one each. At most 3. */
int kiln_cuda_gemv_batch_multi(const kiln_cuda_matrix *const *ms, float *const *ys, int n_mats, const void *xq,
                               const float *xf, int n_vec, cudaStream_t stream);
/* y[j] = silu(gate x_j) * (up x_j); gate and up of the same type and shape. */
int kiln_cuda_gemv_batch_swiglu(const kiln_cuda_matrix *gate, const kiln_cuda_matrix *up, const void *xq,
                                const float *xf, int n_vec, float *y, cudaStream_t stream);
/* Half mode, gate and up that take xq, of a height that is a multiple of 32: the same results as the next GEMV's F16
 * input, the halves kiln_cuda_batch_to_half makes of y, written into yh (n_vec * gate->n halves); -1 otherwise. */
int kiln_cuda_gemv_batch_swiglu_half(const kiln_cuda_matrix *gate, const kiln_cuda_matrix *up, const void *xq,
                                     int n_vec, void *yh, cudaStream_t stream);

/* A paged KV cache: per layer [n_blocks][n_head_kv][block_size][head_dim] halves; a sequence names its blocks in a
 * block table (position p lives in block table[p / block_size], row p % block_size). */
typedef struct kiln_cuda_paged_args {
    int n_head, n_head_kv, head_dim, rope_dim, block_size;
    bool neox;
    float q_scale;
    const float *freq;
} kiln_cuda_paged_args;

/* kiln_cuda_rope_store for tokens of different sequences: token t is at position d_pos[t] and its K/V row goes to
 * cache slot d_slot[t] (block * block_size + row). */
void kiln_cuda_rope_store_paged(const kiln_cuda_paged_args *a, float *q, const float *k, const float *v,
                                const float *bq, const float *bk, const float *bv, void *k_cache, void *v_cache,
                                const int32_t *d_pos, const int32_t *d_slot, int n_tokens, cudaStream_t stream);

/* Q/K/V (ms[0..3), heights n_head and n_head_kv times head_dim) of n_vec tokens with kiln_cuda_rope_store_paged's
 * work done by the GEMV blocks themselves (paged_rope.cuh): q rotated and scaled into q, k and v into their slots;
 * no F32 k and v, no launch of its own. Only where kiln_cuda_gemv_batch_rope_fits says (else -1). */
int kiln_cuda_gemv_batch_qkv_rope(const kiln_cuda_matrix *const *ms, const void *xq, int n_vec,
                                  const kiln_cuda_paged_args *a, float *q, const float *bq, const float *bk,
                                  const float *bv, void *k_cache, void *v_cache, const int32_t *d_pos,
                                  const int32_t *d_slot, cudaStream_t stream);
/* Whether kiln_cuda_gemv_batch_qkv_rope takes these: quantized matrices of heights in multiples of 16, rotation
 * pairs of neighbouring dims (not a.neox); KILN_CUDA_BATCH_ROPE=0 never (read once, for comparisons). */
bool kiln_cuda_gemv_batch_rope_fits(const kiln_cuda_matrix *const *ms, const kiln_cuda_paged_args *a);

/* Attention of n_tokens tokens, token t seeing positions 0..d_pos[t] through its block table d_tables +
 * d_table_off[t]: split-K flash decoding in slices of KILN_CUDA_DECODE_MIN_CHUNK positions or more (up to
 * KILN_CUDA_DECODE_SPLITS, chosen from the token's own length), then a merge into out [n_tokens][n_head * head_dim]
 * and, with out_q, its form as a quantized GEMV's input: Q8_1, or in half mode F16 (kiln_cuda_batch_to_half's).
 * part: n_tokens * n_head * KILN_CUDA_DECODE_SPLITS * (head_dim + 2) floats. max_n_pos: the most positions a token
 * of the launch sees (at least every d_pos[t] + 1), which sizes the grid: no blocks for slices no token has. */
int kiln_cuda_attention_paged(const kiln_cuda_paged_args *a, const float *q, const void *k_cache, const void *v_cache,
                              const int32_t *d_pos, const int32_t *d_tables, const int32_t *d_table_off, int n_tokens,
                              int max_n_pos, float *part, float *out, void *out_q, cudaStream_t stream);

/* How kiln_cuda_attention_paged's blocks take query heads: -1 the most of a K/V head's with which the launch has
 * blocks enough (the default), 0 one a block, 1 all of a K/V head's where built, g > 1 g where g divides a K/V head's
 * and is built; the same bits either way (for tests and comparisons, as KILN_CUDA_ATTN_GROUP=0/1/g). */
void kiln_cuda_attention_paged_group(int mode);

/* dst[i] = src row d_rows[i] (width floats each), i < n_rows. */
void kiln_cuda_gather_rows(const float *src, const int32_t *d_rows, int n_rows, int width, float *dst,
                           cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif

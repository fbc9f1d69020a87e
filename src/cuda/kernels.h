/* Launchers of the CUDA kernels, callable from C (the executor and the tests). Each family lives in its own .cu
 * file. Pointers are device pointers; every launcher only enqueues work on `stream` (no allocation, no host sync),
 * so a whole decode step can be captured into a CUDA graph. Positions come from device memory (`d_pos`) for the
 * same reason: a replayed graph reads the current position instead of baking one in.
 *
 * Activations for quantized weights are Q8_1 (blocks of 32 int8 with a scale), quantized once per input vector and
 * reused by every matrix that reads it (Q/K/V, gate/up). A matrix part of 32 weights pairs with one Q8_1 block. */
#ifndef KILN_CUDA_KERNELS_H
#define KILN_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "quant/types.h"
#include "sample/draw.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A weight matrix on the device: n rows of k elements each, in the file's type. Float types keep the file layout
 * (rows row_bytes apart); quantized types are stored field by field (kiln_cuda_repack, see quant_unpack.cuh). */
typedef struct kiln_cuda_matrix {
    const void *data;
    kiln_type type;
    int k;
    int n;
    size_t row_bytes;
} kiln_cuda_matrix;

/* Whether the GEMV and dequantize kernels handle a type with rows of k elements (k a multiple of the block, and
 * of 8 for float types). */
bool kiln_cuda_type_supported(kiln_type type, int k);

/* Whether a type's GEMV reads Q8_1 activations (quantized types) rather than F32 ones (F32, F16, BF16). */
bool kiln_cuda_type_uses_q8_1(kiln_type type);

/* Converts n_blocks quantized blocks from the file layout (src) to the device layout (dst, same size). -1 for a
 * type that is not quantized. */
int kiln_cuda_repack(kiln_type type, const void *src, void *dst, int64_t n_blocks, cudaStream_t stream);

/* x: n_rows rows of k floats (k a multiple of 32) -> q: Q8_1 of all n = n_rows * k values, field by field: n int8,
 * then n/32 half pairs (d, d * sum of the block's int8 values); n * 36/32 bytes. */
void kiln_cuda_quantize_q8_1(const float *x, void *q, int k, int n_rows, cudaStream_t stream);

/* y[r] = dot(row r of m, x) for r < m->n, or y[r] += ... when accumulate (the residual add for free).
 * xq: Q8_1 activations (quantized types), xf: F32 activations (float types); the other may be NULL. */
int kiln_cuda_gemv(const kiln_cuda_matrix *m, const void *xq, const float *xf, float *y, bool accumulate,
                   cudaStream_t stream);

/* Several GEMVs over the same activations (Q, K and V): ys[i][r] = dot(row r of ms[i], x), at most 3 matrices.
 * One launch for each run of matrices that share a quantized type and width, and one for all three when the first
 * two share one and the last is of its K-quant mix's other type (Q4_K or Q5_K with Q6_K). */
int kiln_cuda_gemv_multi(const kiln_cuda_matrix *const *ms, float *const *ys, int n_mats, const void *xq,
                         const float *xf, cudaStream_t stream);

/* The RMSNorm that follows a residual GEMV, done inside it (kiln_cuda_gemv_norm): out = y / rms(y) * w and
 * out_q, its Q8_1 copy. counter: one unsigned in device memory, zero before the first use (the kernel leaves it
 * zero). */
typedef struct kiln_cuda_norm_args {
    const float *w;
    float *out;
    void *out_q;
    float eps;
    unsigned *counter;
} kiln_cuda_norm_args;

/* y += W x (quantized m, Q8_1 xq), then the RMSNorm of the whole y as norm says, by the grid's last block: the
 * residual add, the next norm and its quantization in one launch. -1 for float types or n not a multiple of 32. */
int kiln_cuda_gemv_norm(const kiln_cuda_matrix *m, const void *xq, float *y, const kiln_cuda_norm_args *norm,
                        cudaStream_t stream);

/* y[r] = silu(dot(gate row r, x)) * dot(up row r, x): the FFN's first half in one pass over both matrices.
 * gate and up must have the same type and shape. */
int kiln_cuda_gemv_swiglu(const kiln_cuda_matrix *gate, const kiln_cuda_matrix *up, const void *xq, const float *xf,
                          float *y, cudaStream_t stream);

/* dst[t] = row tokens[t] of m dequantized to F32 (the embedding lookup); token ids read from device memory. */
int kiln_cuda_get_rows(const kiln_cuda_matrix *m, const int32_t *d_tokens, int n_tokens, float *dst,
                       cudaStream_t stream);

/* Rows [0, m->n) of m dequantized to F16, row-major, k halves per row (prefill: tiles for tensor-core GEMMs). */
int kiln_cuda_dequantize_f16(const kiln_cuda_matrix *m, void *dst_f16, cudaStream_t stream);

/* n floats -> n halves. */
void kiln_cuda_f32_to_f16(const float *x, void *dst_f16, int64_t n, cudaStream_t stream);

/* out = silu(gate) * up, n elements (the prefill path, after two GEMMs). */
void kiln_cuda_swiglu(const float *gate, const float *up, float *out, int64_t n, cudaStream_t stream);

/* For each of n_rows rows of n (a multiple of 4, at most KILN_CUDA_NORM_MAX; rows 16-byte aligned): if residual,
 * x += residual first (stored back into x); then out = x / sqrt(mean(x^2) + eps) * w. When out_q is non-NULL the
 * normed row is also quantized to Q8_1 (n a multiple of 32), saving a launch before the next GEMV. */
#define KILN_CUDA_NORM_MAX 16384
void kiln_cuda_rmsnorm(float *x, const float *residual, const float *w, float *out, void *out_q, int n, int n_rows,
                       float eps, cudaStream_t stream);
/* The same for a decode step's rows, without a residual, each over several blocks (faster for few rows; its float
 * sums are ordered otherwise than kiln_cuda_rmsnorm's, the same for a row whatever n_rows). */
void kiln_cuda_rmsnorm_rows(float *x, const float *w, float *out, void *out_q, int n, int n_rows, float eps,
                            cudaStream_t stream);

/* The attention input stage for n_tokens tokens at positions *d_pos + t: adds the optional biases to q, k, v,
 * rotates the first rope_dim dims of each q and k head by pos * freq[i] (pairs (2i, 2i+1) for normal rope, (i,
 * i + rope_dim/2) for NeoX), scales q by q_scale, and stores k and v as F16 into the cache rows at their positions.
 * q: [n_tokens][n_head * head_dim] (rotated in place), k, v: [n_tokens][n_head_kv * head_dim].
 * k_cache, v_cache: [n_head_kv][n_ctx][head_dim] halves. freq: rope_dim/2 floats on the device. head_dim even, at
 * most 2048 (a thread per pair of dims). */
typedef struct kiln_cuda_rope_args {
    int n_head, n_head_kv, head_dim, rope_dim, n_ctx;
    bool neox;
    float q_scale;
    const float *freq;
} kiln_cuda_rope_args;

void kiln_cuda_rope_store(const kiln_cuda_rope_args *a, float *q, const float *k, const float *v, const float *bq,
                          const float *bk, const float *bv, void *k_cache, void *v_cache, const int32_t *d_pos,
                          int n_tokens, cudaStream_t stream);

/* Q, K and V of one token (ms[0..2], over the same Q8_1 activations) with the rope stage above in the same launch:
 * q rotated and scaled into q, the rotated k and the v rows into the caches at *d_pos, as kiln_cuda_gemv_multi then
 * kiln_cuda_rope_store would leave them (the same arithmetic: equal results); one launch where that needs none
 * between. Rotation pairs must be neighbouring dims (not NeoX: a block's rows hold both of a pair), the three
 * quantized, of one width, in one type or a mixed pair kiln_cuda_gemv_multi takes in one launch, one warp a row,
 * with rows a multiple of 16. -1, and nothing launched, where they are not. */
int kiln_cuda_gemv_qkv_rope(const kiln_cuda_matrix *const *ms, float *q, const void *xq, const kiln_cuda_rope_args *r,
                            const float *bq, const float *bk, const float *bv, void *k_cache, void *v_cache,
                            const int32_t *d_pos, cudaStream_t stream);

/* Attention of n_tokens query tokens (already scaled and rotated), token t seeing cache positions 0..*d_pos + t:
 * split-K flash decoding. Each of n_split blocks per (head, token) runs an online softmax over its slice of the
 * positions into part (n_tokens * n_head * n_split * (head_dim + 2) floats), then a second kernel merges the
 * slices into out [n_tokens][n_head * head_dim], and when out_q is non-NULL also into its Q8_1 form (the output
 * projection's input, quantized without another launch). One token in one slice (n_split 1) has no merge: each
 * head's block writes out (and out_q) itself. head_dim must be 64, 128 or 256. Batches of
 * KILN_CUDA_PREFILL_ATTENTION_MIN tokens or more (without out_q) take kiln_cuda_attention_prefill instead, which
 * needs no part. */
/* H100 (bench_cuda_attention): on tensor cores, faster than the per-token kernels from 64 tokens (11.1 against 12.6 us
 * at qwen2-1.5b's shape, 12.8 against 21.6 at llama3-8b's) */
#define KILN_CUDA_PREFILL_ATTENTION_MIN 64

/* The decode step's split: up to KILN_CUDA_DECODE_SPLITS slices per head, each of at least KILN_CUDA_DECODE_MIN_CHUNK
 * positions, so the split grows with the context (one slice up to 32 positions, 4 at 128, all 32 from 1024). Measured
 * by bench_cuda_attention on H100 (docs/cuda-measured.md): slices of about 32 positions were the fastest or within 5%
 * of it from 128 to 8192 positions at both shapes; 8192 positions took 56 us in 32 slices against 89 in 16 and 1124 in
 * one. */
#define KILN_CUDA_DECODE_SPLITS 32
#define KILN_CUDA_DECODE_MIN_CHUNK 32
/* Warps a block of one token's attention (the decode step's split and the one-launch form): 8, which load 128 positions
 * of a slice before their wait. Measured on H100 in the decode step (tg128, in-process; docs/cuda-measured.md session
 * 17): one block of 8 warps a head, no merge, ran llama3-8b 2.2% and qwen2-1.5b 3.2% faster than slices of 16 positions
 * in blocks of 2 warps and a merge; 4 and 16 warps less so; loading 16 positions a warp (all 128) instead of 8 another
 * 0.9%. */
#define KILN_CUDA_DECODE_WARPS 8
/* Positions a slice of the decode step's attention at least (KILN_CUDA_DECODE_CHUNK sets others): one slice a head up
 * to 128 positions, so no merge launch, 2 at 256, ... 32 at 4096, longer past that. Measured on H100 in blocks of 8
 * warps (tg from an empty context, in-process, docs/cuda-measured.md session 17): against 64 and 256 positions,
 * qwen2-1.5b's tg2048 ran 3.4% and 2.1% faster, llama3-8b's tg1024 3.2% and 1.6%; against 64 beyond the first 128,
 * their tg512 1.0% and 0.8%. */
#define KILN_CUDA_DECODE_CHUNK 128

typedef struct kiln_cuda_attn_args {
    int n_head, n_head_kv, head_dim, n_ctx, n_split;
    int min_chunk; /* positions per slice at least (0 or 1: none); fewer slices run while *d_pos is small */
    int warps;     /* warps a block of one token's split: 2, 4, 8 or 16 (0: KILN_CUDA_DECODE_WARPS) */
} kiln_cuda_attn_args;

int kiln_cuda_attention(const kiln_cuda_attn_args *a, const float *q, const void *k_cache, const void *v_cache,
                        const int32_t *d_pos, int n_tokens, float *part, float *out, void *out_q,
                        cudaStream_t stream);

/* The causal attention of a prompt batch (as kiln_cuda_attention's, into out only) by a tiled kernel: flash
 * attention on tensor cores (F16 operands, F32 sums) for head_dim 64 and 128, F32 FMA for 256 or where
 * KILN_CUDA_PREFILL_MMA=0 (attention_prefill.cu). */
int kiln_cuda_attention_prefill(const kiln_cuda_attn_args *a, const float *q, const void *k_cache, const void *v_cache,
                                const int32_t *d_pos, int n_tokens, float *out, cudaStream_t stream);

/* The attention of one decode token in one launch: the rope stage's work (biases, rotation, q scale, the k and v
 * rows into the cache at *d_pos) and kiln_cuda_attention's split and merge, the merge done by the last block of each
 * head, or by the head's only block while the context is one slice (a->min_chunk positions or fewer). Blocks of
 * `warps` warps: 4, 8 or 16 (0: KILN_CUDA_DECODE_WARPS). q, k, v are the Q/K/V GEMVs' outputs, left as they
 * are. counters: n_head unsigneds in device memory, zero before the first call (and left zero). The decode
 * step runs it under KILN_CUDA_FUSE=1 (not by default: the three launches are faster, docs/cuda-measured.md). */
typedef struct kiln_cuda_attn_decode_args {
    kiln_cuda_rope_args rope;
    const float *q, *k, *v, *bq, *bk, *bv;
    void *k_cache, *v_cache;
    float *out;
    void *out_q;
    int warps;
} kiln_cuda_attn_decode_args;

int kiln_cuda_attention_decode(const kiln_cuda_attn_args *a, const kiln_cuda_attn_decode_args *d,
                               const int32_t *d_pos, float *part, unsigned *counters, cudaStream_t stream);

/* The layers of a decode step (one token) in one persistent launch (decode_persistent.cu, Hopper): one block an SM,
 * each owning a range of rows of every matrix; a copy warp streams the block's rows into shared memory ahead of use
 * while the compute warps take the stages, meeting at grid-wide barriers, five a layer: Q/K/V (every block
 * normalizes x into its shared memory first), attention (rope, cache store, split, merge by each head's last
 * block), output projection (+= x), gate/up/SwiGLU (norm first), down projection (+= x). x holds the embedding
 * before and the residual stream after; the final norm and the head are left to the caller. */
#define KILN_CUDA_DECODE_STAGES 5 /* Q/K/V, attention, output projection, gate/up, down */

typedef struct kiln_cuda_decode_layer {
    kiln_cuda_matrix wq, wk, wv, wo, gate, up, down;
    const float *attn_norm, *ffn_norm, *bq, *bk, *bv; /* biases may be NULL */
    void *k_cache, *v_cache;                          /* this layer's [n_head_kv][n_ctx][head_dim] halves */
} kiln_cuda_decode_layer;

typedef struct kiln_cuda_decode_args {
    const kiln_cuda_decode_layer *layers; /* device memory, n_layer of them */
    int n_layer, n_embd, n_ff;
    float eps;
    kiln_cuda_rope_args rope;
    kiln_cuda_attn_args attn;
    float *x, *q, *k, *v, *attn_out, *ff, *part;
    unsigned *counters;      /* n_head, zero before the first launch and left zero */
    unsigned *grid_sync;     /* 2, zero before the first launch: the stage barrier's count, launches so far */
    const int32_t *d_pos;
    unsigned long long *stamps; /* NULL, or 1 + KILN_CUDA_DECODE_STAGES * n_layer device times (ns): the start,
                                 * then each stage's end */
} kiln_cuda_decode_args;

/* Whether the persistent step runs these layers (host copies): quantized matrices with rows of k multiple of their
 * block, a multiple of 8 blocks each, 16-byte aligned, rows of at most 16384 (a row or a gate/up pair of rows
 * fitting 32 KB), gate and up alike, head_dim 64, 128 or 256, and a GPU of compute capability 9.0+ that can launch
 * cooperatively. */
bool kiln_cuda_decode_layers_supported(const kiln_cuda_decode_layer *layers, int n_layer, int head_dim);

int kiln_cuda_decode_layers(const kiln_cuda_decode_args *a, cudaStream_t stream);

/* The persistent step's GEMV stage alone, for timing (bench_cuda_gemv's streamed rows): one block an SM streams
 * its rows of m[r % n_mats] for r < repeats through shared memory (a copy warp, cp.async.bulk) and `warps` compute
 * warps (4, 8 or 16) write y = m xq (xq: Q8_1), so y ends as the last matrix's product. Q4_K or Q6_K matrices of
 * one shape that kiln_cuda_decode_layers could stream; Hopper. -1 where it cannot run. */
#define KILN_CUDA_STREAM_MATS 8
typedef struct kiln_cuda_stream_args {
    kiln_cuda_matrix m[KILN_CUDA_STREAM_MATS];
    int n_mats, repeats;
    const void *xq;
    float *y;
} kiln_cuda_stream_args;
int kiln_cuda_stream_gemv(const kiln_cuda_stream_args *a, int warps, cudaStream_t stream);

/* d_out[0] = index of the largest of x[0..n) (the lowest index among equals). scratch: device memory of
 * kiln_cuda_argmax_scratch_bytes(n) bytes. d_advance, when not NULL, is incremented by the thread that writes the
 * id: the position of a captured greedy step, which every earlier kernel of the step has finished reading (one
 * launch a step fewer than a kernel of its own). */
size_t kiln_cuda_argmax_scratch_bytes(int n);
void kiln_cuda_argmax(const float *x, int n, void *scratch, int32_t *d_out, int32_t *d_advance, cudaStream_t stream);

/* The k best of each of rows rows of n values (v, rows n apart; ranked by value, then lower index), best first, into
 * out_v and out_id (rows k apart), k from 1 to KILN_CUDA_TOP_K_MAX and at most n. scratch:
 * kiln_cuda_top_k_scratch_bytes(n, rows, k) bytes for any rows and k up to those it was sized for. -1: k or rows
 * out of range, or a launch failed. */
size_t kiln_cuda_top_k_scratch_bytes(int n, int rows, int k);
int kiln_cuda_top_k(const float *v, int n, int rows, int k, void *scratch, float *out_v, int32_t *out_id,
                    cudaStream_t stream);
/* A draw on the device as the host sampler draws (sample/draw.h): its parameters, and the PRNG state it starts
 * from and leaves with the token it drew. */
typedef struct kiln_cuda_draw {
    kiln_draw_params p;
    int32_t token;
    kiln_rng rng;
} kiln_cuda_draw;

/* kiln_cuda_top_k of one row, then the draw among its k best (draw in device memory): the token into draw->token
 * and *d_token, and d_advance, when not NULL, moved on by one (a captured step's position, as kiln_cuda_argmax). The
 * token and PRNG state are those kiln_sampler_sample_candidates gives from the same k best and state. */
int kiln_cuda_top_k_draw(const float *v, int n, int k, void *scratch, float *out_v, int32_t *out_id,
                         kiln_cuda_draw *draw, int32_t *d_token, int32_t *d_advance, cudaStream_t stream);

/* out[i] = v[ids[i]] for i < n. */
void kiln_cuda_gather_f32(const float *v, const int32_t *ids, int n, float *out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif

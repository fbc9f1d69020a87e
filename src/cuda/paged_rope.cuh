/* The paged KV cache's row addressing, and the batched step's rope stage as the epilogue of its Q/K/V GEMV
 * (kiln_cuda_gemv_batch_qkv_rope): the rows of a GEMV block come in rotation pairs (2p, 2p + 1; every model's are
 * neighbours on the device, NeoX ones uploaded interleaved), so the block that made a pair's results for its tokens
 * finishes them as rope_store_paged_kernel would: bias, rotation at the token's position, q scaled, k and v stored as
 * F16 at the token's cache slot. No launch of its own, and the q, k and v rows never go out to memory unfinished.
 *
 * The arithmetic is pinned (no contraction left to the compiler), so every GEMV kernel that takes this epilogue
 * gives the same bits for a token whatever the batch. */
#ifndef KILN_CUDA_PAGED_ROPE_CUH
#define KILN_CUDA_PAGED_ROPE_CUH

#include "cuda/cuda_common.cuh"
#include "cuda/kernels_batch.h"

/* Element 0 of row `row` of kv head kvh in cache block `block` (layout: kernels_batch.h). */
__device__ __forceinline__ int64_t paged_row(const kiln_cuda_paged_args &a, int block, int kvh, int row) {
    return (((int64_t)block * a.n_head_kv + kvh) * a.block_size + row) * a.head_dim;
}

#define ROPE_BLOCK_PAIRS 8   /* rotation pairs a GEMV block holds, at most (16 rows) */
#define ROPE_BLOCK_TOKENS 64 /* tokens a GEMV block holds, at most */

/* A launch's rope stage: a.freq NULL when it has none. */
struct batch_rope {
    kiln_cuda_paged_args a;
    const float *bias[3]; /* by role: q, k, v (NULL: no bias) */
    int role[3];          /* the launch's matrix m holds role[m]: 0 q, 1 k, 2 v */
    float *q;             /* [token][n_head * head_dim] */
    __half *k_cache, *v_cache;
    const int32_t *d_pos, *d_slot;
};

/* What a block's stage needs besides its results, made before the PDL wait (after the release, so that loads that
 * stall a thread do not hold back the next kernel): the biases (after the wait a DRAM round trip, the step's
 * weights having evicted them from L2), each (pair, token)'s sine and cosine at the token's position, the tokens'
 * slots. Positions and slots come from the host before the step's first kernel (cuda_common.cuh). Measured against
 * copying the biases, frequencies and positions with cp.async and taking the sines after the sums (H200,
 * bench_cuda_batch, generated tok/s at 1 / 2 sequences): llama3-8b 428-429 / 654-655 against 419 / 647-649,
 * qwen2-1.5b 993 / 1,595-1,602 against 998-999 / 1,579-1,582. */
struct rope_block {
    float b0[ROPE_BLOCK_PAIRS], b1[ROPE_BLOCK_PAIRS];
    float sn[ROPE_BLOCK_PAIRS * ROPE_BLOCK_TOKENS], cs[ROPE_BLOCK_PAIRS * ROPE_BLOCK_TOKENS];
    int slot[ROPE_BLOCK_TOKENS];
};

__device__ __forceinline__ int block_thread() { return threadIdx.y * blockDim.x + threadIdx.x; }

/* Whether dim d of a row of role `role` rotates. */
__device__ __forceinline__ bool rope_rotates(const batch_rope &r, int role, int d) {
    return role < 2 && d < r.a.rope_dim;
}

/* s for the block's `pairs` pairs from row row0 of a matrix of role `role`, and its tokens j0 .. j0 + tokens
 * (every thread calls it). */
__device__ __forceinline__ void rope_block_prepare(const batch_rope &r, int role, int row0, int pairs, int j0,
                                                   int tokens, rope_block &s) {
    int t = block_thread(), n_threads = blockDim.x * blockDim.y;
    const float *bias = role == 0 ? r.bias[0] : role == 1 ? r.bias[1] : r.bias[2];
    if (t < pairs) s.b0[t] = bias ? bias[row0 + 2 * t] : 0.0f, s.b1[t] = bias ? bias[row0 + 2 * t + 1] : 0.0f;
    if (t < tokens) s.slot[t] = r.d_slot[j0 + t];
    for (int k = t; k < pairs * tokens; k += n_threads) {
        int j = k / pairs, d = (row0 + 2 * (k % pairs)) % r.a.head_dim;
        float sn = 0.0f, cs = 1.0f;
        if (rope_rotates(r, role, d)) sincosf(__fmul_rn((float)r.d_pos[j0 + j], r.a.freq[d / 2]), &sn, &cs);
        s.sn[k] = sn, s.cs[k] = cs;
    }
}

/* The stage for every (pair, token) of the block (every thread calls it, once its results are in vals:
 * vals[j * 2 * pairs + i] is token j0 + j's result of row row0 + i). */
__device__ __forceinline__ void rope_block_finish(const batch_rope &r, int role, int row0, int pairs, int j0,
                                                  int tokens, const float *vals, const rope_block &s) {
    __syncthreads();
    const kiln_cuda_paged_args &a = r.a;
    for (int k = block_thread(); k < pairs * tokens; k += blockDim.x * blockDim.y) {
        int j = k / pairs, p = k % pairs, row = row0 + 2 * p, d = row % a.head_dim;
        float x0 = __fadd_rn(vals[j * 2 * pairs + 2 * p], s.b0[p]);
        float x1 = __fadd_rn(vals[j * 2 * pairs + 2 * p + 1], s.b1[p]);
        if (rope_rotates(r, role, d)) {
            float sn = s.sn[k], cs = s.cs[k];
            float r0 = __fmaf_rn(x0, cs, -__fmul_rn(x1, sn)), r1 = __fmaf_rn(x0, sn, __fmul_rn(x1, cs));
            x0 = r0, x1 = r1;
        }
        if (role == 0) {
            float *dst = r.q + (int64_t)(j0 + j) * a.n_head * a.head_dim + row;
            dst[0] = __fmul_rn(x0, a.q_scale), dst[1] = __fmul_rn(x1, a.q_scale);
            continue;
        }
        int slot = s.slot[j];
        __half *c = (role == 1 ? r.k_cache : r.v_cache) +
                    paged_row(a, slot / a.block_size, row / a.head_dim, slot % a.block_size) + d;
        c[0] = __float2half(x0), c[1] = __float2half(x1);
    }
}

#endif

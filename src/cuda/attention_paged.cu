/* The attention of a batched step over a paged KV cache: each token of the step belongs to a sequence whose cache
 * rows sit in fixed-size blocks named by its block table. One launch stores every token's rotated K and its V into
 * its own slot (where the Q/K/V GEMV does not in its epilogue: paged_rope.cuh); then split-K flash decoding runs
 * per (head, token) over the positions that token sees, found through its table, and a merge kernel combines the
 * slices (and quantizes the result for the output projection).
 *
 * Batch invariance: a token's slices depend only on how many positions it sees (never on the step's other tokens),
 * and the merge adds them in slice order, so its attention output is the same whoever shares the step.
 *
 * Cache layout per layer: [block][kv head][position in block][head_dim] halves, so a block's rows for one head are
 * one contiguous run. */
#include "cuda/attention_slice.cuh"
#include "cuda/cuda_common.cuh"
#include "cuda/kernels_batch.h"
#include "cuda/paged_rope.cuh"
#include "cuda/rope_head.cuh"

#define PAGED_WARPS 4

/* One block per (head, token), as rope.cu: bias, rotation, q scale, and the F16 stores of k and v at the slot. */
__global__ void rope_store_paged_kernel(kiln_cuda_paged_args a, float *q, const float *k, const float *v,
                                        const float *bq, const float *bk, const float *bv, __half *k_cache,
                                        __half *v_cache, const int32_t *d_pos, const int32_t *d_slot) {
    pdl_release_and_wait();
    int head = blockIdx.x, t = blockIdx.y;
    int pos = d_pos[t], slot = d_slot[t];
    int64_t row = paged_row(a, slot / a.block_size, rope_kv_head(a, head), slot % a.block_size);
    rope_store_head(a, head, t, pos, q, k, v, bq, bk, bv, k_cache + row, v_cache + row);
}

/* Positions a warp takes in one round (every PAGED_WARPS-th of its slice): their table entries, then their K and V
 * rows, are all loaded before the first is used, and their scores reduced together, so a round costs two memory
 * round trips where a position at a time cost two a position (its row's table entry, then its rows). */
#define PAGED_AHEAD 8

/* part per (token, head, slice): max, sum, then head_dim accumulators. */
template <int HD>
__global__ void __launch_bounds__(32 * PAGED_WARPS)
    attn_paged_split_kernel(kiln_cuda_paged_args a, const float *q, const __half *k_cache, const __half *v_cache,
                            const int32_t *d_pos, const int32_t *d_tables, const int32_t *d_table_off, float *part) {
    pdl_release_and_wait();
    constexpr int D = HD / 32;
    int head = blockIdx.x, split = blockIdx.y, t = blockIdx.z;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int n_pos = d_pos[t] + 1;
    int chunk = max(KILN_CUDA_DECODE_MIN_CHUNK, (n_pos + KILN_CUDA_DECODE_SPLITS - 1) / KILN_CUDA_DECODE_SPLITS);
    int begin = split * chunk, end = min(n_pos, begin + chunk);
    if (begin >= end) return; /* a slice past this token's length: the merge does not read it */
    int kvh = head / (a.n_head / a.n_head_kv);
    const int32_t *table = d_tables + d_table_off[t];
    const float *qh = q + ((int64_t)t * a.n_head + head) * HD;

    float qr[D], acc[D];
#pragma unroll
    for (int d = 0; d < D; d++) qr[d] = qh[lane * D + d], acc[d] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int p0 = begin + warp; p0 < end; p0 += PAGED_WARPS * PAGED_AHEAD) {
        int blk[PAGED_AHEAD];
#pragma unroll
        for (int i = 0; i < PAGED_AHEAD; i++) {
            int p = p0 + i * PAGED_WARPS;
            blk[i] = p < end ? table[p / a.block_size] : 0;
        }
        halves<D> kf[PAGED_AHEAD] = {}, vf[PAGED_AHEAD] = {}; /* zeros past the slice: scored, never used */
#pragma unroll
        for (int i = 0; i < PAGED_AHEAD; i++) {
            int p = p0 + i * PAGED_WARPS;
            if (p >= end) continue;
            int64_t row = paged_row(a, blk[i], kvh, p % a.block_size) + lane * D;
            kf[i] = load_halves<D>(k_cache + row), vf[i] = load_halves<D>(v_cache + row);
        }
        float s[PAGED_AHEAD], mx = m;
#pragma unroll
        for (int i = 0; i < PAGED_AHEAD; i++) {
            float v = 0.0f;
#pragma unroll
            for (int d = 0; d < D; d++) v += qr[d] * half_at<D>(kf[i], d);
            s[i] = warp_sum(v);
            if (p0 + i * PAGED_WARPS < end) mx = fmaxf(mx, s[i]);
        }
        float corr = expf(m - mx); /* 0 on the first round (m = -inf) */
        l *= corr;
#pragma unroll
        for (int d = 0; d < D; d++) acc[d] *= corr;
#pragma unroll
        for (int i = 0; i < PAGED_AHEAD; i++) {
            if (p0 + i * PAGED_WARPS >= end) continue;
            float w = expf(s[i] - mx);
            l += w;
#pragma unroll
            for (int d = 0; d < D; d++) acc[d] += w * half_at<D>(vf[i], d);
        }
        m = mx;
    }

    float *out = part + (((int64_t)t * a.n_head + head) * KILN_CUDA_DECODE_SPLITS + split) * (HD + 2);
    write_slice<HD, PAGED_WARPS>(m, l, acc, out);
}

/* One block per (head, token), a thread per dim; with out_q the merged row is also quantized to Q8_1 (a warp holds
 * 32 consecutive dims, one Q8_1 block). Only the slices the token's length gives are read. */
__global__ void attn_paged_merge_kernel(kiln_cuda_paged_args a, const int32_t *d_pos, const float *part, float *out,
                                        int8_t *out_q, int n_tokens) {
    pdl_release_and_wait();
    int head = blockIdx.x, t = blockIdx.y, d = threadIdx.x;
    int hd = a.head_dim;
    int n_pos = d_pos[t] + 1;
    int chunk = max(KILN_CUDA_DECODE_MIN_CHUNK, (n_pos + KILN_CUDA_DECODE_SPLITS - 1) / KILN_CUDA_DECODE_SPLITS);
    int n_split = (n_pos + chunk - 1) / chunk;
    const float *p = part + ((int64_t)t * a.n_head + head) * KILN_CUDA_DECODE_SPLITS * (hd + 2);
    float mx = -INFINITY;
    for (int s = 0; s < n_split; s++) mx = fmaxf(mx, p[s * (hd + 2)]);
    float num = 0.0f, den = 0.0f;
    for (int s = 0; s < n_split; s++) {
        const float *ps = p + s * (hd + 2);
        float w = expf(ps[0] - mx);
        num += ps[2 + d] * w;
        den += ps[1] * w;
    }
    store_merged(num / den, out, out_q, ((int64_t)t * a.n_head + head) * hd + d, (int64_t)n_tokens * a.n_head * hd);
}

extern "C" void kiln_cuda_rope_store_paged(const kiln_cuda_paged_args *a, float *q, const float *k, const float *v,
                                           const float *bq, const float *bk, const float *bv, void *k_cache,
                                           void *v_cache, const int32_t *d_pos, const int32_t *d_slot, int n_tokens,
                                           cudaStream_t stream) {
    dim3 grid(a->n_head + a->n_head_kv, n_tokens);
    int threads = a->head_dim / 2 < 128 ? a->head_dim / 2 : 128;
    threads = (threads + 31) / 32 * 32;
    launch_pdl(rope_store_paged_kernel, grid, threads, stream, *a, q, k, v, bq, bk, bv, (__half *)k_cache,
               (__half *)v_cache, d_pos, d_slot);
}

extern "C" int kiln_cuda_attention_paged(const kiln_cuda_paged_args *a, const float *q, const void *k_cache,
                                         const void *v_cache, const int32_t *d_pos, const int32_t *d_tables,
                                         const int32_t *d_table_off, int n_tokens, int max_n_pos, float *part,
                                         float *out, void *out_q, cudaStream_t stream) {
    const __half *kc = (const __half *)k_cache, *vc = (const __half *)v_cache;
    /* a token of n positions has at most n / KILN_CUDA_DECODE_MIN_CHUNK slices (rounded up); blocks past its own
     * still leave at once, but a grid of every possible slice was mostly such blocks at short contexts */
    int splits = div_up(max_n_pos, KILN_CUDA_DECODE_MIN_CHUNK);
    splits = splits < 1 ? 1 : splits > KILN_CUDA_DECODE_SPLITS ? KILN_CUDA_DECODE_SPLITS : splits;
    dim3 grid(a->n_head, splits, n_tokens);
    switch (a->head_dim) {
#define X(HD)                                                                                                          \
    case HD:                                                                                                           \
        launch_pdl(attn_paged_split_kernel<HD>, grid, 32 * PAGED_WARPS, stream, *a, q, kc, vc, d_pos, d_tables,        \
                   d_table_off, part);                                                                                 \
        break;
        X(64) X(128) X(256)
#undef X
    default: return -1;
    }
    launch_pdl(attn_paged_merge_kernel, dim3(a->n_head, n_tokens), a->head_dim, stream, *a, d_pos, part, out,
               (int8_t *)out_q, n_tokens);
    return 0;
}

/* The attention of a batched step over a paged KV cache: each token of the step belongs to a sequence whose cache
 * rows sit in fixed-size blocks named by its block table. One launch stores every token's rotated K and its V into
 * its own slot (where the Q/K/V GEMV does not in its epilogue: paged_rope.cuh); then split-K flash decoding runs
 * per (head, token) over the positions that token sees, found through its table, and a merge kernel combines the
 * slices (and writes the result as the output projection's input too: Q8_1, or half mode's F16).
 *
 * Batch invariance: a token's slices depend only on how many positions it sees (never on the step's other tokens),
 * and the merge adds them in slice order, so its attention output is the same whoever shares the step.
 *
 * Cache layout per layer: [block][kv head][position in block][head_dim] halves, so a block's rows for one head are
 * one contiguous run. */
#include <stdlib.h>

#include "cuda/attention_slice.cuh"
#include "cuda/cuda_common.cuh"
#include "cuda/half_parts.cuh"
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

/* The 32 partial sums of a lane (index gq * 8 + i: head gq of a quad, position i of a round) summed over the warp
 * by halving exchanges, each lane keeping the half its lane bit names: then lane L holds the whole sum of index L.
 * 31 shuffles where a warp_sum each took 160; the pairs are warp_sum's (lane L and L ^ 16 first, then 8, ...), so
 * every sum has warp_sum's bits. */
template <int W = 16>
__device__ __forceinline__ float reduce_scatter32(float (&v)[32], int lane) {
    bool up = lane & W;
#pragma unroll
    for (int j = 0; j < W; j++) {
        float keep = up ? v[j + W] : v[j], send = up ? v[j] : v[j + W];
        v[j] = keep + __shfl_xor_sync(0xffffffffu, send, W);
    }
    if constexpr (W > 1) return reduce_scatter32<W / 2>(v, lane);
    else return v[0];
}

/* x[i] of a constant-indexed array picked by a run-time i < N (no local memory). */
template <int N>
__device__ __forceinline__ float pick_of(const float (&x)[N], int i) {
    float r = x[0];
#pragma unroll
    for (int j = 1; j < N; j++) r = i == j ? x[j] : r;
    return r;
}

/* One round of the split kernel for heads q0..q0+3 (those below G) of a block: each head's scores of the round's
 * PAGED_AHEAD positions (lane gq * 8 + i holds head gq's score of position i after reduce_scatter32), the online
 * softmax, then the V rows into acc. Each lane takes one exp of a score where each took all of them (and shuffles
 * it to the others); the scores, maxima, exps and sums are those of the head-by-head form it replaced, in the same
 * order. */
template <int D, int G>
__device__ __forceinline__ void quad_round(int q0, const float (&qr)[G][D], const halves<D> (&kf)[PAGED_AHEAD],
                                           const halves<D> (&vf)[PAGED_AHEAD], int p0, int end, int lane,
                                           float (&m)[G], float (&l)[G], float (&acc)[G][D]) {
    static_assert(PAGED_AHEAD == 8, "a quad's 4 heads of 8 positions are a warp's 32 lanes");
    float v[32];
#pragma unroll
    for (int gq = 0; gq < 4; gq++)
#pragma unroll
        for (int i = 0; i < PAGED_AHEAD; i++) {
            float x = 0.0f; /* heads past G (a quad's padding) score 0; their index below stays in bounds */
            if (q0 + gq < G)
#pragma unroll
                for (int d = 0; d < D; d++) x += qr[q0 + gq < G ? q0 + gq : 0][d] * half_at<D>(kf[i], d);
            v[gq * 8 + i] = x;
        }
    float s = reduce_scatter32(v, lane);
    bool valid = p0 + (lane & 7) * PAGED_WARPS < end;
    float sm = valid ? s : -INFINITY; /* the head's maximum over the round's positions: its 8 lanes */
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) sm = fmaxf(sm, __shfl_xor_sync(0xffffffffu, sm, o));
    float mx[4];
#pragma unroll
    for (int gq = 0; gq < 4; gq++) {
        int g = q0 + gq < G ? q0 + gq : 0;
        mx[gq] = fmaxf(m[g], __shfl_sync(0xffffffffu, sm, gq * 8));
    }
    float w = valid ? expf(s - pick_of(mx, lane >> 3)) : 0.0f;
#pragma unroll
    for (int gq = 0; gq < 4; gq++) {
        int g = q0 + gq;
        if (g >= G) break;
        float corr = expf(m[g] - mx[gq]); /* 0 on the first round (m = -inf) */
        l[g] *= corr;
#pragma unroll
        for (int d = 0; d < D; d++) acc[g][d] *= corr;
#pragma unroll
        for (int i = 0; i < PAGED_AHEAD; i++) {
            float wi = __shfl_sync(0xffffffffu, w, gq * 8 + i);
            if (p0 + i * PAGED_WARPS >= end) continue;
            l[g] += wi;
#pragma unroll
            for (int d = 0; d < D; d++) acc[g][d] += wi * half_at<D>(vf[i], d);
        }
        m[g] = mx[gq];
    }
}

/* part per (token, head, slice): max, sum, then head_dim accumulators. A block takes G heads of one K/V head (grid
 * x: n_head / G), so each K/V row it loads serves G heads; a head's operations are the same whatever G (the same
 * positions a warp, rounds, reductions and order), so G changes no bit of the result, only how often a row is
 * loaded and how many blocks there are (paged_heads_a_block). */
template <int HD, int G>
__global__ void __launch_bounds__(32 * PAGED_WARPS)
    attn_paged_split_kernel(kiln_cuda_paged_args a, const float *q, const __half *k_cache, const __half *v_cache,
                            const int32_t *d_pos, const int32_t *d_tables, const int32_t *d_table_off, float *part) {
    pdl_release_and_wait();
    constexpr int D = HD / 32;
    int head0 = blockIdx.x * G, split = blockIdx.y, t = blockIdx.z;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int n_pos = d_pos[t] + 1;
    int chunk = max(KILN_CUDA_DECODE_MIN_CHUNK, (n_pos + KILN_CUDA_DECODE_SPLITS - 1) / KILN_CUDA_DECODE_SPLITS);
    int begin = split * chunk, end = min(n_pos, begin + chunk);
    if (begin >= end) return; /* a slice past this token's length: the merge does not read it */
    int kvh = head0 / (a.n_head / a.n_head_kv);
    const int32_t *table = d_tables + d_table_off[t];

    float qr[G][D], acc[G][D], m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float *qh = q + ((int64_t)t * a.n_head + head0 + g) * HD;
#pragma unroll
        for (int d = 0; d < D; d++) qr[g][d] = qh[lane * D + d], acc[g][d] = 0.0f;
        m[g] = -INFINITY, l[g] = 0.0f;
    }
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
#pragma unroll
        for (int q0 = 0; q0 < G; q0 += 4)
            quad_round<D, G>(q0, qr, kf, vf, p0, end, lane, m, l, acc);
    }
    /* every head's results of every warp shared behind one barrier (a head at a time took two a head), then each
     * head's slice combined as write_slice does */
    __shared__ warp_results<HD, PAGED_WARPS> r[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (lane == 0) r[g].m[warp] = m[g], r[g].l[warp] = l[g];
#pragma unroll
        for (int d = 0; d < D; d++) r[g].acc[warp][lane * D + d] = acc[g][d];
    }
    sync_warps<PAGED_WARPS>();
#pragma unroll
    for (int g = 0; g < G; g++)
        combine_slice<HD, PAGED_WARPS>(
            r[g], part + (((int64_t)t * a.n_head + head0 + g) * KILN_CUDA_DECODE_SPLITS + split) * (HD + 2));
}

/* One block per (head, token), a thread per dim; with out_q the merged row is also quantized to Q8_1 (a warp holds
 * 32 consecutive dims, one Q8_1 block), with out_h written as half mode's F16 input (half_parts.cuh). Only the
 * slices the token's length gives are read. */
__global__ void attn_paged_merge_kernel(kiln_cuda_paged_args a, const int32_t *d_pos, const float *part, float *out,
                                        int8_t *out_q, __half *out_h, int n_tokens) {
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
    float o = num / den;
    if (out_h) out_h[half_parts_at(t, head * hd + d, n_tokens)] = __float2half_rn(o);
    store_merged(o, out, out_q, ((int64_t)t * a.n_head + head) * hd + d, (int64_t)n_tokens * a.n_head * hd);
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

/* The (head_dim, heads a block) pairs built: a K/V head's query heads together where their accumulators fit a
 * lane's registers (G * head_dim / 32 <= 32), every head_dim alone. */
#define PAGED_GROUPS(X)                                                                                                \
    X(64, 1) X(128, 1) X(256, 1) X(64, 2) X(64, 3) X(64, 4) X(64, 6) X(64, 7) X(64, 8) X(128, 2) X(128, 3) X(128, 4)  \
        X(128, 6) X(128, 7) X(128, 8) X(256, 2) X(256, 3) X(256, 4)

static bool paged_group_built(int head_dim, int g) {
    switch (head_dim * 16 + g) {
#define X(HD, G)                                                                                                       \
    case HD * 16 + G: return true;
        PAGED_GROUPS(X)
#undef X
    default: return false;
    }
}

/* Query heads a block of the split kernel takes: the most of a K/V head's (a divisor of them, where that form is
 * built) with which the launch still has 2.5 blocks an SM, else one: fewer, longer blocks lose while they leave SMs
 * idle. H200, bench_cuda_batch, generated tok/s, all of a K/V head's always against never: qwen2-1.5b (2 K/V heads,
 * 8 slices) at 1 / 2 / 8 / 16 / 24 / 32 / 48 / 64 sequences 844-855 / 1,424-1,442 / 3,668-3,695 / 6,083-6,085 /
 * 7,541-7,572 / 8,485-8,530 / 9,753-9,789 / 10,474-10,522 against 980-981 / 1,581-1,584 / 3,749-3,750 /
 * 6,095-6,107 / 7,431-7,453 / 8,366-8,370 / 9,507 / 10,086-10,111; llama3-8b (8 K/V heads) at 1 / 2 / 4 / 8 / 12 /
 * 64 402-404 / 634-635 / 806 / 1,261-1,264 / 1,486-1,489 / 3,026-3,027 against 428-429 / 655-656 / 809-811 /
 * 1,258-1,260 / 1,478 / 2,917-2,918: the crossing is near 300-380 blocks. Between the two, part of a K/V head's
 * (half mode, 6 slices, qwen2-1.5b's 6 query heads a K/V head): 3 a block at 8 / 16 / 64 sequences 4,729-4,746 /
 * 8,133-8,151 / 20,890-20,939 against 6 a block 4,551 / 7,915-7,945 / 21,001 and the rule of all or one 4,738 /
 * 7,778-7,821 / 21,101-21,128 (2 a block: 4,679-4,689 / 8,062-8,072 / 21,009-21,029).
 * KILN_CUDA_ATTN_GROUP=0 / 1 / g: never / always / g heads a block where g divides a K/V head's and is built (read
 * once, for comparisons; kiln_cuda_attention_paged_group sets it too). The bits are the same either way. */
static int group_mode = -2; /* -1: by the rule above, 0 never, 1 always, g > 1 g; -2: the environment not read yet */

extern "C" void kiln_cuda_attention_paged_group(int mode) { group_mode = mode; }

static int paged_heads_a_block(const kiln_cuda_paged_args *a, int splits, int n_tokens) {
    if (group_mode == -2) {
        const char *e = getenv("KILN_CUDA_ATTN_GROUP");
        group_mode = e && *e ? atoi(e) : -1;
    }
    int heads = a->n_head / a->n_head_kv;
    if (group_mode == 0) return 1;
    if (group_mode > 0) {
        int g = group_mode == 1 ? heads : group_mode;
        return heads % g == 0 && paged_group_built(a->head_dim, g) ? g : 1;
    }
    int64_t slices = (int64_t)a->n_head * splits * n_tokens; /* (head, slice, token)s: the blocks at one head */
    for (int g = heads; g > 1; g--)
        if (heads % g == 0 && paged_group_built(a->head_dim, g) && 2 * (slices / g) >= 5 * (int64_t)sm_count())
            return g;
    return 1;
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
    int g = paged_heads_a_block(a, splits, n_tokens);
    dim3 grid(a->n_head / g, splits, n_tokens);
    switch (a->head_dim * 16 + g) {
#define X(HD, G)                                                                                                       \
    case HD * 16 + G:                                                                                                  \
        launch_pdl(attn_paged_split_kernel<HD, G>, grid, 32 * PAGED_WARPS, stream, *a, q, kc, vc, d_pos, d_tables,     \
                   d_table_off, part);                                                                                 \
        break;
        PAGED_GROUPS(X)
#undef X
    default: return -1;
    }
    bool half = kiln_cuda_batch_half();
    launch_pdl(attn_paged_merge_kernel, dim3(a->n_head, n_tokens), a->head_dim, stream, *a, d_pos, part, out,
               half ? nullptr : (int8_t *)out_q, half ? (__half *)out_q : nullptr, n_tokens);
    return 0;
}

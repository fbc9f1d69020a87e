/* The k best logits of a row on the device, for sampling with top-k: instead of the row (n_vocab floats across
 * PCIe, then a pass over all of them on the host), the sampler gets k (id, logit) pairs. Ranked by logit, then by the
 * lower id, the order the host sampler ranks in, so the set at the cut is the same when logits tie.
 *
 * A block orders a tile of TOPK_TILE values in shared memory (bitonic networks) and keeps its best k; the kept ones
 * of all tiles are tiles again for the next pass, until one tile is left. 152k logits and k = 40 take three passes.
 * Two ways to order a tile, both measured by bench_cuda_decode: a full sort, and runs of k sorted then merged in
 * pairs that keep the better half (the default). */
#include <limits.h>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"

#define TOPK_THREADS 1024
#define TOPK_TILE (2 * TOPK_THREADS)

/* a ranks before b */
__device__ __forceinline__ bool ranks_before(float av, int32_t ai, float bv, int32_t bi) {
    return av > bv || (av == bv && ai < bi);
}

/* Tile blockIdx.x of row blockIdx.y of v (rows n apart; ids: id[i] of the row, or i where id is NULL; past n: -inf,
 * ranked last) into shared memory. */
__device__ __forceinline__ void load_tile(const float *v, const int32_t *id, int n, float *sv, int32_t *si) {
    int64_t base = (int64_t)blockIdx.x * TOPK_TILE;
    v += (int64_t)blockIdx.y * n;
    if (id) id += (int64_t)blockIdx.y * n;
    for (int i = threadIdx.x; i < TOPK_TILE; i += TOPK_THREADS) {
        int64_t g = base + i;
        sv[i] = g < n ? v[g] : -INFINITY;
        si[i] = g < n ? (id ? id[g] : (int32_t)g) : INT_MAX;
    }
}

/* The tile's first k (its best, once ordered) to place k * blockIdx.x of row blockIdx.y (rows out_n apart). */
__device__ __forceinline__ void store_best(const float *sv, const int32_t *si, int k, float *out_v, int32_t *out_id,
                                           int out_n) {
    __syncthreads();
    int64_t at = (int64_t)blockIdx.y * out_n + (int64_t)blockIdx.x * k;
    for (int i = threadIdx.x; i < k; i += TOPK_THREADS) out_v[at + i] = sv[i], out_id[at + i] = si[i];
}

/* Places i and j in order: the better first, or with best_first false the worse first. */
__device__ __forceinline__ void order_pair(float *sv, int32_t *si, int i, int j, bool best_first) {
    if (ranks_before(sv[j], si[j], sv[i], si[i]) == best_first) {
        float tv = sv[i];
        int32_t ti = si[i];
        sv[i] = sv[j], si[i] = si[j], sv[j] = tv, si[j] = ti;
    }
}

/* Thread t's pair at this stride: i with a zero inserted at the stride's bit, and i + stride. */
__device__ __forceinline__ int pair_at(int t, int stride) { return ((t & ~(stride - 1)) << 1) | (t & (stride - 1)); }

/* The tile (load_tile) reduced to its best run of `run` (a power of two >= k) without sorting
 * all of it: runs of `run` are sorted in alternating directions, then pairs of runs merge, each keeping the better
 * of its two elements at every place (a bitonic run holding the pair's best `run`), sorted again, halving the tile
 * each round. About half the shared-memory traffic of the full sort for k = 40. */
__global__ void __launch_bounds__(TOPK_THREADS)
    top_k_tile_halving_kernel(const float *v, const int32_t *id, int n, int k, float *out_v, int32_t *out_id,
                              int out_n, int run) {
    __shared__ float sv[TOPK_TILE];
    __shared__ int32_t si[TOPK_TILE];
    load_tile(v, id, n, sv, si);
    int t = threadIdx.x;
    /* the full sort's first levels: runs of `run` sorted, run r best first when r is even */
    for (int size = 2; size <= run; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            int i = pair_at(t, stride);
            order_pair(sv, si, i, i + stride, (i & size) == 0);
        }
    for (int m = TOPK_TILE; m > run; m >>= 1) {
        /* runs 2p (best first) and 2p + 1 (worst first) make a bitonic 2 * run: the better of places i and i + run
         * are its best run, which becomes run p */
        __syncthreads();
        float bv = 0.0f;
        int32_t bi = 0;
        bool active = t < m / 2;
        if (active) {
            int p = t / run, i = 2 * p * run + t % run, j = i + run;
            bool first = ranks_before(sv[i], si[i], sv[j], si[j]);
            bv = first ? sv[i] : sv[j], bi = first ? si[i] : si[j];
        }
        __syncthreads();
        if (active) sv[t] = bv, si[t] = bi;
        for (int stride = run >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            if (t < m / 4) {
                int i = pair_at(t, stride);
                order_pair(sv, si, i, i + stride, (i & run) == 0);
            }
        }
    }
    store_best(sv, si, k, out_v, out_id, out_n);
}

/* The tile (load_tile) sorted best first, all of it; its k best out (store_best). */
__global__ void __launch_bounds__(TOPK_THREADS)
    top_k_tile_kernel(const float *v, const int32_t *id, int n, int k, float *out_v, int32_t *out_id, int out_n) {
    __shared__ float sv[TOPK_TILE];
    __shared__ int32_t si[TOPK_TILE];
    load_tile(v, id, n, sv, si);
    /* bitonic: each step a thread orders one pair (i, i + stride); runs of `size` alternate direction, so the whole
     * tile ends in the best-first direction */
    for (int size = 2; size <= TOPK_TILE; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            int i = pair_at(threadIdx.x, stride);
            order_pair(sv, si, i, i + stride, (i & size) == 0);
        }
    store_best(sv, si, k, out_v, out_id, out_n);
}

static int tiles(int n) { return div_up(n, TOPK_TILE); }

/* KILN_CUDA_TOPK=1: the full sort of each tile (top_k_tile_kernel), for comparisons; else the halving one. Read at
 * each call (a few hundred ns against a decode step's tens of us), so a bench can switch in one process. */
static int top_k_version() {
    const char *e = getenv("KILN_CUDA_TOPK");
    return e && *e ? atoi(e) : 2;
}

extern "C" size_t kiln_cuda_top_k_scratch_bytes(int n, int rows, int k) {
    /* two ping-pong arrays of (value, id) for the first pass's tiles' k best each, per row */
    return 2 * (size_t)rows * (size_t)tiles(n) * (size_t)k * (sizeof(float) + sizeof(int32_t));
}

extern "C" int kiln_cuda_top_k(const float *v, int n, int rows, int k, void *scratch, float *out_v, int32_t *out_id,
                               cudaStream_t stream) {
    if (k < 1 || k > KILN_CUDA_TOP_K_MAX || k > n || rows < 1 || rows > 65535) return -1;
    int run = 2;
    while (run < k) run <<= 1;
    size_t half = (size_t)rows * (size_t)tiles(n) * (size_t)k;
    float *sv[2] = {(float *)scratch, (float *)scratch + half};
    int32_t *si[2] = {(int32_t *)(sv[1] + half), (int32_t *)(sv[1] + half) + half};
    const float *in_v = v;
    const int32_t *in_id = NULL;
    for (int pass = 0;; pass++) {
        int blocks = tiles(n);
        bool last = blocks == 1;
        float *ov = last ? out_v : sv[pass & 1];
        int32_t *oi = last ? out_id : si[pass & 1];
        int out_n = last ? k : blocks * k;
        if (top_k_version() == 1)
            top_k_tile_kernel<<<dim3(blocks, rows), TOPK_THREADS, 0, stream>>>(in_v, in_id, n, k, ov, oi, out_n);
        else
            top_k_tile_halving_kernel<<<dim3(blocks, rows), TOPK_THREADS, 0, stream>>>(in_v, in_id, n, k, ov, oi,
                                                                                       out_n, run);
        if (last) return cudaGetLastError() == cudaSuccess ? 0 : -1;
        in_v = ov, in_id = oi, n = out_n;
    }
}

__global__ void gather_f32_kernel(const float *v, const int32_t *ids, int n, float *out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = v[ids[i]];
}

extern "C" void kiln_cuda_gather_f32(const float *v, const int32_t *ids, int n, float *out, cudaStream_t stream) {
    if (n > 0) gather_f32_kernel<<<div_up(n, 256), 256, 0, stream>>>(v, ids, n, out);
}

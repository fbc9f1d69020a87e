/* The k best logits of a row on the device, for sampling with top-k: instead of the row (n_vocab floats across
 * PCIe, then a pass over all of them on the host), the sampler gets k (id, logit) pairs. Ranked by logit, then by the
 * lower id, the order the host sampler ranks in, so the set at the cut is the same when logits tie.
 *
 * A block sorts a tile of TOPK_TILE values in shared memory (bitonic) and keeps its best k; the kept ones of all
 * tiles are tiles again for the next pass, until one tile is left. 152k logits and k = 40 take three passes. */
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
 * ranked last) sorted best first, its k best to out_v / out_id at k * blockIdx.x of the row (rows out_n apart). */
__global__ void __launch_bounds__(TOPK_THREADS)
    top_k_tile_kernel(const float *v, const int32_t *id, int n, int k, float *out_v, int32_t *out_id, int out_n) {
    __shared__ float sv[TOPK_TILE];
    __shared__ int32_t si[TOPK_TILE];
    int64_t base = (int64_t)blockIdx.x * TOPK_TILE;
    v += (int64_t)blockIdx.y * n;
    if (id) id += (int64_t)blockIdx.y * n;
    out_v += (int64_t)blockIdx.y * out_n, out_id += (int64_t)blockIdx.y * out_n;
    for (int i = threadIdx.x; i < TOPK_TILE; i += TOPK_THREADS) {
        int64_t g = base + i;
        sv[i] = g < n ? v[g] : -INFINITY;
        si[i] = g < n ? (id ? id[g] : (int32_t)g) : INT_MAX;
    }
    /* bitonic: each step a thread orders one pair (i, i + stride); runs of `size` alternate direction, so the whole
     * tile ends in the best-first direction */
    for (int size = 2; size <= TOPK_TILE; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            int t = threadIdx.x, i = ((t & ~(stride - 1)) << 1) | (t & (stride - 1)), j = i + stride;
            bool best_first = (i & size) == 0;
            if (ranks_before(sv[j], si[j], sv[i], si[i]) == best_first) {
                float tv = sv[i];
                int32_t ti = si[i];
                sv[i] = sv[j], si[i] = si[j], sv[j] = tv, si[j] = ti;
            }
        }
    __syncthreads();
    for (int i = threadIdx.x; i < k; i += TOPK_THREADS)
        out_v[(int64_t)blockIdx.x * k + i] = sv[i], out_id[(int64_t)blockIdx.x * k + i] = si[i];
}

static int tiles(int n) { return div_up(n, TOPK_TILE); }

extern "C" size_t kiln_cuda_top_k_scratch_bytes(int n, int rows, int k) {
    /* two ping-pong arrays of (value, id) for the first pass's tiles' k best each, per row */
    return 2 * (size_t)rows * (size_t)tiles(n) * (size_t)k * (sizeof(float) + sizeof(int32_t));
}

extern "C" int kiln_cuda_top_k(const float *v, int n, int rows, int k, void *scratch, float *out_v, int32_t *out_id,
                               cudaStream_t stream) {
    if (k < 1 || k > KILN_CUDA_TOP_K_MAX || k > n || rows < 1 || rows > 65535) return -1;
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
        top_k_tile_kernel<<<dim3(blocks, rows), TOPK_THREADS, 0, stream>>>(in_v, in_id, n, k, ov, oi, out_n);
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

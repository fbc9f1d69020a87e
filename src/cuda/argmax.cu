/* Greedy selection on the device, so only a token id crosses to the host; the thread that writes the id may also
 * advance a captured decode step's position. */
#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"

/* Two launches: blocks of ARGMAX_THREADS threads each take ARGMAX_SPAN consecutive values, every thread's
 * ARGMAX_PER_THREAD loads issued before any comparison, and leave their best in the scratch; one warp then reduces
 * the blocks' bests. A single block over the vocabulary (151,936 values on qwen2-1.5b) was a chain of round trips,
 * and one SM's share of L2 bandwidth at best. */
#define ARGMAX_THREADS 256
#define ARGMAX_PER_THREAD 8
#define ARGMAX_SPAN (ARGMAX_THREADS * ARGMAX_PER_THREAD)

struct argmax_best {
    float v;
    int i;
};

__device__ __forceinline__ void keep_best(float &v, int &i, float ov, int oi) {
    if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
}

__device__ __forceinline__ void warp_best(float &v, int &i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, i, o);
        keep_best(v, i, ov, oi);
    }
}

__global__ void __launch_bounds__(ARGMAX_THREADS) argmax_blocks_kernel(const float *x, int n, argmax_best *best) {
    pdl_wait_and_release();
    int base = blockIdx.x * ARGMAX_SPAN + threadIdx.x;
    float v[ARGMAX_PER_THREAD];
#pragma unroll
    for (int j = 0; j < ARGMAX_PER_THREAD; j++) {
        int i = base + j * ARGMAX_THREADS;
        v[j] = i < n ? x[i] : -INFINITY;
    }
    float bv = -INFINITY;
    int bi = n; /* beaten by any real index, also when every value is -inf; never by one past the end */
#pragma unroll
    for (int j = 0; j < ARGMAX_PER_THREAD; j++) keep_best(bv, bi, v[j], base + j * ARGMAX_THREADS);
    warp_best(bv, bi);
    __shared__ argmax_best warps[ARGMAX_THREADS / 32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warps[warp] = argmax_best{bv, bi};
    __syncthreads();
    if (warp != 0) return;
    bv = lane < ARGMAX_THREADS / 32 ? warps[lane].v : -INFINITY;
    bi = lane < ARGMAX_THREADS / 32 ? warps[lane].i : n;
    warp_best(bv, bi);
    if (lane == 0) best[blockIdx.x] = argmax_best{bv, bi};
}

__global__ void argmax_final_kernel(const argmax_best *best, int n_blocks, int n, int32_t *out, int32_t *advance) {
    pdl_wait_and_release();
    float bv = -INFINITY;
    int bi = n;
    for (int b = threadIdx.x; b < n_blocks; b += 32) keep_best(bv, bi, best[b].v, best[b].i);
    warp_best(bv, bi);
    if (threadIdx.x == 0) {
        *out = bi < n ? bi : 0;
        if (advance) *advance += 1;
    }
}

extern "C" size_t kiln_cuda_argmax_scratch_bytes(int n) { return sizeof(argmax_best) * (size_t)div_up(n, ARGMAX_SPAN); }

extern "C" void kiln_cuda_argmax(const float *x, int n, void *scratch, int32_t *d_out, int32_t *d_advance,
                                 cudaStream_t stream) {
    int blocks = div_up(n, ARGMAX_SPAN);
    launch_pdl(argmax_blocks_kernel, blocks, ARGMAX_THREADS, stream, x, n, (argmax_best *)scratch);
    launch_pdl(argmax_final_kernel, 1, 32, stream, (const argmax_best *)scratch, blocks, n, d_out, d_advance);
}

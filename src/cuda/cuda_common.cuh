/* Small device helpers shared by the kernel files. */
#ifndef KILN_CUDA_COMMON_CUH
#define KILN_CUDA_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#define KILN_WARP 32

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over a block of up to 1024 threads (blockDim.x a multiple of 32); every thread gets the result. */
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* partial may still be read by a previous call */
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < n_warps ? partial[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

static inline int div_up(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

#endif

/* Greedy selection on the device, so only a token id crosses to the host; and the position counter a captured
 * decode step advances. */
#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"

#define ARGMAX_THREADS 1024

__device__ __forceinline__ void keep_best(float &v, int &i, float ov, int oi) {
    if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
}

__global__ void __launch_bounds__(ARGMAX_THREADS) argmax_kernel(const float *x, int n, int32_t *out) {
    pdl_wait_and_release();
    float best = -INFINITY;
    int idx = n; /* beaten by any real index, also when every value is -inf */
    for (int i = threadIdx.x; i < n; i += ARGMAX_THREADS) keep_best(best, idx, x[i], i);
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        keep_best(best, idx, ov, oi);
    }
    __shared__ float sv[32];
    __shared__ int si[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sv[warp] = best, si[warp] = idx;
    __syncthreads();
    if (warp == 0) {
        best = sv[lane], idx = si[lane];
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, idx, o);
            keep_best(best, idx, ov, oi);
        }
        if (lane == 0) *out = idx < n ? idx : 0;
    }
}

extern "C" void kiln_cuda_argmax(const float *x, int n, int32_t *d_out, cudaStream_t stream) {
    launch_pdl(argmax_kernel, 1, ARGMAX_THREADS, stream, x, n, d_out);
}

__global__ void advance_pos_kernel(int32_t *pos, int delta) {
    pdl_wait_and_release();
    *pos += delta;
}

extern "C" void kiln_cuda_advance_pos(int32_t *d_pos, int delta, cudaStream_t stream) {
    launch_pdl(advance_pos_kernel, 1, 1, stream, d_pos, delta);
}

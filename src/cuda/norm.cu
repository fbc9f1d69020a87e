/* RMSNorm, one block per row, with the residual add folded in (x += residual, then norm) and, optionally, the Q8_1
 * quantization of the result that the next GEMV reads: one pass instead of three launches. */
#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"
#include "cuda/quant_unpack.cuh"

__global__ void __launch_bounds__(1024)
    rmsnorm_kernel(float *x, const float *residual, const float *w, float *out, int8_t *out_q, int n, int n_rows,
                   float eps) {
    pdl_wait_and_release();
    int64_t base = (int64_t)blockIdx.x * n;
    float *xr = x + base;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i];
        if (residual) {
            v += residual[base + i];
            xr[i] = v;
        }
        ss += v * v;
    }
    float scale = rsqrtf(block_sum(ss) / (float)n + eps);
    /* a warp covers 32 consecutive elements per step: exactly one Q8_1 block */
    for (int i0 = 0; i0 < n; i0 += blockDim.x) {
        int i = i0 + threadIdx.x;
        float v = i < n ? xr[i] * scale * w[i] : 0.0f;
        if (i < n) out[base + i] = v;
        if (out_q && i0 + (threadIdx.x & ~31) < n) {
            int64_t blk = (base + i0 + (threadIdx.x & ~31)) / 32, n_blocks = (int64_t)n_rows * n / 32;
            float amax = warp_max(fabsf(v));
            float d = amax / 127.0f;
            int q = amax > 0.0f ? __float2int_rn(v / d) : 0;
            int sum = warp_sum_int(q);
            out_q[blk * 32 + (threadIdx.x & 31)] = (int8_t)q;
            if ((threadIdx.x & 31) == 0) ((__half2 *)(out_q + n_blocks * 32))[blk] = __floats2half2_rn(d, d * (float)sum);
        }
    }
}

extern "C" void kiln_cuda_rmsnorm(float *x, const float *residual, const float *w, float *out, void *out_q, int n,
                                  int n_rows, float eps, cudaStream_t stream) {
    /* one block per row: a single decode row needs wide blocks, or one SM does all the work (four elements per
     * thread at most) */
    int threads = n >= 4096 ? 1024 : n >= 2048 ? 512 : 256;
    launch_pdl(rmsnorm_kernel, n_rows, threads, stream, x, residual, w, out, (int8_t *)out_q, n, n_rows, eps);
}

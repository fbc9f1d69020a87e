/* RMSNorm, one block per row, with the residual add folded in (x += residual, then norm) and, optionally, the Q8_1
 * quantization of the result that the next GEMV reads: one pass instead of three launches. */
#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"
#include "cuda/quant_unpack.cuh"

/* A thread holds PER values of the row, all loaded (x, the residual, w) before any arithmetic: a norm is then one
 * round trip to memory. The loop this replaced waited for each element's loads in turn, eight round trips for
 * llama3-8b's 4096-wide rows (8.6 us a norm under ncu, 64 norms a decode step). */
template <int PER>
__global__ void __launch_bounds__(1024)
    rmsnorm_kernel(float *x, const float *residual, const float *w, float *out, int8_t *out_q, int n, int n_rows,
                   float eps) {
    pdl_wait_and_release();
    int64_t base = (int64_t)blockIdx.x * n;
    float *xr = x + base;
    float v[PER], wv[PER], r[PER];
#pragma unroll
    for (int j = 0; j < PER; j++) {
        int i = threadIdx.x + j * blockDim.x;
        v[j] = i < n ? xr[i] : 0.0f;
        r[j] = residual && i < n ? residual[base + i] : 0.0f;
        wv[j] = i < n ? w[i] : 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        int i = threadIdx.x + j * blockDim.x;
        if (residual) {
            v[j] += r[j];
            if (i < n) xr[i] = v[j];
        }
        ss += v[j] * v[j];
    }
    float scale = rsqrtf(block_sum(ss) / (float)n + eps);
    /* a warp covers 32 consecutive elements per step: exactly one Q8_1 block */
#pragma unroll
    for (int j = 0; j < PER; j++) {
        int i0 = j * blockDim.x, i = i0 + threadIdx.x;
        float o = v[j] * scale * wv[j];
        if (i < n) out[base + i] = o;
        if (out_q && i0 + (threadIdx.x & ~31) < n) {
            int64_t blk = (base + i0 + (threadIdx.x & ~31)) / 32, n_blocks = (int64_t)n_rows * n / 32;
            float amax = warp_max(fabsf(o));
            float d = amax / 127.0f;
            int q = amax > 0.0f ? __float2int_rn(o / d) : 0;
            int sum = warp_sum_int(q);
            out_q[blk * 32 + (threadIdx.x & 31)] = (int8_t)q;
            if ((threadIdx.x & 31) == 0)
                ((__half2 *)(out_q + n_blocks * 32))[blk] = __floats2half2_rn(d, d * (float)sum);
        }
    }
}

extern "C" void kiln_cuda_rmsnorm(float *x, const float *residual, const float *w, float *out, void *out_q, int n,
                                  int n_rows, float eps, cudaStream_t stream) {
    /* one block per row: a single decode row needs wide blocks, or one SM does all the work. Four values a thread
     * up to 4096 (whole warps: a warp's 32 values are a Q8_1 block), then 1024 threads with 8 or 16 */
    int threads = n <= 4096 ? ((n + 127) / 128) * 32 : 1024, per = div_up(n, threads);
    auto kernel = per <= 4 ? rmsnorm_kernel<4> : per <= 8 ? rmsnorm_kernel<8> : rmsnorm_kernel<16>;
    launch_pdl(kernel, n_rows, threads, stream, x, residual, w, out, (int8_t *)out_q, n, n_rows, eps);
}

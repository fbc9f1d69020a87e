/* RMSNorm, one block per row, with the residual add folded in (x += residual, then norm) and, optionally, the Q8_1
 * quantization of the result that the next GEMV reads: one pass instead of three launches. */
#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"
#include "cuda/q8_1.cuh"

/* A thread holds QUADS runs of four consecutive values of the row (float4 loads of x, the residual and w), all
 * loaded before any arithmetic: a norm is then one round trip to memory (the loop before that waited for each
 * element's loads in turn: 8.6 us a llama3-8b norm under ncu). Four consecutive values a thread make a Q8_1 block of
 * 32 eight lanes', quantized with one 3-level reduction for the max and one for the sum (quantize_quad); with a
 * warp's 32 values a block (four values a thread strided by the block), each of a thread's four values took its
 * own pair of 5-level reductions, one after the other. */
template <int QUADS>
__global__ void __launch_bounds__(1024)
    rmsnorm_kernel(float *x, const float *residual, const float *w, float *out, int8_t *out_q, int n, int n_rows,
                   float eps) {
    int64_t base = (int64_t)blockIdx.x * n;
    int n4 = n / 4;
    float4 *x4 = (float4 *)(x + base);
    const float4 *r4 = residual ? (const float4 *)(residual + base) : nullptr, *w4 = (const float4 *)w;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 v[QUADS], wv[QUADS], r[QUADS];
    /* the weights before the wait: no kernel of a step writes them, and they come from DRAM where x comes from L2 */
#pragma unroll
    for (int j = 0; j < QUADS; j++) {
        int i = threadIdx.x + j * blockDim.x;
        wv[j] = i < n4 ? w4[i] : zero;
    }
    pdl_release_and_wait();
#pragma unroll
    for (int j = 0; j < QUADS; j++) {
        int i = threadIdx.x + j * blockDim.x;
        v[j] = i < n4 ? x4[i] : zero;
        r[j] = residual && i < n4 ? r4[i] : zero;
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < QUADS; j++) {
        int i = threadIdx.x + j * blockDim.x;
        if (residual) {
            v[j] = make_float4(v[j].x + r[j].x, v[j].y + r[j].y, v[j].z + r[j].z, v[j].w + r[j].w);
            if (i < n4) x4[i] = v[j];
        }
        ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    }
    float scale = rsqrtf(block_sum(ss) / (float)n + eps);
    int64_t n_blocks = (int64_t)n_rows * n / 32;
    char4 *q = (char4 *)out_q;
    __half2 *ds = (__half2 *)(out_q + n_blocks * 32);
#pragma unroll
    for (int j = 0; j < QUADS; j++) {
        int i = threadIdx.x + j * blockDim.x;
        float4 o = make_float4(v[j].x * scale * wv[j].x, v[j].y * scale * wv[j].y, v[j].z * scale * wv[j].z,
                               v[j].w * scale * wv[j].w);
        if (i < n4) ((float4 *)(out + base))[i] = o;
        /* whole warps go round together (the shuffles need every lane); a Q8_1 block's 8 lanes are all in or out */
        if (out_q) quantize_quad(o, i < n4, q + base / 4 + i, ds + (base / 4 + i) / 8);
    }
}

extern "C" void kiln_cuda_rmsnorm(float *x, const float *residual, const float *w, float *out, void *out_q, int n,
                                  int n_rows, float eps, cudaStream_t stream) {
    /* one block per row: a single decode row needs wide blocks, or one SM does all the work. One run of four a
     * thread up to 4096 (whole warps), then 1024 threads with 2 or 4 */
    int quads = div_up(n, 4), threads = quads <= 1024 ? div_up(quads, 32) * 32 : 1024, per = div_up(quads, threads);
    auto kernel = per <= 1 ? rmsnorm_kernel<1> : per <= 2 ? rmsnorm_kernel<2> : rmsnorm_kernel<4>;
    launch_pdl(kernel, n_rows, threads, stream, x, residual, w, out, (int8_t *)out_q, n, n_rows, eps);
}

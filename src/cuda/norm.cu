/* RMSNorm, one block per row (a decode step's single row over several: rmsnorm_split_kernel), with the residual add
 * folded in (x += residual, then norm) and, optionally, the Q8_1 quantization of the result that the next GEMV
 * reads: one pass instead of three launches. */
#include "cuda/cuda_common.cuh"
#include "cuda/half_parts.cuh"
#include "cuda/kernels.h"
#include "cuda/kernels_batch.h"
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

/* A decode step's rows (no residual), each over blocks of NORM_SPLIT_THREADS (blockIdx.y the row): every block sums
 * the squares of the whole row (QUADS runs of four a thread, all loaded before any arithmetic: 16 KB at n = 4096,
 * from L2, where the next GEMV is about to read its weights) and writes only its own run of four a thread (out, and
 * its Q8_1). Against one block of 1024 threads for the row (rmsnorm_kernel), whose reduction spans 32 warps and
 * whose stores all leave one SM, measured on H100 (tg128, in-process against a context with
 * KILN_CUDA_NORM_SPLIT=0): blocks of 128 threads llama3-8b 508.3-509.2 tok/s against 494.9-495.7 (+2.7%),
 * qwen2-1.5b 1,349.4-1,350.8 against 1,336.0-1,337.7 (+1.0%); of 256 threads 507.3 and 1,346.3-1,348.2, of 64 503.1
 * and 1,346.1-1,346.9, of 512 506.2-506.4 and 1,337.8-1,337.9, of 32 even. */
#define NORM_SPLIT_THREADS 128
#define NORM_SPLIT_MAX_BLOCKS 16

template <int QUADS>
__global__ void __launch_bounds__(NORM_SPLIT_THREADS)
    rmsnorm_split_kernel(const float *x, const float *w, float *out, int8_t *out_q, __half2 *out_h, int n, int n_rows,
                         float eps) {
    int n4 = n / 4, mine = blockIdx.x * NORM_SPLIT_THREADS + threadIdx.x;
    int64_t base = (int64_t)blockIdx.y * n;
    const float4 *x4 = (const float4 *)(x + base), *w4 = (const float4 *)w;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 wv = mine < n4 ? w4[mine] : zero; /* before the wait, as rmsnorm_kernel */
    pdl_release_and_wait();
    float4 v[QUADS];
#pragma unroll
    for (int j = 0; j < QUADS; j++) {
        int i = threadIdx.x + j * NORM_SPLIT_THREADS;
        v[j] = i < n4 ? x4[i] : zero;
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < QUADS; j++) ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    float scale = rsqrtf(block_sum(ss) / (float)n + eps);
    float4 m = zero;
#pragma unroll
    for (int j = 0; j < QUADS; j++) /* the block's own run is among the loaded ones: j = blockIdx.x */
        if (j == (int)blockIdx.x) m = v[j];
    float4 o = make_float4(m.x * scale * wv.x, m.y * scale * wv.y, m.z * scale * wv.z, m.w * scale * wv.w);
    if (mine < n4) ((float4 *)(out + base))[mine] = o;
    if (out_q)
        quantize_quad(o, mine < n4, (char4 *)(out_q + base) + mine,
                      (__half2 *)(out_q + (int64_t)n_rows * n) + (base / 4 + mine) / 8);
    if (out_h && mine < n4) {
        out_h[half_parts_pair(blockIdx.y, 4 * mine, n_rows)] = __floats2half2_rn(o.x, o.y);
        out_h[half_parts_pair(blockIdx.y, 4 * mine + 2, n_rows)] = __floats2half2_rn(o.z, o.w);
    }
}

/* The split form for rows of up to NORM_SPLIT_MAX_BLOCKS blocks (8192 values), unless KILN_CUDA_NORM_SPLIT=0 (read
 * at launch; for comparisons). False: not launched. */
static bool launch_split(const float *x, const float *w, float *out, void *out_q, void *out_h, int n, int n_rows,
                         float eps, cudaStream_t stream) {
    const char *e = getenv("KILN_CUDA_NORM_SPLIT");
    int blocks = div_up(n / 4, NORM_SPLIT_THREADS);
    if ((e && atoi(e) == 0) || n % 32 || blocks > NORM_SPLIT_MAX_BLOCKS) return false;
    auto kernel = blocks <= 1   ? rmsnorm_split_kernel<1>
                  : blocks <= 2 ? rmsnorm_split_kernel<2>
                  : blocks <= 4 ? rmsnorm_split_kernel<4>
                  : blocks <= 8 ? rmsnorm_split_kernel<8>
                                : rmsnorm_split_kernel<16>;
    launch_pdl(kernel, dim3(blocks, n_rows), NORM_SPLIT_THREADS, stream, x, w, out, (int8_t *)out_q, (__half2 *)out_h,
               n, n_rows, eps);
    return true;
}

extern "C" void kiln_cuda_rmsnorm(float *x, const float *residual, const float *w, float *out, void *out_q, int n,
                                  int n_rows, float eps, cudaStream_t stream) {
    /* one block per row: a single decode row needs wide blocks, or one SM does all the work. One run of four a
     * thread up to 4096 (whole warps), then 1024 threads with 2 or 4 */
    int quads = div_up(n, 4), threads = quads <= 1024 ? div_up(quads, 32) * 32 : 1024, per = div_up(quads, threads);
    auto kernel = per <= 1 ? rmsnorm_kernel<1> : per <= 2 ? rmsnorm_kernel<2> : rmsnorm_kernel<4>;
    launch_pdl(kernel, n_rows, threads, stream, x, residual, w, out, (int8_t *)out_q, n, n_rows, eps);
}

/* Its sum of squares is ordered otherwise than rmsnorm_kernel's; which one a row takes depends on n alone (and
 * KILN_CUDA_NORM_SPLIT), so the batched step's rows are the same alone and among others, and the same as the single
 * context's decode rows. In the batched step it runs as fast as one block a row (H100, bench_cuda_batch against
 * KILN_CUDA_NORM_SPLIT=0 in one call, 1 to 64 sequences on llama3-8b and qwen2-1.5b: within 1% either way). */
extern "C" void kiln_cuda_rmsnorm_rows(float *x, const float *w, float *out, void *out_q, int n, int n_rows, float eps,
                                       cudaStream_t stream) {
    if (!launch_split(x, w, out, out_q, NULL, n, n_rows, eps, stream))
        kiln_cuda_rmsnorm(x, NULL, w, out, out_q, n, n_rows, eps, stream);
}

/* ... writing the half mode's F16 activations as well (the values kiln_cuda_batch_to_half makes of out): one launch
 * in the split form, else the norm and then the conversion. */
extern "C" void kiln_cuda_rmsnorm_rows_half(float *x, const float *w, float *out, void *out_h, int n, int n_rows,
                                            float eps, cudaStream_t stream) {
    if (!launch_split(x, w, out, NULL, out_h, n, n_rows, eps, stream)) {
        kiln_cuda_rmsnorm(x, NULL, w, out, NULL, n, n_rows, eps, stream);
        kiln_cuda_batch_to_half(out, out_h, n, n_rows, stream);
    }
}

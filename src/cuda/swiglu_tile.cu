/* The FFN's gate/up pair for one token in tiles of 32 consecutive rows a block, whose SwiGLU values leave as the Q8_1
 * input of the down projection: the quantize launch between the two, and the wait for it, go. A Q8_1 block is 32
 * consecutive values, so one block of the launch must hold a tile's 32 results: lane r of every warp takes row r of
 * the tile, warp w the parts w, w + WARPS, ... of it, and the warps' sums meet in shared memory, where the first
 * warp adds them up (lane r: row r), applies SwiGLU and quantizes the 32 as the quantize kernel does. A warp's load
 * is 32 rows' bytes at one offset; the rows' other bytes of each 32-byte sector are the next warp's part, read while
 * the line is in L1. */
#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"
#include "cuda/q8_1.cuh"
#include "cuda/quant_unpack.cuh"

#define TILE_WARPS 8
#define TILE_BATCH 3 /* parts of both matrices a lane loads before its first product */
#define TILE_MIN_BLOCKS 3

template <class F>
__device__ __forceinline__ void load_parts(const qtensor &gate, const qtensor &up, int64_t g0, int u0, int n_parts,
                                           kraw (&ra)[TILE_BATCH], kraw (&rb)[TILE_BATCH]) {
#pragma unroll
    for (int i = 0; i < TILE_BATCH; i++) {
        int u = min(u0 + TILE_WARPS * i, n_parts - 1);
        F::load(gate, g0 + u / F::parts, u % F::parts, ra[i]);
        F::load(up, g0 + u / F::parts, u % F::parts, rb[i]);
    }
}

template <class F>
__global__ void __launch_bounds__(32 * TILE_WARPS, TILE_MIN_BLOCKS)
    swiglu_tile_kernel(qtensor gate, qtensor up, int n_parts, const void *xq, float *y, int8_t *yq, int n) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, row = blockIdx.x * 32 + lane;
    int64_t g0 = (int64_t)row * (n_parts / F::parts);
    kraw ra[TILE_BATCH], rb[TILE_BATCH];
    load_parts<F>(gate, up, g0, warp, n_parts, ra, rb); /* the weights do not wait for the previous kernel */
    pdl_release_and_wait();
    q8_1_view x = q8_1_at(xq, (int64_t)n_parts * 32);
    float a = 0.0f, b = 0.0f;
    for (int u0 = warp;;) {
        __syncwarp(); /* keeps the batch's loads before its products */
#pragma unroll
        for (int i = 0; i < TILE_BATCH; i++) {
            int u = u0 + TILE_WARPS * i;
            if (u < n_parts) {
                q8_1_held h;
                hold_q8_1<F>(x, u, h);
                a += dot_held<F>(ra[i], u % F::parts, h);
                b += dot_held<F>(rb[i], u % F::parts, h);
            }
        }
        u0 += TILE_WARPS * TILE_BATCH;
        if (u0 >= n_parts) break;
        load_parts<F>(gate, up, g0, u0, n_parts, ra, rb);
    }
    __shared__ float sa[TILE_WARPS][32], sb[TILE_WARPS][32];
    sa[warp][lane] = a, sb[warp][lane] = b;
    __syncthreads();
    if (warp != 0) return;
    a = b = 0.0f;
#pragma unroll
    for (int w = 0; w < TILE_WARPS; w++) a += sa[w][lane], b += sb[w][lane];
    float v = silu(a) * b;
    y[row] = v;
    quantize_warp(v, yq + 32 * blockIdx.x, (__half2 *)(yq + n) + blockIdx.x);
}

extern "C" int kiln_cuda_gemv_swiglu_q8(const kiln_cuda_matrix *gate, const kiln_cuda_matrix *up, const void *xq,
                                        float *y, void *yq, cudaStream_t stream) {
    if (gate->type != up->type || gate->k != up->k || gate->n != up->n || gate->n % 32 ||
        !kiln_cuda_type_uses_q8_1(gate->type) || !kiln_cuda_type_supported(gate->type, gate->k))
        return -1;
    switch (gate->type) {
#define X(id, F)                                                                                                       \
    case id:                                                                                                           \
        launch_pdl(swiglu_tile_kernel<F>, gate->n / 32, 32 * TILE_WARPS, stream, tensor_of<F>(gate), tensor_of<F>(up),  \
                   gate->k / 32, xq, y, (int8_t *)yq, gate->n);                                                        \
        return 0;
        KILN_CUDA_QUANT_TYPES(X)
#undef X
    default: return -1;
    }
}

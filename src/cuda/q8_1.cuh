/* Quantizing F32 activations to Q8_1 inside a kernel (blocks of 32 int8 with a scale d and s = d * their sum):
 * the GEMV inputs of a decode step. */
#ifndef KILN_CUDA_Q8_1_CUH
#define KILN_CUDA_Q8_1_CUH

#include "cuda/cuda_common.cuh"

/* One Q8_1 block from the 32 values a warp holds, one per lane (the lanes' order is the elements' order). */
__device__ __forceinline__ void quantize_warp(float v, int8_t *qs, __half2 *ds) {
    int lane = threadIdx.x & 31;
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    int q = amax > 0.0f ? __float2int_rn(v / d) : 0;
    int sum = warp_sum_int(q);
    qs[lane] = (int8_t)q;
    if (lane == 0) *ds = __floats2half2_rn(d, d * (float)sum);
}

/* One Q8_1 block from 32 consecutive values held four per lane by 8 consecutive lanes: the same arithmetic as
 * quantize_warp, with a quarter of the shuffles per value. Every lane of the warp calls it; lanes whose 8 are out of
 * range pass store = false. */
__device__ __forceinline__ void quantize_quad(float4 v, bool store, char4 *qs, __half2 *ds) {
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float d = amax / 127.0f;
    int q0 = amax > 0.0f ? __float2int_rn(v.x / d) : 0, q1 = amax > 0.0f ? __float2int_rn(v.y / d) : 0;
    int q2 = amax > 0.0f ? __float2int_rn(v.z / d) : 0, q3 = amax > 0.0f ? __float2int_rn(v.w / d) : 0;
    int sum = q0 + q1 + q2 + q3;
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (!store) return;
    *qs = make_char4((signed char)q0, (signed char)q1, (signed char)q2, (signed char)q3);
    if ((threadIdx.x & 7) == 0) *ds = __floats2half2_rn(d, d * (float)sum);
}

#endif

/* Row gathering for a batched step: the hidden rows of the tokens that need logits, packed for the LM head. */
#include "cuda/cuda_common.cuh"
#include "cuda/kernels_batch.h"

__global__ void gather_rows_kernel(const float *src, const int32_t *d_rows, int width, float *dst) {
    pdl_release_and_wait();
    const float *s = src + (int64_t)d_rows[blockIdx.x] * width;
    float *o = dst + (int64_t)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) o[i] = s[i];
}

extern "C" void kiln_cuda_gather_rows(const float *src, const int32_t *d_rows, int n_rows, int width, float *dst,
                                      cudaStream_t stream) {
    launch_pdl(gather_rows_kernel, n_rows, 256, stream, src, d_rows, width, dst);
}

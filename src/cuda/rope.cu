/* The attention input stage in one launch: QKV bias, rotary embedding of q and k, the softmax scale folded into q,
 * and the F16 stores of k and v into the KV cache. One block per (head, token); a thread owns two dims. */
#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"
#include "cuda/rope_head.cuh"

__global__ void rope_store_kernel(kiln_cuda_rope_args a, float *q, const float *k, const float *v, const float *bq,
                                  const float *bk, const float *bv, __half *k_cache, __half *v_cache,
                                  const int32_t *d_pos) {
    pdl_wait_and_release();
    int head = blockIdx.x, t = blockIdx.y;
    int pos = *d_pos + t;
    int64_t row = ((int64_t)rope_kv_head(a, head) * a.n_ctx + pos) * a.head_dim;
    rope_store_head(a, head, t, pos, q, k, v, bq, bk, bv, k_cache + row, v_cache + row);
}

extern "C" void kiln_cuda_rope_store(const kiln_cuda_rope_args *a, float *q, const float *k, const float *v,
                                     const float *bq, const float *bk, const float *bv, void *k_cache, void *v_cache,
                                     const int32_t *d_pos, int n_tokens, cudaStream_t stream) {
    dim3 grid(a->n_head + a->n_head_kv, n_tokens);
    int threads = a->head_dim / 2 < 128 ? a->head_dim / 2 : 128;
    threads = (threads + 31) / 32 * 32;
    launch_pdl(rope_store_kernel, grid, threads, stream, *a, q, k, v, bq, bk, bv, (__half *)k_cache, (__half *)v_cache,
               d_pos);
}

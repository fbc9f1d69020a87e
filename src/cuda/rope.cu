/* The attention input stage in one launch: QKV bias, rotary embedding of q and k, the softmax scale folded into q,
 * and the F16 stores of k and v into the KV cache. One block per (head, token); a thread owns two dims. */
#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"
#include "cuda/rope_head.cuh"

__global__ void rope_store_kernel(kiln_cuda_rope_args a, float *q, const float *k, const float *v, const float *bq,
                                  const float *bk, const float *bv, __half *k_cache, __half *v_cache,
                                  const int32_t *d_pos) {
    /* Before the wait, what does not depend on the previous kernel: the biases and the frequency (weights, from
     * DRAM), the position (written by the last kernel of the step before, finished and visible: cuda_common.cuh)
     * and the rotation's sine and cosine. A thread owns one pair (the launch has head_dim / 2 threads). */
    int head = blockIdx.x, t = blockIdx.y, i = threadIdx.x;
    int pos = *d_pos + t;
    rope_consts r = rope_consts_of(a, head, i, bq, bk, bv);
    rope_angle(r, pos);
    pdl_release_and_wait();
    int64_t row = ((int64_t)rope_kv_head(a, head) * a.n_ctx + pos) * a.head_dim;
    rope_finish(a, head, t, i, r, rope_inputs_of(a, head, t, i, r, q, k, v), q, k_cache + row, v_cache + row);
}

extern "C" void kiln_cuda_rope_store(const kiln_cuda_rope_args *a, float *q, const float *k, const float *v,
                                     const float *bq, const float *bk, const float *bv, void *k_cache, void *v_cache,
                                     const int32_t *d_pos, int n_tokens, cudaStream_t stream) {
    dim3 grid(a->n_head + a->n_head_kv, n_tokens);
    int threads = a->head_dim / 2; /* 32, 64 or 128: head_dim is checked when a context is made */
    launch_pdl(rope_store_kernel, grid, threads, stream, *a, q, k, v, bq, bk, bv, (__half *)k_cache, (__half *)v_cache,
               d_pos);
}

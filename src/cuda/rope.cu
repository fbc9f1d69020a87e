/* The attention input stage in one launch: QKV bias, rotary embedding of q and k, the softmax scale folded into q,
 * and the F16 stores of k and v into the KV cache. One block per (head, token); a thread owns two dims. */
#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"

__global__ void rope_store_kernel(kiln_cuda_rope_args a, float *q, const float *k, const float *v, const float *bq,
                                  const float *bk, const float *bv, __half *k_cache, __half *v_cache,
                                  const int32_t *d_pos) {
    pdl_wait_and_release();
    int head = blockIdx.x, t = blockIdx.y;
    int pos = *d_pos + t;
    bool is_q = head < a.n_head;
    int h = is_q ? head : head - a.n_head;
    int q_dim = a.n_head * a.head_dim, kv_dim = a.n_head_kv * a.head_dim;
    int off = h * a.head_dim;
    float *src = is_q ? q + (int64_t)t * q_dim + off : nullptr;
    const float *ks = k + (int64_t)t * kv_dim + off;
    const float *bias = is_q ? (bq ? bq + off : nullptr) : (bk ? bk + off : nullptr);
    __half *kc = k_cache + ((int64_t)h * a.n_ctx + pos) * a.head_dim;
    __half *vc = v_cache + ((int64_t)h * a.n_ctx + pos) * a.head_dim;
    int half_rope = a.rope_dim / 2;
    for (int i = threadIdx.x; i < a.head_dim / 2; i += blockDim.x) {
        int i0, i1; /* the two dims this thread owns */
        if (i < half_rope && a.neox) i0 = i, i1 = i + half_rope;
        else i0 = 2 * i, i1 = 2 * i + 1;
        float x0 = is_q ? src[i0] : ks[i0], x1 = is_q ? src[i1] : ks[i1];
        if (bias) x0 += bias[i0], x1 += bias[i1];
        if (i < half_rope) {
            float s, c;
            sincosf((float)pos * a.freq[i], &s, &c);
            float r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
            x0 = r0, x1 = r1;
        }
        if (is_q) {
            src[i0] = x0 * a.q_scale, src[i1] = x1 * a.q_scale;
        } else {
            kc[i0] = __float2half(x0), kc[i1] = __float2half(x1);
            const float *vs = v + (int64_t)t * kv_dim + off;
            float v0 = vs[2 * i], v1 = vs[2 * i + 1];
            if (bv) v0 += bv[off + 2 * i], v1 += bv[off + 2 * i + 1];
            vc[2 * i] = __float2half(v0), vc[2 * i + 1] = __float2half(v1);
        }
    }
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

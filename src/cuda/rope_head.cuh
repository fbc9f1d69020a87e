/* The rope stage of one (head, token): bias, rotary embedding, the softmax scale folded into q, and the F16 stores
 * of k and v. Shared by rope.cu (contiguous cache) and attention_paged.cu (paged cache), which differ only in where a
 * token's position comes from and where its cache rows are. */
#ifndef KILN_CUDA_ROPE_HEAD_CUH
#define KILN_CUDA_ROPE_HEAD_CUH

#include "cuda/cuda_common.cuh"

/* head < n_head: q head `head` of token t, rotated and scaled in place; else k/v head head - n_head, rotated k and v
 * stored as F16 at kc and vc (that head's cache rows for this token; not touched for q heads). A: any argument struct
 * with n_head, n_head_kv, head_dim, rope_dim, neox, q_scale and freq. Every thread of the block calls it; a thread
 * owns two dims. */
template <class A>
__device__ __forceinline__ void rope_store_head(const A &a, int head, int t, int pos, float *q, const float *k,
                                                const float *v, const float *bq, const float *bk, const float *bv,
                                                __half *kc, __half *vc) {
    bool is_q = head < a.n_head;
    int h = is_q ? head : head - a.n_head;
    int q_dim = a.n_head * a.head_dim, kv_dim = a.n_head_kv * a.head_dim;
    int off = h * a.head_dim;
    float *src = is_q ? q + (int64_t)t * q_dim + off : nullptr;
    const float *ks = k + (int64_t)t * kv_dim + off;
    const float *bias = is_q ? (bq ? bq + off : nullptr) : (bk ? bk + off : nullptr);
    int half_rope = a.rope_dim / 2;
    const float *vs = v + (int64_t)t * kv_dim + off;
    for (int i = threadIdx.x; i < a.head_dim / 2; i += blockDim.x) {
        int i0, i1; /* the two dims this thread owns */
        if (i < half_rope && a.neox) i0 = i, i1 = i + half_rope;
        else i0 = 2 * i, i1 = 2 * i + 1;
        /* every load first (the value rows too), so the stage waits for memory once: a store whose value waits on a
         * load holds back the instructions behind it, loads included */
        float x0 = is_q ? src[i0] : ks[i0], x1 = is_q ? src[i1] : ks[i1];
        float b0 = bias ? bias[i0] : 0.0f, b1 = bias ? bias[i1] : 0.0f;
        float v0 = 0.0f, v1 = 0.0f, c0 = 0.0f, c1 = 0.0f;
        if (!is_q) {
            v0 = vs[2 * i], v1 = vs[2 * i + 1];
            if (bv) c0 = bv[off + 2 * i], c1 = bv[off + 2 * i + 1];
        }
        float freq = i < half_rope ? a.freq[i] : 0.0f;
        if (bias) x0 += b0, x1 += b1;
        if (i < half_rope) {
            float s, c;
            sincosf((float)pos * freq, &s, &c);
            float r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
            x0 = r0, x1 = r1;
        }
        if (is_q) {
            src[i0] = x0 * a.q_scale, src[i1] = x1 * a.q_scale;
        } else {
            kc[i0] = __float2half(x0), kc[i1] = __float2half(x1);
            if (bv) v0 += c0, v1 += c1;
            vc[2 * i] = __float2half(v0), vc[2 * i + 1] = __float2half(v1);
        }
    }
}

/* The k/v head whose cache rows a rope block writes (0 for q heads, which write none). */
template <class A>
__device__ __forceinline__ int rope_kv_head(const A &a, int head) {
    return head < a.n_head ? 0 : head - a.n_head;
}

#endif

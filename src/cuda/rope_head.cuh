/* The rope stage of one (head, token): bias, rotary embedding, the softmax scale folded into q, and the F16 stores
 * of k and v. Shared by rope.cu (contiguous cache) and attention_paged.cu (paged cache), which differ only in where a
 * token's position comes from and where its cache rows are. */
#ifndef KILN_CUDA_ROPE_HEAD_CUH
#define KILN_CUDA_ROPE_HEAD_CUH

#include "cuda/cuda_common.cuh"

/* head < n_head: q head `head` of token t, rotated and scaled in place; else k/v head head - n_head, rotated k and v
 * stored as F16 at kc and vc (that head's cache rows for this token; not touched for q heads). A: any argument struct
 * with n_head, n_head_kv, head_dim, rope_dim, neox, q_scale and freq. A thread owns two dims (pair i), in three
 * steps: rope_consts_of loads what no kernel of a step writes (biases, frequency), rope_inputs_of the q or k pair
 * and the v pair, rope_finish does the arithmetic and the stores. */
struct rope_consts {
    int i0, i1;          /* the two dims this thread owns */
    float b0, b1, c0, c1; /* the q or k biases of the pair, the v biases of dims 2i, 2i + 1 */
    float freq, sn, cs;   /* the pair's frequency; sine and cosine of its angle (rope_angle) */
};

struct rope_inputs {
    float x0, x1, v0, v1;
};

template <class A>
__device__ __forceinline__ rope_consts rope_consts_of(const A &a, int head, int i, const float *bq, const float *bk,
                                                      const float *bv) {
    bool is_q = head < a.n_head;
    int off = (is_q ? head : head - a.n_head) * a.head_dim, half_rope = a.rope_dim / 2;
    const float *bias = is_q ? (bq ? bq + off : nullptr) : (bk ? bk + off : nullptr);
    rope_consts r = {};
    if (i < half_rope && a.neox) r.i0 = i, r.i1 = i + half_rope;
    else r.i0 = 2 * i, r.i1 = 2 * i + 1;
    if (bias) r.b0 = bias[r.i0], r.b1 = bias[r.i1];
    if (!is_q && bv) r.c0 = bv[off + 2 * i], r.c1 = bv[off + 2 * i + 1];
    r.freq = i < half_rope ? a.freq[i] : 0.0f;
    return r;
}

__device__ __forceinline__ void rope_angle(rope_consts &r, int pos) { sincosf((float)pos * r.freq, &r.sn, &r.cs); }

template <class A>
__device__ __forceinline__ rope_inputs rope_inputs_of(const A &a, int head, int t, int i, const rope_consts &r,
                                                      const float *q, const float *k, const float *v) {
    bool is_q = head < a.n_head;
    int off = (is_q ? head : head - a.n_head) * a.head_dim;
    const float *x = is_q ? q + (int64_t)t * a.n_head * a.head_dim + off
                          : k + (int64_t)t * a.n_head_kv * a.head_dim + off;
    rope_inputs in = {x[r.i0], x[r.i1], 0.0f, 0.0f};
    if (!is_q) {
        const float *vs = v + (int64_t)t * a.n_head_kv * a.head_dim + off;
        in.v0 = vs[2 * i], in.v1 = vs[2 * i + 1];
    }
    return in;
}

template <class A>
__device__ __forceinline__ void rope_finish(const A &a, int head, int t, int i, const rope_consts &r, rope_inputs in,
                                            float *q, __half *kc, __half *vc) {
    float x0 = in.x0 + r.b0, x1 = in.x1 + r.b1;
    if (i < a.rope_dim / 2) {
        float r0 = x0 * r.cs - x1 * r.sn, r1 = x0 * r.sn + x1 * r.cs;
        x0 = r0, x1 = r1;
    }
    if (head < a.n_head) {
        float *dst = q + (int64_t)t * a.n_head * a.head_dim + head * a.head_dim;
        dst[r.i0] = x0 * a.q_scale, dst[r.i1] = x1 * a.q_scale;
    } else {
        kc[r.i0] = __float2half(x0), kc[r.i1] = __float2half(x1);
        vc[2 * i] = __float2half(in.v0 + r.c0), vc[2 * i + 1] = __float2half(in.v1 + r.c1);
    }
}

/* The whole stage for a block (every thread calls it). Every load first, the value rows too, so the stage waits for
 * memory once: a store whose value waits on a load holds back the instructions behind it, loads included. */
template <class A>
__device__ __forceinline__ void rope_store_head(const A &a, int head, int t, int pos, float *q, const float *k,
                                                const float *v, const float *bq, const float *bk, const float *bv,
                                                __half *kc, __half *vc) {
    for (int i = threadIdx.x; i < a.head_dim / 2; i += blockDim.x) {
        rope_consts r = rope_consts_of(a, head, i, bq, bk, bv);
        rope_inputs in = rope_inputs_of(a, head, t, i, r, q, k, v);
        rope_angle(r, pos);
        rope_finish(a, head, t, i, r, in, q, kc, vc);
    }
}

/* The k/v head whose cache rows a rope block writes (0 for q heads, which write none). */
template <class A>
__device__ __forceinline__ int rope_kv_head(const A &a, int head) {
    return head < a.n_head ? 0 : head - a.n_head;
}

#endif

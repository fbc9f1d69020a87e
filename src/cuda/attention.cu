/* Attention over the F16 KV cache by split-K flash decoding: the positions a query token sees are cut into n_split
 * slices; each block runs an online softmax over its slice (its warps take turns over positions, a lane owns
 * head_dim/32 dims), and a second kernel merges the slices with their running maxima. Splitting keeps every SM
 * busy when one token has few heads but a long context; one token in one slice needs no merge (its block writes the
 * head's output). Query token t of a batch sees positions 0..*d_pos + t, which makes the same kernels the causal
 * attention of a short prefill batch (longer ones: attention_prefill.cu). The one-launch decode form also does the
 * rope stage's work and the merge. */
#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"

#include "cuda/attention_slice.cuh"

template <int HD, bool DECODE, int WARPS, bool DEEP>
__global__ void __launch_bounds__(32 * WARPS)
    attn_split_kernel(kiln_cuda_attn_args a, const float *q, const __half *k_cache, const __half *v_cache,
                      const int32_t *d_pos, float *part, attn_decode x) {
    int t = blockIdx.z; /* waits inside, after loading the K/V rows that earlier steps wrote */
    attn_slice<HD, DECODE, WARPS, true, attn_ahead<HD, DEEP>()>(a, q, k_cache, v_cache, *d_pos + t + 1, part, x,
                                                                blockIdx.x, blockIdx.y, t);
}

/* One block per (head, token), a thread per dim. With out_q, the merged row is also quantized to Q8_1 for the
 * output projection's GEMV: a warp holds 32 consecutive dims, one Q8_1 block. */
__global__ void attn_merge_kernel(kiln_cuda_attn_args a, const float *part, float *out, int8_t *out_q, int n_tokens) {
    pdl_release_and_wait();
    int head = blockIdx.x, t = blockIdx.y, d = threadIdx.x;
    int hd = a.head_dim;
    const float *p = part + ((int64_t)t * a.n_head + head) * a.n_split * (hd + 2);
    store_merged(merge_slices(a, p, d, a.n_split), out, out_q, ((int64_t)t * a.n_head + head) * hd + d,
                 (int64_t)n_tokens * a.n_head * hd);
}

extern "C" int kiln_cuda_attention(const kiln_cuda_attn_args *a, const float *q, const void *k_cache,
                                   const void *v_cache, const int32_t *d_pos, int n_tokens, float *part, float *out,
                                   void *out_q, cudaStream_t stream) {
    const __half *kc = (const __half *)k_cache, *vc = (const __half *)v_cache;
    if (n_tokens >= KILN_CUDA_PREFILL_ATTENTION_MIN && !out_q)
        return kiln_cuda_attention_prefill(a, q, k_cache, v_cache, d_pos, n_tokens, out, stream);
    dim3 grid(a->n_head, a->n_split, n_tokens);
    /* one token in one slice: each head's block writes its output (and Q8_1) itself, no merge launch */
    bool whole = n_tokens == 1 && a->n_split == 1;
    attn_decode x = {};
    if (whole) x.out = out, x.out_q = (int8_t *)out_q;
    if (n_tokens > 1) {
        switch (a->head_dim) {
#define X(hd)                                                                                                          \
    case hd:                                                                                                           \
        launch_pdl(attn_split_kernel<hd, false, ATTN_WARPS, false>, grid, 32 * ATTN_WARPS, stream, *a, q, kc, vc,     \
                   d_pos, part, x);                                                                                    \
        break;
            X(64) X(128) X(256)
#undef X
        default: return -1;
        }
    } else {
        int warps = a->warps ? a->warps : KILN_CUDA_DECODE_WARPS;
        switch (a->head_dim * 64 + warps) {
#define X(hd, w)                                                                                                       \
    case hd * 64 + w:                                                                                                  \
        launch_pdl(attn_split_kernel<hd, false, w, true>, grid, 32 * w, stream, *a, q, kc, vc, d_pos, part, x);       \
        break;
            X(64, 2) X(128, 2) X(256, 2) X(64, 4) X(128, 4) X(256, 4) X(64, 8) X(128, 8) X(256, 8) X(64, 16)
            X(128, 16) X(256, 16)
#undef X
        default: return -1;
        }
    }
    if (whole) return 0;
    launch_pdl(attn_merge_kernel, dim3(a->n_head, n_tokens), a->head_dim, stream, *a, part, out, (int8_t *)out_q, n_tokens);
    return 0;
}

extern "C" int kiln_cuda_attention_decode(const kiln_cuda_attn_args *a, const kiln_cuda_attn_decode_args *d,
                                          const int32_t *d_pos, float *part, unsigned *counters, cudaStream_t stream) {
    if (a->n_head != d->rope.n_head || a->n_head_kv != d->rope.n_head_kv || a->head_dim != d->rope.head_dim ||
        a->n_ctx != d->rope.n_ctx)
        return -1;
    attn_decode x = {d->rope, d->k, d->v, d->bq, d->bk, d->bv, (__half *)d->k_cache, (__half *)d->v_cache, d->out,
                     (int8_t *)d->out_q, counters};
    const __half *kc = (const __half *)d->k_cache, *vc = (const __half *)d->v_cache;
    dim3 grid(a->n_head, a->n_split, 1);
    int warps = d->warps ? d->warps : KILN_CUDA_DECODE_WARPS;
    switch (a->head_dim * 64 + warps) {
#define X(hd, w)                                                                                                       \
    case hd * 64 + w:                                                                                                  \
        launch_pdl(attn_split_kernel<hd, true, w, false>, grid, 32 * w, stream, *a, d->q, kc, vc, d_pos, part, x);     \
        return 0;
        X(64, 4) X(128, 4) X(256, 4) X(64, 8) X(128, 8) X(256, 8) X(64, 16) X(128, 16) X(256, 16)
#undef X
    default: return -1;
    }
}

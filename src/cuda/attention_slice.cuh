/* One slice of split-K flash decoding for one (head, token): the body of attention.cu's split kernel, also run by
 * the persistent decode kernel (decode_persistent.cu), which takes the slices of every head in turn in each block.
 * Inputs the same launch may have written (q, k, v, the slices' partial results) are read through L2 (__ldcg):
 * a block's L1 is not coherent with other blocks' stores. */
#ifndef KILN_CUDA_ATTENTION_SLICE_CUH
#define KILN_CUDA_ATTENTION_SLICE_CUH

#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"

#define ATTN_WARPS 4 /* the prefill batch's split kernel */

/* The decode form's extras: q, k and v arrive as the Q/K/V GEMVs left them; the biases, the rotation and the q
 * scale are applied here, the current position's k and v rows go into the cache, and the last block of each head
 * merges its slices into out (and out_q). */
struct attn_decode {
    kiln_cuda_rope_args r;
    const float *k, *v, *bq, *bk, *bv;
    __half *k_cache, *v_cache;
    float *out;
    int8_t *out_q;
    unsigned *counters; /* one per head */
};

/* Dim d of x + b and the other dim of its rotation pair (none past rope_dim): the loads of rope, apart from its
 * arithmetic so that a thread issues all of them before the first use. */
struct rope_in {
    float xd, xp;
};

__device__ __forceinline__ bool rope_first(const kiln_cuda_rope_args &r, int d) {
    return r.neox ? d < r.rope_dim / 2 : (d & 1) == 0;
}

__device__ __forceinline__ rope_in rope_load(const kiln_cuda_rope_args &r, const float *x, const float *b, int d) {
    int half = r.rope_dim / 2;
    int pd = r.neox ? (rope_first(r, d) ? d + half : d - half) : d ^ 1;
    rope_in v;
    v.xd = __ldcg(x + d) + (b ? b[d] : 0.0f);
    v.xp = d < r.rope_dim ? __ldcg(x + pd) + (b ? b[pd] : 0.0f) : 0.0f;
    return v;
}

/* Dim d rotated for position pos, as rope_store_kernel computes it (same pairs, same expressions). */
__device__ __forceinline__ float rope_rotate(const kiln_cuda_rope_args &r, rope_in v, int d, int pos) {
    if (d >= r.rope_dim) return v.xd;
    bool first = rope_first(r, d);
    int i = r.neox ? (first ? d : d - r.rope_dim / 2) : d / 2;
    float s, c;
    sincosf((float)pos * r.freq[i], &s, &c);
    return first ? v.xd * c - v.xp * s : v.xp * s + v.xd * c;
}

/* Dim d of the merged attention output of one (token, head) from its first n_slices slices at p (max, sum,
 * accumulators; read through L2, since the decode form merges in the block that arrives last). Slices go in runs of
 * MERGE_RUN whose loads are all issued before any arithmetic: one L2 round trip a run (with a pass for the maximum and
 * then one for the sums, each exponential waited for its loads while the next slices' loads queued behind it: three
 * to four round trips for 8 slices, in the SASS). Runs after the first rescale what came before to the new maximum;
 * up to MERGE_RUN slices the arithmetic is the two passes', in the same order. */
#define MERGE_RUN 8
__device__ __forceinline__ float merge_slices(const kiln_cuda_attn_args &a, const float *p, int d, int n_slices) {
    int stride = a.head_dim + 2;
    float mx = -INFINITY, num = 0.0f, den = 0.0f;
    for (int s0 = 0; s0 < n_slices; s0 += MERGE_RUN) {
        float ms[MERGE_RUN], acc[MERGE_RUN], sum[MERGE_RUN];
#pragma unroll
        for (int i = 0; i < MERGE_RUN; i++) {
            const float *ps = p + (s0 + i) * stride;
            bool in = s0 + i < n_slices;
            ms[i] = in ? __ldcg(ps) : -INFINITY, sum[i] = in ? __ldcg(ps + 1) : 0.0f;
            acc[i] = in ? __ldcg(ps + 2 + d) : 0.0f;
        }
        float run_max = mx;
#pragma unroll
        for (int i = 0; i < MERGE_RUN; i++) run_max = fmaxf(run_max, ms[i]);
        float rescale = mx == -INFINITY ? 0.0f : expf(mx - run_max); /* nothing summed yet, or the old max's share */
        num *= rescale, den *= rescale;
#pragma unroll
        for (int i = 0; i < MERGE_RUN; i++) {
            float w = ms[i] == -INFINITY ? 0.0f : expf(ms[i] - run_max); /* an empty slice: acc and sum are zeros */
            num += acc[i] * w;
            den += sum[i] * w;
        }
        mx = run_max;
    }
    return num / den;
}

/* out[i] = v, and when out_q is non-NULL its Q8_1 form (n values in all): the warp holds 32 consecutive values. */
__device__ __forceinline__ void store_merged(float v, float *out, int8_t *out_q, int64_t i, int64_t n) {
    out[i] = v;
    if (!out_q) return;
    float amax = warp_max(fabsf(v));
    float scale = amax / 127.0f;
    int q = amax > 0.0f ? __float2int_rn(v / scale) : 0;
    int sum = warp_sum_int(q);
    out_q[i] = (int8_t)q;
    if ((i & 31) == 0) ((__half2 *)(out_q + n))[i / 32] = __floats2half2_rn(scale, scale * (float)sum);
}

/* The WARPS warps' running maxima, sums and accumulators (D = HD / 32 dims a lane) in shared memory, for every
 * thread of the block to combine. Every thread of the WARPS warps calls it. */
template <int HD, int WARPS>
struct warp_results {
    float m[WARPS], l[WARPS], acc[WARPS][HD];
};

template <int HD, int WARPS>
__device__ __forceinline__ const warp_results<HD, WARPS> &share_results(float m, float l, const float *acc) {
    constexpr int D = HD / 32;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __shared__ warp_results<HD, WARPS> r;
    if (lane == 0) r.m[warp] = m, r.l[warp] = l;
#pragma unroll
    for (int d = 0; d < D; d++) r.acc[warp][lane * D + d] = acc[d];
    sync_warps<WARPS>();
    return r;
}

template <int HD, int WARPS>
__device__ __forceinline__ float results_max(const warp_results<HD, WARPS> &r) {
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < WARPS; w++) mx = fmaxf(mx, r.m[w]);
    return mx;
}

/* A slice's result from the WARPS warps' results r, rescaled to the largest max and written to out: max, sum, then
 * HD accumulators. Every thread of the WARPS warps calls it. */
template <int HD, int WARPS>
__device__ __forceinline__ void combine_slice(const warp_results<HD, WARPS> &r, float *out) {
    float mx = results_max(r);
    for (int d = threadIdx.x; d < HD; d += 32 * WARPS) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; w++)
            if (r.m[w] > -INFINITY) v += r.acc[w][d] * expf(r.m[w] - mx);
        out[2 + d] = v;
    }
    if (threadIdx.x == (32 * WARPS > HD ? HD : 0)) { /* a thread without a dim above, where there is one */
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; w++)
            if (r.m[w] > -INFINITY) sum += r.l[w] * expf(r.m[w] - mx);
        out[0] = mx, out[1] = sum;
    }
}

/* combine_slice of this block's warps' m, l and acc. */
template <int HD, int WARPS>
__device__ __forceinline__ void write_slice(float m, float l, const float *acc, float *out) {
    combine_slice<HD, WARPS>(share_results<HD, WARPS>(m, l, acc), out);
}

/* Dim d of the head's output from the warps' results of a block that ran the whole context: each thread sums the
 * weights itself, so no second barrier. */
template <int HD, int WARPS>
__device__ __forceinline__ float whole_value(const warp_results<HD, WARPS> &r, float mx, int d) {
    float num = 0.0f, den = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; w++)
        if (r.m[w] > -INFINITY) {
            float e = expf(r.m[w] - mx);
            num += r.acc[w][d] * e, den += r.l[w] * e;
        }
    return num / den;
}

/* D consecutive halves of a K or V row (D = head_dim / 32: 2, 4 or 8, so 4, 8 or 16 aligned bytes), loaded in one
 * go and kept packed until used. */
template <int D>
struct halves {
    uint32_t w[D / 2];
};

template <int D>
__device__ __forceinline__ halves<D> load_halves(const __half *p) {
    halves<D> h;
    if constexpr (D == 2) h.w[0] = *(const uint32_t *)p;
    if constexpr (D == 4) {
        uint2 u = *(const uint2 *)p;
        h.w[0] = u.x, h.w[1] = u.y;
    }
    if constexpr (D == 8) {
        uint4 u = *(const uint4 *)p;
        h.w[0] = u.x, h.w[1] = u.y, h.w[2] = u.z, h.w[3] = u.w;
    }
    return h;
}

template <int D>
__device__ __forceinline__ float half_at(const halves<D> &h, int d) {
    float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&h.w[d / 2]));
    return d & 1 ? f.y : f.x;
}

/* The K and V rows (this lane's dims) of positions p0, p0 + WARPS, ... (AHEAD of them) that lie in [lo, hi) and are
 * not skip, all loads issued at once; the others are left as they were. */
template <int D, int AHEAD, int WARPS>
__device__ __forceinline__ void load_rows(const __half *kb, const __half *vb, int p0, int lo, int hi, int skip,
                                          int lane, halves<D> *kf, halves<D> *vf) {
#pragma unroll
    for (int i = 0; i < AHEAD; i++) {
        int p = p0 + i * WARPS;
        if (lo <= p && p < hi && p != skip) {
            kf[i] = load_halves<D>(kb + (int64_t)p * (32 * D) + lane * D);
            vf[i] = load_halves<D>(vb + (int64_t)p * (32 * D) + lane * D);
        }
    }
}

/* The HD merged values of one head (warp by warp, so that store_merged sees 32 consecutive ones) stored by every
 * block thread: value(d) for d < HD. */
template <int HD, int WARPS, typename F>
__device__ __forceinline__ void store_head(const attn_decode &x, int n_head, int head, F value) {
    int warp = threadIdx.x >> 5;
    for (int d0 = 0; d0 < HD; d0 += 32 * WARPS) /* whole warps: HD 64 leaves two idle */
        if (d0 + warp * 32 < HD) {
            int d = d0 + threadIdx.x;
            store_merged(value(d), x.out, x.out_q, (int64_t)head * HD + d, (int64_t)n_head * HD);
        }
}

/* K/V rows a warp loads before it uses the first: 8 (4 at head_dim 256), or with DEEP twice that, as a decode step's
 * split takes them: a block of 8 warps then loads a whole slice of 128 positions before its wait. */
template <int HD, bool DEEP>
__host__ __device__ constexpr int attn_ahead() {
    return (HD / 32 <= 4 ? 8 : 4) * (DEEP ? 2 : 1);
}

/* Slice `split` of query token t, head `head`, run by a block of WARPS warps: an online softmax over the slice's
 * positions into its part (max, sum, then head_dim accumulators, per (token, head, split)). DECODE: one token, with
 * the work of attn_decode above; when the context is one slice, the block writes the head's output itself (no part,
 * no count), otherwise the last block of a head to finish merges the head's slices. WAIT: the kernel has not waited
 * for the previous one yet; the first K/V rows that earlier steps wrote are loaded before pdl_release_and_wait, what
 * the previous kernels of this step wrote (q, k, v; the rows of this step's tokens) after. Every thread of the
 * block's first WARPS warps calls it (its barriers leave any other warp out); a block may call it again for another
 * slice (the barrier at the top keeps the shared arrays of the previous call until all have read them). */
template <int HD, bool DECODE, int WARPS, bool WAIT, int AHEAD>
__device__ __forceinline__ void attn_slice(const kiln_cuda_attn_args &a, const float *q, const __half *k_cache,
                                           const __half *v_cache, int n_pos, float *part, const attn_decode &x,
                                           int head, int split, int t) {
    constexpr int D = HD / 32;
    sync_warps<WARPS>();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int cur = n_pos - 1;
    /* slices of at least min_chunk positions: while the context is short, the later blocks find theirs empty */
    int chunk = max(max(a.min_chunk, 1), (n_pos + a.n_split - 1) / a.n_split);
    int begin = split * chunk, end = min(n_pos, begin + chunk);
    /* the decode form runs only the slices that hold positions, and merges those: 1 of 32 up to 32 positions */
    int n_used = (n_pos + chunk - 1) / chunk;
    if (DECODE && split >= n_used) return;
    int group = a.n_head / a.n_head_kv, kvh = head / group;
    const float *qh = q + ((int64_t)t * a.n_head + head) * HD;
    const __half *kb = k_cache + (int64_t)kvh * a.n_ctx * HD;
    const __half *vb = v_cache + (int64_t)kvh * a.n_ctx * HD;
    /* a warp takes positions begin + warp, + WARPS, ..., AHEAD of them at a time: all their K and V rows are loaded
     * before the first is used (one round trip, not one per position), and their scores are reduced together */
    halves<D> kf[AHEAD] = {}, vf[AHEAD] = {};
    int p0 = begin + warp;
    /* rows from this step's first position on are this step's (DECODE: the current one, kept in registers) */
    int fresh = n_pos - 1 - t, skip = DECODE ? cur : -1;
    load_rows<D, AHEAD, WARPS>(kb, vb, p0, begin, min(end, fresh), skip, lane, kf, vf);
    if (WAIT) pdl_release_and_wait();
    if (!DECODE) load_rows<D, AHEAD, WARPS>(kb, vb, p0, fresh, end, skip, lane, kf, vf);

    float qr[D], acc[D], kc[D], vc[D]; /* kc, vc: the current position's k and v (DECODE), as F16 values */
    /* the blocks whose slice holds the current position use its k and v from registers; the first head of each KV
     * group stores them, which no other block reads in this launch */
    bool has_cur = DECODE && begin <= cur && cur < end;
    rope_in qin[D], kin[D];
    float vin[D];
    /* every load of q (and of the current k and v) before any arithmetic or store: one round trip, not one per dim */
#pragma unroll
    for (int d = 0; d < D; d++) {
        int dd = lane * D + d;
        if (!DECODE) qr[d] = __ldcg(qh + dd);
        else if (begin < end) qin[d] = rope_load(x.r, qh, x.bq ? x.bq + head * HD : nullptr, dd);
        if (has_cur) {
            kin[d] = rope_load(x.r, x.k + kvh * HD, x.bk ? x.bk + kvh * HD : nullptr, dd);
            vin[d] = __ldcg(x.v + kvh * HD + dd) + (x.bv ? x.bv[kvh * HD + dd] : 0.0f);
        }
        acc[d] = kc[d] = vc[d] = 0.0f;
    }
    if (DECODE)
#pragma unroll
        for (int d = 0; d < D; d++) /* rotated here by each block of the head; an empty slice needs none */
            qr[d] = begin < end ? rope_rotate(x.r, qin[d], lane * D + d, cur) * x.r.q_scale : 0.0f;
    if (has_cur) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            int dd = lane * D + d;
            __half kq = __float2half(rope_rotate(x.r, kin[d], dd, cur)), vq = __float2half(vin[d]);
            kc[d] = __half2float(kq), vc[d] = __half2float(vq);
            if (head % group == 0 && warp == 0) {
                x.k_cache[((int64_t)kvh * a.n_ctx + cur) * HD + dd] = kq;
                x.v_cache[((int64_t)kvh * a.n_ctx + cur) * HD + dd] = vq;
            }
        }
    }
    float m = -INFINITY, l = 0.0f;
    for (bool first = true; p0 < end; p0 += AHEAD * WARPS, first = false) {
        if (!first) load_rows<D, AHEAD, WARPS>(kb, vb, p0, begin, end, skip, lane, kf, vf);
        float s[AHEAD];
#pragma unroll
        for (int i = 0; i < AHEAD; i++) {
            bool here = has_cur && p0 + i * WARPS == cur;
            s[i] = 0.0f;
#pragma unroll
            for (int d = 0; d < D; d++) s[i] += qr[d] * (here ? kc[d] : half_at<D>(kf[i], d));
        }
#pragma unroll
        for (int i = 0; i < AHEAD; i++) s[i] = warp_sum(s[i]);
        float m_new = m;
#pragma unroll
        for (int i = 0; i < AHEAD; i++)
            if (p0 + i * WARPS < end) m_new = fmaxf(m_new, s[i]);
        float corr = expf(m - m_new); /* the first batch: exp(-inf) = 0 */
        l *= corr;
#pragma unroll
        for (int d = 0; d < D; d++) acc[d] *= corr;
#pragma unroll
        for (int i = 0; i < AHEAD; i++) {
            if (p0 + i * WARPS >= end) break;
            bool here = has_cur && p0 + i * WARPS == cur;
            float w = expf(s[i] - m_new);
            l += w;
#pragma unroll
            for (int d = 0; d < D; d++) acc[d] += w * (here ? vc[d] : half_at<D>(vf[i], d));
        }
        m = m_new;
    }

    if (x.out && n_used == 1) { /* the whole context in this block: its combine is the head's output */
        const warp_results<HD, WARPS> &r = share_results<HD, WARPS>(m, l, acc);
        float mx = results_max(r);
        store_head<HD, WARPS>(x, a.n_head, head, [&](int d) { return whole_value(r, mx, d); });
        return;
    }
    write_slice<HD, WARPS>(m, l, acc, part + (((int64_t)t * a.n_head + head) * a.n_split + split) * (HD + 2));
    if (!DECODE || !arrive_last<WARPS>(x.counters + head, n_used)) return;
    const float *ph = part + (int64_t)head * a.n_split * (HD + 2);
    store_head<HD, WARPS>(x, a.n_head, head, [&](int d) { return merge_slices(a, ph, d, n_used); });
}

#endif

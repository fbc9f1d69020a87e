/* Causal attention of a prompt batch (query token t at position *d_pos + t sees cache positions 0..*d_pos + t), two
 * kernels kept side by side while they are measured:
 *
 * - attn_prefill_mma_kernel (head_dim 64 and 128, the default): flash attention on tensor cores. A block takes 16
 *   query tokens of one head a warp, PREFILL_MMA_WARPS warps. K and V of PREFILL_MMA_KV positions at a time are
 *   staged in shared memory for all warps, the next chunk's copies (cp.async) in flight while the warps work on the
 *   one before; a warp's scores S = Q K^T (16 x PREFILL_MMA_KV) are mma.sync m16n8k16 products of F16 operands with
 *   F32 sums, the online softmax runs on them in registers, and O += P V multiplies the probabilities, rounded to
 *   F16, by V the same way. q is rounded to F16 too: relative errors of 2-3e-4 against an F32 softmax (test_attention),
 *   where the GEMMs around it already run on F16 operands.
 * - attn_prefill_fma_kernel (every head_dim; KILN_CUDA_PREFILL_MMA=0 for comparisons): F32 FMA, four threads a
 *   query, each owning a quarter of the dims, 16 queries a block over chunks of 32 staged positions.
 *
 * Query tiles are taken last first: the causal mask gives the last ones the most positions, and a grid whose longest
 * blocks start first ends sooner. */
#include <stdlib.h>

#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"

#define PREFILL_QUERIES 16
#define PREFILL_CHUNK 32

template <int HD>
__global__ void __launch_bounds__(4 * PREFILL_QUERIES)
    attn_prefill_fma_kernel(kiln_cuda_attn_args a, const float *q, const __half *k_cache, const __half *v_cache,
                            const int32_t *d_pos, int n_tokens, float *out) {
    constexpr int DS = HD / 4;
    __shared__ __align__(16) __half ks[PREFILL_CHUNK * HD], vs[PREFILL_CHUNK * HD];
    int head = blockIdx.x, t0 = (gridDim.y - 1 - blockIdx.y) * PREFILL_QUERIES;
    int qi = threadIdx.x >> 2, s = threadIdx.x & 3, lane = threadIdx.x & 31;
    unsigned group = 0xFu << (lane & ~3);
    int t = t0 + qi, pos0 = *d_pos;
    bool active = t < n_tokens;
    int last = pos0 + (active ? t : -1 - pos0);  /* the last position this query sees (-1: none) */
    int tile_last = pos0 + min(t0 + PREFILL_QUERIES, n_tokens) - 1;
    int kvh = head / (a.n_head / a.n_head_kv);
    const __half *kb = k_cache + (int64_t)kvh * a.n_ctx * HD, *vb = v_cache + (int64_t)kvh * a.n_ctx * HD;
    float qr[DS], acc[DS];
    const float *qh = q + ((int64_t)(active ? t : 0) * a.n_head + head) * HD + s * DS;
#pragma unroll
    for (int d = 0; d < DS; d++) qr[d] = qh[d], acc[d] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int p0 = 0; p0 <= tile_last; p0 += PREFILL_CHUNK) {
        __syncthreads(); /* the previous chunk is no longer read */
        for (int i = threadIdx.x; i < PREFILL_CHUNK * HD / 8; i += 4 * PREFILL_QUERIES) {
            bool in = p0 + i * 8 / HD <= tile_last;
            uint4 zero = make_uint4(0, 0, 0, 0);
            ((uint4 *)ks)[i] = in ? ((const uint4 *)(kb + (int64_t)p0 * HD))[i] : zero;
            ((uint4 *)vs)[i] = in ? ((const uint4 *)(vb + (int64_t)p0 * HD))[i] : zero;
        }
        __syncthreads();
        int n = min(PREFILL_CHUNK, last - p0 + 1);
        for (int j = 0; j < n; j++) {
            const __half2 *kr = (const __half2 *)(ks + j * HD + s * DS);
            float sc = 0.0f;
#pragma unroll
            for (int d = 0; d < DS / 2; d++) {
                float2 kf = __half22float2(kr[d]);
                sc += qr[2 * d] * kf.x + qr[2 * d + 1] * kf.y;
            }
            sc += __shfl_xor_sync(group, sc, 1);
            sc += __shfl_xor_sync(group, sc, 2);
            float m_new = fmaxf(m, sc);
            float corr = expf(m - m_new), w = expf(sc - m_new);
            const __half2 *vr = (const __half2 *)(vs + j * HD + s * DS);
#pragma unroll
            for (int d = 0; d < DS / 2; d++) {
                float2 vf = __half22float2(vr[d]);
                acc[2 * d] = acc[2 * d] * corr + w * vf.x;
                acc[2 * d + 1] = acc[2 * d + 1] * corr + w * vf.y;
            }
            l = l * corr + w;
            m = m_new;
        }
    }
    if (!active) return;
    float *o = out + ((int64_t)t * a.n_head + head) * HD + s * DS;
#pragma unroll
    for (int d = 0; d < DS; d++) o[d] = acc[d] / l;
}

/* Four warps (64 queries) a block: on H100 (bench_cuda_attention) as fast as two or faster at every prompt length,
 * though two make twice the blocks: llama3-8b's shape 31.3 against 33.9 us at 512 tokens, 694.8 against 904.9 at
 * 4096; qwen2-1.5b's 26.3 against 28.4, 290.7 against 357.0. The chunk copies in flight while the warps work on the
 * chunk before took 4096 tokens from 764 to 695 us (llama3-8b) and 309 to 291 (qwen2-1.5b). */
#define PREFILL_MMA_WARPS 4
#define PREFILL_MMA_KV 64

/* c += a b: 16x16 F16 a (row-major fragments), 16x8 F16 b (column-major), F32 c. Lane (g = lane / 4, q = lane % 4)
 * holds a's rows g and g + 8 at columns 2q, 2q + 1 and 2q + 8, 2q + 9; b's rows 2q, 2q + 1 and 2q + 8, 2q + 9 of
 * column g; c's rows g and g + 8 at columns 2q, 2q + 1. */
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8x8 F16 matrices from shared memory, lane l giving the address of row l % 8 of matrix l / 8; with TRANS each
 * is transposed on the way. r[i] is matrix i's fragment: row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1. */
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __half *row) {
    unsigned addr = (unsigned)__cvta_generic_to_shared(row);
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ uint32_t pack_half2(float x, float y) {
    __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t *>(&h);
}

/* The warp's 16 query rows as A fragments, k-step kk holding dims 16 kk .. 16 kk + 15; rows past n_tokens zero. */
template <int HD>
__device__ __forceinline__ void load_q_fragments(const kiln_cuda_attn_args &a, const float *q, int t_warp,
                                                 int n_tokens, int head, uint32_t (&qf)[HD / 16][4]) {
    int g = (threadIdx.x & 31) >> 2, c = 2 * (threadIdx.x & 3);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int t = t_warp + g + 8 * r;
        const float *qr = q + ((int64_t)min(t, n_tokens - 1) * a.n_head + head) * HD + c;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            float2 lo = *(const float2 *)(qr + 16 * kk), hi = *(const float2 *)(qr + 16 * kk + 8);
            if (t >= n_tokens) lo = hi = make_float2(0.0f, 0.0f);
            qf[kk][r] = pack_half2(lo.x, lo.y), qf[kk][2 + r] = pack_half2(hi.x, hi.y);
        }
    }
}

/* Copies of positions p0 .. p0 + PREFILL_MMA_KV - 1 of K and V into shared memory (rows of STRIDE halves), zeros
 * past last, issued as one cp.async group that the caller waits for. */
template <int HD, int STRIDE>
__device__ __forceinline__ void stage_kv(const __half *kb, const __half *vb, int p0, int last, __half *ks, __half *vs) {
    constexpr int ROW_CHUNKS = HD / 8;
    for (int i = threadIdx.x; i < PREFILL_MMA_KV * ROW_CHUNKS; i += 32 * PREFILL_MMA_WARPS) {
        int r = i / ROW_CHUNKS, c = 8 * (i % ROW_CHUNKS);
        bool in = p0 + r <= last;
        int64_t at = in ? (int64_t)(p0 + r) * HD + c : 0; /* a source in bounds; none of it is read when !in */
        unsigned kd = (unsigned)__cvta_generic_to_shared(ks + r * STRIDE + c);
        unsigned vd = (unsigned)__cvta_generic_to_shared(vs + r * STRIDE + c);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(kd), "l"(kb + at), "r"(in ? 16 : 0));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(vd), "l"(vb + at), "r"(in ? 16 : 0));
    }
    cp_async_commit();
}

/* S = Q K^T over the staged chunk: s[j] holds positions 8 j .. 8 j + 7 (C fragments). One ldmatrix_x4 gives the B
 * fragments of one position group for two k-steps. */
template <int HD, int STRIDE>
__device__ __forceinline__ void chunk_scores(const uint32_t (&qf)[HD / 16][4], const __half *ks,
                                             float (&s)[PREFILL_MMA_KV / 8][4]) {
    int lane = threadIdx.x & 31, mi = lane >> 3, r = lane & 7;
#pragma unroll
    for (int j = 0; j < PREFILL_MMA_KV / 8; j++) {
        s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk += 2) {
            uint32_t b[4]; /* k-step kk: b[0], b[1]; kk + 1: b[2], b[3] */
            ldmatrix_x4<false>(b, ks + (8 * j + r) * STRIDE + 16 * kk + 8 * mi);
            mma_f16(s[j], qf[kk], b[0], b[1]);
            mma_f16(s[j], qf[kk + 1], b[2], b[3]);
        }
    }
}

/* The online softmax of the chunk's scores for rows g (r = 0) and g + 8 (r = 1): masks positions past each row's
 * last, rescales o and l to the new maximum, and leaves the probabilities in s. */
template <int HD>
__device__ __forceinline__ void chunk_softmax(float (&s)[PREFILL_MMA_KV / 8][4], int p0, const int (&last)[2],
                                              float (&m)[2], float (&l)[2], float (&o)[HD / 8][4]) {
    int c = 2 * (threadIdx.x & 3);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < PREFILL_MMA_KV / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                if (p0 + 8 * j + c + e > last[r]) s[j][2 * r + e] = -INFINITY;
                mx = fmaxf(mx, s[j][2 * r + e]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        /* finite: every row sees position 0, which the first chunk holds */
        float m_new = fmaxf(m[r], mx), corr = expf(m[r] - m_new), sum = 0.0f;
#pragma unroll
        for (int j = 0; j < PREFILL_MMA_KV / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float p = expf(s[j][2 * r + e] - m_new);
                s[j][2 * r + e] = p, sum += p;
            }
#pragma unroll
        for (int j = 0; j < HD / 8; j++) o[j][2 * r] *= corr, o[j][2 * r + 1] *= corr;
        l[r] = l[r] * corr + sum;
        m[r] = m_new;
    }
}

/* O += P V: the probabilities as A fragments (k-step kk: positions 16 kk .. 16 kk + 15), V's B fragments by
 * transposing loads, one ldmatrix_x4 for two dim groups. */
template <int HD, int STRIDE>
__device__ __forceinline__ void chunk_values(const float (&s)[PREFILL_MMA_KV / 8][4], const __half *vs,
                                             float (&o)[HD / 8][4]) {
    int lane = threadIdx.x & 31, mi = lane >> 3, r = lane & 7;
#pragma unroll
    for (int kk = 0; kk < PREFILL_MMA_KV / 16; kk++) {
        uint32_t pa[4] = {pack_half2(s[2 * kk][0], s[2 * kk][1]), pack_half2(s[2 * kk][2], s[2 * kk][3]),
                          pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int j = 0; j < HD / 8; j += 2) {
            uint32_t b[4]; /* dims 8 j ..: b[0], b[1]; 8 (j + 1) ..: b[2], b[3] */
            ldmatrix_x4<true>(b, vs + (16 * kk + 8 * (mi & 1) + r) * STRIDE + 8 * j + 8 * (mi >> 1));
            mma_f16(o[j], pa, b[0], b[1]);
            mma_f16(o[j + 1], pa, b[2], b[3]);
        }
    }
}

/* Halves of shared memory a chunk buffer holds: K and V rows of head_dim + 8 (16 bytes of padding a row: the 8 rows
 * an ldmatrix phase reads then start in 8 different groups of 4 banks). Two buffers a block. */
template <int HD>
__host__ __device__ constexpr int chunk_halves() {
    return 2 * PREFILL_MMA_KV * (HD + 8);
}

template <int HD>
__global__ void __launch_bounds__(32 * PREFILL_MMA_WARPS)
    attn_prefill_mma_kernel(kiln_cuda_attn_args a, const float *q, const __half *k_cache, const __half *v_cache,
                            const int32_t *d_pos, int n_tokens, float *out) {
    constexpr int STRIDE = HD + 8, BLOCK_QUERIES = 16 * PREFILL_MMA_WARPS;
    extern __shared__ __align__(16) __half staged[]; /* two buffers of chunk_halves: K rows, then V rows */
    int head = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = 2 * (lane & 3);
    int t_block = (gridDim.y - 1 - blockIdx.y) * BLOCK_QUERIES, t_warp = t_block + 16 * warp;
    int pos0 = *d_pos;
    int block_last = pos0 + min(t_block + BLOCK_QUERIES, n_tokens) - 1;
    int warp_last = t_warp < n_tokens ? pos0 + min(t_warp + 16, n_tokens) - 1 : -1; /* -1: the warp has no rows */
    int last[2];
    for (int r = 0; r < 2; r++) last[r] = pos0 + t_warp + g + 8 * r; /* rows past n_tokens: any, never stored */
    int kvh = head / (a.n_head / a.n_head_kv);
    const __half *kb = k_cache + (int64_t)kvh * a.n_ctx * HD, *vb = v_cache + (int64_t)kvh * a.n_ctx * HD;

    stage_kv<HD, STRIDE>(kb, vb, 0, block_last, staged, staged + chunk_halves<HD>() / 2);
    uint32_t qf[HD / 16][4];
    load_q_fragments<HD>(a, q, t_warp, n_tokens, head, qf);
    float o[HD / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < HD / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    for (int p0 = 0, buf = 0; p0 <= block_last; p0 += PREFILL_MMA_KV, buf ^= 1) {
        const __half *ks = staged + buf * chunk_halves<HD>(), *vs = ks + chunk_halves<HD>() / 2;
        if (p0 + PREFILL_MMA_KV <= block_last) { /* the next chunk into the other buffer, read two barriers ago */
            __half *next = staged + (buf ^ 1) * chunk_halves<HD>();
            stage_kv<HD, STRIDE>(kb, vb, p0 + PREFILL_MMA_KV, block_last, next, next + chunk_halves<HD>() / 2);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads(); /* every thread's copies of this chunk have landed */
        if (p0 <= warp_last) { /* else every position is past the warp's rows */
            float s[PREFILL_MMA_KV / 8][4];
            chunk_scores<HD, STRIDE>(qf, ks, s);
            chunk_softmax<HD>(s, p0, last, m, l, o);
            chunk_values<HD, STRIDE>(s, vs, o);
        }
        __syncthreads(); /* this buffer is no longer read: the next round but one refills it */
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = l[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        int t = t_warp + g + 8 * r;
        if (t >= n_tokens) continue;
        float *orow = out + ((int64_t)t * a.n_head + head) * HD + c;
#pragma unroll
        for (int j = 0; j < HD / 8; j++) *(float2 *)(orow + 8 * j) = make_float2(o[j][2 * r] / sum, o[j][2 * r + 1] / sum);
    }
}

/* Whether prompt batches take the tensor-core kernel where it has the head_dim (KILN_CUDA_PREFILL_MMA=0: the FMA
 * kernel, for comparisons; read at each launch). */
static bool prefill_mma() {
    const char *e = getenv("KILN_CUDA_PREFILL_MMA");
    return !e || atoi(e) != 0;
}

template <int HD>
static int launch_mma(const kiln_cuda_attn_args *a, const float *q, const __half *kc, const __half *vc,
                      const int32_t *d_pos, int n_tokens, float *out, cudaStream_t stream) {
    auto kernel = attn_prefill_mma_kernel<HD>;
    size_t smem = 2 * sizeof(__half) * chunk_halves<HD>();
    static bool sized = false; /* more than the 48 KB a launch gets unasked: once per instantiation */
    if (!sized && cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return -1;
    sized = true;
    dim3 grid(a->n_head, div_up(n_tokens, 16 * PREFILL_MMA_WARPS));
    kernel<<<grid, 32 * PREFILL_MMA_WARPS, smem, stream>>>(*a, q, kc, vc, d_pos, n_tokens, out);
    return 0;
}

extern "C" int kiln_cuda_attention_prefill(const kiln_cuda_attn_args *a, const float *q, const void *k_cache,
                                           const void *v_cache, const int32_t *d_pos, int n_tokens, float *out,
                                           cudaStream_t stream) {
    const __half *kc = (const __half *)k_cache, *vc = (const __half *)v_cache;
    bool mma = prefill_mma() && (a->head_dim == 64 || a->head_dim == 128);
    if (mma && a->head_dim == 64) return launch_mma<64>(a, q, kc, vc, d_pos, n_tokens, out, stream);
    if (mma) return launch_mma<128>(a, q, kc, vc, d_pos, n_tokens, out, stream);
    dim3 grid(a->n_head, div_up(n_tokens, PREFILL_QUERIES));
    switch (a->head_dim) {
#define FMA(HD) attn_prefill_fma_kernel<HD><<<grid, 4 * PREFILL_QUERIES, 0, stream>>>(*a, q, kc, vc, d_pos, n_tokens, out)
    case 64: FMA(64); return 0;
    case 128: FMA(128); return 0;
    case 256: FMA(256); return 0;
#undef FMA
    default: return -1;
    }
}

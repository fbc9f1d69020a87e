/* Matrix times several vectors for a batched decode step (the tokens of many sequences): each weight part is read
 * from memory and unpacked once, then dotted with up to BATCH_GROUP activation vectors; a warp owns ROWS_PER_WARP
 * rows, and the warps of a block walk the same parts together, so the activations one loads from L2 serve the rest
 * from L1. Batches larger than a group run as more blocks over the same rows, placed next to each other in the grid
 * so their weight reads meet in L2. Traffic from L2 per group is about the weights once plus the group's
 * activations once per block (2 * BATCH_GROUP / rows per block times the Q4_K weight bytes).
 *
 * Batch invariance: vector j's result is summed in the same order whatever the batch size or j's place in it (a
 * lane adds its parts in order, then the warp sum), so a sequence's output does not depend on who shares the step. */
#include "cuda/cuda_common.cuh"
#include "cuda/kernels_batch.h"
#include "cuda/quant_unpack.cuh"

#define BATCH_GROUP 16
#define ROWS_PER_WARP 2
/* warps per block: 16 x 2 rows; the SwiGLU form, with twice the registers a row, 8 x 2 rows of two matrices */
#define Q_WARPS(SWIGLU) ((SWIGLU) ? 8 : 16)
#define F_WARPS 4
#define BATCH_MAX_MATS 3

struct batch_job {
    qtensor w[BATCH_MAX_MATS];
    const uint8_t *wf[BATCH_MAX_MATS]; /* float types: the rows, row_bytes apart */
    float *y[BATCH_MAX_MATS];
    int n[BATCH_MAX_MATS];
    int first[BATCH_MAX_MATS]; /* matrix m's first row block */
    int n_mats;
    bool accumulate;
};

/* dot_part's arithmetic on a part already unpacked, with activation block xq (32 int8) and its scale d. */
template <class F>
__device__ __forceinline__ float dot_unpacked(const kpart &p, const int xq[8], float d) {
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        s0 = __dp4a(p.q[i], xq[i], s0);
        s1 = __dp4a(p.q[4 + i], xq[4 + i], s1);
    }
    float r = p.d[0] * (float)s0 + p.d[1] * (float)s1;
    if (F::has_min) {
        int t0 = 0, t1 = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            t0 = __dp4a(0x01010101, xq[i], t0);
            t1 = __dp4a(0x01010101, xq[4 + i], t1);
        }
        r += p.m[0] * (float)t0 + p.m[1] * (float)t1;
    }
    return r * d;
}

/* The matrix of row block rb, picked with constant indices (a run-time index would put the job in local memory). */
__device__ __forceinline__ int pick(const batch_job &job, int rb) {
    return job.n_mats > 2 && rb >= job.first[2] ? 2 : job.n_mats > 1 && rb >= job.first[1] ? 1 : 0;
}

template <class T>
__device__ __forceinline__ T select3(int m, const T &a, const T &b, const T &c) { return m == 2 ? c : m == 1 ? b : a; }

__device__ __forceinline__ void store(float *y, int64_t i, float v, bool accumulate) {
    y[i] = accumulate ? y[i] + v : v;
}

/* Block: Q_WARPS warps of ROWS_PER_WARP rows; grid: row blocks x groups of vectors, the group varying fastest.
 * With SWIGLU, w[0] is the gate and w[1] the up matrix, and y[0] receives silu(gate x) * (up x). */
template <class F, bool SWIGLU>
__global__ void __launch_bounds__(32 * Q_WARPS(SWIGLU))
    gemv_batch_q_kernel(batch_job job, int n_parts, const void *xq, int n_vec) {
    pdl_wait_and_release();
    int n_groups = (n_vec + BATCH_GROUP - 1) / BATCH_GROUP;
    int group = blockIdx.x % n_groups, rb = blockIdx.x / n_groups;
    int mi = SWIGLU ? 0 : pick(job, rb);
    qtensor w = select3(mi, job.w[0], job.w[1], job.w[2]);
    float *y = select3(mi, job.y[0], job.y[1], job.y[2]);
    int n = select3(mi, job.n[0], job.n[1], job.n[2]);
    int first = select3(mi, job.first[0], job.first[1], job.first[2]);
    int row0 = ((rb - first) * Q_WARPS(SWIGLU) + threadIdx.y) * ROWS_PER_WARP;
    if (row0 >= n) return;
    const qtensor up = job.w[1];
    int j0 = group * BATCH_GROUP, nv = min(BATCH_GROUP, n_vec - j0);
    const int8_t *qs = (const int8_t *)xq;
    const __half2 *ds = (const __half2 *)(qs + (int64_t)n_vec * n_parts * 32);
    int blocks_per_row = n_parts / F::parts;
    float a[ROWS_PER_WARP][BATCH_GROUP], b[ROWS_PER_WARP][BATCH_GROUP];
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; r++)
#pragma unroll
        for (int j = 0; j < BATCH_GROUP; j++) a[r][j] = b[r][j] = 0.0f;
    for (int u = threadIdx.x; u < n_parts; u += 32) {
        kpart p[ROWS_PER_WARP], pu[ROWS_PER_WARP];
#pragma unroll
        for (int r = 0; r < ROWS_PER_WARP; r++) {
            int row = min(row0 + r, n - 1); /* a missing last row reads its neighbour and is not stored */
            int64_t g = (int64_t)row * blocks_per_row + u / F::parts;
            F::unpack(w, g, u % F::parts, p[r]);
            if (SWIGLU) F::unpack(up, g, u % F::parts, pu[r]);
        }
#pragma unroll
        for (int j = 0; j < BATCH_GROUP; j++) {
            if (j >= nv) break;
            int64_t blk = (int64_t)(j0 + j) * n_parts + u;
            int x[8];
            ld32b((const uint8_t *)(qs + 32 * blk), x);
            float d = __low2float(ds[blk]);
#pragma unroll
            for (int r = 0; r < ROWS_PER_WARP; r++) {
                a[r][j] += dot_unpacked<F>(p[r], x, d);
                if (SWIGLU) b[r][j] += dot_unpacked<F>(pu[r], x, d);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; r++) {
#pragma unroll
        for (int j = 0; j < BATCH_GROUP; j++) {
            float va = warp_sum(a[r][j]), vb = SWIGLU ? warp_sum(b[r][j]) : 0.0f;
            if (threadIdx.x != 0 || j >= nv || row0 + r >= n) continue;
            int64_t i = (int64_t)(j0 + j) * n + row0 + r;
            if (SWIGLU) y[i] = silu(va) * vb;
            else store(y, i, va, job.accumulate);
        }
    }
}

/* Eight consecutive weights of a float row as F32 (as gemv.cu reads them). */
template <kiln_type T>
__device__ __forceinline__ void load8f(const uint8_t *row, int i8, float v[8]) {
    if (T == KILN_TYPE_F32) {
        const float4 *p = (const float4 *)row + 2 * i8;
        float4 a = p[0], b = p[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        uint4 r = ((const uint4 *)row)[i8];
        uint32_t words[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (T == KILN_TYPE_F16) {
                float2 f = __half22float2(*(__half2 *)&words[i]);
                v[2 * i] = f.x, v[2 * i + 1] = f.y;
            } else {
                v[2 * i] = __uint_as_float(words[i] << 16);
                v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
            }
        }
    }
}

__device__ __forceinline__ float dot8f(const float w[8], const float *x, int i8) {
    const float4 *xp = (const float4 *)x + 2 * i8;
    float4 a = xp[0], b = xp[1];
    return w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
}

/* Float weights with F32 activations: one row per warp, eight weights per lane and step. */
template <kiln_type T, bool SWIGLU>
__global__ void __launch_bounds__(32 * F_WARPS)
    gemv_batch_f_kernel(batch_job job, size_t row_bytes, int k, const float *x, int n_vec) {
    pdl_wait_and_release();
    int n_groups = (n_vec + BATCH_GROUP - 1) / BATCH_GROUP;
    int group = blockIdx.x % n_groups, rb = blockIdx.x / n_groups;
    int mi = SWIGLU ? 0 : pick(job, rb);
    const uint8_t *w = select3(mi, job.wf[0], job.wf[1], job.wf[2]);
    float *y = select3(mi, job.y[0], job.y[1], job.y[2]);
    int n = select3(mi, job.n[0], job.n[1], job.n[2]);
    int first = select3(mi, job.first[0], job.first[1], job.first[2]);
    int row = (rb - first) * F_WARPS + threadIdx.y;
    if (row >= n) return;
    int j0 = group * BATCH_GROUP, nv = min(BATCH_GROUP, n_vec - j0);
    const uint8_t *wr = w + row_bytes * row, *ur = SWIGLU ? job.wf[1] + row_bytes * row : nullptr;
    float a[BATCH_GROUP], b[BATCH_GROUP];
#pragma unroll
    for (int j = 0; j < BATCH_GROUP; j++) a[j] = b[j] = 0.0f;
    for (int i8 = threadIdx.x; i8 < k / 8; i8 += 32) {
        float wv[8], uv[8];
        load8f<T>(wr, i8, wv);
        if (SWIGLU) load8f<T>(ur, i8, uv);
#pragma unroll
        for (int j = 0; j < BATCH_GROUP; j++) {
            if (j >= nv) break;
            const float *xj = x + (int64_t)(j0 + j) * k;
            a[j] += dot8f(wv, xj, i8);
            if (SWIGLU) b[j] += dot8f(uv, xj, i8);
        }
    }
#pragma unroll
    for (int j = 0; j < BATCH_GROUP; j++) {
        float va = warp_sum(a[j]), vb = SWIGLU ? warp_sum(b[j]) : 0.0f;
        if (threadIdx.x != 0 || j >= nv) continue;
        int64_t i = (int64_t)(j0 + j) * n + row;
        if (SWIGLU) y[i] = silu(va) * vb;
        else store(y, i, va, job.accumulate);
    }
}

/* ms[0..n_mats) share type and width (checked by the callers). */
template <bool SWIGLU>
static int launch_batch(const kiln_cuda_matrix *const *ms, float *const *ys, int n_mats, const void *xq,
                        const float *xf, int n_vec, bool accumulate, cudaStream_t stream) {
    const kiln_cuda_matrix *m0 = ms[0];
    bool quant = kiln_cuda_type_uses_q8_1(m0->type);
    int warps = quant ? Q_WARPS(SWIGLU) : F_WARPS, rows_per_block = quant ? warps * ROWS_PER_WARP : warps;
    batch_job job = {};
    job.n_mats = n_mats;
    job.accumulate = accumulate;
    int row_blocks = 0;
    for (int i = 0; i < n_mats; i++) {
        job.wf[i] = (const uint8_t *)ms[i]->data;
        job.y[i] = ys[i];
        job.n[i] = ms[i]->n;
        job.first[i] = row_blocks;
        if (!SWIGLU || i == 0) row_blocks += div_up(ms[i]->n, rows_per_block);
    }
    int grid = row_blocks * div_up(n_vec, BATCH_GROUP);
    dim3 block(32, warps);
    int n_parts = m0->k / 32;
    switch (m0->type) {
#define X(id, F)                                                                                                       \
    case id:                                                                                                           \
        for (int i = 0; i < n_mats; i++)                                                                               \
            job.w[i] = qtensor{(const uint8_t *)ms[i]->data, (int64_t)ms[i]->n * (n_parts / F::parts)};                \
        launch_pdl(gemv_batch_q_kernel<F, SWIGLU>, grid, block, stream, job, n_parts, xq, n_vec);                     \
        return 0;
        KILN_CUDA_QUANT_TYPES(X)
#undef X
#define X(id)                                                                                                          \
    case id:                                                                                                           \
        launch_pdl(gemv_batch_f_kernel<id, SWIGLU>, grid, block, stream, job, m0->row_bytes, m0->k, xf, n_vec);       \
        return 0;
        X(KILN_TYPE_F32) X(KILN_TYPE_F16) X(KILN_TYPE_BF16)
#undef X
    default: return -1;
    }
}

extern "C" int kiln_cuda_gemv_batch(const kiln_cuda_matrix *m, const void *xq, const float *xf, int n_vec, float *y,
                                    bool accumulate, cudaStream_t stream) {
    if (!kiln_cuda_type_supported(m->type, m->k) || n_vec < 1) return -1;
    return launch_batch<false>(&m, &y, 1, xq, xf, n_vec, accumulate, stream);
}

extern "C" int kiln_cuda_gemv_batch_multi(const kiln_cuda_matrix *const *ms, float *const *ys, int n_mats,
                                          const void *xq, const float *xf, int n_vec, cudaStream_t stream) {
    if (n_mats < 1 || n_mats > BATCH_MAX_MATS || n_vec < 1) return -1;
    bool same = true;
    for (int i = 0; i < n_mats; i++) {
        if (!kiln_cuda_type_supported(ms[i]->type, ms[i]->k)) return -1;
        same = same && ms[i]->type == ms[0]->type && ms[i]->k == ms[0]->k && ms[i]->row_bytes == ms[0]->row_bytes;
    }
    if (same) return launch_batch<false>(ms, ys, n_mats, xq, xf, n_vec, false, stream);
    for (int i = 0; i < n_mats; i++)
        if (launch_batch<false>(ms + i, ys + i, 1, xq, xf, n_vec, false, stream)) return -1;
    return 0;
}

extern "C" int kiln_cuda_gemv_batch_swiglu(const kiln_cuda_matrix *gate, const kiln_cuda_matrix *up, const void *xq,
                                           const float *xf, int n_vec, float *y, cudaStream_t stream) {
    if (gate->type != up->type || gate->k != up->k || gate->n != up->n || gate->row_bytes != up->row_bytes) return -1;
    if (!kiln_cuda_type_supported(gate->type, gate->k) || n_vec < 1) return -1;
    const kiln_cuda_matrix *ms[2] = {gate, up};
    float *ys[2] = {y, y};
    return launch_batch<true>(ms, ys, 2, xq, xf, n_vec, false, stream);
}

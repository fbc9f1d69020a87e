/* Matrix-vector products for batch-1 decode, which is bound by reading the weights once: one warp per output row
 * streams the row in parts of 32 weights, lane after lane over consecutive bytes, so each warp load is one
 * contiguous run. Quantized rows are dotted with Q8_1 activations by int8 dp4a; float rows with F32 activations in
 * 16-byte loads. The fused gate/up kernel reads both matrices in the same pass and applies SwiGLU. */
#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"
#include "cuda/quant_unpack.cuh"

#define GEMV_ROWS_PER_BLOCK 4

/* One Q8_1 block from the 32 values a warp holds, one per lane (the lanes' order is the elements' order). */
__device__ __forceinline__ void quantize_warp(float v, int8_t *qs, __half2 *ds) {
    int lane = threadIdx.x & 31;
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    int q = amax > 0.0f ? __float2int_rn(v / d) : 0;
    int sum = warp_sum_int(q);
    qs[lane] = (int8_t)q;
    if (lane == 0) *ds = __floats2half2_rn(d, d * (float)sum);
}

__global__ void quantize_q8_1_kernel(const float *x, int8_t *q, int64_t n_blocks) {
    pdl_wait_and_release();
    int64_t b = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (b >= n_blocks) return; /* whole warps leave together: n_blocks is counted in warps */
    quantize_warp(x[b * 32 + (threadIdx.x & 31)], q + b * 32, (__half2 *)(q + n_blocks * 32) + b);
}

extern "C" void kiln_cuda_quantize_q8_1(const float *x, void *q, int k, int n_rows, cudaStream_t stream) {
    int64_t n_blocks = (int64_t)n_rows * (k / 32);
    launch_pdl(quantize_q8_1_kernel, div_up(n_blocks * 32, 256), 256, stream, x, (int8_t *)q, n_blocks);
}

__device__ __forceinline__ void store_row(float *y, int row, float v, bool accumulate) {
    y[row] = accumulate ? y[row] + v : v;
}

/* Up to three matrices of one type and width in one launch (Q, K and V read the same activations): blocks are
 * dealt to the matrices in order, first[m] being matrix m's first block. With SWIGLU, w[0] is the gate, w[1] the up
 * matrix and one output is written. */
#define GEMV_MAX_MATS 3

struct gemv_job {
    qtensor w[GEMV_MAX_MATS];
    float *y[GEMV_MAX_MATS];
    int n[GEMV_MAX_MATS];
    int first[GEMV_MAX_MATS];
    int n_mats;
    bool accumulate;
};

/* SPLIT warps per row (each takes every SPLIT-th run of 32 parts; long rows, like the FFN down projection's, then
 * keep more loads in flight). The matrix is picked with constant indices: a run-time index into the parameter
 * arrays would copy them to local memory. */
template <class F, bool SWIGLU, int SPLIT>
__global__ void __launch_bounds__(32 * GEMV_ROWS_PER_BLOCK) gemv_q_kernel(gemv_job job, int n_parts, const void *xq) {
    pdl_wait_and_release();
    qtensor w = job.w[0];
    float *y = job.y[0];
    int n = job.n[0], first = 0;
    if (!SWIGLU && job.n_mats > 1 && (int)blockIdx.x >= job.first[1]) w = job.w[1], y = job.y[1], n = job.n[1], first = job.first[1];
    if (!SWIGLU && job.n_mats > 2 && (int)blockIdx.x >= job.first[2]) w = job.w[2], y = job.y[2], n = job.n[2], first = job.first[2];
    int slice = threadIdx.y % SPLIT;
    int row = ((int)blockIdx.x - first) * (GEMV_ROWS_PER_BLOCK / SPLIT) + threadIdx.y / SPLIT;
    if (SPLIT == 1 && row >= n) return; /* with SPLIT > 1 every warp must reach the barrier below */
    const qtensor up = job.w[1];
    q8_1_view x = q8_1_at(xq, (int64_t)n_parts * 32);
    int64_t g0 = (int64_t)row * (n_parts / F::parts); /* the row's first block */
    float a = 0.0f, b = 0.0f;
#pragma unroll 2
    for (int u = 32 * slice + threadIdx.x; row < n && u < n_parts; u += 32 * SPLIT) {
        int64_t g = g0 + u / F::parts;
        int part = u % F::parts;
        a += dot_part<F>(w, g, part, x, u);
        if (SWIGLU) b += dot_part<F>(up, g, part, x, u);
    }
    a = warp_sum(a);
    if (SWIGLU) b = warp_sum(b);
    if (SPLIT > 1) {
        __shared__ float sa[GEMV_ROWS_PER_BLOCK], sb[GEMV_ROWS_PER_BLOCK];
        if (threadIdx.x == 0) sa[threadIdx.y] = a, sb[threadIdx.y] = b;
        __syncthreads();
        if (slice != 0 || row >= n) return;
#pragma unroll
        for (int s = 1; s < SPLIT; s++) a += sa[threadIdx.y + s], b += sb[threadIdx.y + s];
    }
    if (threadIdx.x == 0) {
        if (SWIGLU) y[row] = silu(a) * b;
        else store_row(y, row, a, job.accumulate);
    }
}

/* Eight consecutive weights of a float row as F32: one 16-byte load for F16/BF16, two for F32. */
template <kiln_type T>
__device__ __forceinline__ void load8(const uint8_t *row, int i8, float v[8]) {
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
                __half2 h = *(__half2 *)&words[i];
                float2 f = __half22float2(h);
                v[2 * i] = f.x, v[2 * i + 1] = f.y;
            } else {
                v[2 * i] = __uint_as_float(words[i] << 16);
                v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
            }
        }
    }
}

template <kiln_type T>
__device__ __forceinline__ float dot8(const uint8_t *row, int i8, const float *x) {
    float w[8];
    load8<T>(row, i8, w);
    const float4 *xp = (const float4 *)x + 2 * i8;
    float4 a = xp[0], b = xp[1];
    return w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
}

template <kiln_type T, bool SWIGLU>
__global__ void __launch_bounds__(32 * GEMV_ROWS_PER_BLOCK)
    gemv_f_kernel(const uint8_t *w, const uint8_t *w_up, size_t row_bytes, int k, const float *x, float *y, int n,
                  bool accumulate) {
    pdl_wait_and_release();
    int row = blockIdx.x * GEMV_ROWS_PER_BLOCK + threadIdx.y;
    if (row >= n) return;
    const uint8_t *wr = w + row_bytes * row;
    const uint8_t *ur = SWIGLU ? w_up + row_bytes * row : nullptr;
    float a = 0.0f, b = 0.0f;
    for (int i8 = threadIdx.x; i8 < k / 8; i8 += 32) {
        a += dot8<T>(wr, i8, x);
        if (SWIGLU) b += dot8<T>(ur, i8, x);
    }
    a = warp_sum(a);
    if (SWIGLU) b = warp_sum(b);
    if (threadIdx.x == 0) {
        if (SWIGLU) y[row] = silu(a) * b;
        else store_row(y, row, a, accumulate);
    }
}

static int block_elems(kiln_type t) {
    switch (t) {
    case KILN_TYPE_F32: case KILN_TYPE_F16: case KILN_TYPE_BF16: return 8;
#define X(id, F) case id: return 32 * F::parts;
        KILN_CUDA_QUANT_TYPES(X)
#undef X
    default: return 0;
    }
}

extern "C" bool kiln_cuda_type_supported(kiln_type type, int k) {
    int b = block_elems(type);
    return b > 0 && k > 0 && k % b == 0;
}

extern "C" bool kiln_cuda_type_uses_q8_1(kiln_type type) {
    return kiln_cuda_type_supported(type, 256) && type != KILN_TYPE_F32 && type != KILN_TYPE_F16 &&
           type != KILN_TYPE_BF16;
}

template <class F>
static qtensor tensor_of(const kiln_cuda_matrix *m) {
    return qtensor{(const uint8_t *)m->data, (int64_t)m->n * (m->k / 32 / F::parts)};
}

template <bool SWIGLU>
static int launch_float(const kiln_cuda_matrix *m, const uint8_t *w_up, const float *xf, float *y, bool accumulate,
                        cudaStream_t stream) {
    dim3 block(32, GEMV_ROWS_PER_BLOCK);
    int grid = div_up(m->n, GEMV_ROWS_PER_BLOCK);
    const uint8_t *w = (const uint8_t *)m->data;
    switch (m->type) {
#define X(id)                                                                                                          \
    case id:                                                                                                           \
        launch_pdl(gemv_f_kernel<id, SWIGLU>, grid, block, stream, w, w_up, m->row_bytes, m->k, xf, y, m->n, accumulate);\
        return 0;
        X(KILN_TYPE_F32) X(KILN_TYPE_F16) X(KILN_TYPE_BF16)
#undef X
    default: return -1;
    }
}

/* ms[0..n_mats) share type and width (checked by the callers). */
template <bool SWIGLU>
static int launch_quant(const kiln_cuda_matrix *const *ms, float *const *ys, int n_mats, const void *xq,
                        bool accumulate, cudaStream_t stream) {
    const kiln_cuda_matrix *m0 = ms[0];
    gemv_job job = {};
    job.n_mats = n_mats;
    job.accumulate = accumulate;
    /* long rows (8192+ inputs) in few rows get two warps each: measured on H100, qwen2-1.5b's down projection
     * (8960 x 1536) ran 12% faster, llama3-8b's (14336 x 4096, enough warps already) no faster */
    int split = m0->k / 32 >= 256 && m0->n < 4096 ? 2 : 1;
    int blocks = 0, rows_per_block = GEMV_ROWS_PER_BLOCK / split;
    for (int i = 0; i < n_mats; i++) {
        job.y[i] = ys[i];
        job.n[i] = ms[i]->n;
        job.first[i] = blocks;
        if (!SWIGLU || i == 0) blocks += div_up(ms[i]->n, rows_per_block);
    }
    dim3 block(32, GEMV_ROWS_PER_BLOCK);
    int n_parts = m0->k / 32;
    switch (m0->type) {
#define X(id, F)                                                                                                       \
    case id:                                                                                                           \
        for (int i = 0; i < n_mats; i++) job.w[i] = tensor_of<F>(ms[i]);                                              \
        if (split == 2) launch_pdl(gemv_q_kernel<F, SWIGLU, 2>, blocks, block, stream, job, n_parts, xq);                  \
        else launch_pdl(gemv_q_kernel<F, SWIGLU, 1>, blocks, block, stream, job, n_parts, xq);                             \
        return 0;
        KILN_CUDA_QUANT_TYPES(X)
#undef X
    default: return -1;
    }
}

extern "C" int kiln_cuda_gemv(const kiln_cuda_matrix *m, const void *xq, const float *xf, float *y, bool accumulate,
                              cudaStream_t stream) {
    if (!kiln_cuda_type_supported(m->type, m->k)) return -1;
    if (!kiln_cuda_type_uses_q8_1(m->type)) return launch_float<false>(m, nullptr, xf, y, accumulate, stream);
    return launch_quant<false>(&m, &y, 1, xq, accumulate, stream);
}

extern "C" int kiln_cuda_gemv_multi(const kiln_cuda_matrix *const *ms, float *const *ys, int n_mats, const void *xq,
                                    const float *xf, cudaStream_t stream) {
    if (n_mats < 1 || n_mats > GEMV_MAX_MATS) return -1;
    bool same = true;
    for (int i = 0; i < n_mats; i++) {
        if (!kiln_cuda_type_supported(ms[i]->type, ms[i]->k)) return -1;
        same = same && ms[i]->type == ms[0]->type && ms[i]->k == ms[0]->k;
    }
    if (same && kiln_cuda_type_uses_q8_1(ms[0]->type)) return launch_quant<false>(ms, ys, n_mats, xq, false, stream);
    for (int i = 0; i < n_mats; i++)
        if (kiln_cuda_gemv(ms[i], xq, xf, ys[i], false, stream)) return -1;
    return 0;
}

extern "C" int kiln_cuda_gemv_swiglu(const kiln_cuda_matrix *gate, const kiln_cuda_matrix *up, const void *xq,
                                     const float *xf, float *y, cudaStream_t stream) {
    if (gate->type != up->type || gate->k != up->k || gate->n != up->n || gate->row_bytes != up->row_bytes) return -1;
    if (!kiln_cuda_type_supported(gate->type, gate->k)) return -1;
    if (!kiln_cuda_type_uses_q8_1(gate->type))
        return launch_float<true>(gate, (const uint8_t *)up->data, xf, y, false, stream);
    const kiln_cuda_matrix *ms[2] = {gate, up};
    float *ys[2] = {y, y};
    return launch_quant<true>(ms, ys, 2, xq, false, stream);
}

/* The layers of a decode step as one persistent cooperative kernel (see kiln_cuda_decode_layers in kernels.h).
 *
 * Why: at batch 1 a layer of a small model reads its weights in a few microseconds, about what a kernel boundary
 * costs (launch, ramp-up of the first loads, the tail of the last blocks), so a step of ~10 launches a layer spends
 * most of its time between kernels. Here the grid stays resident, stages meet at grid-wide barriers, and the weights
 * of each warp's next rows are already on their way into L2 while it waits at a barrier.
 *
 * Work split: a GEMV stage deals rows to warps (warp w of the grid takes rows w, w + W, ...), each row dotted as in
 * gemv.cu (a lane per part of 32 weights, int8 dp4a against Q8_1 activations); the activations sit in the block's
 * shared memory. The attention stage deals (head, slice) pairs to blocks (attention_slice.cuh). Data written in this
 * launch is read back through L2 (__ldcg): L1 is not coherent between blocks.
 *
 * Measured on H100 it runs at 0.65x the kernel-per-op step (qwen2-1.5b 502 against 767 tok/s, llama3-8b 225 against
 * 366): with 16 warps an SM (128 registers a thread) each stage is a few dependent round trips to DRAM and L2 plus a
 * grid barrier, ~11-24 us a stage where the weights take 1-5 (the stage profile in docs/cuda.md). So it is opt-in
 * (KILN_CUDA_PERSISTENT=1), tested with the rest, and the starting point for a step without stage-wide waits. */
#include <cooperative_groups.h>

#include "cuda/attention_slice.cuh"
#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"
#include "cuda/q8_1.cuh"
#include "cuda/quant_unpack.cuh"

namespace cg = cooperative_groups;

#define PD_WARPS 4
#define PD_THREADS (32 * PD_WARPS)

enum { PREFETCH_NEXT_STAGE = 1 };

static __device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }
static __device__ __forceinline__ int grid_warp() { return blockIdx.x * PD_WARPS + (threadIdx.x >> 5); }
static __device__ __forceinline__ int grid_warps() { return gridDim.x * PD_WARPS; }

template <class F>
__device__ __forceinline__ qtensor tensor_of(const kiln_cuda_matrix &m) {
    return qtensor{(const uint8_t *)m.data, (int64_t)m.n * (m.k / 32 / F::parts)};
}

/* The dot products of NR rows of m with x (row0, row0 + stride, ...; the first nr of them), and of m2's same rows
 * when TWO (gate and up in one pass), each summed over the warp. A lane takes parts of 32 weights of every row at
 * once, so NR rows' loads are in flight together: a warp has few rows per stage and would otherwise wait for each. */
template <class F, bool TWO, int NR, int UNROLL>
__device__ __forceinline__ void dot_rows(const kiln_cuda_matrix &m, const kiln_cuda_matrix &m2, int row0, int stride,
                                         int nr, q8_1_view x, float *a, float *b) {
    qtensor t = tensor_of<F>(m), t2 = tensor_of<F>(m2);
    int n_parts = m.k / 32;
    int64_t per_row = n_parts / F::parts;
#pragma unroll
    for (int j = 0; j < NR; j++) a[j] = b[j] = 0.0f;
#pragma unroll UNROLL
    for (int u = lane_id(); u < n_parts; u += 32) {
        int64_t gu = u / F::parts;
        int part = u % F::parts;
#pragma unroll
        for (int j = 0; j < NR; j++)
            if (j < nr) {
                int64_t g = (int64_t)(row0 + j * stride) * per_row + gu;
                a[j] += dot_part<F>(t, g, part, x, u);
                if (TWO) b[j] += dot_part<F>(t2, g, part, x, u);
            }
    }
#pragma unroll
    for (int j = 0; j < NR; j++) {
        a[j] = warp_sum(a[j]);
        if (TWO) b[j] = warp_sum(b[j]);
    }
}

/* Rows of a matrix are dealt to the grid's warps from warp `offset` on (matrices sharing a stage follow each
 * other): this warp's first row, its rows being W apart. */
__device__ __forceinline__ int first_row(int offset) {
    int w = grid_warps();
    return ((grid_warp() - offset) % w + w) % w;
}

/* y[row] = dot(row of m, x), or y[row] += dot (the residual add) when accumulate, for this warp's rows. Short rows
 * go NR = 4 at a time; long ones (the down projection) 2 at a time with two parts of each in flight. */
template <class F>
__device__ void gemv_rows_t(const kiln_cuda_matrix &m, int offset, float *y, bool accumulate, q8_1_view x) {
    constexpr int NR = 4;
    int w = grid_warps();
    for (int r = first_row(offset); r < m.n; r += NR * w) {
        int nr = min(NR, (m.n - r + w - 1) / w);
        float a[NR], b[NR];
        if (m.k >= 8192) dot_rows<F, false, NR / 2, 2>(m, m, r, w, nr, x, a, b);
        if (m.k >= 8192 && nr > NR / 2) dot_rows<F, false, NR / 2, 2>(m, m, r + NR / 2 * w, w, nr - NR / 2, x, a + NR / 2, b);
        if (m.k < 8192) dot_rows<F, false, NR, 1>(m, m, r, w, nr, x, a, b);
        if (lane_id() == 0)
#pragma unroll
            for (int j = 0; j < NR; j++)
                if (j < nr) {
                    float *yr = y + r + j * w;
                    *yr = accumulate ? __ldcg(yr) + a[j] : a[j];
                }
    }
}

__device__ void gemv_rows(const kiln_cuda_matrix &m, int offset, float *y, bool accumulate, q8_1_view x) {
    switch (m.type) {
#define X(id, F)                                                                                                           case id: gemv_rows_t<F>(m, offset, y, accumulate, x); return;
        KILN_CUDA_QUANT_TYPES(X)
#undef X
    default: return;
    }
}

/* Row `row` of m into L2 (the warp's lanes ask for one field each). */
__device__ void prefetch_row(const kiln_cuda_matrix &m, int row) {
    if (row >= m.n) return;
    switch (m.type) {
#define X(id, F)                                                                                                       \
    case id: {                                                                                                         \
        int64_t per_row = m.k / 32 / F::parts;                                                                         \
        prefetch_blocks<F>(tensor_of<F>(m), row * per_row, (row + 1) * per_row);                                       \
        return;                                                                                                        \
    }
        KILN_CUDA_QUANT_TYPES(X)
#undef X
    default: return;
    }
}

/* RMSNorm of x (n values, read through L2) times w, quantized to Q8_1 into the block's shared memory xs. */
__device__ void norm_to_shared(const float *x, const float *w, int n, float eps, int8_t *xs) {
    const float4 *x4 = (const float4 *)x, *w4 = (const float4 *)w;
    int n4 = n / 4;
    float ss = 0.0f;
#pragma unroll 4
    for (int i = threadIdx.x; i < n4; i += PD_THREADS) {
        float4 v = __ldcg(x4 + i);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    float scale = rsqrtf(block_sum(ss) / (float)n + eps);
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    /* whole warps go round together (quantize_quad shuffles); n4 is a multiple of 8, so a Q8_1 block's 8 lanes are
     * all in or all out */
    for (int i = threadIdx.x; i - lane_id() < n4; i += PD_THREADS) {
        bool in = i < n4;
        float4 v = in ? __ldcg(x4 + i) : zero, g = in ? w4[i] : zero;
        float4 o = make_float4(v.x * scale * g.x, v.y * scale * g.y, v.z * scale * g.z, v.w * scale * g.w);
        quantize_quad(o, in, (char4 *)xs + i, (__half2 *)(xs + n) + i / 8);
    }
    __syncthreads();
}

/* The Q8_1 form of n values (n int8, then n/32 half pairs) from device memory into the block's shared memory. */
__device__ void q8_1_to_shared(const void *src, int n, int8_t *xs) {
    const uint4 *q = (const uint4 *)src;
#pragma unroll 4
    for (int i = threadIdx.x; i < n / 16; i += PD_THREADS) ((uint4 *)xs)[i] = __ldcg(q + i);
    const unsigned *ds = (const unsigned *)((const int8_t *)src + n);
    for (int i = threadIdx.x; i < n / 32; i += PD_THREADS) ((unsigned *)(xs + n))[i] = __ldcg(ds + i);
    __syncthreads();
}

/* ff[row] = silu(gate . x) * (up . x) for this warp's rows, two at a time; the warp that completes a group of 32
 * outputs (counted on counters) quantizes the group into ff_q, so the down projection's input is ready at the
 * barrier. */
template <class F>
__device__ void swiglu_rows_t(const kiln_cuda_matrix &gate, const kiln_cuda_matrix &up, q8_1_view x, float *ff,
                              int8_t *ff_q, unsigned *counters) {
    constexpr int NR = 2;
    int n = gate.n, w = grid_warps();
    for (int r = first_row(0); r < n; r += NR * w) {
        int nr = min(NR, (n - r + w - 1) / w);
        float a[NR], b[NR];
        dot_rows<F, true, NR, 1>(gate, up, r, w, nr, x, a, b);
#pragma unroll
        for (int j = 0; j < NR; j++)
            if (j < nr) {
                if (lane_id() == 0) ff[r + j * w] = silu(a[j]) * b[j];
                quantize_when_complete(ff, r + j * w, n, ff_q, counters);
            }
    }
}

__device__ void swiglu_rows(const kiln_cuda_matrix &gate, const kiln_cuda_matrix &up, q8_1_view x, float *ff,
                            int8_t *ff_q, unsigned *counters) {
    switch (gate.type) {
#define X(id, F)                                                                                                           case id: swiglu_rows_t<F>(gate, up, x, ff, ff_q, counters); return;
        KILN_CUDA_QUANT_TYPES(X)
#undef X
    default: return;
    }
}

/* Asks for this warp's first row of m (dealt from warp offset) into L2, when the prefetch bit says so. */
__device__ __forceinline__ void prefetch_first_row(const kiln_cuda_matrix &m, int offset, int prefetch) {
    if (prefetch & PREFETCH_NEXT_STAGE) prefetch_row(m, first_row(offset));
}

__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Four blocks an SM (128 registers a thread): capped at 80 registers to let six in, it spilled and ran 5-10% slower
 * on H100. */
template <int HD>
__global__ void __launch_bounds__(PD_THREADS, 4) decode_layers_kernel(kiln_cuda_decode_args a) {
    extern __shared__ __align__(16) int8_t xs[]; /* the Q8_1 input of the stage's GEMVs */
    cg::grid_group grid = cg::this_grid();
    const kiln_cuda_rope_args &r = a.rope;
    int q_dim = r.n_head * HD, n_pos = *a.d_pos + 1;
    int n_items = a.attn.n_head * a.attn.n_split;
    q8_1_view xe = q8_1_at(xs, a.n_embd), xa = q8_1_at(xs, q_dim), xf = q8_1_at(xs, a.n_ff);
    /* with stamps, block 0 notes the time as it leaves each barrier: the stages' durations for the profile */
    auto stamp = [&](int i) {
        if (a.stamps && blockIdx.x == 0 && threadIdx.x == 0) a.stamps[i] = global_ns();
    };
    stamp(0);
    for (int l = 0; l < a.n_layer; l++) {
        const kiln_cuda_decode_layer &L = a.layers[l];
        int nq = L.wq.n, nk = L.wk.n;

        norm_to_shared(a.x, L.attn_norm, a.n_embd, a.eps, xs);
        gemv_rows(L.wq, 0, a.q, false, xe);
        gemv_rows(L.wk, nq, a.k, false, xe);
        gemv_rows(L.wv, nq + nk, a.v, false, xe);
        prefetch_first_row(L.wo, 0, a.prefetch);
        grid.sync();
        stamp(1 + KILN_CUDA_DECODE_STAGES * l);

        attn_decode x = {r, a.k, a.v, L.bq, L.bk, L.bv, (__half *)L.k_cache, (__half *)L.v_cache,
                         a.attn_out, (int8_t *)a.attn_q, a.counters};
        for (int it = blockIdx.x; it < n_items; it += gridDim.x)
            attn_slice<HD, true, PD_WARPS, false>(a.attn, a.q, (const __half *)L.k_cache, (const __half *)L.v_cache,
                                                  n_pos, a.part, x, it / a.attn.n_split, it % a.attn.n_split, 0);
        grid.sync();
        stamp(2 + KILN_CUDA_DECODE_STAGES * l);

        q8_1_to_shared(a.attn_q, q_dim, xs);
        gemv_rows(L.wo, 0, a.x, true, xa);
        prefetch_first_row(L.gate, 0, a.prefetch);
        prefetch_first_row(L.up, 0, a.prefetch);
        grid.sync();
        stamp(3 + KILN_CUDA_DECODE_STAGES * l);

        norm_to_shared(a.x, L.ffn_norm, a.n_embd, a.eps, xs);
        swiglu_rows(L.gate, L.up, xe, a.ff, (int8_t *)a.ff_q, a.counters + r.n_head);
        prefetch_first_row(L.down, 0, a.prefetch);
        grid.sync();
        stamp(4 + KILN_CUDA_DECODE_STAGES * l);

        q8_1_to_shared(a.ff_q, a.n_ff, xs);
        gemv_rows(L.down, 0, a.x, true, xf);
        if (l + 1 < a.n_layer) prefetch_first_row(a.layers[l + 1].wq, 0, a.prefetch);
        grid.sync();
        stamp(5 + KILN_CUDA_DECODE_STAGES * l);
    }
}

static bool matrix_ok(const kiln_cuda_matrix *m) {
    return kiln_cuda_type_uses_q8_1(m->type) && kiln_cuda_type_supported(m->type, m->k);
}

extern "C" bool kiln_cuda_decode_layers_supported(const kiln_cuda_decode_layer *layers, int n_layer, int head_dim) {
    int dev = 0, coop = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess || !coop)
        return false;
    if (head_dim != 64 && head_dim != 128 && head_dim != 256) return false;
    for (int l = 0; l < n_layer; l++) {
        const kiln_cuda_decode_layer *L = &layers[l];
        const kiln_cuda_matrix *ms[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down};
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
            if (!matrix_ok(ms[i])) return false;
        if (L->gate.type != L->up.type || L->gate.n % 32) return false;
    }
    return true;
}

template <int HD>
static int launch(const kiln_cuda_decode_args *a, cudaStream_t stream) {
    auto kernel = decode_layers_kernel<HD>;
    int widest = a->n_embd > a->n_ff ? a->n_embd : a->n_ff;
    if (a->rope.n_head * HD > widest) widest = a->rope.n_head * HD;
    size_t smem = (size_t)widest + widest / 8;
    int dev = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return -1;
    if (smem > 48 * 1024 && cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return -1;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, PD_THREADS, smem) != cudaSuccess || per_sm < 1)
        return -1;
    if (a->blocks_per_sm > 0 && a->blocks_per_sm < per_sm) per_sm = a->blocks_per_sm;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = sms * per_sm, cfg.blockDim = PD_THREADS, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
    cfg.attrs = &attr, cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, *a) == cudaSuccess ? 0 : -1;
}

extern "C" int kiln_cuda_decode_layers(const kiln_cuda_decode_args *a, cudaStream_t stream) {
    switch (a->rope.head_dim) {
    case 64: return launch<64>(a, stream);
    case 128: return launch<128>(a, stream);
    case 256: return launch<256>(a, stream);
    default: return -1;
    }
}

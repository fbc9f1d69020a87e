/* A decode token's attention with the output projection split by head, in one launch. The projection is linear in
 * its input, so W_o o = sum over heads h of W_o[:, h's dims] o_h: the block that has head h's output can multiply it
 * into its rows' columns of the head at once, and the next RMSNorm adds the heads' partial rows into x. The output
 * projection's launch, and the wait between it and the attention, go. A head's blocks each run its attention again
 * (one per slice of W_o's rows) so that the product has as many warps as a GEMV launch; their weights and the K/V
 * rows of earlier steps are loaded before the wait for the Q/K/V launch. */
#include "cuda/attention_slice.cuh"
#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"
#include "cuda/q8_1.cuh"
#include "cuda/quant_unpack.cuh"

/* Block (head, slice): the head's attention over the whole context (one slice), its output quantized to Q8_1 in
 * shared memory as the one-slice split kernel stores it, then PASSES runs of WARPS * ROWS rows of W_o over the
 * head's P parts: lane (r, p) of a warp takes part p of its r-th row, and the P lanes of a row add up their
 * products. */
template <class F, int HD, int PASSES>
__global__ void __launch_bounds__(32 * KILN_CUDA_DECODE_WARPS)
    attn_wo_kernel(kiln_cuda_attn_args a, const float *q, const __half *k_cache, const __half *v_cache,
                   const int32_t *d_pos, qtensor wo, int n_out, float *parts) {
    constexpr int WARPS = KILN_CUDA_DECODE_WARPS, P = HD / 32, ROWS = 32 / P;
    int head = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int u = head * P + lane % P; /* the lane's part of each row */
    int rows[PASSES];
    kraw w[PASSES];
#pragma unroll
    for (int i = 0; i < PASSES; i++) {
        rows[i] = ((blockIdx.y * PASSES + i) * WARPS + warp) * ROWS + lane / P;
        if (rows[i] < n_out)
            F::load(wo, (int64_t)rows[i] * (a.n_head * P / F::parts) + u / F::parts, u % F::parts, w[i]);
    }
    float m, l, acc[P];
    const attn_decode none = {};
    attn_slice_warps<HD, false, WARPS, true, attn_ahead<HD, true>()>(a, q, k_cache, v_cache, *d_pos + 1, none, head, 0,
                                                                     0, m, l, acc);
    const warp_results<HD, WARPS> &r = share_results<HD, WARPS>(m, l, acc);
    __shared__ __align__(16) int8_t head_q[HD];
    __shared__ __half2 head_ds[P];
    if (warp < P) quantize_warp(whole_value(r, results_max(r), warp * 32 + lane), head_q + warp * 32, head_ds + warp);
    __syncthreads();
    q8_1_held h;
    hold_q8_1<F>(q8_1_view{head_q, head_ds}, lane % P, h);
#pragma unroll
    for (int i = 0; i < PASSES; i++) {
        float v = rows[i] < n_out ? dot_held<F>(w[i], u % F::parts, h) : 0.0f;
#pragma unroll
        for (int o = 1; o < P; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane % P == 0 && rows[i] < n_out) parts[(int64_t)head * n_out + rows[i]] = v;
    }
}

/* A form of the kernel and W_o as it reads it. */
struct wo_form {
    void (*kernel)(kiln_cuda_attn_args, const float *, const __half *, const __half *, const int32_t *, qtensor, int,
                   float *);
    qtensor w;
    int rows; /* of W_o a block */
};

static wo_form form_of(const kiln_cuda_attn_args *a, const kiln_cuda_matrix *wo, int passes) {
    int rows = passes * KILN_CUDA_DECODE_WARPS * 32 / (a->head_dim / 32);
    switch (wo->type * 1024 + a->head_dim * 2 + passes - 1) {
#define FORM(id, F, hd, passes)                                                                                            case id * 1024 + hd * 2 + passes - 1: return wo_form{attn_wo_kernel<F, hd, passes>, tensor_of<F>(wo), rows};
#define HEADS(id, F, passes) FORM(id, F, 64, passes) FORM(id, F, 128, passes) FORM(id, F, 256, passes)
#define X(id, F) HEADS(id, F, 1) HEADS(id, F, 2) HEADS(id, F, 4)
        KILN_CUDA_QUANT_TYPES(X)
#undef X
#undef HEADS
#undef FORM
    default: return wo_form{nullptr, {}, rows};
    }
}

/* The form whose grid of (head, slice of W_o's rows) the GPU holds at once with the fewest rows a block (each block
 * runs its head's attention again); nullptr kernel where none does. KILN_CUDA_WO_PASSES (1, 2 or 4, read at launch)
 * asks for one form, for comparisons. */
static wo_form pick_form(const kiln_cuda_attn_args *a, const kiln_cuda_matrix *wo, dim3 *grid) {
    if (a->n_split != 1 || wo->k != a->n_head * a->head_dim || !kiln_cuda_type_uses_q8_1(wo->type))
        return wo_form{nullptr, {}, 0};
    const char *e = getenv("KILN_CUDA_WO_PASSES");
    int only = e ? atoi(e) : 0;
    for (int passes = 1; passes <= 4; passes *= 2) {
        if (only && passes != only) continue;
        wo_form f = form_of(a, wo, passes);
        int per_sm = 0;
        if (!f.kernel || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f.kernel, 32 * KILN_CUDA_DECODE_WARPS,
                                                                       0) != cudaSuccess)
            return wo_form{nullptr, {}, 0};
        *grid = dim3(a->n_head, div_up(wo->n, f.rows));
        if ((int64_t)grid->x * grid->y <= (int64_t)per_sm * sm_count()) return f;
    }
    return wo_form{nullptr, {}, 0};
}

extern "C" bool kiln_cuda_attention_wo_fits(const kiln_cuda_attn_args *a, const kiln_cuda_matrix *wo) {
    dim3 grid;
    return pick_form(a, wo, &grid).kernel != nullptr;
}

extern "C" int kiln_cuda_attention_wo(const kiln_cuda_attn_args *a, const float *q, const void *k_cache,
                                      const void *v_cache, const int32_t *d_pos, const kiln_cuda_matrix *wo,
                                      float *parts, cudaStream_t stream) {
    dim3 grid;
    wo_form f = pick_form(a, wo, &grid);
    if (!f.kernel) return -1;
    launch_pdl(f.kernel, grid, 32 * KILN_CUDA_DECODE_WARPS, stream, *a, q, (const __half *)k_cache,
               (const __half *)v_cache, d_pos, f.w, wo->n, parts);
    return 0;
}

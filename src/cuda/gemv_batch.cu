/* Matrix times several vectors for a batched step (the tokens of many sequences): each weight part is read from
 * memory and unpacked once for all the vectors of its block. Quantized weights go through int8 tensor cores
 * (gemv_batch_mma_kernel), or for one to four vectors through dp4a in the same order of operations
 * (gemv_batch_small_kernel, the same bits; small_batch says where), or in half mode (kiln_cuda_batch_half) F16
 * tensor cores at every batch size (mma_range_h), which F16 and BF16 weights take too; other float weights, and
 * those outside half mode, go through FMA with F32 activations. Batches larger
 * than a block's vectors run as more blocks over the same rows, placed next to each other in the grid so their
 * weight reads meet in L2.
 *
 * Batch invariance: vector j's result is summed in the same order whatever the batch size or j's place in it, so a
 * sequence's output does not depend on who shares the step. */
#include <stdlib.h>

#include "cuda/cuda_common.cuh"
#include "cuda/half_parts.cuh"
#include "cuda/kernels_batch.h"
#include "cuda/paged_rope.cuh"
#include "cuda/quant_unpack.cuh"

#define BATCH_GROUP 16 /* vectors per block of the float kernel */
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
    __half *yh; /* half mode with SwiGLU: the results as the next GEMV's F16 input (half_parts.cuh), not into y */
};

/* The matrix of row block rb, picked with constant indices (a run-time index would put the job in local memory). */
__device__ __forceinline__ int pick(const batch_job &job, int rb) {
    return job.n_mats > 2 && rb >= job.first[2] ? 2 : job.n_mats > 1 && rb >= job.first[1] ? 1 : 0;
}

template <class T>
__device__ __forceinline__ T select3(int m, const T &a, const T &b, const T &c) { return m == 2 ? c : m == 1 ? b : a; }

__device__ __forceinline__ void store(float *y, int64_t i, float v, bool accumulate) {
    y[i] = accumulate ? y[i] + v : v;
}

/* Quantized weights: int8 mma.sync m16n8k16 of the unpacked parts (A: 16 rows x 16 weights, B: 16 Q8_1 values x 8
 * vectors) into int32 sums that then take their scales in F32, w = d * q + m as quant_unpack.cuh writes every format:
 * per part for the formats with one scale a part (two mmas chained over its halves), per half for Q2_K, Q3_K and
 * Q6_K. The sums of the activations that the offsets m multiply come from the same mma with an all-ones A. A block
 * owns MMA_ROWS rows and up to MMA_VEC vectors; its warps take fixed ranges of the parts, and their partial sums add
 * in a fixed order: a vector's result never depends on the others. Against the dp4a form it replaced (one lane a
 * row part, 16 dp4a per part and vector on K-quants), on an H100: 1.6x the decode rate at 64 sequences on llama3-8b,
 * 1.9x on prompt chunks, 0.6x at one sequence (16 rows a warp read four times as much per lane; latency-bound). */
#define MMA_ROWS 16
#define MMA_TILES 8 /* n-tiles of 8 vectors */
#define MMA_VEC (8 * MMA_TILES)
#define MMA_WARPS 8
/* Launches of fewer row blocks than the GPU has SMs (qwen2-1.5b's output and down projections: 96 blocks of 16 rows)
 * take 16 warps a block instead, each half the row's parts: twice the warps at work on the SMs they have. Chosen by
 * the matrix alone, so a vector's sums keep one order whatever the batch. Without SwiGLU only (its partial sums
 * would pass 48 KB of shared memory). In half mode, 16 warps wherever one such block an SM fills the launch's last
 * wave better than two of 8 (llama3-8b's Q/K/V, 384 blocks: 2.9 waves against 1.45; both shapes' gate/up) lost:
 * H200, bench_cuda_batch, llama3-8b at 8 / 32 / 64 sequences 1,212-1,213 / 3,951-3,958 / 6,082-6,094 tok/s against
 * 1,282-1,285 / 4,080-4,087 / 6,223-6,240, qwen2-1.5b 4,080-4,091 / 12,414-12,478 / 19,132-19,133 against
 * 4,363-4,390 / 13,313-13,329 / 19,922-19,974. KILN_CUDA_BATCH_WIDE=0 never takes it (read once, for comparisons:
 * the batched step launches eagerly, so an environment read at each launch would be a few hundred a step). */
#define MMA_WARPS_WIDE 16
#define ONES 0x01010101

/* Whether the switch `name` is on: unless the environment sets it to 0; read once into *cache (-1 before). */
static bool switch_on(const char *name, int *cache) {
    if (*cache < 0) {
        const char *e = getenv(name);
        *cache = !(e && atoi(e) == 0);
    }
    return *cache;
}

/* The int8 8-warp mma forms stage each part's activations in shared memory (b_stage) from this many tiles of 8 vectors
 * in a launch's first group (fewer tiles' work does not cover the copies' round trip; the 16-warp forms would need
 * twice the space and never do). KILN_CUDA_BATCH_STAGE_TILES sets another (1: always, 9: never; read once, for
 * comparisons). The choice changes no result's operations. */
#define STAGE_TILES 4
static int stage_tiles(void) {
    static int tiles = -1;
    if (tiles < 0) {
        const char *e = getenv("KILN_CUDA_BATCH_STAGE_TILES");
        tiles = e && atoi(e) > 0 ? atoi(e) : STAGE_TILES;
    }
    return tiles;
}

static bool wide_blocks(int row_blocks) {
    static int allowed = -1;
    return switch_on("KILN_CUDA_BATCH_WIDE", &allowed) && row_blocks < sm_count();
}

/* A half2's bits. */
union h2_bits {
    unsigned u;
    __half2 h;
};

/* Half mode: -1 until read from KILN_CUDA_BATCH_HALF (1: on), or set by kiln_cuda_batch_half_set. */
static int half_mode = -1;

extern "C" bool kiln_cuda_batch_half(void) {
    if (half_mode < 0) {
        const char *e = getenv("KILN_CUDA_BATCH_HALF");
        half_mode = e && atoi(e) == 1;
    }
    return half_mode;
}

extern "C" void kiln_cuda_batch_half_set(bool on) { half_mode = on; }

/* Chunk i of the F32 rows (row-major: row, part, chunk) into the half mode's activations (half_parts.cuh). */
__global__ void to_half_parts_kernel(const float *x, uint4 *xh, int n_parts, int n_rows, int64_t n_chunks) {
    pdl_release_and_wait();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_chunks) return;
    int64_t row = i / (4 * n_parts);
    int part = (int)(i - row * 4 * n_parts) >> 2;
    const float2 *p = (const float2 *)(x + (i >> 2) * 32) + (i & 3);
    h2_bits h[4];
#pragma unroll
    for (int j = 0; j < 4; j++) { /* values 2c, 2c+1 then + 8, + 16, + 24 */
        float2 v = p[4 * j];
        h[j].h = __floats2half2_rn(v.x, v.y);
    }
    /* chunk c = i & 3 of the part: its four pairs from the pair of values 2c on */
    xh[half_parts_pair(row, 32 * part + 2 * (int)(i & 3), n_rows) / 4] = make_uint4(h[0].u, h[1].u, h[2].u, h[3].u);
}

extern "C" void kiln_cuda_batch_to_half(const float *x, void *xh, int k, int n_rows, cudaStream_t stream) {
    int64_t n_chunks = (int64_t)n_rows * (k / 8);
    launch_pdl(to_half_parts_kernel, div_up(n_chunks, 256), 256, stream, x, (uint4 *)xh, k / 32, n_rows, n_chunks);
}

/* Formats whose part has one scale and one offset (d[0] == d[1], m[0] == m[1]). */
template <class F> struct one_scale { static constexpr bool value = false; };
template <> struct one_scale<q4_0_t> { static constexpr bool value = true; };
template <> struct one_scale<q4_1_t> { static constexpr bool value = true; };
template <> struct one_scale<q5_0_t> { static constexpr bool value = true; };
template <> struct one_scale<q5_1_t> { static constexpr bool value = true; };
template <> struct one_scale<q8_0_t> { static constexpr bool value = true; };
template <> struct one_scale<q4_K_t> { static constexpr bool value = true; };
template <> struct one_scale<q5_K_t> { static constexpr bool value = true; };

/* d = A B (+ d when chained). */
template <bool CHAIN>
__device__ __forceinline__ void mma_s8(int d[4], int a0, int a1, int b) {
    if (CHAIN)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                     : "r"(a0), "r"(a1), "r"(b));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                     : "r"(a0), "r"(a1), "r"(b), "r"(0));
}

/* A part's exact integer sums (below 2^20) as floats: one I2FP on sm_90. The integer-add-then-float-subtract form
 * it replaced took two issue slots: H200, bench_cuda_batch, 1.0-2.1% fewer tok/s at 8 and 64 sequences. */
__device__ __forceinline__ float i2f(int v) { return __int2float_rn(v); }

/* q[off + c] with constant indices only (a run-time index would put the part in local memory). */
__device__ __forceinline__ int word_at(const int *q, int off, int c) {
    int r = q[off];
    r = c == 1 ? q[off + 1] : r;
    r = c == 2 ? q[off + 2] : r;
    return c == 3 ? q[off + 3] : r;
}

/* This lane's A words of a part: weights 4c.. of each half (h0, h1) for rows g (lo) and g + 8 (hi). */
struct mma_a {
    int lo0, hi0, lo1, hi1;
};

__device__ __forceinline__ mma_a a_words(const kpart &lo, const kpart &hi, int c) {
    return {word_at(lo.q, 0, c), word_at(hi.q, 0, c), word_at(lo.q, 4, c), word_at(hi.q, 4, c)};
}

/* One part's contribution to a result before the activations' scale: the weights' scales d times the exact integer
 * sums fs (per half, or fs[0] the whole part's for one-scale formats), plus the offsets m times the activations'
 * sums ft. Both kernels below take it and acc = fma(value, dx, acc) in these operations (no contraction left to the
 * compiler), so their results agree bit for bit and a vector's result does not depend on which one ran. */
template <class F>
__device__ __forceinline__ float part_value(const float d[2], const float m[2], const float fs[2], const float ft[2]) {
    float r = __fmul_rn(d[0], fs[0]);
    if (!one_scale<F>::value) r = __fmaf_rn(d[1], fs[1], r);
    if (F::has_min) {
        r = __fmaf_rn(m[0], ft[0], r);
        if (!one_scale<F>::value) r = __fmaf_rn(m[1], ft[1], r);
    }
    return r;
}

/* acc[i] += one part's contribution to this lane's four results: rows g (i < 2) and g + 8, columns 2c and 2c + 1
 * (i & 1). x0 / x1: the B words of the halves; tk: the activation sums (per part, or per half in tk[0] / tk[1]). */
template <class F>
__device__ __forceinline__ void mma_part(float acc[4], const kpart &lo, const kpart &hi, const mma_a &a, int x0,
                                         int x1, const float t[2][2], float dx0, float dx1) {
    int s0[4], s1[4];
    mma_s8<false>(s0, a.lo0, a.hi0, x0);
    if (one_scale<F>::value) mma_s8<true>(s0, a.lo1, a.hi1, x1);
    else mma_s8<false>(s1, a.lo1, a.hi1, x1);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const kpart &p = i < 2 ? lo : hi;
        float fs[2] = {i2f(s0[i]), one_scale<F>::value ? 0.0f : i2f(s1[i])}, ft[2] = {t[0][i & 1], t[1][i & 1]};
        acc[i] = __fmaf_rn(part_value<F>(p.d, p.m, fs, ft), i & 1 ? dx1 : dx0, acc[i]);
    }
}

/* part_value of a decoded part against one vector's 32 Q8_1 values xv, its exact sums taken by dp4a. */
template <class F>
__device__ __forceinline__ float small_part(const kpart &p, const int xv[8], const float ft[2]) {
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) s0 = __dp4a(p.q[k], xv[k], s0), s1 = __dp4a(p.q[4 + k], xv[4 + k], s1);
    float fs[2] = {one_scale<F>::value ? i2f(s0 + s1) : i2f(s0), i2f(s1)};
    return part_value<F>(p.d, p.m, fs, ft);
}

/* Where a part's B operands come from: word c of the group's first vector's values and the low half of its
 * (scale, sum) pair, and the distances to the next vector's, in 32-bit offsets (one multiply-add a load). */
struct b_source {
    const int *x;
    const __half *d;
    int x_stride, d_stride;
};

/* A tile's B operands: the words of vector t * 8 + g and the scales of this lane's result columns t * 8 + 2c and
 * the next. Past the group's last vector the loads repeat it (always in bounds; those columns are not stored). */
struct b_operands {
    int x0, x1;
    float dx0, dx1;
};

__device__ __forceinline__ b_operands load_b(const b_source &s, int t, int g, int c, int last) {
    int xo = min(t * 8 + g, last) * s.x_stride;
    int v0 = min(t * 8 + 2 * c, last), v1 = min(t * 8 + 2 * c + 1, last);
    return {s.x[xo], s.x[xo + 4], __half2float(s.d[v0 * s.d_stride]), __half2float(s.d[v1 * s.d_stride])};
}

/* A warp's copy of one part's activations for its group's vectors (the 8-warp blocks), filled by cp.async while
 * the warp works on the part before: the values of vector v with their two 16-byte halves swapped when bit 2 of v
 * is set, so that a tile's 32 lanes read 32 different banks, and the (scale, sum) pairs. */
struct b_stage {
    int x[MMA_VEC][8];
    __half2 d[MMA_VEC];
};

/* Starts the copies of part u's activations for the group's first n (a multiple of 8) vectors into st; vectors past
 * the last take its values (those columns are not stored). */
__device__ __forceinline__ void stage_b(b_stage &st, const int8_t *qs, const __half2 *ds, int64_t j0, int n_parts,
                                        int u, int n, int last, int lane) {
    for (int k = lane; k < 2 * n; k += 32) {
        int v = k >> 1, h = k & 1;
        cp_async16(&st.x[v][(h ^ ((v >> 2) & 1)) * 4], qs + ((j0 + min(v, last)) * n_parts + u) * 32 + h * 16);
    }
    for (int v = lane; v < n; v += 32) cp_async4(&st.d[v], ds + (j0 + min(v, last)) * n_parts + u);
    cp_async_commit();
}

__device__ __forceinline__ b_operands load_b(const b_stage &st, int t, int g, int c) {
    int v = t * 8 + g, sw = (g >> 2) & 1;
    return {st.x[v][sw * 4 + c], st.x[v][(sw ^ 1) * 4 + c], __low2float(st.d[t * 8 + 2 * c]),
            __low2float(st.d[t * 8 + 2 * c + 1])};
}

/* A staged range's wait at each part for that part's copies, with the next part's (more) still in flight. */
__device__ __forceinline__ void stage_wait(bool more) {
    if (more) cp_async_wait<1>();
    else cp_async_wait<0>();
}

/* The weights a warp's parts come from: the matrix (and with SWIGLU the up matrix) and the first blocks of the rows
 * of its lower (g) and upper (g + 8) A fragment halves. */
struct mma_rows {
    qtensor w, up;
    int64_t base_lo, base_hi;
    int64_t base_line;   /* half mode: the first block of this lane's row, lane % 16 of the block's */
    unsigned char *a_buf; /* half mode: the warp's weights in F16 (h_lines) */
};

/* The activations of a block's group of vectors: Q8_1 values and (scale, sum) pairs of the step, the group's first
 * vector and count, and this warp's two stages (NULL in the forms that do not stage). */
struct b_group {
    const int8_t *qs;
    const __half2 *ds;
    int64_t j0;
    int n_parts, nv, n_vec;
    void *stages;
};

/* acc (and with SWIGLU up_acc) += parts [u0, u_end) of the rows against the group's vectors, part after part, the
 * activations from the warp's stages (STAGE: part u + 1's copies out while u is worked on) or from global memory. */
template <class F, bool SWIGLU, bool STAGE, int TILES>
__device__ __forceinline__ void mma_range(const mma_rows &r, const b_group &bg, int u0, int u_end,
                                          float (&acc)[TILES][4], float (&up_acc)[TILES][4]) {
    int lane = threadIdx.x, g = lane >> 2, c = lane & 3, last = bg.nv - 1, n_tiles = (bg.nv + 7) / 8;
    b_stage *stages = (b_stage *)bg.stages;
    if (STAGE && u0 < u_end) stage_b(stages[0], bg.qs, bg.ds, bg.j0, bg.n_parts, u0, n_tiles * 8, last, lane);
    for (int u = u0; u < u_end; u++) {
        const b_stage *st = STAGE ? stages + ((u - u0) & 1) : nullptr;
        if (STAGE) { /* the next part's copies go out, this one's are waited for */
            if (u + 1 < u_end)
                stage_b(stages[(u + 1 - u0) & 1], bg.qs, bg.ds, bg.j0, bg.n_parts, u + 1, n_tiles * 8, last, lane);
            stage_wait(u + 1 < u_end);
            __syncwarp();
        }
        b_source src = {(const int *)bg.qs + (bg.j0 * bg.n_parts + u) * 8 + c,
                        (const __half *)(bg.ds + bg.j0 * bg.n_parts + u), bg.n_parts * 8, bg.n_parts * 2};
        /* the B operands of the next WINDOW tiles are in flight while a tile's products are taken: one, or in the
         * four-tile direct forms all four, asked for before the weights' unpacking */
        constexpr int WINDOW = !STAGE && TILES == 4 ? 4 : 1;
        b_operands nb[WINDOW];
#pragma unroll
        for (int i = 0; i < WINDOW; i++) /* a warp with parts has a first tile */
            if (i == 0 || i < n_tiles) nb[i] = STAGE ? load_b(*st, i, g, c) : load_b(src, i, g, c, last);
        kpart lo, hi, ulo, uhi;
        unpack_part<F>(r.w, r.base_lo + u / F::parts, u % F::parts, lo);
        unpack_part<F>(r.w, r.base_hi + u / F::parts, u % F::parts, hi);
        mma_a wa = a_words(lo, hi, c), ua = {0, 0, 0, 0};
        if (SWIGLU) {
            unpack_part<F>(r.up, r.base_lo + u / F::parts, u % F::parts, ulo);
            unpack_part<F>(r.up, r.base_hi + u / F::parts, u % F::parts, uhi);
            ua = a_words(ulo, uhi, c);
        }
#pragma unroll
        for (int t = 0; t < TILES; t++) {
            if (t >= n_tiles) break;
            b_operands cb = nb[t % WINDOW]; /* the loads WINDOW tiles on go out before this one's products */
            if (t + WINDOW < TILES)
                nb[t % WINDOW] = STAGE ? load_b(*st, t + WINDOW, g, c) : load_b(src, t + WINDOW, g, c, last);
            float tk[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
            if (F::has_min) {
                int t0[4], t1[4];
                mma_s8<false>(t0, ONES, ONES, cb.x0);
                if (one_scale<F>::value) {
                    mma_s8<true>(t0, ONES, ONES, cb.x1);
                } else {
                    mma_s8<false>(t1, ONES, ONES, cb.x1);
                    tk[1][0] = i2f(t1[0]), tk[1][1] = i2f(t1[1]);
                }
                tk[0][0] = i2f(t0[0]), tk[0][1] = i2f(t0[1]);
            }
            mma_part<F>(acc[t], lo, hi, wa, cb.x0, cb.x1, tk, cb.dx0, cb.dx1);
            if (SWIGLU) mma_part<F>(up_acc[t], ulo, uhi, ua, cb.x0, cb.x1, tk, cb.dx0, cb.dx1);
        }
        if (STAGE) __syncwarp(); /* every lane has read st before the copies of part u + 2 go into it */
    }
}

/* Half mode (kiln_cuda_batch_half): the activations in F16 and the weights turned into F16, w = d * q + m as
 * quant_unpack.cuh writes every format, then F16 mma.sync m16n8k16 with F32 sums that run over the warp's whole range
 * of parts in the tensor core's accumulators. A part's scales are then taken once for all the group's vectors,
 * where the int8 form takes them in F32 for each result of every part (part_value); the price is F16 rounding of
 * the weights (d * q + m) and of the activations instead of Q8_1's. Each lane decodes one row's part (a line: with
 * SWIGLU lanes 0-15 the gate's rows and 16-31 the up matrix's, else parts u and u + 1 of the 16 rows, every other
 * part), writes it in F16 to the warp's 32 lines in shared memory, and ldmatrix hands every lane its A registers:
 * each part is decoded once, where each lane decoding the parts of its two rows (the int8 form's way) took four
 * times the work. The activations' layout is half_parts.cuh's (chunk c of a part: this lane's B registers of the
 * part's two mmas, one load): a part of a group's vectors is one run of memory, a tile's lanes reading whole
 * 64-byte rows. Each part's B registers of every tile (four at a time with SWIGLU, whose eight would
 * spill) are loaded while the part before is worked on; staging them in shared memory by cp.async (the int8 form's
 * way) lost: H200, bench_cuda_batch, llama3-8b at 32 / 48 / 64 sequences 3,530 / 4,406-4,411 / 5,186 tok/s against
 * 4,031-4,036 / 5,121-5,125 / 6,126-6,131 (staging the SwiGLU form alone: even at 48 and 64, -3% at 32). */
__device__ __forceinline__ void mma_f16(float d[4], const unsigned a[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(p))
                 : "memory");
}

/* Bytes 0, 1 (sel 0x4140) or 2, 3 (0x4342) of w, signed, as d * q + m in F16: 1024 + 128 + q made exact by the
 * exponent bits 0x64, less 1152 (0x6480), then one fused multiply-add. */
__device__ __forceinline__ unsigned half_pair(int w, unsigned sel, __half2 d, __half2 m) {
    h2_bits v, r;
    v.u = __byte_perm((unsigned)w ^ 0x80808080u, 0x64646464u, sel);
    r.h = __hfma2(__hsub2(v.h, __half2half2(__ushort_as_half(0x6480))), d, m);
    return r.u;
}

/* A warp's 32 lines of 32 F16 weights (64 bytes), 16-byte chunk j of line L at chunk j ^ (L / 2 % 4): the 8 lanes
 * of a store phase and the 8 rows of an ldmatrix matrix then meet 32 different banks. */
#define H_LINE_BYTES 64
#define H_LINES_BYTES (32 * H_LINE_BYTES)

__device__ __forceinline__ unsigned char *h_chunk(unsigned char *lines, int line, int j) {
    return lines + line * H_LINE_BYTES + ((j ^ ((line >> 1) & 3)) << 4);
}

/* This lane's decoded part into its line, in F16. */
__device__ __forceinline__ void store_line(unsigned char *lines, int lane, const kpart &p) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int h = j >> 1; /* chunk j holds words 2j and 2j + 1: values 8j..8j+7 */
        __half2 d = __float2half2_rn(p.d[h]), m = __float2half2_rn(p.m[h]);
        int w0 = p.q[2 * j], w1 = p.q[2 * j + 1];
        *(uint4 *)h_chunk(lines, lane, j) = make_uint4(half_pair(w0, 0x4140, d, m), half_pair(w0, 0x4342, d, m),
                                                        half_pair(w1, 0x4140, d, m), half_pair(w1, 0x4342, d, m));
    }
}

/* How half mode turns a lane's loaded part (raw_t) into its line: a quantized format's part decoded (line_t: kpart)
 * and made F16 by store_line. */
template <class F>
struct h_format {
    using raw_t = kraw;
    using line_t = kpart;
    __device__ static void load(const qtensor &t, int64_t g, int part, kraw &r) { F::load(t, g, part, r); }
    __device__ static void decode(const kraw &r, int part, kpart &p) { F::decode(r, part, p); }
    __device__ static void store(unsigned char *lines, int lane, const kpart &p) { store_line(lines, lane, p); }
};

/* F16 and BF16 weights in half mode: a part is 32 consecutive values of a row (a block of one part, rows k values
 * apart), loaded as they are and made F16 for the line: F16 as it is, BF16 exactly wherever F16's range holds the
 * value. F32 weights keep the float kernel (F32 activations, FMA): their 8-tile forms spilled 76-132 bytes. */
template <int WORDS>
struct h_words {
    uint4 v[WORDS / 4];
};
struct h_line {
    uint4 c[4]; /* chunk j: values 8j..8j+7 in F16 */
};

template <int BYTES>
__device__ __forceinline__ void load_part(const qtensor &t, int64_t g, h_words<BYTES / 4> &r) {
    const uint4 *p = (const uint4 *)(t.base + g * BYTES);
#pragma unroll
    for (int i = 0; i < BYTES / 16; i++) r.v[i] = p[i];
}

__device__ __forceinline__ void store_chunks(unsigned char *lines, int lane, const h_line &p) {
#pragma unroll
    for (int j = 0; j < 4; j++) *(uint4 *)h_chunk(lines, lane, j) = p.c[j];
}

/* A BF16 pair's word as an F16 pair's. */
__device__ __forceinline__ unsigned bf16_pair_to_half(unsigned w) {
    h2_bits h;
    h.h = __floats2half2_rn(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
    return h.u;
}

struct f16_w {
    static constexpr int parts = 1, raw_words = 16;
    using raw_t = h_words<16>;
    using line_t = h_line;
    __device__ static void load(const qtensor &t, int64_t g, int, raw_t &r) { load_part<64>(t, g, r); }
    __device__ static void decode(const raw_t &r, int, h_line &p) {
#pragma unroll
        for (int j = 0; j < 4; j++) p.c[j] = r.v[j];
    }
    __device__ static void store(unsigned char *lines, int lane, const h_line &p) { store_chunks(lines, lane, p); }
};

struct bf16_w : f16_w {
    __device__ static void decode(const raw_t &r, int, h_line &p) {
#pragma unroll
        for (int j = 0; j < 4; j++)
            p.c[j] = make_uint4(bf16_pair_to_half(r.v[j].x), bf16_pair_to_half(r.v[j].y),
                                bf16_pair_to_half(r.v[j].z), bf16_pair_to_half(r.v[j].w));
    }
};

template <> struct h_format<f16_w> : f16_w {};
template <> struct h_format<bf16_w> : bf16_w {};

/* The A registers of lines first..first+15 (16 rows) for the mma over values 16h..16h+15. */
__device__ __forceinline__ void load_a(unsigned a[4], unsigned char *lines, int first, int h, int lane) {
    int i = lane >> 3, line = first + (i & 1) * 8 + (lane & 7);
    ldmatrix_x4(a, h_chunk(lines, line, 2 * h + (i >> 1)));
}

/* mma_range in half mode: the sums of a tile's results chain in its mma accumulators over the range's parts. A
 * lane decodes one part of its row a decode, SPAN parts of the warp's (without SwiGLU lanes 16-31 take the part
 * after lanes 0-15's); its lines are loaded from memory AHEAD decodes before their use: six for one tile (a step
 * of one to eight vectors, whose parts take little work and whose registers are free; five for the formats whose
 * loaded part takes 9 registers, else Q8_0's SwiGLU form spills; three for F16 and BF16 weights, whose part takes
 * 16, 116-121 registers without spills), else one. The one-tile forms take up to 128
 * registers, two 8-warp blocks an SM. H200, bench_cuda_batch, half mode, against three ahead at three blocks an SM
 * (80 registers), one call, two rounds: llama3-8b at 1 / 2 / 4 / 8 sequences 212.7-214.5 / 423.7 / 834.5-834.6 /
 * 1,628-1,630 tok/s against 183.1-184.8 / 369.5-369.6 / 740.7-741.2 / 1,465-1,470, qwen2-1.5b 708.8-711.4 /
 * 1,393.7-1,404.6 / 2,718.7-2,733.0 / 5,398-5,412 against 723.2-727.1 / 1,408.6-1,411.2 / 2,790.8-2,801.4 /
 * 5,410-5,428 (a warp's range: llama3-8b 16 to 56 parts, qwen2-1.5b 6 but its down projection's 18). Two ahead at
 * four blocks an SM (64 registers, spilling) lost on both; the rest of a lane's range asked into L2 at its start
 * lost 2-6%; B registers loaded two or three parts ahead lost 1-3%. */
template <bool SWIGLU>
__host__ __device__ constexpr int h_span() { return SWIGLU ? 1 : 2; }
template <class F, int TILES>
__host__ __device__ constexpr int h_ahead() {
    return TILES > 1 ? 1 : F::raw_words > 9 ? 3 : F::raw_words > 8 ? 5 : 6;
}

/* A lane's weights for its line: the parts of its row (line_part: which of a decode's parts is the lane's), loaded
 * from memory AHEAD decodes before their use into a ring of AHEAD slots. The ring is walked with constant indices
 * (mma_range_h unrolls its loop AHEAD decodes at a time): moving each slot down to the one before, in a loop that
 * was not unrolled, copied registers whose loads were still out, so every decode waited for the loads the one
 * before had sent (H200, ncu, llama3-8b's gate/up at one vector: long-scoreboard stalls 5.6 an issued
 * instruction). w is a copy of the lane's tensor: picked by reference between the gate's and the up matrix's, it
 * kept mma_rows in local memory (a 64-byte stack frame in every SwiGLU form; H200, bench_cuda_batch, half mode,
 * the copy +3-5% on llama3-8b and +5-8% on qwen2-1.5b from 1 to 64 sequences). */
template <class F, int AHEAD>
struct line_feed {
    qtensor w;
    int64_t base;
    int line_part, u_end;
    typename h_format<F>::raw_t raw[AHEAD];
    int raw_part[AHEAD];

    __device__ __forceinline__ void load(int u, int i) {
        int up = min(u + line_part, u_end - 1);
        raw_part[i] = up % F::parts;
        h_format<F>::load(w, base + up / F::parts, raw_part[i], raw[i]);
    }
    /* the first AHEAD decodes' parts, from u0 on, span parts a decode (before the PDL wait: the weights do not
     * depend on the kernel before) */
    __device__ __forceinline__ void start(int u0, int span) {
#pragma unroll
        for (int i = 0; i < AHEAD; i++)
            if (u0 + i * span < u_end) load(u0 + i * span, i);
    }
    /* the decode at part u from slot i (a constant once unrolled): the lane's part into its line, and slot i's
     * loads of the decode AHEAD on */
    __device__ __forceinline__ void next(int u, int span, int i, unsigned char *lines, int lane) {
        typename h_format<F>::line_t p;
        h_format<F>::decode(raw[i], raw_part[i], p);
        if (u + AHEAD * span < u_end) load(u + AHEAD * span, i);
        __syncwarp(); /* every lane is done with the lines before */
        h_format<F>::store(lines, lane, p);
    }
};

template <class F, int TILES>
using h_feed_t = line_feed<F, h_ahead<F, TILES>()>;

template <class F, bool SWIGLU, int TILES>
__device__ __forceinline__ h_feed_t<F, TILES> h_feed(const mma_rows &r, int lane, int u_end) {
    h_feed_t<F, TILES> f;
    f.w = SWIGLU && lane >= 16 ? r.up : r.w;
    f.base = r.base_line, f.line_part = SWIGLU ? 0 : lane >> 4, f.u_end = u_end;
    return f;
}

/* The mmas of tiles [0, min(TG, n)) of a part: every tile's first half, then every tile's second, so that a
 * tile's chained mma never waits for the one before it (in tile order, each second mma waited for its first). */
template <bool SWIGLU, int TG>
__device__ __forceinline__ void h_tiles(float (*acc)[4], float (*up_acc)[4], const unsigned (&wa)[2][4],
                                        const unsigned (&ua)[2][4], const uint4 (&bv)[TG], int n) {
#pragma unroll
    for (int i = 0; i < TG; i++) {
        if (i >= n) break;
        mma_f16(acc[i], wa[0], bv[i].x, bv[i].y);
        if (SWIGLU) mma_f16(up_acc[i], ua[0], bv[i].x, bv[i].y);
    }
#pragma unroll
    for (int i = 0; i < TG; i++) {
        if (i >= n) break;
        mma_f16(acc[i], wa[1], bv[i].z, bv[i].w);
        if (SWIGLU) mma_f16(up_acc[i], ua[1], bv[i].z, bv[i].w);
    }
}

/* feed: the one-tile forms' h_feed, started (its first decodes' loads out); the other forms' is made here */
template <class F, bool SWIGLU, int TILES>
__device__ __forceinline__ void mma_range_h(const mma_rows &r, h_feed_t<F, TILES> &feed, const b_group &bg,
                                            int u0, int u_end, float (&acc)[TILES][4], float (&up_acc)[TILES][4]) {
    /* TG: tiles whose B registers are held at once (with SWIGLU all eight would spill) */
    constexpr int SPAN = h_span<SWIGLU>(), AHEAD = h_ahead<F, TILES>(), TG = SWIGLU && TILES > 4 ? 4 : TILES;
    int lane = threadIdx.x, g = lane >> 2, c = lane & 3, last = bg.nv - 1, n_tiles = (bg.nv + 7) / 8;
    /* made here, not before the PDL wait with the one-tile forms', the 8-tile SwiGLU forms' feed spills nothing
     * (made in the kernel: 20-56 bytes) */
    if (TILES > 1) feed = h_feed<F, SWIGLU, TILES>(r, lane, u_end), feed.start(u0, SPAN);
    const uint4 *xh = (const uint4 *)bg.qs;
    /* the direct loads: part u's B registers of the first TG tiles are loaded while part u - 1 is worked on */
    int64_t part_chunks = (int64_t)bg.n_vec * 4;
    const uint4 *src = xh + (u0 * part_chunks + bg.j0 * 4) + c;
    uint4 bv[TG];
#pragma unroll
    for (int i = 0; i < TG; i++)
        bv[i] = u0 >= u_end || i >= n_tiles ? make_uint4(0, 0, 0, 0) : src[min(i * 8 + g, last) * 4];
    for (int ur = u0; ur < u_end; ur += AHEAD * SPAN)
#pragma unroll
        for (int i = 0; i < AHEAD * SPAN; i++) {
            int u = ur + i;
            if (u >= u_end) break;
            if (i % SPAN == 0) feed.next(u, SPAN, i / SPAN, r.a_buf, lane);
            __syncwarp(); /* the lines are complete */
            unsigned wa[2][4], ua[2][4];
            int first = SWIGLU ? 0 : 16 * (i % SPAN);
            load_a(wa[0], r.a_buf, first, 0, lane);
            load_a(wa[1], r.a_buf, first, 1, lane);
            if (SWIGLU) load_a(ua[0], r.a_buf, 16, 0, lane), load_a(ua[1], r.a_buf, 16, 1, lane);
#pragma unroll
            for (int t0 = 0; t0 < TILES; t0 += TG) {
                if (t0 >= n_tiles) break;
                /* columns past the group's vectors repeat its last: their results are not stored */
                if (t0 > 0)
#pragma unroll
                    for (int k = 0; k < TG && t0 + k < n_tiles; k++) bv[k] = src[min((t0 + k) * 8 + g, last) * 4];
                h_tiles<SWIGLU, TG>(acc + t0, up_acc + t0, wa, ua, bv, n_tiles - t0);
            }
            if (u + 1 < u_end) {
                src += part_chunks;
#pragma unroll
                for (int k = 0; k < TG && k < n_tiles; k++) bv[k] = src[min(k * 8 + g, last) * 4];
            }
        }
}

/* Bytes of a block's dynamic shared memory: the warps' partial sums, or with STAGE their two stages a warp first; */
__host__ __device__ constexpr int mma_sums_bytes(bool swiglu, int warps, bool stage, int tiles) {
    int part = (swiglu ? 2 : 1) * (warps / 2) * tiles * 4 * 32 * (int)sizeof(float);
    int st = stage ? warps * 2 * (int)sizeof(b_stage) : 0;
    return part > st ? part : st;
}

/* ... and after them, in half mode, each warp's F16 lines. */
__host__ __device__ constexpr int mma_shared_bytes(bool swiglu, int warps, bool stage, bool half, int tiles) {
    return mma_sums_bytes(swiglu, warps, stage, tiles) + (half ? warps * H_LINES_BYTES : 0);
}

/* Block: WARPS warps over the same MMA_ROWS rows; grid: row blocks x groups of 8 * TILES vectors. With SWIGLU,
 * w[0] is the gate and w[1] the up matrix, and y[0] receives silu(gate x) * (up x). With rope.a.freq, the rope
 * stage takes the results instead of y (paged_rope.cuh). HALF_ACT: half mode (mma_range_h). At most 128 registers,
 * so two 8-warp blocks (or one of 16) fit an SM: unbounded, Q2_K's SwiGLU form took 153 once the next tile's loads
 * went out early and some direct forms 131-142 (bounded, Q2_K's SwiGLU forms spill 28-48 bytes, Q5_K's staged one
 * 12); half mode's one-tile forms too (h_ahead). */
template <class F, bool SWIGLU, int WARPS, bool STAGE, bool HALF_ACT, int TILES>
__global__ void __launch_bounds__(32 * WARPS, 16 / WARPS)
    gemv_batch_mma_kernel(batch_job job, int n_parts, const void *xq, int n_vec, batch_rope rope) {
    int n_groups = (n_vec + 8 * TILES - 1) / (8 * TILES);
    int group = blockIdx.x % n_groups, rb = blockIdx.x / n_groups;
    int mi = SWIGLU ? 0 : pick(job, rb);
    qtensor w = select3(mi, job.w[0], job.w[1], job.w[2]);
    float *y = select3(mi, job.y[0], job.y[1], job.y[2]);
    int n = select3(mi, job.n[0], job.n[1], job.n[2]);
    int first = select3(mi, job.first[0], job.first[1], job.first[2]);
    const qtensor up = job.w[1];
    int row0 = (rb - first) * MMA_ROWS, lane = threadIdx.x, warp = threadIdx.y, g = lane >> 2, c = lane & 3;
    int j0 = group * 8 * TILES, nv = min(8 * TILES, n_vec - j0);
    bool roped = !SWIGLU && rope.a.freq;
    int role = select3(mi, rope.role[0], rope.role[1], rope.role[2]);
    __shared__ rope_block rs;
    int blocks_per_row = n_parts / F::parts;
    /* rows past the matrix read the last one and are not stored */
    int64_t base_lo = (int64_t)min(row0 + g, n - 1) * blocks_per_row;
    int64_t base_hi = (int64_t)min(row0 + g + 8, n - 1) * blocks_per_row;
    int per_warp = (n_parts + WARPS - 1) / WARPS;
    int u0 = warp * per_warp, u_end = min(n_parts, (warp + 1) * per_warp);
    /* with STAGE the warps' stages take the partial sums' space before the sums (mma_shared_bytes) */
    constexpr int HALF = WARPS / 2;
    extern __shared__ __align__(16) unsigned char smem[];
    int64_t base_line = (int64_t)min(row0 + (lane & 15), n - 1) * blocks_per_row;
    unsigned char *a_buf = smem + mma_sums_bytes(SWIGLU, WARPS, STAGE, TILES) + warp * H_LINES_BYTES;
    mma_rows rows = {w, up, base_lo, base_hi, base_line, a_buf};
    /* half mode's one-tile forms ask for their first weights before the wait (the weights do not depend on the
     * kernel before); the 8-tile forms make and start their feed in mma_range_h */
    constexpr bool EARLY = HALF_ACT && TILES == 1;
    h_feed_t<F, TILES> feed;
    if (EARLY) feed = h_feed<F, SWIGLU, TILES>(rows, lane, u_end), feed.start(u0, h_span<SWIGLU>());
    pdl_release();
    if (roped) rope_block_prepare(rope, role, row0, MMA_ROWS / 2, j0, nv, rs);
    pdl_wait();
    const int8_t *qs = (const int8_t *)xq;
    const __half2 *ds = (const __half2 *)(qs + (int64_t)n_vec * n_parts * 32);
    float a[TILES][4], b[TILES][4];
#pragma unroll
    for (int t = 0; t < TILES; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) a[t][i] = b[t][i] = 0.0f;
    void *stages = STAGE ? (void *)((b_stage *)smem + 2 * warp) : nullptr;
    b_group grp = {qs, ds, j0, n_parts, nv, n_vec, stages};
    if constexpr (HALF_ACT) mma_range_h<F, SWIGLU, TILES>(rows, feed, grp, u0, u_end, a, b);
    else mma_range<F, SWIGLU, STAGE, TILES>(rows, grp, u0, u_end, a, b);
    /* the warps' partial sums: the upper half's go to the lower half, then the lower half's add in warp order */
    if (STAGE) __syncthreads(); /* no warp still reads its stages, which the sums overwrite */
    float(*part)[HALF][TILES][4][32] = (float(*)[HALF][TILES][4][32])smem;
    if (warp >= HALF)
#pragma unroll
        for (int t = 0; t < TILES; t++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                part[0][warp - HALF][t][i][lane] = a[t][i];
                if (SWIGLU) part[SWIGLU ? 1 : 0][warp - HALF][t][i][lane] = b[t][i];
            }
    __syncthreads();
    if (warp < HALF)
#pragma unroll
        for (int t = 0; t < TILES; t++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                part[0][warp][t][i][lane] += a[t][i];
                if (SWIGLU) part[SWIGLU ? 1 : 0][warp][t][i][lane] += b[t][i];
            }
    __syncthreads();
    __shared__ float vals[SWIGLU ? 1 : MMA_VEC * MMA_ROWS];
    for (int e = warp; e < TILES * 4; e += WARPS) {
        int t = e / 4, i = e % 4;
        int row = row0 + g + (i >= 2 ? 8 : 0), v = t * 8 + 2 * c + (i & 1);
        if (row >= n || v >= nv) continue;
        float va = 0.0f, vb = 0.0f;
        for (int k = 0; k < HALF; k++) {
            va += part[0][k][t][i][lane];
            if (SWIGLU) vb += part[SWIGLU ? 1 : 0][k][t][i][lane];
        }
        int64_t at = (int64_t)(j0 + v) * n + row;
        if (SWIGLU && job.yh) job.yh[half_parts_at(j0 + v, row, n_vec)] = __float2half_rn(silu(va) * vb);
        else if (SWIGLU) y[at] = silu(va) * vb;
        else if (roped) vals[v * MMA_ROWS + row - row0] = va;
        else store(y, at, va, job.accumulate);
    }
    if (!roped) return;
    rope_block_finish(rope, role, row0, MMA_ROWS / 2, j0, nv, vals, rs);
}

/* One or two vectors (a step of one or two sequences' decode tokens) take dp4a where each lane's share of a row is
 * at most 16 parts (small_lane_parts): one warp a row, each range of the mma kernel's warps (WARPS for this matrix)
 * 32 / WARPS lanes, lane t of a range taking its parts t, t + 32 / WARPS, ... (so a range's lanes load neighbouring
 * parts together). A lane loads its parts, the first before the PDL wait (the weights do not depend on the kernel
 * before), takes each part's exact int32 sums against a vector by dp4a and the part's value in part_value's
 * operations; then every lane of a range runs the range's chain in the mma kernel's order (acc = fma(value, dx,
 * acc) part after part), each value shuffled from the lane that holds it, and the ranges' sums are added in the mma
 * kernel's order. The results are its bits, so which kernel runs depends on nothing a result could; the chain is
 * fmas and independent shuffles, the loads and products run on all lanes at once.
 * Measured on H100 (bench_cuda_batch, decode steps replayed as graphs, best logit ranked on the device, one call),
 * generated tok/s at one / two sequences: llama3-8b 360 / 608 against 170 / 332 with the mma kernel (with the
 * session-19 layout of a whole range on one lane, which it took nowhere: 153 at one); qwen2-1.5b 886 / 1,571
 * against 475 / 940 (the whole-range layout: 781-784 / 1,306). A range's parts as consecutive shares of its lanes,
 * handed from lane to lane, ran llama3-8b at 292 / 410 (loads of four lanes 64 bytes apart instead of one run). For
 * up to 8 vectors the whole-range layout lost on qwen2-1.5b (each vector's products repeat the part's
 * decode-and-sum chain); with this one, three and four vectors on shares of up to 4 parts (rows of up to 128 parts)
 * gained: llama3-8b 629.5 / 745-748 against 490.2 / 640.0 with the mma kernel, qwen2-1.5b 1,631-1,645 / 1,991-2,000
 * against 1,430 / 1,894 (one call). */
#define SMALL_VEC 2     /* vectors on any share */
#define SMALL_MAX_VEC 4 /* vectors on short shares */
#define SMALL_ROWS 8 /* rows (warps) a block */
/* The most parts a lane may take; the kernels are built for shares of up to 4 and of up to 16. */
#define SMALL_SHORT_SHARE 4
#define SMALL_LONG_SHARE 16
/* Matrices (all of a launch's) of at most this many MB ask for each lane's parts past its first two in L2 before the
 * wait; larger ones would evict what the kernel before still reads. */
#define SMALL_PREFETCH_MAX_MB 16.0
/* Pairs of parts a lane has in flight: two for one vector, one for two (their values take the registers). Measured
 * on H100 against one everywhere (bench_cuda_batch, one call): llama3-8b at one sequence 385-387 tok/s against
 * 372, qwen2-1.5b 929-935 against 912-914; at two sequences two lost 1% on both. One pair on long rows at one
 * vector, for 3 blocks an SM instead of 2, lost 5% on both (366 against 385, 904-908 against 947-948); three
 * pairs there were even. */
template <int NV>
__host__ __device__ constexpr int small_ahead() { return NV == 1 ? 2 : 1; }

/* Parts each lane of the small kernel takes: its range's among the range's 32 / warps lanes. */
static int small_lane_parts(int n_parts, int warps) { return div_up(div_up(n_parts, warps), 32 / warps); }

/* Whether n_vec vectors over rows of n_parts parts, summed in `warps` ranges, take the small kernel.
 * KILN_CUDA_BATCH_SMALL=0 never (read once, for comparisons). */
static bool small_batch(int n_vec, int n_parts, int warps) {
    static int allowed = -1;
    if (!switch_on("KILN_CUDA_BATCH_SMALL", &allowed)) return false;
    int share = small_lane_parts(n_parts, warps);
    return (n_vec <= SMALL_VEC && share <= SMALL_LONG_SHARE) || (n_vec <= SMALL_MAX_VEC && share <= SMALL_SHORT_SHARE);
}

/* The weights of parts u and u + step (the second clamped to the lane's last, last) of the row whose first block is
 * base; with SWIGLU the up matrix's too. */
template <class F, bool SWIGLU>
__device__ __forceinline__ void small_load(const qtensor &w, const qtensor &up, int64_t base, int u, int step,
                                           int last, kraw (&ra)[2], kraw (&rb)[2]) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int uc = min(u + i * step, last);
        F::load(w, base + uc / F::parts, uc % F::parts, ra[i]);
        if (SWIGLU) F::load(up, base + uc / F::parts, uc % F::parts, rb[i]);
    }
}

/* A part's value against vector j (small_part) and the vector's scale of that part, dx. */
template <class F>
__device__ __forceinline__ float small_value(const kpart &p, const int8_t *qs, const __half2 *ds, int64_t at,
                                             float &dx) {
    int xv[8];
    ld32b((const uint8_t *)(qs + at * 32), xv);
    dx = __low2float(ds[at]);
    float ft[2] = {0.0f, 0.0f};
    if (F::has_min) {
        int t0 = 0, t1 = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) t0 = __dp4a(ONES, xv[k], t0), t1 = __dp4a(ONES, xv[4 + k], t1);
        if (one_scale<F>::value) ft[0] = i2f(t0 + t1);
        else ft[0] = i2f(t0), ft[1] = i2f(t1);
    }
    return small_part<F>(p, xv, ft);
}

/* NV: the vectors (1 to 4), so that fewer vectors' values take fewer registers. */
template <class F, bool SWIGLU, int WARPS, int SHARE, int NV>
__global__ void __launch_bounds__(32 * SMALL_ROWS)
    gemv_batch_small_kernel(batch_job job, int n_parts, const void *xq, bool prefetch, batch_rope rope) {
    constexpr int LANES = 32 / WARPS, PAIRS = (SHARE + 1) / 2, AHEAD = small_ahead<NV>(), SLOTS = AHEAD + 1;
    int rb = blockIdx.x, mi = SWIGLU ? 0 : pick(job, rb);
    qtensor w = select3(mi, job.w[0], job.w[1], job.w[2]);
    float *y = select3(mi, job.y[0], job.y[1], job.y[2]);
    int n = select3(mi, job.n[0], job.n[1], job.n[2]);
    int first = select3(mi, job.first[0], job.first[1], job.first[2]);
    const qtensor up = job.w[1];
    int lane = threadIdx.x, sub = lane % LANES, row0 = (rb - first) * SMALL_ROWS, row = row0 + threadIdx.y;
    int64_t base = (int64_t)min(row, n - 1) * (n_parts / F::parts);
    /* the lane's range [r0, r1) and its parts in it: u0, u0 + LANES, ... (count of them) */
    int per = (n_parts + WARPS - 1) / WARPS, r0 = min(n_parts, lane / LANES * per), r1 = min(n_parts, r0 + per);
    int u0 = r0 + sub, count = u0 < r1 ? (r1 - u0 + LANES - 1) / LANES : 0, last = u0 + (count - 1) * LANES;
    /* pairs of parts in flight: AHEAD loaded before the wait (the weights do not depend on the kernel before),
     * then each pair's loads go out AHEAD pairs before its use */
    kraw ra[SLOTS][2], rb2[SLOTS][2];
#pragma unroll
    for (int q = 0; q < AHEAD && q < PAIRS; q++)
        if (2 * q < count) small_load<F, SWIGLU>(w, up, base, u0 + 2 * q * LANES, LANES, last, ra[q], rb2[q]);
    if (prefetch && sub == 0 && r0 + 2 * AHEAD * LANES < r1) {
        int64_t g0 = base + (r0 + 2 * AHEAD * LANES) / F::parts, g1 = base + (r1 + F::parts - 1) / F::parts;
        for (int f = 0; f < F::n_fields; f++) {
            prefetch_field<F>(w, f, g0, g1);
            if (SWIGLU) prefetch_field<F>(up, f, g0, g1);
        }
    }
    bool roped = !SWIGLU && rope.a.freq;
    int role = select3(mi, rope.role[0], rope.role[1], rope.role[2]);
    __shared__ rope_block rs;
    pdl_release();
    if (roped) rope_block_prepare(rope, role, row0, SMALL_ROWS / 2, 0, NV, rs);
    pdl_wait();
    if (row >= n) return; /* the whole warp: it is one row (never with the rope stage: whole blocks of rows) */
    const int8_t *qs = (const int8_t *)xq;
    /* launched for exactly NV vectors, so the loops below know their count (with a run-time count, H100:
     * qwen2-1.5b at one / two sequences 915-931 / 1,443-1,464 tok/s against 946-949 / 1,598-1,607, llama3-8b 373 /
     * 532 against 385 / 624) */
    const __half2 *ds = (const __half2 *)(qs + (int64_t)NV * n_parts * 32);
    float va[NV][SHARE], vb[NV][SHARE], dx[NV][SHARE];
#pragma unroll
    for (int q = 0; q < PAIRS; q++) {
        if (2 * q >= count) break;
        int next = q + AHEAD;
        if (next < PAIRS && 2 * next < count)
            small_load<F, SWIGLU>(w, up, base, u0 + 2 * next * LANES, LANES, last, ra[next % SLOTS], rb2[next % SLOTS]);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int k = 2 * q + i, u = u0 + k * LANES;
            if (k >= SHARE || k >= count) break;
            kpart pa, pb;
            F::decode(ra[q % SLOTS][i], u % F::parts, pa);
            if (SWIGLU) F::decode(rb2[q % SLOTS][i], u % F::parts, pb);
#pragma unroll
            for (int j = 0; j < NV; j++) {
                va[j][k] = small_value<F>(pa, qs, ds, (int64_t)j * n_parts + u, dx[j][k]);
                if (SWIGLU) vb[j][k] = small_value<F>(pb, qs, ds, (int64_t)j * n_parts + u, dx[j][k]);
            }
        }
    }
    /* the range's chain, in every lane of it: part r0 + k * LANES + t's value comes from the range's lane t (the
     * chain's shuffles interleaved with the loads above, each value used as soon as it is made, ran slower: 355-357
     * tok/s on llama3-8b at one sequence against 369-371 with a pair ahead, H100) */
    float a[NV], b[NV];
#pragma unroll
    for (int j = 0; j < NV; j++) a[j] = b[j] = 0.0f;
    int src = lane - sub;
#pragma unroll
    for (int k = 0; k < SHARE; k++) {
        if (k * LANES >= per) break; /* the same for the whole warp */
#pragma unroll
        for (int t = 0; t < LANES; t++) {
            bool in = r0 + k * LANES + t < r1;
#pragma unroll
            for (int j = 0; j < NV; j++) {
                float v = __shfl_sync(0xffffffffu, va[j][k], src + t), d = __shfl_sync(0xffffffffu, dx[j][k], src + t);
                float vu = SWIGLU ? __shfl_sync(0xffffffffu, vb[j][k], src + t) : 0.0f;
                if (in) a[j] = __fmaf_rn(v, d, a[j]);
                if (SWIGLU && in) b[j] = __fmaf_rn(vu, d, b[j]);
            }
        }
    }
    /* the ranges' sums as the mma kernel adds its warps': range k + HALF's and range k's, then those in order */
    constexpr int HALF = WARPS / 2;
    __shared__ float vals[NV * SMALL_ROWS];
#pragma unroll
    for (int j = 0; j < NV; j++) {
        float pa = __shfl_down_sync(0xffffffffu, a[j], HALF * LANES) + a[j];
        float pb = SWIGLU ? __shfl_down_sync(0xffffffffu, b[j], HALF * LANES) + b[j] : 0.0f;
        float sa = 0.0f, sb = 0.0f;
#pragma unroll
        for (int k = 0; k < HALF; k++) {
            sa += __shfl_sync(0xffffffffu, pa, k * LANES);
            if (SWIGLU) sb += __shfl_sync(0xffffffffu, pb, k * LANES);
        }
        if (lane != 0) continue;
        int64_t at = (int64_t)j * n + row;
        if (SWIGLU) y[at] = silu(sa) * sb;
        else if (roped) vals[j * SMALL_ROWS + threadIdx.y] = sa;
        else store(y, at, sa, job.accumulate);
    }
    if (!roped) return;
    rope_block_finish(rope, role, row0, SMALL_ROWS / 2, 0, NV, vals, rs);
}

/* Float weights with F32 activations: one row per warp, eight weights per lane and step. */
template <kiln_type T, bool SWIGLU>
__global__ void __launch_bounds__(32 * F_WARPS)
    gemv_batch_f_kernel(batch_job job, size_t row_bytes, int k, const float *x, int n_vec) {
    pdl_release_and_wait();
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
        load8<T>(wr, i8, wv);
        if (SWIGLU) load8<T>(ur, i8, uv);
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

/* The small kernel for F, its share of parts a lane (up to 4 or up to 16), the mma kernel's warps (WARPS) and n_vec
 * vectors (1 or 2, and 3 or 4 on shares of up to 4: small_batch). */
template <class F, bool SWIGLU, int WARPS, int SHARE>
static void launch_small_share(int row_blocks, cudaStream_t stream, const batch_job &job, int n_parts, const void *xq,
                               int n_vec, bool prefetch, const batch_rope &rope) {
    dim3 block(32, SMALL_ROWS);
#define GO(NV)                                                                                                         \
    launch_pdl(gemv_batch_small_kernel<F, SWIGLU, WARPS, SHARE, NV>, row_blocks, block, stream, job, n_parts, xq,      \
               prefetch, rope)
    if (n_vec == 1) GO(1);
    else if constexpr (SHARE > SMALL_SHORT_SHARE) GO(2);
    else if (n_vec == 2) GO(2);
    else if (n_vec == 3) GO(3);
    else GO(4);
#undef GO
}

template <class F, bool SWIGLU, int WARPS>
static void launch_small(int share, int row_blocks, cudaStream_t stream, const batch_job &job, int n_parts,
                         const void *xq, int n_vec, bool prefetch, const batch_rope &rope) {
    if (share <= SMALL_SHORT_SHARE)
        launch_small_share<F, SWIGLU, WARPS, SMALL_SHORT_SHARE>(row_blocks, stream, job, n_parts, xq, n_vec, prefetch,
                                                                rope);
    else
        launch_small_share<F, SWIGLU, WARPS, SMALL_LONG_SHARE>(row_blocks, stream, job, n_parts, xq, n_vec, prefetch,
                                                               rope);
}

/* The mma kernel's form with its dynamic shared memory (allowed at its first launch: with the static shared memory,
 * the rope stage's, a block may pass 48 KB even where its dynamic part does not). */
template <class F, bool SWIGLU, int WARPS, bool STAGE, bool HALF_ACT, int TILES = MMA_TILES>
static void launch_mma(int grid, dim3 block, cudaStream_t stream, const batch_job &job, int n_parts, const void *xq,
                       int n_vec, const batch_rope &rope) {
    constexpr int bytes = mma_shared_bytes(SWIGLU, WARPS, STAGE, HALF_ACT, TILES);
    auto kernel = gemv_batch_mma_kernel<F, SWIGLU, WARPS, STAGE, HALF_ACT, TILES>;
    static bool allowed = false;
    if (!allowed) allowed = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == 0;
    launch_pdl_shared(kernel, grid, block, bytes, stream, job, n_parts, xq, n_vec, rope);
}

/* The mma kernel's forms: wide blocks (never staged), or 8 warps, in the int8 form staged from stage_tiles() tiles
 * (half mode never stages: mma_range_h); half mode takes a one-tile form up to 8 vectors (a tile's sums do not
 * depend on the others', so the bits are the same). */
template <class F, bool SWIGLU, bool HALF_ACT>
static void launch_mma_form(bool wide, int grid, dim3 block, cudaStream_t stream, const batch_job &job, int n_parts,
                            const void *xq, int n_vec, const batch_rope &rope) {
    if constexpr (HALF_ACT) {
        if (n_vec <= 8 && wide)
            launch_mma<F, false, MMA_WARPS_WIDE, false, true, 1>(grid, block, stream, job, n_parts, xq, n_vec, rope);
        else if (n_vec <= 8)
            launch_mma<F, SWIGLU, MMA_WARPS, false, true, 1>(grid, block, stream, job, n_parts, xq, n_vec, rope);
        else if (wide)
            launch_mma<F, false, MMA_WARPS_WIDE, false, true>(grid, block, stream, job, n_parts, xq, n_vec, rope);
        else launch_mma<F, SWIGLU, MMA_WARPS, false, true>(grid, block, stream, job, n_parts, xq, n_vec, rope);
    } else {
        if (wide && n_vec <= 32)
            launch_mma<F, false, MMA_WARPS_WIDE, false, false, 4>(grid, block, stream, job, n_parts, xq, n_vec, rope);
        else if (wide)
            launch_mma<F, false, MMA_WARPS_WIDE, false, false>(grid, block, stream, job, n_parts, xq, n_vec, rope);
        else if (n_vec >= stage_tiles() * 8)
            launch_mma<F, SWIGLU, MMA_WARPS, true, false>(grid, block, stream, job, n_parts, xq, n_vec, rope);
        else if (n_vec <= 32)
            launch_mma<F, SWIGLU, MMA_WARPS, false, false, 4>(grid, block, stream, job, n_parts, xq, n_vec, rope);
        else launch_mma<F, SWIGLU, MMA_WARPS, false, false>(grid, block, stream, job, n_parts, xq, n_vec, rope);
    }
}

/* Whether an F16 or BF16 matrix takes half mode's tensor cores: rows of whole parts, each row a run of memory. */
static bool half_float(const kiln_cuda_matrix *m) {
    return (m->type == KILN_TYPE_F16 || m->type == KILN_TYPE_BF16) && kiln_cuda_batch_half() && m->k % 32 == 0 &&
           m->row_bytes == (size_t)2 * m->k;
}

extern "C" bool kiln_cuda_gemv_batch_takes_act(const kiln_cuda_matrix *m) {
    return kiln_cuda_type_uses_q8_1(m->type) || half_float(m);
}

/* ms[0..n_mats) share type and width (checked by the callers); rope.a.freq: the tensor-core kernels' rope stage. */
template <bool SWIGLU>
static int launch_batch(const kiln_cuda_matrix *const *ms, float *const *ys, int n_mats, const void *xq,
                        const float *xf, int n_vec, bool accumulate, const batch_rope &rope, cudaStream_t stream,
                        __half *yh = nullptr) {
    const kiln_cuda_matrix *m0 = ms[0];
    bool quant = kiln_cuda_type_uses_q8_1(m0->type), mma = quant || half_float(m0);
    int n_parts = m0->k / 32, mma_blocks = 0;
    int64_t bytes = 0;
    for (int i = 0; i < n_mats && (!SWIGLU || i == 0); i++) mma_blocks += div_up(ms[i]->n, MMA_ROWS);
    for (int i = 0; i < n_mats; i++) bytes += (int64_t)ms[i]->row_bytes * ms[i]->n;
    /* the mma kernel's warps a block set the sums' order, which the small kernel keeps */
    bool wide = !SWIGLU && wide_blocks(mma_blocks);
    int warps = wide ? MMA_WARPS_WIDE : MMA_WARPS;
    bool half = kiln_cuda_batch_half();
    bool small = quant && !half && small_batch(n_vec, n_parts, warps);
    bool prefetch = (double)bytes <= SMALL_PREFETCH_MAX_MB * 1048576.0;
    int rows_per_block = !mma ? F_WARPS : small ? SMALL_ROWS : MMA_ROWS, share = small_lane_parts(n_parts, warps);
    batch_job job = {};
    job.n_mats = n_mats;
    job.accumulate = accumulate;
    job.yh = yh;
    int row_blocks = 0;
    for (int i = 0; i < n_mats; i++) {
        job.wf[i] = (const uint8_t *)ms[i]->data;
        job.y[i] = ys[i];
        job.n[i] = ms[i]->n;
        job.first[i] = row_blocks;
        if (!SWIGLU || i == 0) row_blocks += div_up(ms[i]->n, rows_per_block);
    }
    int grid = row_blocks * div_up(n_vec, mma ? MMA_VEC : BATCH_GROUP);
    dim3 block(32, mma ? warps : F_WARPS);
    if (mma && !quant) { /* F16 or BF16 in half mode: parts of 32 values, one a block */
        for (int i = 0; i < n_mats; i++) job.w[i] = qtensor{(const uint8_t *)ms[i]->data, (int64_t)ms[i]->n * n_parts};
        if (m0->type == KILN_TYPE_F16)
            launch_mma_form<f16_w, SWIGLU, true>(wide, grid, block, stream, job, n_parts, xq, n_vec, rope);
        else launch_mma_form<bf16_w, SWIGLU, true>(wide, grid, block, stream, job, n_parts, xq, n_vec, rope);
        return 0;
    }
    switch (m0->type) {
#define X(id, F)                                                                                                       \
    case id:                                                                                                           \
        for (int i = 0; i < n_mats; i++) job.w[i] = tensor_of<F>(ms[i]);                                               \
        if (small && wide)                                                                                             \
            launch_small<F, false, MMA_WARPS_WIDE>(share, row_blocks, stream, job, n_parts, xq, n_vec, prefetch, rope);\
        else if (small)                                                                                                \
            launch_small<F, SWIGLU, MMA_WARPS>(share, row_blocks, stream, job, n_parts, xq, n_vec, prefetch, rope);    \
        else if (half)                                                                                                 \
            launch_mma_form<F, SWIGLU, true>(wide, grid, block, stream, job, n_parts, xq, n_vec, rope);                \
        else                                                                                                           \
            launch_mma_form<F, SWIGLU, false>(wide, grid, block, stream, job, n_parts, xq, n_vec, rope);               \
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
    return launch_batch<false>(&m, &y, 1, xq, xf, n_vec, accumulate, batch_rope{}, stream);
}

/* Whether ms[i..j) share type and row layout (one launch can take them). */
static bool same_kind(const kiln_cuda_matrix *const *ms, int i, int j) {
    for (int m = i + 1; m < j; m++)
        if (ms[m]->type != ms[i]->type || ms[m]->k != ms[i]->k || ms[m]->row_bytes != ms[i]->row_bytes) return false;
    return true;
}

/* Whether ms[i..j) in one launch would take the blocks each takes alone (wide or not). Measured on H100
 * (bench_cuda_batch, one call, 1 / 8 / 64 sequences): qwen2-1.5b's Q and K together (wide alone and together)
 * 919-921 / 3,557-3,587 / 9,804-9,836 tok/s against 900-908 / 3,466-3,471 / 9,569-9,571 one by one; llama3-8b's
 * (Q alone 256 blocks of 16 rows, K 64 in wide blocks) together 374 / 1,173-1,177 / 2,732-2,738 against 372 /
 * 1,185-1,187 / 2,772-2,773 one by one, so one by one there. */
static bool same_shape(const kiln_cuda_matrix *const *ms, int i, int j) {
    int total = 0;
    for (int m = i; m < j; m++) total += div_up(ms[m]->n, MMA_ROWS);
    for (int m = i; m < j; m++)
        if (wide_blocks(div_up(ms[m]->n, MMA_ROWS)) != wide_blocks(total)) return false;
    return true;
}

/* Matrices ms[0..n_mats) over the same vectors, the rope stage (rope.a.freq) taking matrix m's results as
 * role m's. */
static int launch_multi(const kiln_cuda_matrix *const *ms, float *const *ys, int n_mats, const void *xq,
                        const float *xf, int n_vec, batch_rope rope, cudaStream_t stream) {
    if (n_mats < 1 || n_mats > BATCH_MAX_MATS || n_vec < 1) return -1;
    for (int i = 0; i < n_mats; i++)
        if (!kiln_cuda_type_supported(ms[i]->type, ms[i]->k)) return -1;
    if (same_kind(ms, 0, n_mats)) return launch_batch<false>(ms, ys, n_mats, xq, xf, n_vec, false, rope, stream);
    /* otherwise (V in another type than Q and K in the K-quant mixes) runs of one kind in one launch each where
     * that keeps every matrix's block shape (wide_blocks), else one launch a matrix: the launch sets the sums'
     * order, and which matrices share it depends on the model and the GPU alone */
    for (int i = 0, j; i < n_mats; i = j) {
        for (j = i + 1; j < n_mats && same_kind(ms, i, j + 1) && same_shape(ms, i, j + 1); j++) {}
        for (int m = i; m < j; m++) rope.role[m - i] = m;
        if (launch_batch<false>(ms + i, ys + i, j - i, xq, xf, n_vec, false, rope, stream)) return -1;
    }
    return 0;
}

extern "C" int kiln_cuda_gemv_batch_multi(const kiln_cuda_matrix *const *ms, float *const *ys, int n_mats,
                                          const void *xq, const float *xf, int n_vec, cudaStream_t stream) {
    return launch_multi(ms, ys, n_mats, xq, xf, n_vec, batch_rope{}, stream);
}

static_assert(MMA_ROWS / 2 <= ROPE_BLOCK_PAIRS && MMA_VEC <= ROPE_BLOCK_TOKENS, "a block's rope stage");
static_assert(SMALL_ROWS / 2 <= ROPE_BLOCK_PAIRS && SMALL_MAX_VEC <= ROPE_BLOCK_TOKENS, "a block's rope stage");

/* The epilogue needs the tensor-core kernels (the float one has none) and blocks of whole rotation pairs: row blocks
 * of 16 rows (8 in the small kernel) that heads of even dims never straddle, pairs of neighbouring dims. */
extern "C" bool kiln_cuda_gemv_batch_rope_fits(const kiln_cuda_matrix *const *ms, const kiln_cuda_paged_args *a) {
    static int allowed = -1;
    if (!switch_on("KILN_CUDA_BATCH_ROPE", &allowed) || !a->freq || a->neox || a->head_dim % 2 || a->rope_dim % 2)
        return false;
    for (int i = 0; i < 3; i++)
        if (!kiln_cuda_gemv_batch_takes_act(ms[i]) || ms[i]->n % MMA_ROWS) return false;
    return true;
}

extern "C" int kiln_cuda_gemv_batch_qkv_rope(const kiln_cuda_matrix *const *ms, const void *xq, int n_vec,
                                             const kiln_cuda_paged_args *a, float *q, const float *bq,
                                             const float *bk, const float *bv, void *k_cache, void *v_cache,
                                             const int32_t *d_pos, const int32_t *d_slot, cudaStream_t stream) {
    if (!kiln_cuda_gemv_batch_rope_fits(ms, a)) return -1;
    batch_rope rope = {*a, {bq, bk, bv}, {0, 1, 2}, q, (__half *)k_cache, (__half *)v_cache, d_pos, d_slot};
    float *ys[3] = {q, q, q}; /* not written: the rope stage takes the results */
    return launch_multi(ms, ys, 3, xq, nullptr, n_vec, rope, stream);
}

/* Whether gate and up, of one type and shape, can take a SwiGLU launch of n_vec vectors. */
static bool swiglu_pair(const kiln_cuda_matrix *gate, const kiln_cuda_matrix *up, int n_vec) {
    return gate->type == up->type && gate->k == up->k && gate->n == up->n && gate->row_bytes == up->row_bytes &&
           kiln_cuda_type_supported(gate->type, gate->k) && n_vec >= 1;
}

extern "C" int kiln_cuda_gemv_batch_swiglu(const kiln_cuda_matrix *gate, const kiln_cuda_matrix *up, const void *xq,
                                           const float *xf, int n_vec, float *y, cudaStream_t stream) {
    if (!swiglu_pair(gate, up, n_vec)) return -1;
    const kiln_cuda_matrix *ms[2] = {gate, up};
    float *ys[2] = {y, y};
    return launch_batch<true>(ms, ys, 2, xq, xf, n_vec, false, batch_rope{}, stream);
}

extern "C" int kiln_cuda_gemv_batch_swiglu_half(const kiln_cuda_matrix *gate, const kiln_cuda_matrix *up,
                                                const void *xq, int n_vec, void *yh, cudaStream_t stream) {
    if (!kiln_cuda_batch_half() || !kiln_cuda_gemv_batch_takes_act(gate) || gate->n % 32) return -1;
    if (!swiglu_pair(gate, up, n_vec)) return -1;
    const kiln_cuda_matrix *ms[2] = {gate, up};
    float *ys[2] = {nullptr, nullptr};
    return launch_batch<true>(ms, ys, 2, xq, nullptr, n_vec, false, batch_rope{}, stream, (__half *)yh);
}

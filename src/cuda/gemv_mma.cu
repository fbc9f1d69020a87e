/* Batch-1 matrix-vector products of K-quant rows (Q4_K, Q6_K) on int8 tensor cores.
 *
 * Why: the dp4a GEMVs (gemv.cu) decode a part of 32 weights a lane, ~100 instructions a part, and on the H200 the
 * small rows of qwen2-1.5b cannot issue them fast enough to read at the copy rate (docs/cuda.md, sessions 13 and
 * 24: 0.54 instructions a scheduler a cycle, DRAM at a third of its peak). Here a warp owns 16 rows (a tile; with
 * SwiGLU 8 gate rows and the same 8 up rows) and takes their parts four at a time (a step) in four mma.m16n8k32:
 * lane (g, t) loads part p + t of rows g and g + 8 (16 bytes each, so a warp's load is 64 consecutive bytes of 8
 * rows) and gives word j of it to mma j (the device layout keeps a part's elements 4j..4j+3 in the low nibbles of
 * word j and 16+4j..16+4j+3 in its high ones, which unpack straight into the A fragment). The activations go into B
 * so that part p + t's two halves land in columns 2t and 2t + 1 (every other entry of B is zero), so after the
 * step's four mmas lane (g, t) holds the int32 sums of part p + t's halves for rows g and g + 8, and applies that
 * part's scales alone: no lane repeats another's arithmetic. A step is ~75 instructions a lane for 64
 * row-parts, against ~3 a row-part in the dp4a form.
 *
 * A tile's steps are dealt to `split` warps of one block (interleaved, so they read neighbouring bytes), whose sums
 * are added in shared memory. The first batch of weights is loaded before the PDL wait.
 *
 * Measured on H200 (tg128, in-process against the dp4a forms): qwen2-1.5b's gate/up pair 1,550 tok/s against
 * 1,562-1,565 (-1%), llama3-8b's 533 against 652 (-18%), single matrices too 1,207-1,281 and 479-559; the weights
 * streamed through shared memory (4 to 12 steps in flight a warp) no better. Fewer instructions a weight do not pay
 * where a warp's chain of dependent steps and the warps an SM set the pace (docs/cuda.md, session 25). */
#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"
#include "cuda/quant_unpack.cuh"

#include <type_traits>

#define MMA_WARPS 8 /* warps a block */

__device__ __forceinline__ void mma_u8s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

/* A format's step of one row as a lane loads it (raw: part p8 + t of block blk, 16 contiguous bytes of its low
 * nibbles, so that the four lanes of a row read 64 consecutive bytes, and that part's scales), its word j unpacked
 * into unsigned A fragments (low: the part's elements 4j..4j+3, high: 16+4j..16+4j+3), and the part's value from
 * the int32 sums c0, c1 of its halves and the plain sums T0, T1 of the activations' halves (dx: their scale). */
struct mma_q4_K {
    struct raw {
        uint32_t w[4];
        uint4 meta; /* d and dmin, then the packed scales and mins (k4_meta) */
    };
    __device__ static void load(const qtensor &q, int64_t blk, int p8, int t, raw &r) {
        uint4 v = *(const uint4 *)(q.base + blk * 128 + 16 * (p8 + t));
        r.w[0] = v.x, r.w[1] = v.y, r.w[2] = v.z, r.w[3] = v.w;
        r.meta = *(const uint4 *)(q.base + 128 * q.n_blocks + blk * 16);
    }
    __device__ static void unpack(const raw &r, int j, uint32_t &lo, uint32_t &hi) {
        lo = r.w[j] & 0x0F0F0F0Fu;
        hi = (r.w[j] >> 4) & 0x0F0F0F0Fu;
    }
    __device__ static float value(const raw &r, int pq, int c0, int c1, int T0, int T1, float dx) {
        int s4 = 4 * pq;
        int sc = ((r.meta.y >> s4) & 15) | (((r.meta.w >> s4) & 3) << 4);
        int mn = ((r.meta.z >> s4) & 15) | (((r.meta.w >> s4) & 12) << 2);
        return dx * (half_lo(r.meta.x) * (float)sc * (float)(c0 + c1) - half_hi(r.meta.x) * (float)mn * (float)(T0 + T1));
    }
};

/* Q6_K: the low nibbles as Q4_K's, the two high bits of a part in 8 bytes of its own (k2_low_bits: elements
 * 4k..4k+3 at bits 2 (k % 4) of word k / 4), two int8 scales a part; q = bits - 32, taken out as 32 times the
 * activations' sums. */
struct mma_q6_K {
    struct raw {
        uint32_t w[4];
        uint2 h;
        uint32_t sc, d;
    };
    __device__ static void load(const qtensor &q, int64_t blk, int p8, int t, raw &r) {
        int part = p8 + t;
        uint4 v = *(const uint4 *)(q.base + blk * 128 + 16 * part);
        r.w[0] = v.x, r.w[1] = v.y, r.w[2] = v.z, r.w[3] = v.w;
        r.h = *(const uint2 *)(q.base + 128 * q.n_blocks + blk * 64 + 8 * part);
        r.sc = ldu16(q.base + 192 * q.n_blocks + blk * 16 + 2 * part);
        r.d = ldu16(q.base + 208 * q.n_blocks + blk * 2);
    }
    __device__ static void unpack(const raw &r, int j, uint32_t &lo, uint32_t &hi) {
        lo = (r.w[j] & 0x0F0F0F0Fu) | (((r.h.x >> (2 * j)) & 0x03030303u) << 4);
        hi = ((r.w[j] >> 4) & 0x0F0F0F0Fu) | (((r.h.y >> (2 * j)) & 0x03030303u) << 4);
    }
    __device__ static float value(const raw &r, int pq, int c0, int c1, int T0, int T1, float dx) {
        float s0 = (float)(int8_t)(r.sc & 0xFF), s1 = (float)(int8_t)(r.sc >> 8);
        return dx * half_lo(r.d) * (s0 * (float)(c0 - 32 * T0) + s1 * (float)(c1 - 32 * T1));
    }
};

struct mma_job {
    qtensor a, b;  /* the matrices of A's rows 0..7 and 8..15: gate and up with SwiGLU, else one matrix twice */
    float *y;
    int n;         /* rows, or with SwiGLU gate/up pairs */
    int n_parts;   /* parts a row */
    int split;     /* warps a tile, a divisor of MMA_WARPS */
    bool accumulate;
};

/* One step (parts p..p+3) of the lane's two rows ra (A row g) and rb (g + 8) into acc_a, acc_b. In mma j, lane
 * (g, t) gives word j of its part p + t, so A's columns 4t.. and 16+4t.. hold part p + t's elements; B routes them:
 * column 2t sums part p + t's low halves, 2t + 1 its high ones, and over the four mmas each column gathers its part's
 * whole half. So lane (2t + h, t) feeds half h of part p + t (its activations' word j), every other B entry is 0. */
template <class M>
__device__ __forceinline__ void mma_step(const typename M::raw &ra, const typename M::raw &rb, int p,
                                         const q8_1_view &x, bool in, float &acc_a, float &acc_b) {
    int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    uint4 xv = *(const uint4 *)(x.qs + 32 * (p + t) + 16 * (g & 1));
    uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
    uint32_t m0 = g == 2 * t ? ~0u : 0u, m1 = g == 2 * t + 1 ? ~0u : 0u;
    int c[4] = {0, 0, 0, 0}, c2[4] = {0, 0, 0, 0}; /* two chains of two mmas, not one of four */
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t a[4];
        M::unpack(ra, j, a[0], a[2]);
        M::unpack(rb, j, a[1], a[3]);
        mma_u8s8(j & 1 ? c2 : c, a, xw[j] & m0, xw[j] & m1);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) c[i] += c2[i];
    /* the activations' half sums: lane (2t + h, t) holds half h of part p + t */
    int h = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) h = __dp4a((int)xw[j], 0x01010101, h);
    int T0 = __shfl_sync(0xffffffffu, h, 9 * t), T1 = __shfl_sync(0xffffffffu, h, 9 * t + 4);
    float dx = __low2float(x.ds[p + t]);
    int pq = (p + t) & 7;
    float va = M::value(ra, pq, c[0], c[1], T0, T1, dx), vb = M::value(rb, pq, c[2], c[3], T0, T1, dx);
    acc_a += in ? va : 0.0f;
    acc_b += in ? vb : 0.0f;
}

/* A batch of the warp's steps step, step + split, ...: loads only (steps past the row read its last again). */
template <class M, int BATCH>
__device__ __forceinline__ void mma_load(const mma_job &job, int64_t blk_a, int64_t blk_b, int step, int n_steps,
                                         typename M::raw (&ra)[BATCH], typename M::raw (&rb)[BATCH]) {
    int t = threadIdx.x & 3;
#pragma unroll
    for (int i = 0; i < BATCH; i++) {
        int s = min(step + i * job.split, n_steps - 1), p = 4 * s;
        M::load(job.a, blk_a + p / 8, p & 7, t, ra[i]);
        M::load(job.b, blk_b + p / 8, p & 7, t, rb[i]);
    }
}

/* BATCH: steps a warp loads before it uses the first; MIN_BLOCKS: blocks an SM (the register budget). */
template <class M, bool SWIGLU, int BATCH, int MIN_BLOCKS>
__global__ void __launch_bounds__(32 * MMA_WARPS, MIN_BLOCKS) gemv_mma_kernel(mma_job job, const void *xq) {
    int g = threadIdx.x >> 2, t = threadIdx.x & 3;
    int warp = blockIdx.x * MMA_WARPS + threadIdx.y, tile = warp / job.split, s = warp % job.split;
    int row_a = SWIGLU ? 8 * tile + g : 16 * tile + g, row_b = SWIGLU ? row_a : row_a + 8;
    bool live_a = row_a < job.n, live_b = row_b < job.n;
    int bpr = job.n_parts / 8, n_steps = job.n_parts / 4;
    int64_t blk_a = (int64_t)min(row_a, job.n - 1) * bpr, blk_b = (int64_t)min(row_b, job.n - 1) * bpr;
    typename M::raw ra[BATCH], rb[BATCH];
    mma_load<M, BATCH>(job, blk_a, blk_b, s, n_steps, ra, rb);
    pdl_release_and_wait();
    q8_1_view x = q8_1_at(xq, (int64_t)job.n_parts * 32);
    float acc_a = 0.0f, acc_b = 0.0f;
    for (int step = s;;) {
        __syncwarp(); /* the batch's loads stay before its first use */
#pragma unroll
        for (int i = 0; i < BATCH; i++) {
            int si = step + i * job.split;
            mma_step<M>(ra[i], rb[i], 4 * min(si, n_steps - 1), x, si < n_steps, acc_a, acc_b);
        }
        step += BATCH * job.split;
        if (step >= n_steps) break;
        mma_load<M, BATCH>(job, blk_a, blk_b, step, n_steps, ra, rb);
    }
    acc_a += __shfl_xor_sync(0xffffffffu, acc_a, 1);
    acc_a += __shfl_xor_sync(0xffffffffu, acc_a, 2);
    acc_b += __shfl_xor_sync(0xffffffffu, acc_b, 1);
    acc_b += __shfl_xor_sync(0xffffffffu, acc_b, 2);
    if (job.split > 1) {
        __shared__ float sums[MMA_WARPS][16];
        if (t == 0) sums[threadIdx.y][g] = acc_a, sums[threadIdx.y][8 + g] = acc_b;
        __syncthreads();
        if (s != 0) return;
        for (int i = 1; i < job.split; i++) acc_a += sums[threadIdx.y + i][g], acc_b += sums[threadIdx.y + i][8 + g];
    }
    if (t != 0) return;
    if (SWIGLU) {
        if (live_a) job.y[row_a] = silu(acc_a) * acc_b;
        return;
    }
    if (live_a) job.y[row_a] = job.accumulate ? job.y[row_a] + acc_a : acc_a;
    if (live_b) job.y[row_b] = job.accumulate ? job.y[row_b] + acc_b : acc_b;
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
#endif
}

__device__ __forceinline__ void cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

/* A step of a warp's 16 Q4_K rows in shared memory: each row's four parts, then each row's block scales. */
struct q4_K_stage {
    uint4 w[16][4];
    uint4 meta[16];
};

/* The copies of step p (parts p..p+3) of the lane's rows: its part p + t of rows g and g + 8, their scales by t 0. */
__device__ __forceinline__ void stage_copy(q4_K_stage &st, const mma_job &job, int64_t blk_a, int64_t blk_b, int p) {
    int g = threadIdx.x >> 2, t = threadIdx.x & 3, part = (p & 7) + t;
    blk_a += p / 8, blk_b += p / 8;
    cp_async16(&st.w[g][t], job.a.base + blk_a * 128 + 16 * part);
    cp_async16(&st.w[8 + g][t], job.b.base + blk_b * 128 + 16 * part);
    if (t == 0) {
        cp_async16(&st.meta[g], job.a.base + 128 * job.a.n_blocks + blk_a * 16);
        cp_async16(&st.meta[8 + g], job.b.base + 128 * job.b.n_blocks + blk_b * 16);
    }
}

/* The same products with the weights streamed into shared memory by the copy engine's asynchronous copies, DEPTH
 * steps a warp in flight, so the loads in flight are not bounded by registers (Q4_K only); the activations are
 * copied into shared memory once a block. */
template <int DEPTH, int MIN_BLOCKS, bool SWIGLU>
__global__ void __launch_bounds__(32 * MMA_WARPS, MIN_BLOCKS) gemv_mma_stream_kernel(mma_job job, const void *xq) {
    extern __shared__ __align__(16) uint8_t shared[];
    q4_K_stage *ring = (q4_K_stage *)shared + threadIdx.y * DEPTH;
    int8_t *xs = (int8_t *)(shared + sizeof(q4_K_stage) * DEPTH * MMA_WARPS);
    int g = threadIdx.x >> 2, t = threadIdx.x & 3;
    int warp = blockIdx.x * MMA_WARPS + threadIdx.y, tile = warp / job.split, s = warp % job.split;
    int row_a = SWIGLU ? 8 * tile + g : 16 * tile + g, row_b = SWIGLU ? row_a : row_a + 8;
    bool live_a = row_a < job.n, live_b = row_b < job.n;
    int bpr = job.n_parts / 8, n_steps = job.n_parts / 4;
    int64_t blk_a = (int64_t)min(row_a, job.n - 1) * bpr, blk_b = (int64_t)min(row_b, job.n - 1) * bpr;
    int n_mine = s < n_steps ? (n_steps - 1 - s) / job.split + 1 : 0;
#pragma unroll
    for (int i = 0; i < DEPTH; i++) {
        if (i < n_mine) stage_copy(ring[i], job, blk_a, blk_b, 4 * (s + i * job.split));
        cp_commit();
    }
    pdl_release_and_wait();
    const uint4 *xg = (const uint4 *)xq;
    for (int i = threadIdx.y * 32 + threadIdx.x; i < job.n_parts * 9 / 4; i += 32 * MMA_WARPS) ((uint4 *)xs)[i] = xg[i];
    __syncthreads();
    q8_1_view x = q8_1_at(xs, (int64_t)job.n_parts * 32);
    float acc_a = 0.0f, acc_b = 0.0f;
    for (int i = 0; i < n_mine; i++) {
        cp_wait<DEPTH - 1>();
        __syncwarp(); /* the scales were copied by another lane */
        q4_K_stage &st = ring[i % DEPTH];
        mma_q4_K::raw ra, rb;
        uint4 wa = st.w[g][t], wb = st.w[8 + g][t];
        ra.w[0] = wa.x, ra.w[1] = wa.y, ra.w[2] = wa.z, ra.w[3] = wa.w, ra.meta = st.meta[g];
        rb.w[0] = wb.x, rb.w[1] = wb.y, rb.w[2] = wb.z, rb.w[3] = wb.w, rb.meta = st.meta[8 + g];
        __syncwarp(); /* every lane has read the slot before it is filled again */
        if (i + DEPTH < n_mine) stage_copy(st, job, blk_a, blk_b, 4 * (s + (i + DEPTH) * job.split));
        cp_commit();
        mma_step<mma_q4_K>(ra, rb, 4 * (s + i * job.split), x, true, acc_a, acc_b);
    }
    acc_a += __shfl_xor_sync(0xffffffffu, acc_a, 1);
    acc_a += __shfl_xor_sync(0xffffffffu, acc_a, 2);
    acc_b += __shfl_xor_sync(0xffffffffu, acc_b, 1);
    acc_b += __shfl_xor_sync(0xffffffffu, acc_b, 2);
    if (job.split > 1) {
        __shared__ float sums[MMA_WARPS][16];
        if (t == 0) sums[threadIdx.y][g] = acc_a, sums[threadIdx.y][8 + g] = acc_b;
        __syncthreads();
        if (s != 0) return;
        for (int i = 1; i < job.split; i++) acc_a += sums[threadIdx.y + i][g], acc_b += sums[threadIdx.y + i][8 + g];
    }
    if (t != 0) return;
    if (SWIGLU) {
        if (live_a) job.y[row_a] = silu(acc_a) * acc_b;
        return;
    }
    if (live_a) job.y[row_a] = job.accumulate ? job.y[row_a] + acc_a : acc_a;
    if (live_b) job.y[row_b] = job.accumulate ? job.y[row_b] + acc_b : acc_b;
}

template <int DEPTH, int MIN_BLOCKS, bool SWIGLU>
static void launch_stream(mma_job job, const void *xq, cudaStream_t stream) {
    constexpr auto kernel = gemv_mma_stream_kernel<DEPTH, MIN_BLOCKS, SWIGLU>;
    size_t shared = sizeof(q4_K_stage) * DEPTH * MMA_WARPS + (size_t)job.n_parts * 36;
    static bool sized = false;
    if (!sized) sized = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024) == cudaSuccess;
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * MMA_WARPS, shared) != cudaSuccess) per_sm = 1;
    int n_tiles = div_up(job.n, SWIGLU ? 8 : 16), n_steps = job.n_parts / 4, wave = sm_count() * per_sm;
    job.split = MMA_WARPS;
    while (job.split > 1 && (job.split > n_steps || div_up((int64_t)n_tiles * job.split, MMA_WARPS) > wave)) job.split /= 2;
    launch_pdl_shared(kernel, div_up((int64_t)n_tiles * job.split, MMA_WARPS), dim3(32, MMA_WARPS), shared, stream,
                      job, xq);
}

/* Blocks of KERNEL an SM holds. */
template <auto KERNEL>
static int mma_blocks_per_sm() {
    static int per_sm = -1;
    if (per_sm < 0 && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, KERNEL, 32 * MMA_WARPS, 0) != cudaSuccess)
        per_sm = 0;
    return per_sm;
}

/* The most warps a tile (8, 4, 2, 1) that keeps the launch within one wave and every warp a step or more. */
template <auto KERNEL>
static int mma_split(int n_tiles, int n_steps) {
    int wave = sm_count() * mma_blocks_per_sm<KERNEL>(), split = MMA_WARPS;
    while (split > 1 && (split > n_steps || div_up((int64_t)n_tiles * split, MMA_WARPS) > wave)) split /= 2;
    return split;
}

template <class M, bool SWIGLU, int BATCH, int MIN_BLOCKS>
static void launch_mma_as(mma_job job, const void *xq, cudaStream_t stream) {
    constexpr auto kernel = gemv_mma_kernel<M, SWIGLU, BATCH, MIN_BLOCKS>;
    int n_tiles = div_up(job.n, SWIGLU ? 8 : 16);
    job.split = mma_split<kernel>(n_tiles, job.n_parts / 4);
    launch_pdl(kernel, div_up((int64_t)n_tiles * job.split, MMA_WARPS), dim3(32, MMA_WARPS), stream, job, xq);
}

/* KILN_CUDA_GEMV_MMA_FORM=BATCH MIN_BLOCKS as two digits picks another of the forms below, for comparisons. */
template <class M, bool SWIGLU>
static void launch_mma(mma_job job, const void *xq, cudaStream_t stream) {
    const char *e = getenv("KILN_CUDA_GEMV_MMA_FORM");
    int form = e && *e ? atoi(e) : 23;
    if constexpr (std::is_same<M, mma_q4_K>::value) switch (form) {
        case 104: return launch_stream<4, 3, SWIGLU>(job, xq, stream);
        case 106: return launch_stream<6, 3, SWIGLU>(job, xq, stream);
        case 108: return launch_stream<8, 2, SWIGLU>(job, xq, stream);
        case 112: return launch_stream<12, 1, SWIGLU>(job, xq, stream);
        }
    switch (form) {
    case 24: return launch_mma_as<M, SWIGLU, 2, 4>(job, xq, stream);
    case 32: return launch_mma_as<M, SWIGLU, 3, 2>(job, xq, stream);
    case 42: return launch_mma_as<M, SWIGLU, 4, 2>(job, xq, stream);
    case 13: return launch_mma_as<M, SWIGLU, 1, 3>(job, xq, stream);
    default: return launch_mma_as<M, SWIGLU, 2, 3>(job, xq, stream);
    }
}

/* Which launches take this form: KILN_CUDA_GEMV_MMA bits, 1 the gate/up pair, 2 one matrix (read at launch, like
 * the other GEMV settings, so a captured step keeps what it was captured with). Off by default: slower than the dp4a
 * forms on both reference shapes (H200, docs/cuda.md session 25). */
static int mma_launches() {
    const char *e = getenv("KILN_CUDA_GEMV_MMA");
    return e && *e ? atoi(e) : 0;
}

extern "C" bool kiln_cuda_gemv_mma_takes(kiln_type type, int k, bool swiglu) {
    if (!(mma_launches() & (swiglu ? 1 : 2))) return false;
    return (type == KILN_TYPE_Q4_K || type == KILN_TYPE_Q6_K) && k > 0 && k % 256 == 0;
}

extern "C" int kiln_cuda_gemv_mma(const kiln_cuda_matrix *m, const kiln_cuda_matrix *up, const void *xq, float *y,
                                  bool accumulate, cudaStream_t stream) {
    if (m->k % 256 || (up && (up->type != m->type || up->k != m->k || up->n != m->n))) return -1;
    int64_t n_blocks = (int64_t)m->n * (m->k / 256);
    mma_job job = {};
    job.a = qtensor{(const uint8_t *)m->data, n_blocks};
    job.b = up ? qtensor{(const uint8_t *)up->data, n_blocks} : job.a;
    job.y = y, job.n = m->n, job.n_parts = m->k / 32, job.accumulate = accumulate;
    switch (m->type) {
    case KILN_TYPE_Q4_K: up ? launch_mma<mma_q4_K, true>(job, xq, stream) : launch_mma<mma_q4_K, false>(job, xq, stream);
        return 0;
    case KILN_TYPE_Q6_K: up ? launch_mma<mma_q6_K, true>(job, xq, stream) : launch_mma<mma_q6_K, false>(job, xq, stream);
        return 0;
    default: return -1;
    }
}

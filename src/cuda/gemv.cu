/* Matrix-vector products for batch-1 decode, which is bound by reading the weights once: one warp per output row
 * streams the row in parts of 32 weights, lane after lane over consecutive bytes, so each warp load is one
 * contiguous run. Quantized rows are dotted with Q8_1 activations by int8 dp4a; float rows with F32 activations in
 * 16-byte loads. The fused gate/up kernel reads both matrices in the same pass and applies SwiGLU. */
#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"
#include "cuda/q8_1.cuh"
#include "cuda/quant_unpack.cuh"

/* Rows (warps) a block. Eight, not four: a launch's cost between kernels grows with its block count (each block is
 * scheduled and retired; H100, a chain of empty kernels under PDL: 1.52 us a kernel at 1056 blocks of 4 warps, 1.12
 * at 528 of 8, about the same at 264 of 16), and the decode step's GEMVs are ~1000-block launches. Measured on H100
 * (tg128, builds alternating in one call): llama3-8b 497.1 and 496.8 tok/s against 492.1 and 491.6 with four (+1.0%),
 * qwen2-1.5b 1,339.1 and 1,338.2 against 1,313.0 and 1,310.8 (+2.0%). The occupancy budgets below keep their warps an
 * SM (24 and 32); the measurements quoted with them were made with blocks of four rows (6 and 8 blocks an SM). */
#define GEMV_ROWS_PER_BLOCK 8
/* Blocks an SM must hold (__launch_bounds__), so at most 80 registers a thread. The budget matters for more than
 * occupancy: without one, the compiler kept registers few (Q4_K 46) by decoding each part as soon as its words
 * arrived, before issuing the next part's loads, so a batch's loads waited on each other again. At 80 all of a
 * batch's loads go out first. Measured on H100 (tg128, alternating): qwen2-1.5b 849 against 807-811 tok/s (+4.9%),
 * llama3-8b even (370.4 against 370.5); a budget of 128 for all but the norm's form (8 blocks, 64) gave 821 and 366. */
#define GEMV_MIN_BLOCKS 3
/* Launches of long rows (128 parts, 4096 inputs, and more) that need more than one wave of GEMV_MIN_BLOCKS blocks an
 * SM take the two-part batch form built for 32 warps an SM (64 registers; the K-quant forms keep their loads in
 * flight without spilling): on H100 llama3-8b's Q/K/V (1536 four-row blocks against 792 a wave), output and down
 * projections (1024) go from 1.3-1.9 waves to 1-1.5, gate/up from 4.5 to 3.4. Measured on H100 (tg128, alternating
 * in one run): llama3-8b 431.6 and 431.8 tok/s against 413.3 for the build before (+4.4%); built for 28 warps (72
 * registers) the same launches gained 1.2% where 32 gained 5.5% (one run, each against a context of its size). On
 * qwen2-1.5b (rows of 1536; only gate/up, 2240 four-row blocks, and the head pass one wave) the form lost 1.3% at
 * first (1076.7 against 1090.5 without it), and 2.3% used everywhere: with a part or two a lane, a warp's loads are
 * all out at once in either form, and the tighter budget cost; since Q4_K and Q6_K parts hold fewer registers it
 * gains there too (wide_launch).
 * KILN_CUDA_GEMV_WAVES=1 always and =0 never take it, for comparisons. */
#define GEMV_WIDE_MIN_BLOCKS 4
#define GEMV_PREFETCH_MB 4.0

__global__ void quantize_q8_1_kernel(const float *x, int8_t *q, int64_t n_blocks) {
    pdl_release_and_wait();
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
 * dealt to the matrices in order, first[m] being matrix m's first block. With GEMV_SWIGLU, w[0] is the gate, w[1]
 * the up matrix and one output is written. */
#define GEMV_MAX_MATS 3

/* The rows a warp takes (the kernels' TWO): one; a gate row and its up row, whose SwiGLU it writes; or rows r and
 * r + n / 2 of one matrix (pair_launch says where). Both two-row forms read each activation once for the two. */
enum { GEMV_ONE, GEMV_SWIGLU, GEMV_PAIR };

/* What a launch does after its rows (the kernels' EPI): nothing more; the RMSNorm of the whole output by the block
 * that finishes last (norm_by_last_block); the rope stage on Q/K/V rows (rope_rows). Each its own instantiations:
 * the rope's code as a run-time branch in every form cost qwen2-1.5b 0.5% of tg128 (H100), where no launch takes
 * it. */
enum { GEMV_EPI_PLAIN, GEMV_EPI_NORM, GEMV_EPI_ROPE };

struct gemv_job {
    qtensor w[GEMV_MAX_MATS];
    float *y[GEMV_MAX_MATS];
    int n[GEMV_MAX_MATS];
    int first[GEMV_MAX_MATS];
    int n_mats;
    bool accumulate;
    bool add_early; /* with accumulate, gemv_rows loads y's old values right after its wait (load_old) */
};

/* The value a residual add adds to, loaded right after the PDL wait by the lane that will store the row (with
 * job.add_early) instead of after its sums, so the launch's tail has no L2 round trip before its stores. In the
 * one-row forms of batches of two, which the residual GEMVs take, and of four (llama3-8b's output projection) or
 * five (GEMV_BATCH5_WORDS) for formats whose loaded part holds at most GEMV_ADD_EARLY_WORDS4 words: with Q5_K's
 * and Q8_0's 9 the register it holds spilled (0 to 8, 8 to 28 bytes). On by default (H100: qwen2-1.5b +1.6%,
 * llama3-8b +0.7% from the batches of two, +0.2% more from those of four); KILN_CUDA_GEMV_ADD_EARLY=0 (read at
 * launch) loads it after the sums, =2 only in the batches of two, for comparisons. */
#define GEMV_ADD_EARLY_WORDS4 8
__device__ __forceinline__ void load_old(const gemv_job &job, const float *y, int row, bool mine, float &old) {
    if (job.accumulate && job.add_early && mine) old = y[row];
}

__device__ __forceinline__ void store_added(const gemv_job &job, float *y, int row, float v, float old) {
    y[row] = job.accumulate ? (job.add_early ? old : y[row]) + v : v;
}

/* The rope stage done by the Q/K/V launch (kiln_cuda_gemv_qkv_rope): its rows' results, bias added, are rotated
 * in neighbouring pairs and written as rope_store_kernel writes them (q scaled into y[0], k and v into the caches at
 * the position). */
struct gemv_rope {
    kiln_cuda_rope_args a; /* a.freq non-NULL: the launch does it */
    const float *bias[GEMV_MAX_MATS];
    __half *k_cache, *v_cache; /* the layer's */
    const int32_t *d_pos;
    bool bias_early; /* the pairs' biases loaded before the wait with their angles (rope_angles) */
};

/* What a launch does beyond its rows, apart from gemv_job: in the job, the norm's fields took the plain GEMV's
 * registers from 40 to 46 (Q4_K) and its speed on llama3-8b's 4096-wide inputs with them. */
struct gemv_extras {
    kiln_cuda_norm_args norm; /* norm.w non-NULL: the last block normalizes y[0] afterwards */
    gemv_rope rope;
    int prefetch_blocks;      /* blocks below this ask for the start of their rows in L2 before waiting for the */
    int prefetch_row_blocks;  /* previous kernel: this many quantized blocks of each row */
};

/* Bytes a GEMV launch asks for in L2 before the previous kernel has finished: KILN_CUDA_PREFETCH megabytes (0: no
 * early prefetch, for comparisons; read once a process, so compare it in separate processes, not as one of
 * bench_cuda_decode's settings). Enough to cover the start of the launch; more would evict what the previous
 * kernel still reads, or the prefetched lines themselves. It needs PDL, which starts a kernel early. */
static int64_t weight_prefetch_bytes() {
    static int64_t bytes = -1;
    if (bytes < 0) {
        const char *e = getenv("KILN_CUDA_PREFETCH");
        bytes = (int64_t)((e ? atof(e) : GEMV_PREFETCH_MB) * 1048576.0);
    }
    return pdl_enabled() ? bytes : 0;
}

/* RMSNorm of the vector x (n values, n a multiple of 32) that every block of this grid has written, done by the
 * block that finishes last: out = x / rms * w and its Q8_1 copy for the next GEMV, without a kernel of its own.
 * x is read twice through L2 in 16-byte loads (16 KB at n = 4096). */
__device__ void norm_by_last_block(const kiln_cuda_norm_args &a, const float *x, int n) {
    if (!arrive_last(a.counter, gridDim.x)) return;
    /* one block does the whole vector, so its passes are chains of L2 round trips: loads are issued BATCH at a time
     * (4 spilled under the kernel's register cap) */
    constexpr int n_threads = 32 * GEMV_ROWS_PER_BLOCK, BATCH = 2;
    int tid = threadIdx.y * 32 + threadIdx.x, n4 = n / 4;
    const float4 *x4 = (const float4 *)x, *w4 = (const float4 *)a.w;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float ss = 0.0f;
#pragma unroll 8
    for (int i = tid; i < n4; i += n_threads) {
        float4 v = __ldcg(x4 + i);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    __shared__ float partial[GEMV_ROWS_PER_BLOCK];
    ss = warp_sum(ss);
    if (threadIdx.x == 0) partial[threadIdx.y] = ss;
    __syncthreads();
    ss = 0.0f;
#pragma unroll
    for (int w = 0; w < GEMV_ROWS_PER_BLOCK; w++) ss += partial[w];
    float scale = rsqrtf(ss / (float)n + a.eps);
    char4 *q = (char4 *)a.out_q;
    __half2 *ds = (__half2 *)((int8_t *)a.out_q + n);
    /* whole warps go round together (the shuffles need every lane); n4 is a multiple of 8, so a Q8_1 block's 8
     * lanes are all in or all out */
    for (int base = threadIdx.y * 32 + threadIdx.x; base - (int)threadIdx.x < n4; base += BATCH * n_threads) {
        float4 v[BATCH], w[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            int i = base + b * n_threads;
            v[b] = i < n4 ? __ldcg(x4 + i) : zero;
            w[b] = i < n4 ? w4[i] : zero;
        }
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            int i = base + b * n_threads;
            float4 o = make_float4(v[b].x * scale * w[b].x, v[b].y * scale * w[b].y, v[b].z * scale * w[b].z,
                                   v[b].w * scale * w[b].w);
            if (i < n4) ((float4 *)a.out)[i] = o;
            quantize_quad(o, i < n4, q + i, ds + i / 8);
        }
    }
}

/* Pairs of neighbouring rows a block rotates: ROWS / 2, twice with row pairs (rows r and r + n in a warp). */
template <int TWO>
__host__ __device__ constexpr int rope_pairs() {
    return (TWO == GEMV_PAIR ? 2 : 1) * GEMV_ROWS_PER_BLOCK / 2;
}

/* Rotation pair t of the block (t < rope_pairs): its first row, from the block's first row row0 and the row pairs'
 * offset n (GEMV_PAIR). */
template <int TWO>
__device__ __forceinline__ int rope_pair_row(int t, int row0, int n) {
    constexpr int PER_HALF = GEMV_ROWS_PER_BLOCK / 2;
    return row0 + 2 * (t % PER_HALF) + (TWO == GEMV_PAIR && t >= PER_HALF ? n : 0);
}

/* The pair's two biases (zeros without any): weights, so they may be read before the wait. */
__device__ __forceinline__ float2 rope_bias_pair(const gemv_rope &r, int mat, int row) {
    const float *bias = mat == 0 ? r.bias[0] : mat == 1 ? r.bias[1] : r.bias[2];
    return bias ? make_float2(bias[row], bias[row + 1]) : make_float2(0.0f, 0.0f);
}

/* Before the wait: the position (written by the step before, finished: cuda_common.cuh) and each pair's sine and
 * cosine into shared memory, by the first warp's first rope_pairs threads, so the epilogue waits for neither; with
 * r.bias_early the pair's biases too (bias), whose loads would otherwise come after the sums, on the launch's tail
 * (the default since it was timed: KILN_CUDA_ROPE_BIAS_EARLY=0 loads them late, for comparisons). */
template <int TWO>
__device__ __forceinline__ void rope_angles(const gemv_rope &r, int mat, int row0, int n, float2 *sc, float2 *bias,
                                            int *pos) {
    int t = threadIdx.y * 32 + threadIdx.x;
    if (t >= rope_pairs<TWO>()) return;
    int row = rope_pair_row<TWO>(t, row0, n), p = *r.d_pos, d = row % r.a.head_dim;
    float sn = 0.0f, cs = 1.0f;
    if (mat < 2 && d < r.a.rope_dim) sincosf((float)p * r.a.freq[d / 2], &sn, &cs);
    sc[t] = make_float2(sn, cs);
    if (r.bias_early) bias[t] = rope_bias_pair(r, mat, row);
    if (t == 0) *pos = p;
}

/* The rope stage of the block's rows (every thread calls it, after the row results a, b): as rope_finish, the same
 * expressions, so the results are those of the GEMV and rope_store_kernel one after the other. mat: 0 q, 1 k, 2 v. */
template <int TWO>
__device__ __forceinline__ void rope_rows(const gemv_rope &r, int mat, int row0, int n, float a, float b, float *y,
                                          const float2 *sc, const float2 *bias, const int *pos) {
    __shared__ float vals[2 * GEMV_ROWS_PER_BLOCK];
    if (threadIdx.x == 0) vals[threadIdx.y] = a, vals[GEMV_ROWS_PER_BLOCK + threadIdx.y] = b;
    __syncthreads();
    int t = threadIdx.y * 32 + threadIdx.x;
    if (t >= rope_pairs<TWO>()) return;
    constexpr int PER_HALF = GEMV_ROWS_PER_BLOCK / 2;
    int row = rope_pair_row<TWO>(t, row0, n), local = 2 * (t % PER_HALF) + (t >= PER_HALF ? GEMV_ROWS_PER_BLOCK : 0);
    int hd = r.a.head_dim, d = row % hd;
    float2 bs = r.bias_early ? bias[t] : rope_bias_pair(r, mat, row);
    float x0 = vals[local] + bs.x, x1 = vals[local + 1] + bs.y;
    if (mat < 2 && d < r.a.rope_dim) {
        float r0 = x0 * sc[t].y - x1 * sc[t].x, r1 = x0 * sc[t].x + x1 * sc[t].y;
        x0 = r0, x1 = r1;
    }
    if (mat == 0) {
        y[row] = x0 * r.a.q_scale, y[row + 1] = x1 * r.a.q_scale;
        return;
    }
    __half *cache = (mat == 1 ? r.k_cache : r.v_cache) + ((int64_t)(row / hd) * r.a.n_ctx + *pos) * hd + d;
    cache[0] = __float2half(x0), cache[1] = __float2half(x1);
}

/* The weights of a lane's batch of parts u0, u0 + 32 * SPLIT, ... (of both rows with TWO, the second's blocks
 * up_off after the first's in up): their loads only, all issued before dot_batch waits for any. */
template <class F, int TWO, int SPLIT, int BATCH>
__device__ __forceinline__ void load_batch(const qtensor &w, const qtensor &up, int64_t g0, int64_t up_off, int u0,
                                           int end, kraw (&ra)[BATCH], kraw (&rb)[BATCH], int (&uc)[BATCH]) {
#pragma unroll
    for (int i = 0; i < BATCH; i++) {
        uc[i] = min(u0 + 32 * SPLIT * i, end - 1);
        int64_t g = g0 + uc[i] / F::parts;
        F::load(w, g, uc[i] % F::parts, ra[i]);
        if (TWO) F::load(up, g + up_off, uc[i] % F::parts, rb[i]);
    }
}

template <class F, int TWO, int SPLIT, int BATCH>
__device__ __forceinline__ void dot_batch(const kraw (&ra)[BATCH], const kraw (&rb)[BATCH], const int (&uc)[BATCH],
                                          int u0, int end, const q8_1_view &x, float &a, float &b) {
    __syncwarp(); /* keeps the batch's loads before it: left alone, the compiler moves each next to its first use */
#pragma unroll
    for (int i = 0; i < BATCH; i++) {
        bool in_row = u0 + 32 * SPLIT * i < end;
        float da = dot_loaded<F>(ra[i], uc[i] % F::parts, x, uc[i]);
        a += in_row ? da : 0.0f;
        if (TWO) {
            float db = dot_loaded<F>(rb[i], uc[i] % F::parts, x, uc[i]);
            b += in_row ? db : 0.0f;
        }
    }
}

/* SPLIT warps per row (each takes every SPLIT-th run of 32 parts; long rows, like the FFN down projection's, then
 * keep more loads in flight). A lane dots BATCH parts of a row (of both rows, with TWO) in one go: the batch is
 * one branch-free block, so all its weight loads are issued before the first product waits for DRAM (a loop of one
 * part at a time, even unrolled, has an exit test between parts, and each part's loads waited for the previous
 * part's). Parts past the row's end read its last part again, always in bounds, and count for nothing. The matrix
 * is picked with constant indices: a run-time index into the parameter arrays would copy them to local memory. */
template <class F, int TWO, int SPLIT, int EPI, int BATCH, bool EARLY>
__device__ __forceinline__ void gemv_rows(const gemv_job &job, const gemv_extras &ex, int n_parts, const void *xq) {
    qtensor w = job.w[0];
    float *y = job.y[0];
    int n = job.n[0], first = 0, mat = 0;
    if (TWO != GEMV_SWIGLU && job.n_mats > 1 && (int)blockIdx.x >= job.first[1])
        w = job.w[1], y = job.y[1], n = job.n[1], first = job.first[1], mat = 1;
    if (TWO != GEMV_SWIGLU && job.n_mats > 2 && (int)blockIdx.x >= job.first[2])
        w = job.w[2], y = job.y[2], n = job.n[2], first = job.first[2], mat = 2;
    int slice = threadIdx.y % SPLIT;
    int row0 = ((int)blockIdx.x - first) * (GEMV_ROWS_PER_BLOCK / SPLIT), row = row0 + threadIdx.y / SPLIT;
    qtensor up = job.w[1];
    int64_t up_off = 0;
    if (TWO == GEMV_PAIR) n /= 2, up = w, up_off = (int64_t)n * (n_parts / F::parts); /* n: the pairs */
    if ((int)blockIdx.x < ex.prefetch_blocks && slice == 0 && row < n) {
        int64_t blocks_per_row = n_parts / F::parts, g0 = row * blocks_per_row;
        int64_t g1 = g0 + min(blocks_per_row, (int64_t)ex.prefetch_row_blocks);
        prefetch_blocks<F>(w, g0, g1);
        if (TWO) prefetch_blocks<F>(up, g0 + up_off, g1 + up_off);
    }
    constexpr int STEP = 32 * SPLIT * BATCH;
    constexpr bool NORM = EPI == GEMV_EPI_NORM, roped = EPI == GEMV_EPI_ROPE;
    __shared__ float2 rope_sc[rope_pairs<TWO>()], rope_b[rope_pairs<TWO>()];
    __shared__ int rope_pos;
    constexpr bool ADD_EARLY = TWO == GEMV_ONE && (BATCH == 2 || F::raw_words <= GEMV_ADD_EARLY_WORDS4);
    float a = 0.0f, b = 0.0f, old = 0.0f;
    bool stores = threadIdx.x == 0 && slice == 0 && row < n; /* the lane that stores the row's result */
    int u_first = 32 * slice + threadIdx.x; /* the lane's first part */
    /* The weights do not depend on the previous kernel: with EARLY, the first batch is loaded before waiting for
     * it, so a warp resident early (the first wave) finds its first parts in registers when the wait ends and has
     * only the activations to read from L2. */
    if constexpr (EARLY) {
        kraw ra[BATCH], rb[BATCH];
        int uc[BATCH];
        /* g0 and end as below, computed here too: declared before the wait for every form, they changed the plain
         * forms' register allocation (the wide gate/up form from 4 to 76 bytes of spills) */
        int64_t g0 = (int64_t)row * (n_parts / F::parts);
        int end = row < n ? n_parts : 0;
        bool any = 32 * slice < end; /* the warp goes round together */
        if (any) load_batch<F, TWO, SPLIT, BATCH>(w, up, g0, up_off, u_first, end, ra, rb, uc);
        if constexpr (roped) rope_angles<TWO>(ex.rope, mat, row0, n, rope_sc, rope_b, &rope_pos);
        pdl_release_and_wait();
        if (SPLIT == 1 && row >= n && !NORM) return; /* as below */
        if (ADD_EARLY) load_old(job, y, row, stores, old);
        q8_1_view x = q8_1_at(xq, (int64_t)n_parts * 32);
        if (any) dot_batch<F, TWO, SPLIT, BATCH>(ra, rb, uc, u_first, end, x, a, b);
        u_first += STEP;
    } else {
        if constexpr (roped) rope_angles<TWO>(ex.rope, mat, row0, n, rope_sc, rope_b, &rope_pos);
        pdl_release_and_wait();
        /* with SPLIT > 1 or a last-block step to follow, every warp must reach the barriers below */
        if (SPLIT == 1 && row >= n && !NORM) return;
        if (ADD_EARLY) load_old(job, y, row, stores, old);
    }
    q8_1_view x = q8_1_at(xq, (int64_t)n_parts * 32);
    int64_t g0 = (int64_t)row * (n_parts / F::parts); /* the row's first block */
    int lane = threadIdx.x, end = row < n ? n_parts : 0;
    for (int u0 = u_first; u0 - lane < end; u0 += STEP) { /* the warp goes round together */
        kraw ra[BATCH], rb[BATCH];
        int uc[BATCH];
        load_batch<F, TWO, SPLIT, BATCH>(w, up, g0, up_off, u0, end, ra, rb, uc);
        dot_batch<F, TWO, SPLIT, BATCH>(ra, rb, uc, u0, end, x, a, b);
    }
    a = warp_sum(a);
    if (TWO) b = warp_sum(b);
    if (SPLIT > 1) {
        __shared__ float sa[GEMV_ROWS_PER_BLOCK], sb[GEMV_ROWS_PER_BLOCK];
        if (threadIdx.x == 0) sa[threadIdx.y] = a, sb[threadIdx.y] = b;
        __syncthreads();
        if (!NORM && (slice != 0 || row >= n)) return;
        if (slice == 0)
#pragma unroll
            for (int s = 1; s < SPLIT; s++) a += sa[threadIdx.y + s], b += sb[threadIdx.y + s];
    }
    if constexpr (roped) return rope_rows<TWO>(ex.rope, mat, row0, n, a, b, y, rope_sc, rope_b, &rope_pos);
    if (threadIdx.x == 0 && (!NORM || (slice == 0 && row < n))) {
        if (TWO == GEMV_SWIGLU) y[row] = silu(a) * b;
        else if (ADD_EARLY) store_added(job, y, row, a, old);
        else store_row(y, row, a, job.accumulate);
        if (TWO == GEMV_PAIR) store_row(y, row + n, b, job.accumulate);
    }
    if (NORM) norm_by_last_block(ex.norm, y, n);
}

/* Whether a form loads its first batch before the wait (gemv_rows' EARLY): batches of up to GEMV_EARLY_WORDS
 * loaded words (Q4_K's gate/up pair, Q6_K's two parts), and in the wide form (64 registers) not the gate/up pair.
 * Beyond, the batch held across the wait spilled: Q6_K's gate/up pair 148 bytes, Q5_K's 260, Q4_K's pair in the
 * wide form 76, and with that pair early llama3-8b's tg128 lost 7.4% on H100. Measured on H100 (tg128, alternating
 * with the build before): qwen2-1.5b 1176-1179 tok/s against 1168-1170, llama3-8b 454.6 against 450.3-451.1. */
#define GEMV_EARLY_WORDS 48

template <class F, int TWO, int BATCH, int MIN_BLOCKS>
__host__ __device__ constexpr bool early_batch() {
    return (MIN_BLOCKS < GEMV_WIDE_MIN_BLOCKS || !TWO) && BATCH * F::raw_words * (TWO ? 2 : 1) <= GEMV_EARLY_WORDS;
}

template <class F, int TWO, int SPLIT, int EPI, int BATCH, int MIN_BLOCKS>
__global__ void __launch_bounds__(32 * GEMV_ROWS_PER_BLOCK, MIN_BLOCKS)
    gemv_q_kernel(gemv_job job, gemv_extras ex, int n_parts, const void *xq) {
    gemv_rows<F, TWO, SPLIT, EPI, BATCH, early_batch<F, TWO, BATCH, MIN_BLOCKS>()>(job, ex, n_parts, xq);
}

/* Rows of at most 64 parts (one batch a lane: qwen2-1.5b's 1536-wide gate/up pair and LM head) past one wave, in a
 * loop: one wave of blocks, each warp taking rows row, row + the grid's warps, ... The activations are loaded once a
 * warp and held (with the offsets' sums), and no block is retired and scheduled again between rows. The first row's
 * weights are loaded before the PDL wait. Same products in the same order as gemv_rows' one batch, so the same bits.
 * Built for GEMV_MIN_BLOCKS blocks an SM (80 registers). Measured on H200 (tg128, against the multi-wave launches in
 * the same run, two calls): qwen2-1.5b 1,536.2 tok/s against 1,508.7, 1,537.5 against 1,511.9 (+1.7-1.8%); with the
 * next row's loads issued before each row's products (two rows' weights a lane, 16 warps an SM) 1,534.3 against
 * 1,514.7; built for 32 warps an SM (64 registers, 16-72 bytes spilled) 1,520.3 against 1,557.9. Its gate/up launch
 * went from 6.44 to 5.86 us a layer (docs/cuda-measured.md, session 22). KILN_CUDA_GEMV_LOOP=0 turns it off, for
 * comparisons (read at launch, like KILN_CUDA_GEMV_WAVES). */
template <class F, int TWO>
__global__ void __launch_bounds__(32 * GEMV_ROWS_PER_BLOCK, GEMV_MIN_BLOCKS)
    gemv_q_loop_kernel(gemv_job job, int n_parts, const void *xq) {
    qtensor w = job.w[0], up = job.w[1];
    float *y = job.y[0];
    int n = job.n[0];
    int64_t blocks_per_row = n_parts / F::parts, up_off = 0;
    if (TWO == GEMV_PAIR) n /= 2, up = w, up_off = (int64_t)n * blocks_per_row; /* n: the pairs */
    int lane = threadIdx.x, stride = gridDim.x * GEMV_ROWS_PER_BLOCK;
    int row = blockIdx.x * GEMV_ROWS_PER_BLOCK + threadIdx.y;
    kraw ra[2], rb[2];
    int uc[2];
    load_batch<F, TWO, 1, 2>(w, up, (int64_t)min(row, n - 1) * blocks_per_row, up_off, lane, n_parts, ra, rb, uc);
    pdl_release_and_wait();
    if (row >= n) return;
    q8_1_view x = q8_1_at(xq, (int64_t)n_parts * 32);
    q8_1_held h[2];
#pragma unroll
    for (int i = 0; i < 2; i++) hold_q8_1<F>(x, uc[i], h[i]);
    for (;;) {
        float a = 0.0f, b = 0.0f;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            bool in_row = lane + 32 * i < n_parts;
            float da = dot_held<F>(ra[i], uc[i] % F::parts, h[i]);
            a += in_row ? da : 0.0f;
            if (TWO) {
                float db = dot_held<F>(rb[i], uc[i] % F::parts, h[i]);
                b += in_row ? db : 0.0f;
            }
        }
        a = warp_sum(a);
        if (TWO) b = warp_sum(b);
        if (lane == 0) {
            if (TWO == GEMV_SWIGLU) y[row] = silu(a) * b;
            else store_row(y, row, a, job.accumulate);
            if (TWO == GEMV_PAIR) store_row(y, row + n, b, job.accumulate);
        }
        row += stride;
        if (row >= n) return;
        load_batch<F, TWO, 1, 2>(w, up, (int64_t)row * blocks_per_row, up_off, lane, n_parts, ra, rb, uc);
    }
}

/* Three matrices whose last is of another type (Q and K in F1, V in F2: Q4_K_M and Q5_K_M keep V in Q6_K in some
 * layers) in one launch instead of two; the branch is the same for a whole block. */
template <class F1, int BATCH1, class F2, int BATCH2, int MIN_BLOCKS, int TWO, int EPI>
__global__ void __launch_bounds__(32 * GEMV_ROWS_PER_BLOCK, MIN_BLOCKS)
    gemv_q_mixed_kernel(gemv_job job, gemv_extras ex, int n_parts, const void *xq) {
    constexpr bool early = early_batch<F1, TWO, BATCH1, MIN_BLOCKS>() && early_batch<F2, TWO, BATCH2, MIN_BLOCKS>();
    if ((int)blockIdx.x < job.first[2]) gemv_rows<F1, TWO, 1, EPI, BATCH1, early>(job, ex, n_parts, xq);
    else gemv_rows<F2, TWO, 1, EPI, BATCH2, early>(job, ex, n_parts, xq);
}

template <kiln_type T>
__device__ __forceinline__ float dot8(const uint8_t *row, int i8, const float *x) {
    float w[8];
    load8<T>(row, i8, w);
    return dot8f(w, x, i8);
}

template <kiln_type T, bool SWIGLU>
__global__ void __launch_bounds__(32 * GEMV_ROWS_PER_BLOCK)
    gemv_f_kernel(const uint8_t *w, const uint8_t *w_up, size_t row_bytes, int k, const float *x, float *y, int n,
                  bool accumulate) {
    pdl_release_and_wait();
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

/* Blocks of KERNEL that the GPU holds at once: the first wave, whose early prefetch lands before their loads; later
 * blocks start as earlier ones finish and would only ask for what they are about to load. */
template <auto KERNEL>
static int first_wave() {
    static int blocks = -1;
    if (blocks < 0) {
        int per_sm = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, KERNEL, 32 * GEMV_ROWS_PER_BLOCK, 0) != cudaSuccess)
            per_sm = 0;
        blocks = sm_count() * per_sm;
    }
    return blocks;
}

/* row_bytes: bytes of one quantized block in all the matrices a row reads (gate and up: two). */
template <auto KERNEL>
static void launch_gemv(int blocks, int rows_per_block, int row_bytes, cudaStream_t stream, const gemv_job &job,
                        gemv_extras ex, int n_parts, const void *xq) {
    int64_t budget = weight_prefetch_bytes();
    ex.prefetch_blocks = budget > 0 ? first_wave<KERNEL>() : 0;
    int64_t rows = (int64_t)(ex.prefetch_blocks < blocks ? ex.prefetch_blocks : blocks) * rows_per_block;
    int64_t per_row = rows > 0 ? budget / (rows * row_bytes) : 0;
    ex.prefetch_row_blocks = per_row < 1 ? 1 : per_row > INT32_MAX ? INT32_MAX : (int)per_row;
    launch_pdl(KERNEL, blocks, dim3(32, GEMV_ROWS_PER_BLOCK), stream, job, ex, n_parts, xq);
}

/* Warps per row of m. Long rows (8192+ inputs) in few rows get two: measured on H100, qwen2-1.5b's down
 * projection (8960 x 1536) ran 12% faster; llama3-8b's (14336 x 4096, enough warps already) no faster, and its
 * 4096-wide matrices (Q/K/V, output) with two warps a row cost 1.9% of tg128. */
static int warps_per_row(const kiln_cuda_matrix *m) { return m->k / 32 >= 256 && m->n < 4096 ? 2 : 1; }

/* Parts a lane dots in one go (gemv_q_kernel's BATCH), 2, 4 or 5 (below). Four where a lane has 3 or 4 parts of a
 * row, so the whole row is one batch, and only in the plain one-warp-a-row form of formats whose four loaded parts
 * take at most 12 words (in the other formats, and the other forms under a 64-register cap, 4 spilled). The gate/up
 * form loads two matrices, so 2 already keeps 4 parts in flight.
 * Measured on H100 (tg128, alternating): 2 everywhere against the loop before it, qwen2-1.5b +5.6%, llama3-8b
 * even; then 4 on one-batch rows (llama3-8b's Q and K) +1.2% on llama3-8b; 4 on longer rows too, nothing more
 * (both under the register caps before GEMV_MIN_BLOCKS).
 * KILN_CUDA_GEMV_BATCH=2 keeps 2 everywhere and =4 takes 4 wherever a lane has more than 2 parts, for comparisons;
 * it is read when a launch is made, so a context's captured graph keeps what was set when it was captured. */
static constexpr int GEMV_BATCH4_WORDS = 12;

/* Two-warp rows of 257-320 parts (qwen2-1.5b's down projection, 280) took three round trips in batches of two, the
 * first before the wait; a lane's five parts go in one batch, all loaded before the wait (40 words: GEMV_EARLY_WORDS),
 * in the formats whose loaded part holds 8 words, Q4_K and Q6_K (ptxas: 8 bytes of spill stores each; Q3_K's form
 * spilled 64, the others are not timed). Measured on H100 (tg128, alternating, the same bits): qwen2-1.5b 1,499.0,
 * 1,497.2 and 1,496.7 tok/s against 1,477.7, 1,477.0 and 1,476.9 in batches of two (+1.4%). KILN_CUDA_GEMV_BATCH=2
 * or 4 keeps them in twos, for comparisons. */
static constexpr int GEMV_BATCH5_WORDS = 8;

static int parts_per_batch(int n_parts, int split) {
    const char *e = getenv("KILN_CUDA_GEMV_BATCH");
    int forced = e ? atoi(e) : 0, per_lane = div_up(n_parts, 32 * split);
    if (forced == 2 || per_lane <= 2) return 2;
    if (forced != 4 && split == 2 && per_lane == 5) return 5;
    return forced == 4 || per_lane <= 4 ? 4 : 2;
}

/* Whether a launch of `blocks` takes the form built for GEMV_WIDE_MIN_BLOCKS blocks an SM: more than one wave at
 * GEMV_MIN_BLOCKS (or as KILN_CUDA_GEMV_WAVES says; read at launch, like KILN_CUDA_GEMV_BATCH). Short rows past one
 * wave are qwen2-1.5b's head (151,936 rows of 48 parts, one batch a warp, 48 waves at 24 warps an SM, 36 at 32): on
 * H100 its tg128 gained 0.7-0.9% in the wide form (1225.4 and 1228.1 tok/s against 1218.6 and 1217.3 for a control
 * context in the same runs); and its gate/up pair (2240 blocks of 48-part rows), which lost 1.3% in it while a
 * loaded Q4_K part held 12 registers, gained 0.9-1.0% once it held 8 (device blocks of their own, quant_unpack.cuh):
 * 1298.6 and 1299.2 tok/s against 1287.1 and 1286.3, H100. Both take the row loop now (gemv_q_loop_kernel). */
static bool wide_launch(int blocks) {
    const char *e = getenv("KILN_CUDA_GEMV_WAVES");
    if (e && *e) return atoi(e) == 1;
    int sms = sm_count();
    return sms > 0 && blocks > GEMV_MIN_BLOCKS * sms;
}

/* Long rows past one wave: the two-part form for 32 warps an SM (GEMV_WIDE_MIN_BLOCKS); else batch 4 where the
 * form and format allow it (above), else 2. */
template <class F, int TWO, int SPLIT, int EPI>
static void launch_batched(int batch, int blocks, int rows_per_block, int row_bytes, cudaStream_t stream,
                           const gemv_job &job, const gemv_extras &ex, int n_parts, const void *xq) {
    if constexpr (EPI != GEMV_EPI_NORM)
        if (wide_launch(blocks))
            return launch_gemv<gemv_q_kernel<F, TWO, SPLIT, EPI, 2, GEMV_WIDE_MIN_BLOCKS>>(
                blocks, rows_per_block, row_bytes, stream, job, ex, n_parts, xq);
    if constexpr (!TWO && EPI != GEMV_EPI_NORM && SPLIT == 1 && F::raw_words <= GEMV_BATCH4_WORDS)
        if (batch == 4)
            return launch_gemv<gemv_q_kernel<F, TWO, SPLIT, EPI, 4, GEMV_MIN_BLOCKS>>(
                blocks, rows_per_block, row_bytes, stream, job, ex, n_parts, xq);
    if constexpr (!TWO && EPI == GEMV_EPI_PLAIN && SPLIT == 2 && F::raw_words == GEMV_BATCH5_WORDS)
        if (batch == 5)
            return launch_gemv<gemv_q_kernel<F, TWO, SPLIT, EPI, 5, GEMV_MIN_BLOCKS>>(
                blocks, rows_per_block, row_bytes, stream, job, ex, n_parts, xq);
    launch_gemv<gemv_q_kernel<F, TWO, SPLIT, EPI, 2, GEMV_MIN_BLOCKS>>(blocks, rows_per_block, row_bytes, stream,
                                                                          job, ex, n_parts, xq);
}

/* Whether a launch takes gemv_q_loop_kernel: one-batch rows past one wave, one matrix (or the gate/up pair), no norm
 * or rope stage, unless KILN_CUDA_GEMV_LOOP=0. */
static bool loop_launch(const gemv_extras &ex, int n_mats, int two, int split, int blocks, int n_parts) {
    const char *e = getenv("KILN_CUDA_GEMV_LOOP");
    if ((e && *e && atoi(e) == 0) || split != 1 || n_parts > 64 || ex.norm.w || ex.rope.a.freq) return false;
    return (two == GEMV_SWIGLU || n_mats == 1) && wide_launch(blocks);
}

/* The loop's grid: its first wave, or fewer blocks where the rows need fewer. */
template <class F, int TWO>
static void launch_loop(const gemv_job &job, int blocks, int n_parts, const void *xq, cudaStream_t stream) {
    int wave = first_wave<gemv_q_loop_kernel<F, TWO>>();
    int grid = wave > 0 && wave < blocks ? wave : blocks;
    launch_pdl(gemv_q_loop_kernel<F, TWO>, grid, dim3(32, GEMV_ROWS_PER_BLOCK), stream, job, n_parts, xq);
}

template <int TWO>
static int launch_quant_as(const kiln_cuda_matrix *const *ms, int n_mats, const void *xq, gemv_job job,
                           const gemv_extras &ex, cudaStream_t stream, int split, int blocks, int rows_per_block) {
    const kiln_cuda_matrix *m0 = ms[0];
    int n_parts = m0->k / 32;
    /* the norm's and the rope's forms only where they are asked for: they take more registers */
    constexpr int CAN_NORM = TWO ? GEMV_EPI_PLAIN : GEMV_EPI_NORM;
    constexpr int CAN_ROPE = TWO == GEMV_SWIGLU ? GEMV_EPI_PLAIN : GEMV_EPI_ROPE;
    bool norm = ex.norm.w != nullptr, rope = ex.rope.a.freq != nullptr;
    bool loop = loop_launch(ex, n_mats, TWO, split, blocks, n_parts);
    switch (m0->type) {
#define GO(F, S, E)                                                                                                    \
    launch_batched<F, TWO, S, E>(batch, blocks, rows_per_block, bytes, stream, job, ex, n_parts, xq)
#define X(id, F)                                                                                                       \
    case id: {                                                                                                         \
        for (int i = 0; i < n_mats; i++) job.w[i] = tensor_of<F>(ms[i]);                                              \
        int bytes = F::block_bytes * (TWO ? 2 : 1);                                                                \
        int batch = parts_per_batch(n_parts, split);                                                                   \
        if (loop) launch_loop<F, TWO>(job, blocks, n_parts, xq, stream);                                               \
        else if (split == 2) norm ? GO(F, 2, CAN_NORM) : GO(F, 2, GEMV_EPI_PLAIN);                                     \
        else norm ? GO(F, 1, CAN_NORM) : rope ? GO(F, 1, CAN_ROPE) : GO(F, 1, GEMV_EPI_PLAIN);                         \
        return 0;                                                                                                      \
    }
        KILN_CUDA_QUANT_TYPES(X)
#undef X
#undef GO
    default: return -1;
    }
}

/* Blocks of a launch over ms[0..n_mats), one warp a row (or a row pair, or with SwiGLU a gate row and its up row:
 * the up matrix takes no blocks of its own). */
static int count_blocks(const kiln_cuda_matrix *const *ms, int n_mats, int rows_per_block, int two) {
    int blocks = 0;
    for (int i = 0; i < n_mats && (two != GEMV_SWIGLU || i == 0); i++)
        blocks += div_up(two == GEMV_PAIR ? ms[i]->n / 2 : ms[i]->n, rows_per_block);
    return blocks;
}

/* Deals the blocks to the matrices in order (job.first) and returns the grid's size. */
static int deal_blocks(gemv_job &job, const kiln_cuda_matrix *const *ms, float *const *ys, int n_mats,
                       int rows_per_block, int two) {
    job.n_mats = n_mats;
    for (int i = 0; i < n_mats; i++) {
        job.y[i] = ys[i];
        job.n[i] = ms[i]->n;
        job.first[i] = count_blocks(ms, i, rows_per_block, two);
    }
    return count_blocks(ms, n_mats, rows_per_block, two);
}

/* Launches of many waves of short rows take pairs too: a row of at most GEMV_PAIR_MAX_PARTS parts is one batch a
 * lane or less, so a warp's one-row pass is mostly its fixed costs (the activations' loads, the reduction, the
 * store), which a pair shares. That is qwen2-1.5b's LM head (151,936 rows of 48 parts, 36 waves in the wide form).
 * Measured on H100 (tg128, in-process against a context without): qwen2-1.5b 1,373.0 and 1,370.1 tok/s against
 * 1,357.5 and 1,360.6 (+0.7-1.1%); llama3-8b's head (128,256 rows of 128 parts) 511.6 and 511.5 against 512.5 and
 * 512.3 in pairs, so not there. */
#define GEMV_PAIR_MIN_WAVES 8
#define GEMV_PAIR_MAX_PARTS 64

/* Whether a launch of one warp a row takes row pairs instead (GEMV_PAIR: rows r and r + n / 2 in one warp, which
 * reads each activation once for both and keeps two rows' loads in flight): where the rows pass one wave even in the
 * wide form and their pairs fit one wave of the plain form, so every warp is resident from the start and none waits
 * for a second wave. That is llama3-8b's Q/K/V (6144 rows, 1.45 waves in the wide form, 3072 pairs). Measured
 * (tg128): on H200 against a context without pairs in the same run, llama3-8b +1.2% with Q/K/V in pairs, -2.2% with
 * the output and down projections (4096 rows, one wave already) in pairs too, qwen2-1.5b (launches under one wave
 * or past two) -1.2 to -1.3% with pairs anywhere; on H100 against the build before, alternating, llama3-8b 489.8 and
 * 491.1 tok/s against 487.3 and 487.2 (+0.7%), qwen2-1.5b even. KILN_CUDA_GEMV_PAIR=1 takes pairs wherever the rows
 * allow, =0 never (read at launch, like KILN_CUDA_GEMV_WAVES). */
static bool pair_launch(const kiln_cuda_matrix *const *ms, int n_mats) {
    for (int i = 0; i < n_mats; i++)
        if (ms[i]->n % 2) return false;
    const char *e = getenv("KILN_CUDA_GEMV_PAIR");
    if (e && *e) return atoi(e) == 1;
    int sms = sm_count(), blocks = count_blocks(ms, n_mats, GEMV_ROWS_PER_BLOCK, GEMV_ONE);
    if (sms <= 0) return false;
    if (blocks > GEMV_PAIR_MIN_WAVES * GEMV_WIDE_MIN_BLOCKS * sms && ms[0]->k / 32 <= GEMV_PAIR_MAX_PARTS) return true;
    return blocks > GEMV_WIDE_MIN_BLOCKS * sms &&
           count_blocks(ms, n_mats, GEMV_ROWS_PER_BLOCK, GEMV_PAIR) <= GEMV_MIN_BLOCKS * sms;
}

/* ms[0..n_mats) share type and width (checked by the callers); job brings accumulate; ex the norm the last block
 * does (ex.norm.w non-NULL) or the rope stage (ex.rope.a.freq). */
template <bool SWIGLU>
static int launch_quant(const kiln_cuda_matrix *const *ms, float *const *ys, int n_mats, const void *xq, gemv_job job,
                        const gemv_extras &ex, cudaStream_t stream) {
    int split = warps_per_row(ms[0]), rows_per_block = GEMV_ROWS_PER_BLOCK / split;
    if (!SWIGLU && split == 1 && !ex.norm.w && pair_launch(ms, n_mats)) {
        int blocks = deal_blocks(job, ms, ys, n_mats, rows_per_block, GEMV_PAIR);
        return launch_quant_as<GEMV_PAIR>(ms, n_mats, xq, job, ex, stream, split, blocks, rows_per_block);
    }
    constexpr int two = SWIGLU ? GEMV_SWIGLU : GEMV_ONE;
    int blocks = deal_blocks(job, ms, ys, n_mats, rows_per_block, two);
    return launch_quant_as<two>(ms, n_mats, xq, job, ex, stream, split, blocks, rows_per_block);
}

/* A measured default that NAME=0 turns off, for comparisons (read at launch). */
static bool on_unless_zero(const char *name) {
    const char *e = getenv(name);
    return !e || !*e || atoi(e) != 0;
}

/* job.add_early for m's launch (load_old): on unless KILN_CUDA_GEMV_ADD_EARLY=0; =2 only where m's lanes take
 * batches other than four, to compare the batches of four alone. */
static bool add_early(const kiln_cuda_matrix *m) {
    const char *e = getenv("KILN_CUDA_GEMV_ADD_EARLY");
    int setting = e && *e ? atoi(e) : 1;
    return setting == 2 ? parts_per_batch(m->k / 32, warps_per_row(m)) != 4 : setting != 0;
}

extern "C" int kiln_cuda_gemv(const kiln_cuda_matrix *m, const void *xq, const float *xf, float *y, bool accumulate,
                              cudaStream_t stream) {
    if (!kiln_cuda_type_supported(m->type, m->k)) return -1;
    if (!kiln_cuda_type_uses_q8_1(m->type)) return launch_float<false>(m, nullptr, xf, y, accumulate, stream);
    gemv_job job = {};
    job.accumulate = accumulate;
    job.add_early = add_early(m);
    return launch_quant<false>(&m, &y, 1, xq, job, gemv_extras{}, stream);
}

/* The batch a format's lane may take in gemv_q_mixed_kernel (launch_batched's rule) */
template <class F>
static constexpr int mixed_batch(int batch) {
    return batch == 4 && F::raw_words <= GEMV_BATCH4_WORDS ? 4 : 2;
}

template <class F1, class F2, int B1, int B2, int MIN_BLOCKS = GEMV_MIN_BLOCKS, int TWO = GEMV_ONE>
static void launch_mixed_as(int blocks, int row_bytes, cudaStream_t stream, const gemv_job &job,
                            const gemv_extras &ex, int n_parts, const void *xq) {
    if (ex.rope.a.freq)
        return launch_gemv<gemv_q_mixed_kernel<F1, B1, F2, B2, MIN_BLOCKS, TWO, GEMV_EPI_ROPE>>(
            blocks, GEMV_ROWS_PER_BLOCK, row_bytes, stream, job, ex, n_parts, xq);
    launch_gemv<gemv_q_mixed_kernel<F1, B1, F2, B2, MIN_BLOCKS, TWO, GEMV_EPI_PLAIN>>(blocks, GEMV_ROWS_PER_BLOCK,
                                                                                      row_bytes, stream, job, ex,
                                                                                      n_parts, xq);
}

template <class F1, class F2>
static void launch_mixed(const kiln_cuda_matrix *const *ms, float *const *ys, const void *xq, const gemv_extras &ex,
                         cudaStream_t stream) {
    gemv_job job = {};
    for (int i = 0; i < 3; i++) job.w[i] = i < 2 ? tensor_of<F1>(ms[i]) : tensor_of<F2>(ms[i]);
    int n_parts = ms[0]->k / 32, batch = parts_per_batch(n_parts, 1);
    int bytes = F1::block_bytes > F2::block_bytes ? F1::block_bytes : F2::block_bytes;
    if (pair_launch(ms, 3)) {
        int blocks = deal_blocks(job, ms, ys, 3, GEMV_ROWS_PER_BLOCK, GEMV_PAIR);
        return launch_mixed_as<F1, F2, 2, 2, GEMV_MIN_BLOCKS, GEMV_PAIR>(blocks, 2 * bytes, stream, job, ex, n_parts, xq);
    }
    int blocks = deal_blocks(job, ms, ys, 3, GEMV_ROWS_PER_BLOCK, GEMV_ONE);
    if (wide_launch(blocks))
        launch_mixed_as<F1, F2, 2, 2, GEMV_WIDE_MIN_BLOCKS>(blocks, bytes, stream, job, ex, n_parts, xq);
    else if (mixed_batch<F1>(batch) == 4)
        launch_mixed_as<F1, F2, 4, mixed_batch<F2>(4)>(blocks, bytes, stream, job, ex, n_parts, xq);
    else launch_mixed_as<F1, F2, 2, 2>(blocks, bytes, stream, job, ex, n_parts, xq);
}

/* Q, K in one quantized type and V in another, one launch where the pair has a kernel (the K-quant mixes' pairs);
 * false: not such a pair */
static bool try_mixed(const kiln_cuda_matrix *const *ms, float *const *ys, const void *xq, const gemv_extras &ex,
                      cudaStream_t stream) {
    kiln_type a = ms[0]->type, b = ms[2]->type;
    if (ms[1]->type != a || ms[1]->k != ms[0]->k || ms[2]->k != ms[0]->k || warps_per_row(ms[0]) != 1 ||
        warps_per_row(ms[2]) != 1)
        return false;
    if (a == KILN_TYPE_Q4_K && b == KILN_TYPE_Q6_K) launch_mixed<q4_K_t, q6_K_t>(ms, ys, xq, ex, stream);
    else if (a == KILN_TYPE_Q5_K && b == KILN_TYPE_Q6_K) launch_mixed<q5_K_t, q6_K_t>(ms, ys, xq, ex, stream);
    else return false;
    return true;
}

/* Runs of matrices that share a quantized type and width go in one launch each, Q/K + V of a mixed pair in one. */
extern "C" int kiln_cuda_gemv_multi(const kiln_cuda_matrix *const *ms, float *const *ys, int n_mats, const void *xq,
                                    const float *xf, cudaStream_t stream) {
    if (n_mats < 1 || n_mats > GEMV_MAX_MATS) return -1;
    for (int i = 0; i < n_mats; i++)
        if (!kiln_cuda_type_supported(ms[i]->type, ms[i]->k)) return -1;
    if (n_mats == 3 && try_mixed(ms, ys, xq, gemv_extras{}, stream)) return 0;
    for (int i = 0, j; i < n_mats; i = j) {
        for (j = i + 1; j < n_mats && ms[j]->type == ms[i]->type && ms[j]->k == ms[i]->k; j++) {}
        if (kiln_cuda_type_uses_q8_1(ms[i]->type)) {
            if (launch_quant<false>(ms + i, ys + i, j - i, xq, gemv_job{}, gemv_extras{}, stream)) return -1;
            continue;
        }
        for (int m = i; m < j; m++)
            if (kiln_cuda_gemv(ms[m], xq, xf, ys[m], false, stream)) return -1;
    }
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
    return launch_quant<true>(ms, ys, 2, xq, gemv_job{}, gemv_extras{}, stream);
}

extern "C" int kiln_cuda_gemv_norm(const kiln_cuda_matrix *m, const void *xq, float *y,
                                   const kiln_cuda_norm_args *norm, cudaStream_t stream) {
    if (!kiln_cuda_type_uses_q8_1(m->type) || !kiln_cuda_type_supported(m->type, m->k) || m->n % 32) return -1;
    gemv_job job = {};
    job.accumulate = true;
    job.add_early = add_early(m);
    gemv_extras ex = {};
    ex.norm = *norm;
    return launch_quant<false>(&m, &y, 1, xq, job, ex, stream);
}

extern "C" int kiln_cuda_gemv_qkv_rope(const kiln_cuda_matrix *const *ms, float *q, const void *xq,
                                       const kiln_cuda_rope_args *r, const float *bq, const float *bk, const float *bv,
                                       void *k_cache, void *v_cache, const int32_t *d_pos, cudaStream_t stream) {
    if (r->neox || r->head_dim % 2 || r->rope_dim % 2) return -1;
    for (int i = 0; i < 3; i++)
        if (!kiln_cuda_type_uses_q8_1(ms[i]->type) || !kiln_cuda_type_supported(ms[i]->type, ms[i]->k) ||
            ms[i]->k != ms[0]->k || warps_per_row(ms[i]) != 1 || ms[i]->n % (2 * GEMV_ROWS_PER_BLOCK))
            return -1;
    gemv_extras ex = {};
    ex.rope = gemv_rope{*r, {bq, bk, bv}, (__half *)k_cache, (__half *)v_cache, d_pos,
                        on_unless_zero("KILN_CUDA_ROPE_BIAS_EARLY")};
    float *ys[3] = {q, q, q}; /* k and v rows go to the caches only */
    if (ms[1]->type == ms[0]->type && ms[2]->type == ms[0]->type)
        return launch_quant<false>(ms, ys, 3, xq, gemv_job{}, ex, stream);
    return try_mixed(ms, ys, xq, ex, stream) ? 0 : -1;
}

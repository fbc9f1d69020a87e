/* The k best logits of a row on the device, for sampling with top-k: instead of the row (n_vocab floats across
 * PCIe, then a pass over all of them on the host), the sampler gets k (id, logit) pairs. Ranked by logit, then by the
 * lower id, the order the host sampler ranks in, so the set at the cut is the same when logits tie.
 *
 * The default (a threshold, four launches): the row is cut into g >= 2k chunks and each chunk's maximum taken; the
 * k-th largest of those maxima, T, is at most the row's k-th largest value (k distinct values reach it), so the k
 * best are among the values >= T, of which random-like rows hold about -g ln(1 - k/g) (~1.4k at g = 2k); those are
 * gathered and one block sorts them. Where ties make more than a tile of them (a row of equal values), that block
 * streams the row instead, keeping its best after each tile: slow, but exact.
 * The one before it, kept for comparison (KILN_CUDA_TOPK=2): a block orders a tile of TOPK_TILE values in shared
 * memory and keeps its best k, runs of k sorted then merged in pairs that keep the better half; the kept ones of all
 * tiles are tiles again for the next pass, until one tile is left (152k logits and k = 40: three passes).
 * bench_cuda_decode times both. */
#include <limits.h>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"

#define TOPK_THREADS 1024
#define TOPK_TILE (2 * TOPK_THREADS)
#define TOPK_SCAN_THREADS 256 /* a chunk's block (maxima, filter) */
#define TOPK_MAX_CHUNKS 512   /* 2 * KILN_CUDA_TOP_K_MAX */
static_assert(TOPK_MAX_CHUNKS >= 2 * KILN_CUDA_TOP_K_MAX, "a row's chunks: at least 2k");

/* a ranks before b */
__device__ __forceinline__ bool ranks_before(float av, int32_t ai, float bv, int32_t bi) {
    return av > bv || (av == bv && ai < bi);
}

/* Tile blockIdx.x of row blockIdx.y of v (rows n apart; ids: id[i] of the row, or i where id is NULL; past n: -inf,
 * ranked last) into shared memory. */
__device__ __forceinline__ void load_tile(const float *v, const int32_t *id, int n, float *sv, int32_t *si) {
    int64_t base = (int64_t)blockIdx.x * TOPK_TILE;
    v += (int64_t)blockIdx.y * n;
    if (id) id += (int64_t)blockIdx.y * n;
    for (int i = threadIdx.x; i < TOPK_TILE; i += TOPK_THREADS) {
        int64_t g = base + i;
        sv[i] = g < n ? v[g] : -INFINITY;
        si[i] = g < n ? (id ? id[g] : (int32_t)g) : INT_MAX;
    }
}

/* The tile's first k (its best, once ordered) to place k * blockIdx.x of row blockIdx.y (rows out_n apart). */
__device__ __forceinline__ void store_best(const float *sv, const int32_t *si, int k, float *out_v, int32_t *out_id,
                                           int out_n) {
    __syncthreads();
    int64_t at = (int64_t)blockIdx.y * out_n + (int64_t)blockIdx.x * k;
    for (int i = threadIdx.x; i < k; i += TOPK_THREADS) out_v[at + i] = sv[i], out_id[at + i] = si[i];
}

/* Places i and j in order: the better first, or with best_first false the worse first. */
__device__ __forceinline__ void order_pair(float *sv, int32_t *si, int i, int j, bool best_first) {
    if (ranks_before(sv[j], si[j], sv[i], si[i]) == best_first) {
        float tv = sv[i];
        int32_t ti = si[i];
        sv[i] = sv[j], si[i] = si[j], sv[j] = tv, si[j] = ti;
    }
}

/* Thread t's pair at this stride: i with a zero inserted at the stride's bit, and i + stride. */
__device__ __forceinline__ int pair_at(int t, int stride) { return ((t & ~(stride - 1)) << 1) | (t & (stride - 1)); }

/* The first `size` values of the shared tile (a power of two, at most TOPK_TILE) ordered in runs of `run` (a power
 * of two up to size) by a bitonic network, each step a thread ordering one pair (i, i + stride); runs alternate
 * direction, run r best first when r is even, so with run = size the whole ends sorted best first. */
__device__ __forceinline__ void sort_runs(float *sv, int32_t *si, int size, int run) {
    for (int r = 2; r <= run; r <<= 1)
        for (int stride = r >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (int t = threadIdx.x; t < size / 2; t += blockDim.x) {
                int i = pair_at(t, stride);
                order_pair(sv, si, i, i + stride, (i & r) == 0);
            }
        }
    __syncthreads();
}

__device__ __forceinline__ void sort_tile(float *sv, int32_t *si, int size) { sort_runs(sv, si, size, size); }

/* The tile (load_tile) reduced to its best run of `run` (a power of two >= k) without sorting
 * all of it: runs of `run` are sorted in alternating directions, then pairs of runs merge, each keeping the better
 * of its two elements at every place (a bitonic run holding the pair's best `run`), sorted again, halving the tile
 * each round. About half the shared-memory traffic of the full sort for k = 40. */
__global__ void __launch_bounds__(TOPK_THREADS)
    top_k_tile_halving_kernel(const float *v, const int32_t *id, int n, int k, float *out_v, int32_t *out_id,
                              int out_n, int run) {
    __shared__ float sv[TOPK_TILE];
    __shared__ int32_t si[TOPK_TILE];
    load_tile(v, id, n, sv, si);
    int t = threadIdx.x;
    sort_runs(sv, si, TOPK_TILE, run); /* the full sort's first levels */
    for (int m = TOPK_TILE; m > run; m >>= 1) {
        /* runs 2p (best first) and 2p + 1 (worst first) make a bitonic 2 * run: the better of places i and i + run
         * are its best run, which becomes run p */
        __syncthreads();
        float bv = 0.0f;
        int32_t bi = 0;
        bool active = t < m / 2;
        if (active) {
            int p = t / run, i = 2 * p * run + t % run, j = i + run;
            bool first = ranks_before(sv[i], si[i], sv[j], si[j]);
            bv = first ? sv[i] : sv[j], bi = first ? si[i] : si[j];
        }
        __syncthreads();
        if (active) sv[t] = bv, si[t] = bi;
        for (int stride = run >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            if (t < m / 4) {
                int i = pair_at(t, stride);
                order_pair(sv, si, i, i + stride, (i & run) == 0);
            }
        }
    }
    store_best(sv, si, k, out_v, out_id, out_n);
}

/* Chunk blockIdx.x of row blockIdx.y: its maximum into maxima (rows g apart). */
__global__ void __launch_bounds__(TOPK_SCAN_THREADS)
    chunk_max_kernel(const float *v, int n, int chunk, float *maxima, int g) {
    pdl_wait_and_release();
    v += (int64_t)blockIdx.y * n;
    int lo = blockIdx.x * chunk, hi = min(n, lo + chunk);
    float m = -INFINITY;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) m = fmaxf(m, v[i]);
    m = block_max(m);
    if (threadIdx.x == 0) maxima[(int64_t)blockIdx.y * g + blockIdx.x] = m;
}

/* Row blockIdx.x's threshold: the k-th largest of its g chunk maxima (g <= blockDim.x), found by counting, for each
 * maximum, those above it and those at least it; its candidate count set to zero. */
__global__ void __launch_bounds__(TOPK_MAX_CHUNKS)
    threshold_kernel(const float *maxima, int g, int k, float *threshold, int *count) {
    __shared__ float sm[TOPK_MAX_CHUNKS];
    pdl_wait_and_release();
    int t = threadIdx.x, row = blockIdx.x;
    float mine = t < g ? maxima[(int64_t)row * g + t] : -INFINITY;
    sm[t] = mine;
    __syncthreads();
    if (t < g) {
        int above = 0, at_least = 0;
        for (int j = 0; j < g; j++) {
            float o = sm[j];
            above += o > mine;
            at_least += o >= mine;
        }
        if (above < k && at_least >= k) threshold[row] = mine; /* every thread holding that value: the same store */
    }
    if (t == 0) count[row] = 0;
}

/* Chunk blockIdx.x of row blockIdx.y: its values >= the row's threshold appended to the row's candidates (up to
 * TOPK_TILE of them; the count goes on past that, telling select_kernel to stream the row instead). */
__global__ void __launch_bounds__(TOPK_SCAN_THREADS)
    chunk_filter_kernel(const float *v, int n, int chunk, const float *threshold, int *count, float *cand_v,
                        int32_t *cand_id) {
    pdl_wait_and_release();
    int row = blockIdx.y;
    v += (int64_t)row * n;
    float th = threshold[row];
    int lo = blockIdx.x * chunk, hi = min(n, lo + chunk);
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float x = v[i];
        if (x >= th) {
            int at = atomicAdd(count + row, 1);
            if (at < TOPK_TILE) cand_v[(int64_t)row * TOPK_TILE + at] = x, cand_id[(int64_t)row * TOPK_TILE + at] = i;
        }
    }
}

/* The shared tile from place `from` on set to the worst rank (-inf, the largest id). */
__device__ __forceinline__ void clear_tile(float *sv, int32_t *si, int from) {
    for (int i = from + threadIdx.x; i < TOPK_TILE; i += blockDim.x) sv[i] = -INFINITY, si[i] = INT_MAX;
}

/* Row blockIdx.x's values >= th streamed into the tile after its best `run`: each round of a block's width appends
 * those of its values that qualify (in place order, by a block-wide count), after sorting the tile and keeping its
 * best run whenever the round might not fit. Returns with the tile sorted. */
__device__ void stream_row(const float *v, int n, float th, int run, float *sv, int32_t *si) {
    __shared__ int warp_at[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5, filled = 0;
    clear_tile(sv, si, 0);
    for (int base = 0; base < n; base += blockDim.x) {
        int i = base + threadIdx.x;
        float x = i < n ? v[i] : -INFINITY;
        bool q = i < n && x >= th;
        unsigned votes = __ballot_sync(0xffffffffu, q);
        __syncthreads(); /* warp_at of the round before has been read */
        if (lane == 0) warp_at[warp] = __popc(votes);
        __syncthreads();
        int before = 0, total = 0;
        for (int w = 0; w < n_warps; w++) before += w < warp ? warp_at[w] : 0, total += warp_at[w];
        if (filled + total > TOPK_TILE) { /* uniform across the block */
            sort_tile(sv, si, TOPK_TILE);
            clear_tile(sv, si, run);
            filled = run;
            __syncthreads();
        }
        if (q) {
            int at = filled + before + __popc(votes & ((1u << lane) - 1u));
            sv[at] = x, si[at] = i;
        }
        filled += total;
    }
    sort_tile(sv, si, TOPK_TILE);
}

/* kiln_draw_first_reaching (sample/draw.h) by one warp, lane l taking run l: the same additions in the same order.
 * Every lane gets the result. */
__device__ int first_reaching_warp(const float *x, int n, double frac, bool strict) {
    int l = threadIdx.x & 31, c = (n + KILN_DRAW_LANES - 1) / KILN_DRAW_LANES, lo = min(l * c, n), hi = min(lo + c, n);
    double run = 0.0;
    for (int j = lo; j < hi; j++) run += (double)x[j];
    double scan = run;
#pragma unroll
    for (int o = 1; o < KILN_DRAW_LANES; o <<= 1) {
        double before = __shfl_up_sync(0xffffffffu, scan, o);
        if (l >= o) scan = before + scan;
    }
    double acc = __shfl_up_sync(0xffffffffu, scan, 1);
    if (l == 0) acc = 0.0;
    double target = frac * __shfl_sync(0xffffffffu, scan, KILN_DRAW_LANES - 1);
    int first = n;
    for (int j = lo; j < hi; j++) {
        acc += (double)x[j];
        if (first == n && (strict ? target < acc : acc >= target)) first = j;
    }
    return __reduce_min_sync(0xffffffffu, first);
}

/* The host sampler's draw (kiln_draw_keep, kiln_draw_index) among the k best in the sorted tile: both weights of
 * every candidate in parallel, then the running sums by the first warp. The token goes to draw->token and *d_token,
 * the PRNG state after the draw to draw->rng; d_advance (a captured step's position), when not NULL, moves on by
 * one. p and rng were loaded before the kernel's wait (the previous step wrote rng, and it has ended). */
__device__ void draw_from_tile(const float *sv, const int32_t *si, int k, const kiln_draw_params &p, kiln_rng rng,
                               kiln_cuda_draw *draw, int32_t *d_token, int32_t *d_advance) {
    __shared__ float w[KILN_CUDA_TOP_K_MAX], t[KILN_CUDA_TOP_K_MAX];
    for (int i = threadIdx.x; i < k; i += blockDim.x)
        w[i] = kiln_draw_weight(sv, i), t[i] = kiln_draw_tempered(sv, i, &p);
    __syncthreads();
    if (threadIdx.x >= 32) return;
    int keep = k;
    if (p.top_p < 1.0f) {
        int cut = first_reaching_warp(w, k, (double)p.top_p, false);
        if (cut < k) keep = cut + 1;
    }
    float floor_logit = sv[0] + p.log_min_p; /* min-p: the first candidate after the best below it ends the list */
    int below = keep;
    for (int i = 1 + threadIdx.x; i < keep; i += 32)
        if (!(sv[i] >= floor_logit)) {
            below = i;
            break;
        }
    keep = __reduce_min_sync(0xffffffffu, below);
    int at = first_reaching_warp(t, keep, (double)kiln_rng_uniform(&rng), true);
    if (threadIdx.x != 0) return;
    int32_t token = si[at < keep ? at : keep - 1];
    draw->rng = rng, draw->token = token, *d_token = token;
    if (d_advance) *d_advance += 1;
}

/* Row blockIdx.x's k best out (rows k apart): its candidates sorted (a tile of the next power of two), or, where
 * more than a tile of them reached the threshold, the row streamed (stream_row). With draw (one row), then the
 * draw among them (draw_from_tile). */
__global__ void __launch_bounds__(TOPK_THREADS)
    select_kernel(const float *v, int n, const float *threshold, const int *count, const float *cand_v,
                  const int32_t *cand_id, int k, int run, float *out_v, int32_t *out_id, kiln_cuda_draw *draw,
                  int32_t *d_token, int32_t *d_advance) {
    __shared__ float sv[TOPK_TILE];
    __shared__ int32_t si[TOPK_TILE];
    kiln_draw_params p = {};
    kiln_rng rng = {};
    if (draw) p = draw->p, rng = draw->rng;
    pdl_wait_and_release();
    int row = blockIdx.x, c = count[row];
    if (c <= TOPK_TILE) {
        int size = 2;
        while (size < c) size <<= 1;
        for (int i = threadIdx.x; i < size; i += blockDim.x) {
            bool in = i < c;
            sv[i] = in ? cand_v[(int64_t)row * TOPK_TILE + i] : -INFINITY;
            si[i] = in ? cand_id[(int64_t)row * TOPK_TILE + i] : INT_MAX;
        }
        sort_tile(sv, si, size);
    } else {
        stream_row(v + (int64_t)row * n, n, threshold[row], run, sv, si);
    }
    for (int i = threadIdx.x; i < k; i += blockDim.x)
        out_v[(int64_t)row * k + i] = sv[i], out_id[(int64_t)row * k + i] = si[i];
    if (draw) draw_from_tile(sv, si, k, p, rng, draw, d_token, d_advance);
}

static int tiles(int n) { return div_up(n, TOPK_TILE); }

/* The threshold's chunks of a row: at least 2k and 256 (more chunks, fewer values reach the threshold), at most n;
 * *chunk values each. */
static int chunks(int n, int k, int *chunk) {
    int g = 2 * k > 256 ? 2 * k : 256;
    if (g > n) g = n;
    *chunk = div_up(n, g);
    return div_up(n, *chunk);
}

/* KILN_CUDA_TOPK=2: the tiles reduced by halving, for comparisons; else the threshold. Read at each call (a few
 * hundred ns against a decode step's tens of us), so a bench can switch in one process. */
static int top_k_version() {
    const char *e = getenv("KILN_CUDA_TOPK");
    return e && *e ? atoi(e) : 3;
}

/* The threshold's scratch: per row the chunk maxima, the threshold, the candidates' count and the candidates. */
struct threshold_scratch {
    float *maxima, *threshold, *cand_v;
    int *count;
    int32_t *cand_id;
};

static threshold_scratch threshold_parts(void *scratch, int rows) {
    threshold_scratch t;
    t.maxima = (float *)scratch;
    t.threshold = t.maxima + (size_t)rows * TOPK_MAX_CHUNKS;
    t.count = (int *)(t.threshold + rows);
    t.cand_v = (float *)(t.count + rows);
    t.cand_id = (int32_t *)(t.cand_v + (size_t)rows * TOPK_TILE);
    return t;
}

static size_t threshold_bytes(int rows) { return (size_t)rows * (TOPK_MAX_CHUNKS + 2 + 2 * TOPK_TILE) * 4; }

static int top_k_threshold(const float *v, int n, int rows, int k, int run, void *scratch, float *out_v,
                           int32_t *out_id, cudaStream_t stream, kiln_cuda_draw *draw = nullptr,
                           int32_t *d_token = nullptr, int32_t *d_advance = nullptr) {
    threshold_scratch t = threshold_parts(scratch, rows);
    int chunk, g = chunks(n, k, &chunk);
    launch_pdl(chunk_max_kernel, dim3(g, rows), TOPK_SCAN_THREADS, stream, v, n, chunk, t.maxima, g);
    launch_pdl(threshold_kernel, rows, TOPK_MAX_CHUNKS, stream, (const float *)t.maxima, g, k, t.threshold, t.count);
    launch_pdl(chunk_filter_kernel, dim3(g, rows), TOPK_SCAN_THREADS, stream, v, n, chunk,
               (const float *)t.threshold, t.count, t.cand_v, t.cand_id);
    launch_pdl(select_kernel, rows, TOPK_THREADS, stream, v, n, (const float *)t.threshold, (const int *)t.count,
               (const float *)t.cand_v, (const int32_t *)t.cand_id, k, run, out_v, out_id, draw, d_token, d_advance);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

static int run_of(int k) {
    int run = 2;
    while (run < k) run <<= 1;
    return run;
}

extern "C" size_t kiln_cuda_top_k_scratch_bytes(int n, int rows, int k) {
    /* the halving's two ping-pong arrays of (value, id) for the first pass's tiles' k best each, per row */
    size_t halving = 2 * (size_t)rows * (size_t)tiles(n) * (size_t)k * (sizeof(float) + sizeof(int32_t));
    return halving > threshold_bytes(rows) ? halving : threshold_bytes(rows);
}

extern "C" int kiln_cuda_top_k(const float *v, int n, int rows, int k, void *scratch, float *out_v, int32_t *out_id,
                               cudaStream_t stream) {
    if (k < 1 || k > KILN_CUDA_TOP_K_MAX || k > n || rows < 1 || rows > 65535) return -1;
    int run = run_of(k);
    if (top_k_version() != 2) return top_k_threshold(v, n, rows, k, run, scratch, out_v, out_id, stream);
    size_t half = (size_t)rows * (size_t)tiles(n) * (size_t)k;
    float *sv[2] = {(float *)scratch, (float *)scratch + half};
    int32_t *si[2] = {(int32_t *)(sv[1] + half), (int32_t *)(sv[1] + half) + half};
    const float *in_v = v;
    const int32_t *in_id = NULL;
    for (int pass = 0;; pass++) {
        int blocks = tiles(n);
        bool last = blocks == 1;
        float *ov = last ? out_v : sv[pass & 1];
        int32_t *oi = last ? out_id : si[pass & 1];
        int out_n = last ? k : blocks * k;
        top_k_tile_halving_kernel<<<dim3(blocks, rows), TOPK_THREADS, 0, stream>>>(in_v, in_id, n, k, ov, oi, out_n,
                                                                                   run);
        if (last) return cudaGetLastError() == cudaSuccess ? 0 : -1;
        in_v = ov, in_id = oi, n = out_n;
    }
}

extern "C" int kiln_cuda_top_k_draw(const float *v, int n, int k, void *scratch, float *out_v, int32_t *out_id,
                                    kiln_cuda_draw *draw, int32_t *d_token, int32_t *d_advance, cudaStream_t stream) {
    if (k < 1 || k > KILN_CUDA_TOP_K_MAX || k > n) return -1;
    return top_k_threshold(v, n, 1, k, run_of(k), scratch, out_v, out_id, stream, draw, d_token, d_advance);
}

__global__ void gather_f32_kernel(const float *v, const int32_t *ids, int n, float *out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = v[ids[i]];
}

extern "C" void kiln_cuda_gather_f32(const float *v, const int32_t *ids, int n, float *out, cudaStream_t stream) {
    if (n > 0) gather_f32_kernel<<<div_up(n, 256), 256, 0, stream>>>(v, ids, n, out);
}

/* The layers of a decode step as one persistent kernel (see kiln_cuda_decode_layers in kernels.h).
 *
 * Why: at batch 1 a layer of a small model reads its weights in a few microseconds, about what a kernel boundary
 * costs (launch, ramp-up of the first loads, the tail of the last blocks), so a step of ~10 launches a layer spends
 * most of its time between kernels, and DRAM idles while the small kernels (norm, rope, attention) run.
 *
 * Shape: one block an SM, all resident at once (cooperative launch). Each block owns a contiguous range of the rows
 * of every matrix. The block's last warp, the copy warp, streams the block's rows of every matrix of every layer,
 * in the order they are used, into a ring of slots in shared memory with the copy engine (cp.async.bulk; each
 * slot's arrival counted in bytes on an mbarrier). It waits only for a slot to be free, never for data, so the
 * weights keep coming from DRAM while the other warps wait at a stage barrier. The compute warps take the stages in
 * turn and meet the other blocks at a grid-wide barrier between them (a counter in device memory), five a layer:
 * Q/K/V (each block normalizes x into Q8_1 in its shared memory first), attention (rope, cache store, split, merge
 * by each head's last block: attention_slice.cuh), output projection (+= x), gate/up/SwiGLU (after the norm), down
 * projection (+= x); the O and down stages quantize their input vector into shared memory themselves. A GEMV warp
 * takes rows of the slot's tile (one row a warp, a lane per part of 32 weights, int8 dp4a against the Q8_1 in
 * shared memory) and, done with a tile, counts itself on the slot's "empty" mbarrier. Data written in this launch
 * is read back through L2 (__ldcg): L1 is not coherent between blocks.
 *
 * Measured on H100 (tg128): qwen2-1.5b 531-545 tok/s against 1,219-1,224 for the kernel-per-op step, llama3-8b
 * 231-233 against 460-464, so it stays opt-in (KILN_CUDA_PERSISTENT=1). Taking parts out one at a time
 * (docs/cuda-measured.md, "The persistent step"): each of the 139 grid barriers costs ~1.5 us, the attention stage
 * ~10 us a layer, the tile hand-offs ~10 us a layer, each vector quantized into shared memory ~2.3 us, and the GEMVs
 * from shared memory ~24 us a layer, where the layer's weights take ~9 us at the copy rate: 8 warps an SM decode
 * Q4_K/Q6_K parts too slowly once the weights are near.
 *
 * Hopper only (the bulk copies and transaction-counted mbarriers of sm_90). */
#include "cuda/attention_slice.cuh"
#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"
#include "cuda/q8_1.cuh"
#include "cuda/quant_unpack.cuh"

/* Compute warps a block. With 15 (512 threads, 128 registers) the kernel spilled in its tile loop, and with most of
 * the shared memory taken by the slots, L1 is small and spills go to L2: 512-536 tok/s against 531-545 with 8. */
#define PS_WARPS 8
#define PS_THREADS (32 * (PS_WARPS + 1)) /* and the copy warp, the last */
#define PS_SLOT_BYTES (32 * 1024)
#define PS_MAX_SLOTS 8
#define PS_HEADER 256 /* the slots' mbarriers (full, empty) and a reduction's partial sums, before the slots */
/* Tiles start and end at multiples of 8 quantized blocks: every field's copy is then 16-byte aligned and a
 * multiple of 16 bytes, as the copy engine requires (field sizes are even; a matrix's blocks a multiple of 8). */
#define PS_ALIGN 8
#define PS_RUNS 16 /* float4 runs a compute thread holds when it quantizes a vector (up to 16384 values) */
#define PS_MAX_VECTOR (PS_RUNS * 4 * 32 * PS_WARPS)

/* What the copy warp needs of a quantized format: block bytes, parts, the sizes of its fields in device order. */
struct qlayout {
    int block_bytes, parts, n_fields, size[5];
};

template <class F>
__host__ __device__ constexpr qlayout layout_of() {
    qlayout q = {F::block_bytes, F::parts, F::n_fields, {0, 0, 0, 0, 0}};
    for (int i = 0; i < F::n_fields; i++) q.size[i] = F::fields[i].size;
    return q;
}

__host__ __device__ qlayout layout_of_type(kiln_type t) {
    switch (t) {
#define X(id, F)                                                                                                       \
    case id: {                                                                                                         \
        constexpr qlayout q = layout_of<F>();                                                                          \
        return q;                                                                                                      \
    }
        KILN_CUDA_QUANT_TYPES(X)
#undef X
    default: return qlayout{};
    }
}

/* A block's rows [r0, r1) of a matrix and how they are cut into tiles of per_tile rows (the last fewer). A tile's
 * blocks are rounded out to multiples of PS_ALIGN, so it holds up to 2 (PS_ALIGN - 1) blocks of neighbouring rows;
 * with pair (gate and up), both matrices' rows share a slot. */
struct tiling {
    qlayout q;
    int r0, r1, per_tile, per_row; /* per_row: blocks a row */
    int64_t n_blocks;
};

__host__ __device__ int tile_capacity_blocks(const qlayout &q, bool pair) {
    return PS_SLOT_BYTES / (pair ? 2 : 1) / q.block_bytes - 2 * (PS_ALIGN - 1);
}

__device__ tiling tiling_of(const kiln_cuda_matrix &m, bool pair) {
    tiling t;
    t.q = layout_of_type(m.type);
    t.per_row = m.k / 32 / t.q.parts;
    t.n_blocks = (int64_t)m.n * t.per_row;
    t.r0 = m.n * (int)blockIdx.x / (int)gridDim.x; /* a layer's n times the SMs is far below 2^31 */
    t.r1 = m.n * ((int)blockIdx.x + 1) / (int)gridDim.x;
    t.per_tile = max(1, tile_capacity_blocks(t.q, pair) / t.per_row);
    return t;
}

/* The blocks [g0, g1) copied for rows [ra, rb) */
__device__ __forceinline__ void tile_blocks(const tiling &t, int ra, int rb, int64_t &g0, int64_t &g1) {
    g0 = (int64_t)ra * t.per_row & ~(int64_t)(PS_ALIGN - 1);
    g1 = min(((int64_t)rb * t.per_row + PS_ALIGN - 1) & ~(int64_t)(PS_ALIGN - 1), t.n_blocks);
}

/* The ring of slots: tiles go to slots in turn; full[s] completes when its bytes have landed, empty[s] when every
 * compute warp is done with it. Both sides take the tiles in the same order: slot is the next tile's, round the
 * times the ring has gone round before it (its phases' parity). */
struct ring {
    uint8_t *slots;
    uint64_t *full, *empty;
    int n_slots, slot;
    unsigned round;
};

__device__ __forceinline__ void advance(ring &rg) {
    if (++rg.slot == rg.n_slots) rg.slot = 0, rg.round++;
}

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) {
    unsigned done = 0;
    while (!done)
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(smem_addr(bar)), "r"(parity)
                     : "memory");
}

/* The ring in a block's shared memory: the header (PS_MAX_SLOTS "full" then "empty" mbarriers, then the caller's
 * scratch), then n_slots slots, then the caller's; the mbarriers set for `warps` compute warps. Every thread of the
 * block calls it (a block barrier). */
__device__ ring ring_start(uint8_t *smem, int n_slots, int warps) {
    uint64_t *full = (uint64_t *)smem, *empty = full + PS_MAX_SLOTS;
    if (threadIdx.x == 0) {
        for (int s = 0; s < n_slots; s++) mbar_init(full + s, 1), mbar_init(empty + s, (unsigned)warps);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    return ring{smem + PS_HEADER, full, empty, n_slots, 0, 0};
}

__device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}

/* Blocks [g0, g1) of m, field by field, to dst in the device layout of a tensor of g1 - g0 blocks. */
__device__ void copy_fields(const kiln_cuda_matrix &m, const tiling &t, int64_t g0, int64_t g1, uint8_t *dst,
                            uint64_t *bar) {
    const uint8_t *base = (const uint8_t *)m.data;
    int64_t off = 0, nb = g1 - g0;
#pragma unroll
    for (int f = 0; f < 5; f++) /* constant indices keep the sizes in registers */
        if (f < t.q.n_fields) {
            int size = t.q.size[f];
            bulk_copy(dst + off * nb, base + off * t.n_blocks + g0 * size, (unsigned)(nb * size), bar);
            off += size;
        }
}

/* The copy warp's share of one matrix (with its up matrix, for the gate/up pair); the ring as it leaves it. */
__device__ ring stream_matrix(ring rg, const kiln_cuda_matrix &m, const kiln_cuda_matrix *up) {
    tiling t = tiling_of(m, up != nullptr);
    for (int ra = t.r0; ra < t.r1; ra += t.per_tile, advance(rg)) {
        int rb = min(ra + t.per_tile, t.r1), s = rg.slot;
        int64_t g0, g1;
        tile_blocks(t, ra, rb, g0, g1);
        if (rg.round > 0) mbar_wait(rg.empty + s, (rg.round - 1) & 1);
        uint8_t *dst = rg.slots + (size_t)s * PS_SLOT_BYTES;
        unsigned bytes = (unsigned)((g1 - g0) * t.q.block_bytes);
        mbar_expect_tx(rg.full + s, up ? 2 * bytes : bytes);
        copy_fields(m, t, g0, g1, dst, rg.full + s);
        if (up) copy_fields(*up, t, g0, g1, dst + bytes, rg.full + s);
    }
    return rg;
}

__device__ void stream_layers(const kiln_cuda_decode_args &a, ring rg) {
    for (int l = 0; l < a.n_layer; l++) {
        const kiln_cuda_decode_layer &L = a.layers[l];
        rg = stream_matrix(rg, L.wq, nullptr);
        rg = stream_matrix(rg, L.wk, nullptr);
        rg = stream_matrix(rg, L.wv, nullptr);
        rg = stream_matrix(rg, L.wo, nullptr);
        rg = stream_matrix(rg, L.gate, &L.up);
        rg = stream_matrix(rg, L.down, nullptr);
    }
}

enum gemv_out { STORE, ACCUMULATE, SWIGLU };

/* The compute warps' share of one matrix: tile after tile from the ring, warp w of WARPS taking the block's rows
 * r0 + w, r0 + w + WARPS, ... as their tiles come. y[row] = dot, += dot, or silu(gate dot) * (up dot). */
template <class F, bool PAIR, int WARPS = PS_WARPS>
__device__ __forceinline__ ring gemv_tiles_t(ring rg, const kiln_cuda_matrix &m, const int8_t *xs, float *y,
                                             gemv_out out) {
    tiling t = tiling_of(m, PAIR);
    q8_1_view x = q8_1_at(xs, m.k);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_parts = m.k / 32;
    for (int ra = t.r0; ra < t.r1; ra += t.per_tile, advance(rg)) {
        int rb = min(ra + t.per_tile, t.r1), s = rg.slot;
        int64_t g0, g1;
        tile_blocks(t, ra, rb, g0, g1);
        mbar_wait(rg.full + s, rg.round & 1);
        const uint8_t *base = rg.slots + (size_t)s * PS_SLOT_BYTES;
        qtensor w = {base, g1 - g0}, u = {base + (g1 - g0) * F::block_bytes, g1 - g0};
        for (int r = ra + ((warp - (ra - t.r0)) % WARPS + WARPS) % WARPS; r < rb; r += WARPS) {
            int64_t gr = (int64_t)r * t.per_row - g0;
            float a = 0.0f, b = 0.0f;
#pragma unroll PAIR ? 1 : 2
            for (int p = lane; p < n_parts; p += 32) {
                int64_t g = gr + p / F::parts;
                a += dot_part<F>(w, g, p % F::parts, x, p);
                if (PAIR) b += dot_part<F>(u, g, p % F::parts, x, p);
            }
            a = warp_sum(a);
            if (PAIR) b = warp_sum(b);
            if (lane == 0) y[r] = out == SWIGLU ? silu(a) * b : out == ACCUMULATE ? __ldcg(y + r) + a : a;
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(rg.empty + s);
    }
    return rg;
}

__device__ ring gemv_tiles(ring rg, const kiln_cuda_matrix &m, bool pair, const int8_t *xs, float *y, gemv_out out) {
    switch (m.type) {
#define X(id, F)                                                                                                       \
    case id:                                                                                                           \
        return pair ? gemv_tiles_t<F, true>(rg, m, xs, y, out) : gemv_tiles_t<F, false>(rg, m, xs, y, out);
        KILN_CUDA_QUANT_TYPES(X)
#undef X
    default: return rg;
    }
}

/* x (n values, read through L2), RMS-normalized and times w when w is not NULL, as Q8_1 into xs; RUNS runs of four
 * values a thread cover n. Every compute thread calls it; a thread loads all its runs of x and of w before any
 * arithmetic (one round trip). */
template <int RUNS, bool NORM>
__device__ __forceinline__ void to_shared_runs(const float *x, const float *w, float eps, int n, int8_t *xs,
                                               float *partial) {
    constexpr int T = 32 * PS_WARPS;
    int tid = threadIdx.x, lane = tid & 31, n4 = n / 4;
    const float4 *x4 = (const float4 *)x, *w4 = (const float4 *)w;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f), one = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    float4 v[RUNS], g[RUNS];
#pragma unroll
    for (int k = 0; k < RUNS; k++) {
        int i = tid + k * T;
        v[k] = i < n4 ? __ldcg(x4 + i) : zero;
        g[k] = !NORM ? one : i < n4 ? w4[i] : zero;
    }
    float scale = 1.0f;
    if (NORM) {
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < RUNS; k++) ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
        ss = warp_sum(ss);
        if (lane == 0) partial[tid >> 5] = ss;
        sync_warps<PS_WARPS>();
        ss = warp_sum(lane < PS_WARPS ? partial[lane] : 0.0f);
        scale = rsqrtf(ss / (float)n + eps);
    }
    /* whole warps go in together (quantize_quad shuffles); n4 is a multiple of 8, so a Q8_1 block's 8 lanes are all
     * in or all out */
#pragma unroll
    for (int k = 0; k < RUNS; k++) {
        int i = tid + k * T;
        if (i - lane >= n4) break;
        float4 o = make_float4(v[k].x * scale * g[k].x, v[k].y * scale * g[k].y, v[k].z * scale * g[k].z,
                               v[k].w * scale * g[k].w);
        quantize_quad(o, i < n4, (char4 *)xs + i, (__half2 *)(xs + n) + i / 8);
    }
    sync_warps<PS_WARPS>();
}

template <int RUNS>
__device__ __forceinline__ void to_shared_as(const float *x, const float *w, float eps, int n, int8_t *xs,
                                             float *partial) {
    if (w) to_shared_runs<RUNS, true>(x, w, eps, n, xs, partial);
    else to_shared_runs<RUNS, false>(x, w, eps, n, xs, partial);
}

/* As few runs a thread as cover n: registers held for runs past the vector's end spilled. */
__device__ void to_shared_q8_1(const float *x, const float *w, float eps, int n, int8_t *xs, float *partial) {
    int runs = (n / 4 + 32 * PS_WARPS - 1) / (32 * PS_WARPS);
    if (runs <= 2) to_shared_as<2>(x, w, eps, n, xs, partial);
    else if (runs <= 4) to_shared_as<4>(x, w, eps, n, xs, partial);
    else to_shared_as<PS_RUNS>(x, w, eps, n, xs, partial);
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* The compute warps of every block meet: count stands at target once all have arrived (counts only grow; the
 * comparison survives wrapping). */
__device__ void grid_barrier(unsigned *count, unsigned target) {
    sync_warps<PS_WARPS>();
    if (threadIdx.x == 0) {
        __threadfence(); /* the block's stores, ordered before the barrier above, reach the device first */
        atomicAdd(count, 1u);
        while ((int)(ld_acquire(count) - target) < 0) {}
        __threadfence();
    }
    sync_warps<PS_WARPS>();
}

__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

template <int HD>
__global__ void __launch_bounds__(PS_THREADS, 1) decode_layers_kernel(kiln_cuda_decode_args a, int n_slots) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint8_t smem[];
    int8_t *xs = (int8_t *)(smem + PS_HEADER + (size_t)n_slots * PS_SLOT_BYTES);
    ring rg = ring_start(smem, n_slots, PS_WARPS);
    float *partial = (float *)(rg.empty + PS_MAX_SLOTS);
    if (threadIdx.x >= 32 * PS_WARPS) {
        if (threadIdx.x == 32 * PS_WARPS) stream_layers(a, rg);
        return;
    }

    /* the k-th barrier of launch e waits for (e * per_launch + k) * gridDim.x arrivals; block 0 counts the launch
     * when it ends, after every block has read e (all have arrived at the first barrier by then) */
    unsigned launch = threadIdx.x == 0 ? *(volatile unsigned *)(a.grid_sync + 1) : 0;
    unsigned per_launch = KILN_CUDA_DECODE_STAGES * a.n_layer - 1, k = 0;
    auto barrier = [&]() { grid_barrier(a.grid_sync, (launch * per_launch + ++k) * gridDim.x); };
    /* with stamps, block 0 notes the time as it leaves each barrier: the stages' durations for the profile */
    auto stamp = [&](int i) {
        if (a.stamps && blockIdx.x == 0 && threadIdx.x == 0) a.stamps[i] = global_ns();
    };
    int q_dim = a.rope.n_head * HD, n_pos = *a.d_pos + 1, n_items = a.attn.n_head * a.attn.n_split;
    stamp(0);
    for (int l = 0; l < a.n_layer; l++) {
        const kiln_cuda_decode_layer &L = a.layers[l];
        const int s0 = KILN_CUDA_DECODE_STAGES * l;
        if (l > 0) barrier(), stamp(s0);
        to_shared_q8_1(a.x, L.attn_norm, a.eps, a.n_embd, xs, partial);
        rg = gemv_tiles(rg, L.wq, false, xs, a.q, STORE);
        rg = gemv_tiles(rg, L.wk, false, xs, a.k, STORE);
        rg = gemv_tiles(rg, L.wv, false, xs, a.v, STORE);
        barrier(), stamp(s0 + 1);

        /* no Q8_1 from the merge: the output projection's stage quantizes attn_out into shared memory */
        attn_decode x = {a.rope, a.k, a.v, L.bq, L.bk, L.bv, (__half *)L.k_cache, (__half *)L.v_cache,
                         a.attn_out, nullptr, a.counters};
        for (int it = blockIdx.x; it < n_items; it += gridDim.x)
            attn_slice<HD, true, PS_WARPS, false, attn_ahead<HD, false>()>(
                a.attn, a.q, (const __half *)L.k_cache, (const __half *)L.v_cache, n_pos, a.part, x,
                it / a.attn.n_split, it % a.attn.n_split, 0);
        barrier(), stamp(s0 + 2);

        to_shared_q8_1(a.attn_out, nullptr, 0.0f, q_dim, xs, partial);
        rg = gemv_tiles(rg, L.wo, false, xs, a.x, ACCUMULATE);
        barrier(), stamp(s0 + 3);

        to_shared_q8_1(a.x, L.ffn_norm, a.eps, a.n_embd, xs, partial);
        rg = gemv_tiles(rg, L.gate, true, xs, a.ff, SWIGLU);
        barrier(), stamp(s0 + 4);

        to_shared_q8_1(a.ff, nullptr, 0.0f, a.n_ff, xs, partial);
        rg = gemv_tiles(rg, L.down, false, xs, a.x, ACCUMULATE);
    }
    stamp(KILN_CUDA_DECODE_STAGES * a.n_layer);
    if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(a.grid_sync + 1, 1u);
#endif
}

/* Q8_1 of n values */
__host__ __device__ static inline size_t vector_bytes(int n) { return (size_t)n + (size_t)n / 8; }

/* A quantized matrix whose tiles the copy engine can move: 16-byte aligned, a multiple of PS_ALIGN blocks, a row
 * (twice, for the gate/up pair) fitting a slot, and an input vector a compute block can quantize. */
static bool matrix_ok(const kiln_cuda_matrix *m, bool pair) {
    if (!kiln_cuda_type_uses_q8_1(m->type) || !kiln_cuda_type_supported(m->type, m->k) || m->k > PS_MAX_VECTOR)
        return false;
    qlayout q = layout_of_type(m->type);
    int64_t per_row = m->k / 32 / q.parts;
    return (uintptr_t)m->data % 16 == 0 && (int64_t)m->n * per_row % PS_ALIGN == 0 &&
           tile_capacity_blocks(q, pair) >= per_row;
}

extern "C" bool kiln_cuda_decode_layers_supported(const kiln_cuda_decode_layer *layers, int n_layer, int head_dim) {
    int dev = 0, coop = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess || !coop || major < 9)
        return false;
    if (head_dim != 64 && head_dim != 128 && head_dim != 256) return false;
    for (int l = 0; l < n_layer; l++) {
        const kiln_cuda_decode_layer *L = &layers[l];
        const kiln_cuda_matrix *ms[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->down};
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
            if (!matrix_ok(ms[i], false)) return false;
        if (!matrix_ok(&L->gate, true) || L->gate.type != L->up.type || L->gate.n != L->up.n ||
            L->gate.k != L->up.k || (uintptr_t)L->up.data % 16)
            return false;
    }
    return true;
}

/* A launch of a kernel holding the ring: as many slots as fit its shared memory beside the header and a Q8_1
 * vector of `widest` values (at most PS_MAX_SLOTS, at least 2), the dynamic shared memory that takes, allowed, and
 * the SMs (one block each). -1 where the runtime cannot say or the slots do not fit. */
static int ring_launch_config(const void *kernel, int widest, int *n_slots, size_t *smem, int *sms) {
    size_t fixed = PS_HEADER + (vector_bytes(widest) + 15) / 16 * 16;
    int dev = 0, optin = 0;
    cudaFuncAttributes fa;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        cudaFuncGetAttributes(&fa, kernel) != cudaSuccess)
        return -1;
    *n_slots = (int)(((int64_t)optin - (int64_t)fa.sharedSizeBytes - (int64_t)fixed) / PS_SLOT_BYTES);
    if (*n_slots > PS_MAX_SLOTS) *n_slots = PS_MAX_SLOTS;
    if (*n_slots < 2) return -1;
    *smem = fixed + (size_t)*n_slots * PS_SLOT_BYTES;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)*smem);
    return e == cudaSuccess ? 0 : -1;
}

template <int HD>
static int launch(const kiln_cuda_decode_args *a, cudaStream_t stream) {
    auto kernel = decode_layers_kernel<HD>;
    int widest = a->n_embd > a->n_ff ? a->n_embd : a->n_ff;
    if (a->rope.n_head * HD > widest) widest = a->rope.n_head * HD;
    size_t smem = 0;
    int n_slots = 0, sms = 0;
    if (ring_launch_config((const void *)kernel, widest, &n_slots, &smem, &sms)) return -1;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = sms, cfg.blockDim = PS_THREADS, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
    cfg.attrs = &attr, cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, *a, n_slots) == cudaSuccess ? 0 : -1;
}

extern "C" int kiln_cuda_decode_layers(const kiln_cuda_decode_args *a, cudaStream_t stream) {
    switch (a->rope.head_dim) {
    case 64: return launch<64>(a, stream);
    case 128: return launch<128>(a, stream);
    case 256: return launch<256>(a, stream);
    default: return -1;
    }
}

/* The persistent step's GEMV stage alone: a block an SM, its copy warp streaming the block's rows of each matrix
 * in turn through the ring, WARPS compute warps multiplying them by a Q8_1 vector held in shared memory. It times
 * how near the copy rate the compute warps of one block an SM decode what the copy warp brings, the piece a
 * persistent step would stand on (session 12's step failed there with 8 warps). Q4_K and Q6_K only. */
template <class F, int WARPS>
__device__ void stream_products(ring rg, const kiln_cuda_stream_args &a, const int8_t *xs) {
    for (int r = 0; r < a.repeats; r++) rg = gemv_tiles_t<F, false, WARPS>(rg, a.m[r % a.n_mats], xs, a.y, STORE);
}

template <int WARPS>
__global__ void __launch_bounds__(32 * (WARPS + 1), 1) stream_gemv_kernel(kiln_cuda_stream_args a, int n_slots) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint8_t smem[];
    int8_t *xs = (int8_t *)(smem + PS_HEADER + (size_t)n_slots * PS_SLOT_BYTES);
    int words = (int)(vector_bytes(a.m[0].k) / 4);
    for (int i = threadIdx.x; i < words; i += blockDim.x) ((int *)xs)[i] = ((const int *)a.xq)[i];
    ring rg = ring_start(smem, n_slots, WARPS); /* its block barrier also publishes xs */
    if (threadIdx.x >= 32 * WARPS) {
        if (threadIdx.x == 32 * WARPS)
            for (int r = 0; r < a.repeats; r++) rg = stream_matrix(rg, a.m[r % a.n_mats], nullptr);
        return;
    }
    if (a.m[0].type == KILN_TYPE_Q4_K) stream_products<q4_K_t, WARPS>(rg, a, xs);
    else stream_products<q6_K_t, WARPS>(rg, a, xs);
#endif
}

template <int WARPS>
static int launch_stream(const kiln_cuda_stream_args *a, cudaStream_t stream) {
    auto kernel = stream_gemv_kernel<WARPS>;
    size_t smem = 0;
    int n_slots = 0, sms = 0;
    if (ring_launch_config((const void *)kernel, a->m[0].k, &n_slots, &smem, &sms)) return -1;
    kernel<<<sms, 32 * (WARPS + 1), smem, stream>>>(*a, n_slots);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

extern "C" int kiln_cuda_stream_gemv(const kiln_cuda_stream_args *a, int warps, cudaStream_t stream) {
    int dev = 0, major = 0;
    if (a->n_mats < 1 || a->n_mats > KILN_CUDA_STREAM_MATS || a->repeats < 1 || cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess || major < 9)
        return -1;
    for (int i = 0; i < a->n_mats; i++) {
        const kiln_cuda_matrix *m = &a->m[i];
        if ((m->type != KILN_TYPE_Q4_K && m->type != KILN_TYPE_Q6_K) || !matrix_ok(m, false) ||
            m->type != a->m[0].type || m->k != a->m[0].k || m->n != a->m[0].n)
            return -1;
    }
    switch (warps) {
    case 4: return launch_stream<4>(a, stream);
    case 8: return launch_stream<8>(a, stream);
    case 16: return launch_stream<16>(a, stream);
    default: return -1;
    }
}

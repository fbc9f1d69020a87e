/* Small device helpers shared by the kernel files. */
#ifndef KILN_CUDA_COMMON_CUH
#define KILN_CUDA_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>

#define KILN_WARP 32

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* WARP's reduction (warp_sum, warp_max) over a block of up to 1024 threads (blockDim.x a multiple of 32), identity
 * where a warp is missing; every thread gets the result. */
template <float (*WARP)(float)>
__device__ __forceinline__ float block_reduce(float v, float identity) {
    __shared__ float partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = WARP(v);
    __syncthreads(); /* partial may still be read by a previous call */
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < n_warps ? partial[lane] : identity;
    return WARP(v);
}

__device__ __forceinline__ float block_sum(float v) { return block_reduce<warp_sum>(v, 0.0f); }
__device__ __forceinline__ float block_max(float v) { return block_reduce<warp_max>(v, -INFINITY); }

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

/* A barrier of the block's first WARPS warps (named barrier 1), or of the whole block (WARPS 0). Where a block has
 * WARPS warps the two are the same; the persistent decode step keeps its copy warp out of the barriers of the
 * warps that compute. */
template <int WARPS = 0>
__device__ __forceinline__ void sync_warps() {
    if constexpr (WARPS == 0) __syncthreads();
    else asm volatile("bar.sync 1, %0;" ::"n"(32 * WARPS) : "memory");
}

/* Lets the block that finishes last of `expected` blocks do the step that needs all their results (a norm over the
 * whole output, the merge of attention slices), instead of a kernel launch of its own. Every thread of each block
 * calls it once, after its stores; it is true in the last block to arrive, which resets *counter for the next launch
 * (kernels of a stream run one after the other, PDL included, so one zeroed counter serves them all in turn). That
 * block must read the others' results with __ldcg: its L1 is not coherent with their stores. */
template <int WARPS = 0>
__device__ __forceinline__ bool arrive_last(unsigned *counter, unsigned expected) {
    __shared__ bool last;
    __threadfence(); /* this thread's stores reach the device before its block counts as arrived */
    sync_warps<WARPS>();
    if (threadIdx.x == 0 && threadIdx.y == 0) {
        last = atomicAdd(counter, 1u) == expected - 1;
        if (last) *counter = 0;
    }
    sync_warps<WARPS>();
    if (last) __threadfence();
    return last;
}

static inline int div_up(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

/* The device's SM count, 0 where it cannot be read. */
static inline int sm_count() {
    static int sms = -1;
    if (sms < 0) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            sms = 0;
    }
    return sms;
}

/* Programmatic dependent launch (Hopper and later). A decode step is ~10 small kernels a layer, each waiting for the
 * last; a kernel started by launch_pdl may be scheduled while its predecessor still runs, so its launch and block
 * start-up overlap the predecessor's tail. Each such kernel waits (griddepcontrol.wait) until the previous kernel
 * has finished and its writes are visible before it reads what that kernel wrote or writes anything, so ordering is
 * as without PDL; finishing is transitive, so everything before is finished too. When it lets the next kernel be
 * scheduled is the kernel's choice:
 * - pdl_wait_and_release: after its wait. The next kernel then starts only once this one has waited, so whatever
 *   the kernels before this one wrote may be read before the next one's wait. The first and last kernels of a
 *   decode step (embedding rows, argmax) and every kernel outside it do so.
 * - pdl_release_and_wait: at once. Kernels may then start while several before them still run, back to the last
 *   that waited first; such a kernel reads before its wait only what no kernel of a step writes (weights, biases)
 *   and what earlier steps wrote (the position, the K/V rows of earlier positions: the step's first kernel waited
 *   for the previous step's last). The decode step's GEMVs, norms, quantization, rope and attention do so: a
 *   GEMV's first wave is then resident, with its first weights asked for, while the small kernels before it run.
 *   So do the batched step's GEMVs, rope, attention and row gathering (its inputs come from the host before its
 *   first kernel, so the Q/K/V GEMV's rope stage reads the tokens' positions and slots before its wait; H200,
 *   bench_cuda_batch against waiting first: qwen2-1.5b one sequence 992-997 tok/s against 978-985, 64 sequences
 *   9,525-9,534 against 9,466-9,476, llama3-8b even).
 * KILN_CUDA_PDL=0 in the environment launches plainly (for comparisons and tools). */
__device__ __forceinline__ void pdl_wait_and_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* pdl_release_and_wait in its two halves, for a kernel with work of its own between them (loads that may stall
 * the thread, which before the release would hold back the next kernel's start). */
__device__ __forceinline__ void pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_release_and_wait() {
    pdl_release();
    pdl_wait();
}

/* Asks for [lo, hi) to be brought into L2, one bulk request (Hopper's copy engine; both ends rounded down to 16
 * bytes, as it requires). For memory no kernel of the step writes (weights), so it may run before
 * pdl_wait_and_release. */
__device__ __forceinline__ void prefetch_l2(const uint8_t *lo, const uint8_t *hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uintptr_t a = (uintptr_t)lo & ~(uintptr_t)15, b = (uintptr_t)hi & ~(uintptr_t)15;
    if (b > a) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"((unsigned)(b - a)));
#endif
}

static inline bool pdl_enabled() {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("KILN_CUDA_PDL");
        on = !(e && !strcmp(e, "0"));
    }
    return on == 1;
}

/* Asynchronous copies global -> shared (cp.async; 16 bytes bypassing L1, 4 bytes through it), their groups, and the
 * wait until at most N of this thread's groups are still in flight. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}

__device__ __forceinline__ void cp_async4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

/* KILN_CUDA_CARVEOUT=P (0-100, read at launch; unset or -1: no hint, the driver's choice a kernel): every launch
 * asks for P% of the most shared memory as its split of the SM's unified L1. Opt-in. Measured on H100 (tg128 at
 * 512 + 128 tokens, each setting's context alternating with the driver's choice in one process): 0 (the most L1
 * cache) qwen2-1.5b +0.3-0.5%, llama3-8b +1.2%, the same bits; 100 qwen2-1.5b +0.5-0.6%, llama3-8b -3.0%; 25 and
 * 60 even or -0.4%. Not the default while unmeasured where it may cost: the driver still gives a kernel the shared
 * memory one block needs, but at a small split fewer blocks may fit an SM (the decode attention's 384 blocks at
 * 4096 positions, the top-k's sorts, the batched step's attention and mma GEMV; run_on_device.sh's carveout stage
 * times those). KILN_CUDA_CARVEOUT=auto asks each kernel for carveout_for_occupancy's split instead. */
#define KILN_CUDA_CARVEOUT_AUTO (-2)
static inline int carveout_setting() {
    const char *e = getenv("KILN_CUDA_CARVEOUT");
    if (!e || !*e) return -1;
    return strcmp(e, "auto") ? atoi(e) : KILN_CUDA_CARVEOUT_AUTO;
}

/* The least shared memory that holds as many of the kernel's blocks an SM as the most shared memory would (its
 * occupancy, times each block's static and dynamic shared memory and the reserve the system keeps a block), in
 * percent of the most, rounded up: the most L1 cache that costs the kernel no block. Computed once a kernel, block
 * size and dynamic size; -1 (no hint) where the runtime cannot say. */
static inline int carveout_for_occupancy(const void *kernel, int threads, size_t dynamic) {
    struct entry {
        const void *kernel;
        int threads;
        size_t dynamic;
        int percent;
    };
    enum { CACHED = 256 };
    static entry cache[CACHED];
    static int n_cached = 0;
    static std::mutex lock;
    std::lock_guard<std::mutex> hold(lock);
    for (int i = 0; i < n_cached; i++)
        if (cache[i].kernel == kernel && cache[i].threads == threads && cache[i].dynamic == dynamic)
            return cache[i].percent;
    cudaFuncAttributes fa;
    int dev = 0, most = 0, reserve = 0, blocks = 0, percent = -1;
    if (cudaFuncGetAttributes(&fa, kernel) == cudaSuccess && cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&reserve, cudaDevAttrReservedSharedMemoryPerBlock, dev) == cudaSuccess &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, dynamic) == cudaSuccess && most > 0) {
        int64_t need = (int64_t)blocks * ((int64_t)fa.sharedSizeBytes + (int64_t)dynamic + reserve);
        int64_t rounded_up = (100 * need + most - 1) / most;
        percent = rounded_up < 100 ? (int)rounded_up : 100;
    } else {
        cudaGetLastError(); /* not left for the next launch's check to report */
    }
    if (n_cached < CACHED) cache[n_cached++] = entry{kernel, threads, dynamic, percent};
    return percent;
}

/* launch_pdl with shared_bytes of dynamic shared memory a block (past 48 KB, the kernel must have been allowed it:
 * cudaFuncAttributeMaxDynamicSharedMemorySize). */
template <typename... Params, typename... Args>
static inline void launch_pdl_shared(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                                     cudaStream_t stream, Args... args) {
    cudaLaunchAttribute attr[2];
    int n_attrs = 0, carveout = carveout_setting();
    if (carveout == KILN_CUDA_CARVEOUT_AUTO)
        carveout = carveout_for_occupancy((const void *)kernel, (int)(block.x * block.y * block.z), shared_bytes);
    if (pdl_enabled()) {
        attr[n_attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n_attrs++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (carveout >= 0 && carveout <= 100) {
        attr[n_attrs].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
        attr[n_attrs++].val.sharedMemCarveout = (unsigned)carveout;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = shared_bytes, cfg.stream = stream;
    cfg.attrs = attr, cfg.numAttrs = n_attrs;
    cudaLaunchKernelEx(&cfg, kernel, args...);
}

template <typename... Params, typename... Args>
static inline void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, Args... args) {
    launch_pdl_shared(kernel, grid, block, 0, stream, args...);
}

#endif

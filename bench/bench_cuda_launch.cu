/* What a dependency between two kernels costs on this GPU, apart from their work: a chain of CHAIN kernels that each
 * read a small vector the one before wrote, captured as a CUDA graph and replayed, per kernel, for several grid and
 * block sizes, three ways of waiting:
 *   plain    stream order (each kernel starts once the one before has ended);
 *   pdl      programmatic dependent launch, the next kernel let in at once and waiting with griddepcontrol.wait (how
 *            the decode step's kernels wait);
 *   counter  PDL without griddepcontrol.wait: every block counts itself on a counter in global memory after its
 *            stores, and the next kernel's blocks spin on it.
 * Then the same chain as one persistent kernel (cooperative launch, 1 to 4 blocks an SM), its links separated by a
 * grid-wide barrier built three ways (what a persistent decode step would pay instead of a kernel boundary):
 *   fence    each block's first thread fences, adds one to a counter and spins on it (the persistent step's);
 *   release  the same with a release add and acquire loads, no full fences;
 *   flags    each block writes the link's number to a word of its own (a release store) and its first warp polls
 *            every block's word (acquire loads, a lane a word), so no two blocks write the same word;
 *   ring     no barrier: block b waits only for block b + 1 of the link before (its word, as with flags) and reads
 *            the values that block wrote, so a link costs one hop between two blocks (what a step whose stages wait
 *            for the rows they read, not for the whole grid, would pay on its critical path).
 * The numbers decide how many blocks a decode kernel should have and whether a barrier inside a kernel can replace a
 * launch (docs/cuda-measured.md, sessions 15 and 34). Usage: bench_cuda_launch [values read a block, default 256] */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#define CHAIN 300
#define REPLAYS 30

enum wait_mode { WAIT_PLAIN, WAIT_PDL, WAIT_COUNTER, WAIT_MODES };
static const char *const mode_names[WAIT_MODES] = {"plain", "pdl", "counter"};

/* Hopper's instructions; the sm_80 build of this file only has to compile (main refuses older GPUs). */
__device__ __forceinline__ unsigned load_acquire(const unsigned *p) {
    unsigned v = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#endif
    return v;
}

__device__ __forceinline__ void let_next_kernel_in() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_kernel_before() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void add_release(unsigned *p, unsigned v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#endif
}

__device__ __forceinline__ void store_release(unsigned *p, unsigned v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#endif
}

/* A link's work: the block sums the n values of in, then writes out[i] for i = first, first + stride, ... below n
 * (first counted from the block's first thread). */
__device__ __forceinline__ void link_work(const float *in, float *out, int n, float *partial, int first, int stride) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += __ldcg(in + i);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = s;
    __syncthreads();
    s = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += partial[w];
    for (int i = first + threadIdx.x; i < n; i += stride) out[i] = __ldcg(in + i) * 0.5f + s * 1e-6f;
}

/* ... as the chains of kernels and of barriers do it: each block its share of out */
__device__ __forceinline__ void link_share(const float *in, float *out, int n, float *partial) {
    link_work(in, out, n, partial, blockIdx.x * blockDim.x, gridDim.x * blockDim.x);
}

enum barrier_kind { BARRIER_FENCE, BARRIER_RELEASE, BARRIER_FLAGS, BARRIER_RING, BARRIER_KINDS };
static const char *const barrier_names[BARRIER_KINDS] = {"fence", "release", "flags", "ring"};

/* The grid's blocks meet for the link-th time (from 1 on): sync is the counter, or (flags) a word a block. */
template <int KIND>
__device__ __forceinline__ void grid_meet(unsigned *sync, unsigned link) {
    __syncthreads();
    if (KIND == BARRIER_FENCE && threadIdx.x == 0) {
        __threadfence();
        atomicAdd(sync, 1u);
        while (load_acquire(sync) < link * gridDim.x) {}
        __threadfence();
    }
    if (KIND == BARRIER_RELEASE && threadIdx.x == 0) {
        add_release(sync, 1u);
        while (load_acquire(sync) < link * gridDim.x) {}
    }
    if (KIND == BARRIER_FLAGS && threadIdx.x < 32) {
        if (threadIdx.x == 0) store_release(sync + blockIdx.x, link);
        for (unsigned b = threadIdx.x; b < gridDim.x; b += 32)
            while (load_acquire(sync + b) < link) {}
        __syncwarp();
    }
    __syncthreads();
}

template <int KIND>
__global__ void persistent_chain_kernel(float *a, float *b, int n, unsigned *sync) {
    __shared__ float partial[32];
    for (int link = 0; link < CHAIN; link++) {
        link_share(link & 1 ? b : a, link & 1 ? a : b, n, partial);
        grid_meet<KIND>(sync, (unsigned)link + 1);
    }
}

/* The ring: each block sums the n values block b + 1 wrote in the link before (once its word says so) and writes n
 * of its own; sync holds a word a block. The longest chain of waits is CHAIN hops, one a link. Nothing holds a block
 * back until its reader has read, so it may overwrite values not yet read: the values are not the point, only the
 * waits. */
__global__ void persistent_ring_kernel(float *a, float *b, int n, unsigned *sync) {
    __shared__ float partial[32];
    unsigned next = (blockIdx.x + 1) % gridDim.x;
    for (int link = 0; link < CHAIN; link++) {
        const float *in = (link & 1 ? b : a) + (size_t)next * n;
        float *out = (link & 1 ? a : b) + (size_t)blockIdx.x * n;
        if (link > 0) {
            if (threadIdx.x == 0)
                while (load_acquire(sync + next) < (unsigned)link) {}
            __syncthreads();
        }
        link_work(in, out, n, partial, 0, blockDim.x);
        __syncthreads();
        if (threadIdx.x == 0) store_release(sync + blockIdx.x, (unsigned)link + 1);
    }
}

/* Link `link` of the chain: waits for the link before as `mode` says, sums n values of in (every block all of them),
 * writes its share of out. counters[link] counts the blocks done; link + 2 resets the counter of link, whose
 * readers (link + 1) have all passed their wait by then. */
template <int MODE>
__global__ void chain_link_kernel(const float *in, float *out, int n, unsigned *counters, int link,
                                  unsigned blocks_before) {
    __shared__ float partial[32];
    if (MODE != WAIT_PLAIN) let_next_kernel_in();
    if (MODE == WAIT_PDL) wait_for_kernel_before();
    if (MODE == WAIT_COUNTER) {
        if (threadIdx.x == 0 && link > 0) {
            while (load_acquire(&counters[link - 1]) < blocks_before) {}
            if (blockIdx.x == 0 && link >= 2) counters[link - 2] = 0;
        }
        __syncthreads();
    }
    link_share(in, out, n, partial);
    if (MODE == WAIT_COUNTER) {
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(&counters[link], 1u);
        }
    }
}

static cudaError_t launch_link(int mode, int grid, int threads, cudaStream_t stream, const float *in, float *out,
                               int n, unsigned *counters, int link) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = threads, cfg.stream = stream;
    cfg.attrs = &attr, cfg.numAttrs = mode == WAIT_PLAIN ? 0 : 1;
    unsigned before = (unsigned)grid;
    if (mode == WAIT_PLAIN)
        return cudaLaunchKernelEx(&cfg, chain_link_kernel<WAIT_PLAIN>, in, out, n, counters, link, before);
    if (mode == WAIT_PDL)
        return cudaLaunchKernelEx(&cfg, chain_link_kernel<WAIT_PDL>, in, out, n, counters, link, before);
    return cudaLaunchKernelEx(&cfg, chain_link_kernel<WAIT_COUNTER>, in, out, n, counters, link, before);
}

/* The best of REPLAYS timed runs of launch() (after one untimed), in ms; reset() before each, untimed. */
template <class Reset, class Launch>
static float best_ms(cudaStream_t stream, Reset reset, Launch launch) {
    cudaEvent_t start, end;
    cudaEventCreate(&start), cudaEventCreate(&end);
    float best = 1e30f;
    for (int r = -1; r < REPLAYS; r++) {
        reset();
        cudaEventRecord(start, stream);
        launch();
        cudaEventRecord(end, stream);
        cudaStreamSynchronize(stream);
        float ms;
        cudaEventElapsedTime(&ms, start, end);
        if (r >= 0 && ms < best) best = ms;
    }
    cudaEventDestroy(start), cudaEventDestroy(end);
    return best;
}

/* Microseconds a link of the chain, the best of REPLAYS replays; negative on a CUDA error. */
static double time_chain(int mode, int grid, int threads, int n, float *const buf[2], unsigned *counters,
                         cudaStream_t stream) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    size_t counter_bytes = sizeof(unsigned) * CHAIN;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) != cudaSuccess) return -1;
    for (int link = 0; link < CHAIN; link++)
        launch_link(mode, grid, threads, stream, buf[link & 1], buf[(link + 1) & 1], n, counters, link);
    if (cudaStreamEndCapture(stream, &graph) != cudaSuccess) return -1;
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return -1;
    /* the reset: the last two links' counters */
    float best = best_ms(stream, [&] { cudaMemsetAsync(counters, 0, counter_bytes, stream); },
                         [&] { cudaGraphLaunch(exec, stream); });
    cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
    return cudaGetLastError() == cudaSuccess ? best * 1000.0 / CHAIN : -1;
}

/* Microseconds a link of the persistent chain (one cooperative launch of CHAIN links and CHAIN barriers) over
 * per_sm blocks on each of the sms SMs, the best of REPLAYS launches; 0 where those blocks cannot all be resident;
 * negative on a CUDA error. */
static double time_persistent(int kind, int per_sm, int sms, int threads, int n, float *const buf[2], unsigned *sync,
                              cudaStream_t stream) {
    void (*kernels[BARRIER_KINDS])(float *, float *, int, unsigned *) = {
        persistent_chain_kernel<BARRIER_FENCE>, persistent_chain_kernel<BARRIER_RELEASE>,
        persistent_chain_kernel<BARRIER_FLAGS>, persistent_ring_kernel};
    int fits = 0, grid = per_sm * sms;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fits, kernels[kind], threads, 0) != cudaSuccess) return -1;
    if (fits < per_sm) return 0;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = threads, cfg.stream = stream;
    cfg.attrs = &attr, cfg.numAttrs = 1;
    float best = best_ms(stream, [&] { cudaMemsetAsync(sync, 0, sizeof(unsigned) * grid, stream); },
                         [&] { cudaLaunchKernelEx(&cfg, kernels[kind], buf[0], buf[1], n, sync); });
    return cudaGetLastError() == cudaSuccess ? best * 1000.0 / CHAIN : -1;
}

/* The persistent chain at 1 to 4 blocks an SM of each block size, each barrier kind */
static int print_persistent(int n, float *const buf[2], unsigned *sync, int sms, cudaStream_t stream) {
    printf("one persistent kernel of %d links, a grid barrier after each (ring: one block waiting for another); "
           "us a link\n", CHAIN);
    printf("%7s %7s %8s %8s %8s %8s\n", "threads", "blocks", barrier_names[0], barrier_names[1], barrier_names[2],
           barrier_names[3]);
    static const int threads[] = {128, 256, 512};
    for (int t = 0; t < 3; t++)
        for (int per_sm = 1; per_sm <= 4; per_sm++) {
            printf("%7d %7d", threads[t], per_sm * sms);
            for (int kind = 0; kind < BARRIER_KINDS; kind++) {
                double us = time_persistent(kind, per_sm, sms, threads[t], n, buf, sync, stream);
                if (us < 0) {
                    fprintf(stderr, "\nbench_cuda_launch: %s\n", cudaGetErrorString(cudaGetLastError()));
                    return 1;
                }
                if (us == 0) printf(" %8s", "-");
                else printf(" %8.3f", us);
            }
            printf("\n");
        }
    return 0;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 256;
    int max_n = 4 * 1024 * n > 1 << 16 ? 4 * 1024 * n : 1 << 16; /* the ring: n values a block, up to 4096 blocks */
    float *buf[2];
    unsigned *counters;
    cudaStream_t stream;
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major < 9) {
        fprintf(stderr, "bench_cuda_launch: needs a Hopper or later GPU (programmatic dependent launch)\n");
        return 1;
    }
    cudaMalloc((void **)&buf[0], sizeof(float) * max_n), cudaMalloc((void **)&buf[1], sizeof(float) * max_n);
    cudaMemset(buf[0], 0, sizeof(float) * max_n), cudaMemset(buf[1], 0, sizeof(float) * max_n);
    int words = CHAIN > 4 * prop.multiProcessorCount ? CHAIN : 4 * prop.multiProcessorCount; /* flags: a block's */
    cudaMalloc((void **)&counters, sizeof(unsigned) * words);
    cudaStreamCreate(&stream);
    printf("device: %s, %d SMs; a chain of %d kernels, each block reading %d floats; us a kernel\n", prop.name,
           prop.multiProcessorCount, CHAIN, n);
    printf("%7s %7s %8s %8s %8s\n", "threads", "blocks", mode_names[0], mode_names[1], mode_names[2]);
    static const int threads[] = {128, 256, 512};
    static const int blocks[] = {132, 264, 396, 528, 1056, 2112, 3584};
    for (int t = 0; t < 3; t++)
        for (int b = 0; b < 7; b++) {
            printf("%7d %7d", threads[t], blocks[b]);
            for (int mode = 0; mode < WAIT_MODES; mode++) {
                double us = time_chain(mode, blocks[b], threads[t], n, buf, counters, stream);
                if (us < 0) {
                    fprintf(stderr, "\nbench_cuda_launch: %s\n", cudaGetErrorString(cudaGetLastError()));
                    return 1;
                }
                printf(" %8.3f", us);
            }
            printf("\n");
        }
    return print_persistent(n, buf, counters, prop.multiProcessorCount, stream);
}

/* What a dependency between two kernels costs on this GPU, apart from their work: a chain of CHAIN kernels that each
 * read a small vector the one before wrote, captured as a CUDA graph and replayed, per kernel, for several grid and
 * block sizes, three ways of waiting:
 *   plain    stream order (each kernel starts once the one before has ended);
 *   pdl      programmatic dependent launch, the next kernel let in at once and waiting with griddepcontrol.wait (how
 *            the decode step's kernels wait);
 *   counter  PDL without griddepcontrol.wait: every block counts itself on a counter in global memory after its
 *            stores, and the next kernel's blocks spin on it (what a fused or persistent step's barrier costs).
 * The numbers decide how many blocks a decode kernel should have and whether a barrier inside a kernel can replace a
 * launch (docs/cuda.md, session 15). Usage: bench_cuda_launch [values read a block, default 256] */
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
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += __ldcg(in + i);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = s;
    __syncthreads();
    s = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += partial[w];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = __ldcg(in + i) * 0.5f + s * 1e-6f;
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
    cudaEvent_t start, end;
    cudaEventCreate(&start), cudaEventCreate(&end);
    float best = 1e30f;
    for (int r = -1; r < REPLAYS; r++) {
        cudaMemsetAsync(counters, 0, counter_bytes, stream); /* the last two links' counters */
        cudaEventRecord(start, stream);
        cudaGraphLaunch(exec, stream);
        cudaEventRecord(end, stream);
        cudaStreamSynchronize(stream);
        float ms;
        cudaEventElapsedTime(&ms, start, end);
        if (r >= 0 && ms < best) best = ms;
    }
    cudaEventDestroy(start), cudaEventDestroy(end);
    cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
    return cudaGetLastError() == cudaSuccess ? best * 1000.0 / CHAIN : -1;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 256;
    int max_n = n > 1 << 16 ? n : 1 << 16;
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
    cudaMalloc((void **)&counters, sizeof(unsigned) * CHAIN);
    cudaStreamCreate(&stream);
    printf("device: %s, %d SMs; a chain of %d kernels, each block reading %d floats; us a kernel\n", prop.name,
           prop.multiProcessorCount, CHAIN, n);
    printf("%7s %7s %8s %8s %8s\n", "threads", "blocks", mode_names[0], mode_names[1], mode_names[2]);
    static const int threads[] = {128, 256, 512};
    static const int blocks[] = {132, 528, 1056, 2112, 3584};
    for (int t = 0; t < 3; t++)
        for (int b = 0; b < 5; b++) {
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
    return 0;
}

/* What the GPU is, and how fast it copies: the bandwidth decode speed is measured against. */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "cuda/cuda_backend.h"

int kiln_cuda_probe(char *desc, size_t desc_size, kiln_error *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return kiln_fail(err, "no CUDA device: %s", cudaGetErrorString(e));
    if (n == 0) return kiln_fail(err, "no CUDA device: none found");
    int dev = 0;
    struct cudaDeviceProp p;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess)
        return kiln_fail(err, "CUDA device %d: cannot read its properties", dev);
    if (p.major < 8) return kiln_fail(err, "CUDA device %s: compute capability %d.%d, kiln needs 8.0 or newer", p.name, p.major, p.minor);
    if (desc && desc_size)
        snprintf(desc, desc_size, "%s, %.1f GiB, compute capability %d.%d, %d SMs", p.name,
                 (double)p.totalGlobalMem / (1 << 30), p.major, p.minor, p.multiProcessorCount);
    return 0;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int kiln_cuda_measure_copy_bandwidth(double *bytes_per_s, kiln_error *err) {
    const size_t size = (size_t)1 << 30;
    enum { WARMUP = 2, RUNS = 9 };
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms[RUNS];
    int rc = -1;
    *bytes_per_s = 0;
    if (cudaMalloc(&a, size) != cudaSuccess || cudaMalloc(&b, size) != cudaSuccess) {
        kiln_fail(err, "copy bandwidth: cannot allocate 2 x %zu MiB", size >> 20);
        goto done;
    }
    cudaMemset(a, 0x5a, size);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int i = 0; i < WARMUP + RUNS; i++) {
        cudaEventRecord(e0, 0);
        cudaMemcpyAsync(b, a, size, cudaMemcpyDeviceToDevice, 0);
        cudaEventRecord(e1, 0);
        if (cudaEventSynchronize(e1) != cudaSuccess) {
            kiln_fail(err, "copy bandwidth: %s", cudaGetErrorString(cudaGetLastError()));
            goto done;
        }
        if (i >= WARMUP) cudaEventElapsedTime(&ms[i - WARMUP], e0, e1);
    }
    qsort(ms, RUNS, sizeof ms[0], cmp_float);
    *bytes_per_s = 2.0 * (double)size / (ms[RUNS / 2] * 1e-3);
    rc = 0;
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return rc;
}

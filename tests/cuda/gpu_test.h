/* Shared pieces of the CUDA tests: GPU presence (tests skip with a message where there is none), device buffers that
 * free themselves at the end of a test, fresh random data, and the relative error the comparisons use. */
#ifndef KILN_TESTS_CUDA_GPU_TEST_H
#define KILN_TESTS_CUDA_GPU_TEST_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cuda_runtime_api.h>

/* True when a CUDA device answers; prints why not once otherwise. */
static inline bool gpu_present(void) {
    static int state = -1;
    if (state < 0) {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        state = e == cudaSuccess && n > 0;
        if (!state)
            fprintf(stderr, "no CUDA device (%s): GPU tests skipped\n", e == cudaSuccess ? "count is 0" : cudaGetErrorString(e));
    }
    return state == 1;
}

#define CUDA_OK(call)                                                                                                  \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(e_));                                      \
    } while (0)

/* Synchronizes and fails the test on any launch or execution error. */
#define CUDA_SYNC() CUDA_OK(cudaGetLastError()); CUDA_OK(cudaDeviceSynchronize())

/* Device allocations of one test, freed by gpu_free_all(). The poison byte fills each buffer so unwritten outputs
 * show up as NaN. */
#define GPU_MAX_BUFS 32
static void *gpu_bufs[GPU_MAX_BUFS];
static int gpu_n_bufs;

static inline void *gpu_alloc(size_t bytes) {
    void *p = NULL;
    if (gpu_n_bufs == GPU_MAX_BUFS || cudaMalloc(&p, bytes) != cudaSuccess) return NULL;
    cudaMemset(p, 0xff, bytes);
    gpu_bufs[gpu_n_bufs++] = p;
    return p;
}

static inline void *gpu_upload(const void *src, size_t bytes) {
    void *p = gpu_alloc(bytes);
    if (p) cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice);
    return p;
}

static inline void gpu_free_all(void) {
    for (int i = 0; i < gpu_n_bufs; i++) cudaFree(gpu_bufs[i]);
    gpu_n_bufs = 0;
}

/* xorshift64*: fresh data per run unless KILN_TEST_SEED is set (the seed is printed to reproduce a failure). */
static uint64_t rng_state;

static inline void rng_seed(void) {
    const char *s = getenv("KILN_TEST_SEED");
    static bool printed;
    rng_state = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)clock() << 20;
    if (!rng_state) rng_state = 1;
    if (!printed) fprintf(stderr, "KILN_TEST_SEED=%llu\n", (unsigned long long)rng_state), printed = true;
}

static inline float rng_uniform(void) { /* in [-1, 1) */
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (float)((rng_state * 2685821657736338717ull) >> 40) / (float)(1 << 23) - 1.0f;
}

static inline void rng_fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * rng_uniform();
}

/* ||a - ref|| / ||ref||, in double; NaN anywhere in a gives infinity. */
static inline double rel_err(const float *a, const double *ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i])) return INFINITY;
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The ranking the host sampler uses and the device's top-k returns: by value descending, then lower id. */
static const float *rank_values;

static inline int by_rank(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (rank_values[i] != rank_values[j]) return rank_values[i] < rank_values[j] ? 1 : -1;
    return i - j;
}

/* order[0..n): the ids of x[0..n) best first. */
static inline void rank_order(const float *x, int n, int32_t *order) {
    for (int i = 0; i < n; i++) order[i] = i;
    rank_values = x;
    qsort(order, (size_t)n, sizeof *order, by_rank);
}

#endif

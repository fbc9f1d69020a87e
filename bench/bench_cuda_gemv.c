/* GEMV bandwidth per weight type on the GPU: a decode-shaped matrix (4096 inputs, 14336 outputs: llama3-8b's FFN
 * gate), eight copies rotated so that no call finds its weights in L2, timed with events; the median call's weight
 * bytes per second, against the device-to-device copy bandwidth measured in the same run (bytes read + written).
 * Weight bytes are random: the integer and float paths run the same instructions whatever the values.
 * Then the persistent step's GEMV stage alone (kiln_cuda_stream_gemv: the weights streamed through shared memory by
 * a copy warp, one block an SM) for Q4_K and Q6_K at 4, 8 and 16 compute warps: one launch reading the eight
 * copies four times over. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"
#include "quant/types.h"

#define N_COPIES 8
#define N_CALLS 64

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static int check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    return -1;
}

/* N_COPIES device copies of the same size random bytes in w (NULL where none was made). */
static int upload_copies(size_t size, void *w[N_COPIES]) {
    unsigned char *host = malloc(size);
    int rc = 0;
    for (size_t i = 0; i < size; i++) host[i] = (unsigned char)(rand() >> 7);
    for (int c = 0; c < N_COPIES && !rc; c++)
        if (!(rc = check(cudaMalloc(&w[c], size), "cudaMalloc weights")))
            cudaMemcpy(w[c], host, size, cudaMemcpyHostToDevice);
    free(host);
    return rc;
}

/* Median microseconds of one GEMV over rotating copies of an n x k matrix of the type. */
static int bench_type(kiln_type type, int k, int n, bool swiglu, double *us, double *bytes) {
    size_t rb = kiln_row_size(type, k), size = rb * n;
    void *w[N_COPIES] = {0}, *xq = NULL;
    float *x = NULL, *y = NULL, times[N_CALLS];
    int rc = -1;
    if (upload_copies(size, w)) goto done;
    if (check(cudaMalloc((void **)&x, sizeof(float) * k), "cudaMalloc x") ||
        check(cudaMalloc(&xq, (size_t)k / 32 * 36), "cudaMalloc xq") ||
        check(cudaMalloc((void **)&y, sizeof(float) * n), "cudaMalloc y"))
        goto done;
    float *hx = malloc(sizeof(float) * k);
    for (int i = 0; i < k; i++) hx[i] = (float)rand() / RAND_MAX - 0.5f;
    cudaMemcpy(x, hx, sizeof(float) * k, cudaMemcpyHostToDevice);
    free(hx);
    kiln_cuda_quantize_q8_1(x, xq, k, 1, 0);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    for (int i = -4; i < N_CALLS; i++) {
        kiln_cuda_matrix m = {w[(i + 8) % N_COPIES], type, k, n, rb};
        kiln_cuda_matrix u = {w[(i + 9) % N_COPIES], type, k, n, rb};
        cudaEventRecord(e0, 0);
        if (swiglu) kiln_cuda_gemv_swiglu(&m, &u, xq, x, y, 0);
        else kiln_cuda_gemv(&m, xq, x, y, false, 0);
        cudaEventRecord(e1, 0);
        if (check(cudaEventSynchronize(e1), "gemv")) goto done;
        if (i >= 0) cudaEventElapsedTime(&times[i], e0, e1);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    qsort(times, N_CALLS, sizeof(float), cmp_float);
    *us = times[N_CALLS / 2] * 1e3;
    *bytes = (double)size * (swiglu ? 2 : 1);
    rc = check(cudaGetLastError(), "launch");
done:
    for (int c = 0; c < N_COPIES; c++) cudaFree(w[c]);
    cudaFree(x), cudaFree(xq), cudaFree(y);
    return rc;
}

/* Median microseconds of one streamed launch over STREAM_ROUNDS rounds of the rotating copies, and its bytes. */
#define STREAM_ROUNDS 4
#define STREAM_LAUNCHES 5
static int bench_stream(kiln_type type, int k, int n, int warps, double *us, double *bytes) {
    size_t rb = kiln_row_size(type, k), size = rb * n;
    kiln_cuda_stream_args a = {.n_mats = N_COPIES, .repeats = N_COPIES * STREAM_ROUNDS};
    void *w[N_COPIES] = {0};
    float times[STREAM_LAUNCHES];
    int rc = -1;
    if (upload_copies(size, w)) goto done;
    for (int c = 0; c < N_COPIES; c++) a.m[c] = (kiln_cuda_matrix){w[c], type, k, n, rb};
    if (check(cudaMalloc((void **)&a.y, sizeof(float) * n), "cudaMalloc y") ||
        check(cudaMalloc((void **)&a.xq, (size_t)k / 32 * 36), "cudaMalloc xq") ||
        check(cudaMemset((void *)a.xq, 0, (size_t)k / 32 * 36), "cudaMemset xq"))
        goto done;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    for (int i = -1; i < STREAM_LAUNCHES; i++) {
        cudaEventRecord(e0, 0);
        if (kiln_cuda_stream_gemv(&a, warps, 0)) {
            fprintf(stderr, "kiln_cuda_stream_gemv: cannot run %s at %d warps here\n", kiln_type_name(type), warps);
            goto done;
        }
        cudaEventRecord(e1, 0);
        if (check(cudaEventSynchronize(e1), "stream gemv")) goto done;
        if (i >= 0) cudaEventElapsedTime(&times[i], e0, e1);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    qsort(times, STREAM_LAUNCHES, sizeof(float), cmp_float);
    *us = times[STREAM_LAUNCHES / 2] * 1e3;
    *bytes = (double)size * a.repeats;
    rc = 0;
done:
    for (int c = 0; c < N_COPIES; c++) cudaFree(w[c]);
    cudaFree(a.y), cudaFree((void *)a.xq);
    return rc;
}

static void print_row(const char *name, double bytes, double us, double copy_bw) {
    printf("%-22s %10.1f %10.1f %10.0f %7.1f%%\n", name, bytes / 1e6, us, bytes / us / 1e3,
           100.0 * bytes / (us * 1e-6) / copy_bw);
}

int main(int argc, char **argv) {
    char desc[256];
    kiln_error err;
    if (kiln_cuda_probe(desc, sizeof desc, &err)) {
        printf("bench_cuda_gemv: skipped: %s\n", err.msg);
        return 0;
    }
    double copy_bw;
    if (kiln_cuda_measure_copy_bandwidth(&copy_bw, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const int k = argc > 1 ? atoi(argv[1]) : 4096, n = argc > 2 ? atoi(argv[2]) : 14336;
    printf("device: %s\ndevice-to-device copy: %.0f GB/s (read + write)\n", desc, copy_bw / 1e9);
    printf("GEMV %d inputs x %d outputs, median of %d calls over %d rotating copies\n", k, n, N_CALLS, N_COPIES);
    printf("%-22s %10s %10s %10s %8s\n", "type", "MB", "us", "GB/s", "% copy");
    const kiln_type types[] = {KILN_TYPE_F32,  KILN_TYPE_F16,  KILN_TYPE_BF16, KILN_TYPE_Q4_0, KILN_TYPE_Q4_1,
                               KILN_TYPE_Q5_0, KILN_TYPE_Q5_1, KILN_TYPE_Q8_0, KILN_TYPE_Q2_K, KILN_TYPE_Q3_K,
                               KILN_TYPE_Q4_K, KILN_TYPE_Q5_K, KILN_TYPE_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        for (int sw = 0; sw < 2; sw++) {
            if (sw && types[i] != KILN_TYPE_Q4_K && types[i] != KILN_TYPE_Q8_0) continue;
            double us, bytes;
            if (bench_type(types[i], k, n, sw, &us, &bytes)) return 1;
            char name[32];
            snprintf(name, sizeof name, "%s%s", kiln_type_name(types[i]), sw ? "+swiglu" : "");
            print_row(name, bytes, us, copy_bw);
        }
    const kiln_type streamed[] = {KILN_TYPE_Q4_K, KILN_TYPE_Q6_K};
    const int warps[] = {4, 8, 16};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            double us, bytes;
            if (bench_stream(streamed[i], k, n, warps[j], &us, &bytes)) continue;
            char name[40];
            snprintf(name, sizeof name, "%s streamed, %d warps", kiln_type_name(streamed[i]), warps[j]);
            print_row(name, bytes, us, copy_bw);
        }
    return 0;
}

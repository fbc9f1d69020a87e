/* Quantized data for the CUDA tests: random rows through the CPU's reference quantizer, matrices uploaded in the
 * device layout, and the GPU's Q8_1 activations read back. Needs cmocka.h (and gpu_test.h) included before it. */
#ifndef KILN_TESTS_CUDA_GPU_QUANT_H
#define KILN_TESTS_CUDA_GPU_QUANT_H

#include "cuda/kernels.h"
#include "gpu_test.h"
#include "quant/quant.h"
#include "util/half.h"

#define Q8_1_BYTES(n) ((size_t)(n) / 32 * 36)

/* d and s of Q8_1 block b of n values. */
static inline float q8_1_d(const uint8_t *q, int n, int b) {
    return kiln_half_to_float(((const kiln_half *)(q + n))[2 * b]);
}
static inline float q8_1_s(const uint8_t *q, int n, int b) {
    return kiln_half_to_float(((const kiln_half *)(q + n))[2 * b + 1]);
}

/* The activations the GPU quantized, back as floats: the exact input its integer dot products saw. */
static inline void dequant_q8_1(const uint8_t *q, int n, float *out) {
    for (int i = 0; i < n; i++) out[i] = q8_1_d(q, n, i / 32) * (float)(int8_t)q[i];
}

/* A quantized matrix uploaded in the file layout and converted to the device layout; float ones as they are. */
static inline const void *upload_matrix(kiln_type type, const uint8_t *w, int k, int n) {
    size_t bytes = kiln_row_size(type, k) * n;
    void *file_layout = gpu_upload(w, bytes);
    if (!kiln_cuda_type_uses_q8_1(type)) return file_layout;
    void *dst = gpu_alloc(bytes);
    assert_int_equal(kiln_cuda_repack(type, file_layout, dst, (int64_t)n * k / kiln_type_get(type)->block_size, 0), 0);
    return dst;
}

/* Random rows of a type: random floats through the CPU's reference quantizer, so every block is a valid one. */
static inline uint8_t *random_rows(kiln_type type, int k, int n, float **deq) {
    const kiln_quant_ops *ops = kiln_quant_ops_get(type, KILN_ISA_SCALAR);
    size_t rb = kiln_row_size(type, k);
    uint8_t *w = malloc(rb * n);
    float *src = malloc(sizeof(float) * k);
    *deq = malloc(sizeof(float) * k * n);
    for (int r = 0; r < n; r++) {
        rng_fill(src, k, 1.0f);
        ops->quantize(src, w + rb * r, k);
        ops->dequantize(w + rb * r, *deq + (size_t)k * r, k);
    }
    free(src);
    return w;
}

#endif

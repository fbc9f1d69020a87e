/* The CUDA executor's internal state, shared by weights.c (upload) and forward.c (contexts and the forward pass). */
#ifndef KILN_CUDA_EXECUTOR_H
#define KILN_CUDA_EXECUTOR_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"

typedef struct kiln_cuda_layer {
    const float *attn_norm, *ffn_norm;
    const float *bq, *bk, *bv; /* NULL when the architecture has no QKV bias */
    kiln_cuda_matrix wq, wk, wv, wo, gate, up, down;
} kiln_cuda_layer;

struct kiln_cuda_model {
    kiln_config cfg;
    void *arena; /* every weight, in one allocation */
    uint64_t arena_bytes;
    kiln_cuda_matrix token_embd, output;
    const float *output_norm;
    const float *rope_freq; /* rope_dim / 2 angles per position */
    kiln_cuda_layer *layers;
    size_t max_matrix_elems; /* the largest layer matrix: the F16 staging size for prefill GEMMs */
};

#endif

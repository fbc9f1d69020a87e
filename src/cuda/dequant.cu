/* Dequantization on the device: embedding rows to F32 (token ids read from device memory, so the lookup can sit in a
 * captured graph) and whole matrices to F16 for the prefill GEMMs. One thread per part of 32 weights. Also the two
 * element-wise conversions the prefill path needs. */
#include <type_traits>

#include "cuda/cuda_common.cuh"
#include "cuda/kernels.h"
#include "cuda/quant_unpack.cuh"

/* Part u of a row whose first block is g0. */
template <class F>
__device__ __forceinline__ void dequant_part(const qtensor &t, int64_t g0, int u, float out[32]) {
    kpart p;
    unpack_part<F>(t, g0 + u / F::parts, u % F::parts, p);
#pragma unroll
    for (int e = 0; e < 32; e++) out[e] = kpart_value(p, e);
}

template <kiln_type T>
__device__ __forceinline__ float float_value(const uint8_t *row, int64_t i) {
    if (T == KILN_TYPE_F32) return ((const float *)row)[i];
    if (T == KILN_TYPE_F16) return __half2float(((const __half *)row)[i]);
    return __uint_as_float((uint32_t)((const uint16_t *)row)[i] << 16);
}

template <class F>
__global__ void get_rows_q_kernel(qtensor w, int k, const int32_t *tokens, float *dst) {
    pdl_wait_and_release();
    int64_t g0 = (int64_t)tokens[blockIdx.x] * (k / 32 / F::parts);
    float *out = dst + (int64_t)blockIdx.x * k;
    for (int u = threadIdx.x; u < k / 32; u += blockDim.x) {
        float v[32];
        dequant_part<F>(w, g0, u, v);
#pragma unroll
        for (int e = 0; e < 32; e += 4) *(float4 *)(out + 32 * u + e) = make_float4(v[e], v[e + 1], v[e + 2], v[e + 3]);
    }
}

template <kiln_type T>
__global__ void get_rows_f_kernel(const uint8_t *w, size_t row_bytes, int k, const int32_t *tokens, float *dst) {
    pdl_wait_and_release();
    const uint8_t *row = w + row_bytes * tokens[blockIdx.x];
    for (int i = threadIdx.x; i < k; i += blockDim.x) dst[(int64_t)blockIdx.x * k + i] = float_value<T>(row, i);
}

extern "C" int kiln_cuda_get_rows(const kiln_cuda_matrix *m, const int32_t *d_tokens, int n_tokens, float *dst,
                                  cudaStream_t stream) {
    if (!kiln_cuda_type_supported(m->type, m->k)) return -1;
    const uint8_t *w = (const uint8_t *)m->data;
    switch (m->type) {
#define X(id, F)                                                                                                       \
    case id:                                                                                                           \
        launch_pdl(get_rows_q_kernel<F>, n_tokens, 128, stream, tensor_of<F>(m), m->k, d_tokens, dst);                     \
        return 0;
        KILN_CUDA_QUANT_TYPES(X)
#undef X
#define X(id)                                                                                                          \
    case id: launch_pdl(get_rows_f_kernel<id>, n_tokens, 256, stream, w, m->row_bytes, m->k, d_tokens, dst); return 0;
        X(KILN_TYPE_F32) X(KILN_TYPE_F16) X(KILN_TYPE_BF16)
#undef X
    default: return -1;
    }
}

#define DEQUANT_THREADS 128

/* A thread a part; part i's 32 halves are at dst + 32 i (rows are k apart and a row's parts consecutive), so a block's
 * output is one run of DEQUANT_THREADS * 64 bytes. It goes out through shared memory: each warp store then writes
 * 512 consecutive bytes, where a thread storing its own 64 bytes left every 32-byte sector to two store
 * instructions that the compiler may issue far apart (with Q4_K and Q6_K in their device order, which decode in
 * another sequence, llama3-8b's pp512 lost 2.4%). */
template <class F>
__global__ void __launch_bounds__(DEQUANT_THREADS) dequant_f16_q_kernel(qtensor w, int k, int64_t n_parts, __half *dst) {
    __shared__ uint4 staged[4 * DEQUANT_THREADS];
    int64_t first = (int64_t)blockIdx.x * DEQUANT_THREADS, i = first + threadIdx.x;
    if (i < n_parts) {
        int parts_per_row = k / 32;
        int64_t row = i / parts_per_row;
        int u = (int)(i % parts_per_row);
        float v[32];
        dequant_part<F>(w, row * (parts_per_row / F::parts), u, v);
#pragma unroll
        for (int c = 0; c < 4; c++) {
            uint4 h;
            __half2 *hc = (__half2 *)&h;
#pragma unroll
            for (int e = 0; e < 4; e++) hc[e] = __floats2half2_rn(v[8 * c + 2 * e], v[8 * c + 2 * e + 1]);
            staged[4 * threadIdx.x + c] = h;
        }
    }
    __syncthreads();
    int64_t n_out = 4 * min((int64_t)DEQUANT_THREADS, n_parts - first); /* 16-byte chunks of this block */
    uint4 *out = (uint4 *)(dst + 32 * first);
#pragma unroll
    for (int c = 0; c < 4; c++) {
        int j = c * DEQUANT_THREADS + threadIdx.x;
        if (j < n_out) out[j] = staged[j];
    }
}

template <kiln_type T>
__global__ void dequant_f16_f_kernel(const uint8_t *w, size_t row_bytes, int k, int64_t n, __half *dst) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int64_t row = i / k;
    dst[i] = __float2half(float_value<T>(w + row_bytes * row, i % k));
}

extern "C" int kiln_cuda_dequantize_f16(const kiln_cuda_matrix *m, void *dst_f16, cudaStream_t stream) {
    if (!kiln_cuda_type_supported(m->type, m->k)) return -1;
    const uint8_t *w = (const uint8_t *)m->data;
    __half *dst = (__half *)dst_f16;
    int64_t n_parts = (int64_t)m->n * (m->k / 32), n = (int64_t)m->n * m->k;
    switch (m->type) {
#define X(id, F)                                                                                                       \
    case id:                                                                                                           \
        dequant_f16_q_kernel<F><<<div_up(n_parts, DEQUANT_THREADS), DEQUANT_THREADS, 0, stream>>>(tensor_of<F>(m),   \
                                                                                           m->k, n_parts, dst);        \
        return 0;
        KILN_CUDA_QUANT_TYPES(X)
#undef X
#define X(id)                                                                                                          \
    case id: dequant_f16_f_kernel<id><<<div_up(n, 256), 256, 0, stream>>>(w, m->row_bytes, m->k, n, dst); return 0;
        X(KILN_TYPE_F32) X(KILN_TYPE_F16) X(KILN_TYPE_BF16)
#undef X
    default: return -1;
    }
}

__global__ void f32_to_f16_kernel(const float *x, __half *dst, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __float2half(x[i]);
}

extern "C" void kiln_cuda_f32_to_f16(const float *x, void *dst_f16, int64_t n, cudaStream_t stream) {
    f32_to_f16_kernel<<<div_up(n, 256), 256, 0, stream>>>(x, (__half *)dst_f16, n);
}

__global__ void swiglu_kernel(const float *gate, const float *up, float *out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = silu(gate[i]) * up[i];
}

extern "C" void kiln_cuda_swiglu(const float *gate, const float *up, float *out, int64_t n, cudaStream_t stream) {
    swiglu_kernel<<<div_up(n, 256), 256, 0, stream>>>(gate, up, out, n);
}

/* Formats whose device block is not the file's bytes in another order: F::to_device rewrites a block first. */
template <class F, class = void>
struct has_to_device : std::false_type {};
template <class F>
struct has_to_device<F, std::void_t<decltype(&F::to_device)>> : std::true_type {};

struct repack_fields {
    int n;
    kfield f[4];
};

template <class F>
static repack_fields fields_of(void) {
    repack_fields r = {F::n_fields, {}};
    for (int i = 0; i < F::n_fields; i++) r.f[i] = F::fields[i];
    return r;
}

/* File layout -> device layout (see quant_unpack.cuh): one thread per block copies each field to its array. */
template <class F>
__global__ void repack_kernel(repack_fields fl, const uint8_t *src, uint8_t *dst, int64_t n_blocks) {
    int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n_blocks) return;
    const uint8_t *b = src + g * F::block_bytes;
    uint8_t block[F::block_bytes];
    if constexpr (has_to_device<F>::value) {
        F::to_device(b, block);
        b = block;
    }
    int64_t soa = 0;
    for (int f = 0; f < fl.n; f++) {
        uint8_t *d = dst + soa * n_blocks + g * fl.f[f].size;
        for (int i = 0; i < fl.f[f].size; i++) d[i] = b[fl.f[f].aos_off + i];
        soa += fl.f[f].size;
    }
}

extern "C" int kiln_cuda_repack(kiln_type type, const void *src, void *dst, int64_t n_blocks, cudaStream_t stream) {
    switch (type) {
#define X(id, F)                                                                                                       \
    case id:                                                                                                           \
        repack_kernel<F><<<div_up(n_blocks, 256), 256, 0, stream>>>(fields_of<F>(), (const uint8_t *)src,             \
                                                                    (uint8_t *)dst, n_blocks);                         \
        return 0;
        KILN_CUDA_QUANT_TYPES(X)
#undef X
    default: return -1;
    }
}

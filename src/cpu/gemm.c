/* The multi-token kernels' scalar reference and their choice by type and ISA. */
#include "cpu/gemm.h"

void kiln_gemm_scales(const void *y, int64_t n, kiln_type y_type, float *scales) {
    int64_t nb = n / QK8_0;
    for (int64_t b = 0; b < nb; b++) {
        if (y_type == KILN_TYPE_Q8_1) {
            const block_q8_1 *blk = (const block_q8_1 *)y + b;
            scales[2 * b] = kiln_half_to_float(blk->d);
            scales[2 * b + 1] = kiln_half_to_float(blk->s);
        } else {
            const block_q8_0 *blk = (const block_q8_0 *)y + b;
            int sum = 0;
            for (int j = 0; j < QK8_0; j++) sum += blk->qs[j];
            scales[2 * b] = kiln_half_to_float(blk->d);
            scales[2 * b + 1] = scales[2 * b] * (float)sum;
        }
    }
}

/* The references: the scalar vec_dot, token by token (it reads the scales from the blocks themselves). */
static void gemm_ref(kiln_type t, int64_t n, const void *x, const void *y, size_t y_stride, float *out) {
    kiln_vec_dot_fn dot = kiln_quant_ops_get(t, KILN_ISA_SCALAR)->vec_dot;
    for (int k = 0; k < KILN_GEMM_TOKENS; k++) out[k] = dot(n, x, (const char *)y + (size_t)k * y_stride);
}

static void gemm_q4_1_ref(int64_t n, const void *x, const void *y, size_t y_stride, const float *scales,
                          size_t s_stride, float *out) {
    (void)scales;
    (void)s_stride;
    gemm_ref(KILN_TYPE_Q4_1, n, x, y, y_stride, out);
}

static void gemm_q4_0_ref(int64_t n, const void *x, const void *y, size_t y_stride, const float *scales,
                          size_t s_stride, float *out) {
    (void)scales;
    (void)s_stride;
    gemm_ref(KILN_TYPE_Q4_0, n, x, y, y_stride, out);
}

static int has_vnni(void) {
#if defined(__x86_64__)
    return __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

kiln_gemm_fn kiln_gemm_get(kiln_type t, kiln_isa isa) {
    bool q4_1 = t == KILN_TYPE_Q4_1;
    if (!q4_1 && t != KILN_TYPE_Q4_0) return NULL;
    if (isa == KILN_ISA_SCALAR) return q4_1 ? gemm_q4_1_ref : gemm_q4_0_ref;
    if (isa == KILN_ISA_AVX2) return q4_1 ? kiln_gemm_q4_1_avx2 : kiln_gemm_q4_0_avx2;
    if (has_vnni()) return q4_1 ? kiln_gemm_q4_1_avx512_vnni : kiln_gemm_q4_0_avx512_vnni;
    return q4_1 ? kiln_gemm_q4_1_avx512 : kiln_gemm_q4_0_avx512;
}

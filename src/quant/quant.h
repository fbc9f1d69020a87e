/* Per-type row operations: dequantize, quantize (reference algorithms), and the dot product of a weight row with
 * activations already quantized to the type's vec_dot_type, as the reference engines pair them (Q4_0/Q5_0/Q8_0 with
 * Q8_0, Q4_1/Q5_1 with Q8_1, k-quants with Q8_K, float types with F32). */
#ifndef KILN_QUANT_QUANT_H
#define KILN_QUANT_QUANT_H

#include <stdint.h>

#include "quant/blocks.h"
#include "quant/types.h"

typedef void (*kiln_dequantize_fn)(const void *src, float *dst, int64_t n);
typedef void (*kiln_quantize_fn)(const float *src, void *dst, int64_t n);
typedef float (*kiln_vec_dot_fn)(int64_t n, const void *x, const void *y);

typedef struct kiln_quant_ops {
    kiln_dequantize_fn dequantize;
    kiln_quantize_fn quantize;
    kiln_vec_dot_fn vec_dot;
    kiln_type vec_dot_type;
} kiln_quant_ops;

typedef enum kiln_isa { KILN_ISA_SCALAR = 0, KILN_ISA_AVX2 = 1, KILN_ISA_AVX512 = 2 } kiln_isa;

/* The best ISA this CPU runs (KILN_ISA env var "scalar"/"avx2"/"avx512" lowers it, for tests and benches). */
kiln_isa kiln_cpu_isa(void);
const char *kiln_isa_name(kiln_isa isa);

/* Operations of a type at a given ISA (functions an ISA lacks fall back to the next lower one); NULL if the type
 * has no operations. kiln_quant_ops_best() uses kiln_cpu_isa(). */
const kiln_quant_ops *kiln_quant_ops_get(kiln_type type, kiln_isa isa);
const kiln_quant_ops *kiln_quant_ops_best(kiln_type type);

#endif

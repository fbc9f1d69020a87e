/* Per-type row operations: dequantize, quantize (reference algorithms), and the dot product of a weight row with
 * activations already quantized to the type's vec_dot_type, as the reference engines pair them (Q4_0/Q5_0/Q8_0 with
 * Q8_0, Q4_1/Q5_1 with Q8_1, k-quants with Q8_K, float types with F32). */
#ifndef KILN_QUANT_QUANT_H
#define KILN_QUANT_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "quant/blocks.h"
#include "quant/types.h"

/* n counts elements and must be a multiple of the type's block size. All ISAs dequantize and quantize to the same
 * bits. vec_dot results differ between ISAs only by float summation order (about 1e-5 of sum|x_i y_i|); the SIMD
 * integer dots assume 8-bit quants in [-127, 127], which every quantizer writes (-128 never occurs). */
typedef void (*kiln_dequantize_fn)(const void *src, float *dst, int64_t n);
typedef void (*kiln_quantize_fn)(const float *src, void *dst, int64_t n);
typedef float (*kiln_vec_dot_fn)(int64_t n, const void *x, const void *y);

/* The dots of one weight row with KILN_DOT_ROWS activation rows at y, y + y_stride, ...: out[k] is bit for bit what
 * the same level's vec_dot gives for row k, each weight block unpacked once for all of them. Prompt batches take it,
 * and a token computed in a batch equals the same token alone. */
#define KILN_DOT_ROWS 4
typedef void (*kiln_vec_dot_rows_fn)(int64_t n, const void *x, const void *y, size_t y_stride, float *out);

typedef struct kiln_quant_ops {
    kiln_dequantize_fn dequantize;
    kiln_quantize_fn quantize;
    kiln_vec_dot_fn vec_dot;
    kiln_type vec_dot_type;
    kiln_vec_dot_rows_fn vec_dot_rows; /* NULL where the level has none: batches then take vec_dot row by row */
} kiln_quant_ops;

typedef enum kiln_isa { KILN_ISA_SCALAR = 0, KILN_ISA_AVX2 = 1, KILN_ISA_AVX512 = 2 } kiln_isa;

/* How a family of types registers its kernels (float.c, legacy*.c, kquant*.c, ...):
 * each file exports one kiln_quant_family for the level its code needs, listing an entry per type it implements.
 * The scalar family of a type must be complete (dequantize, quantize, vec_dot_type, and vec_dot unless the type is
 * only an activation format, like Q8_1, whose vec_dot stays NULL); a SIMD family
 * may leave any function NULL, and that function falls back to the next lower level that has it, except
 * vec_dot_rows, which comes with its level's vec_dot (a level giving vec_dot alone leaves none). quant.c merges
 * the families once into the table behind kiln_quant_ops_get(); to add a family, declare it in quant.c's
 * FAMILIES list (see the comment there) - nothing else in quant.c changes. */
typedef enum kiln_quant_level {
    KILN_LEVEL_SCALAR = 0,
    KILN_LEVEL_AVX2,        /* AVX2 + FMA + F16C */
    KILN_LEVEL_AVX512,      /* AVX-512 F/BW/VL/DQ */
    KILN_LEVEL_AVX512_VNNI, /* the above plus AVX512-VNNI (vpdpbusd); used by the AVX512 ISA when present */
    KILN_LEVEL_COUNT
} kiln_quant_level;

typedef struct kiln_quant_entry {
    kiln_type type;
    kiln_quant_ops ops;
} kiln_quant_entry;

typedef struct kiln_quant_family {
    const char *name; /* "legacy_avx2", for test and benchmark output */
    kiln_quant_level level;
    const kiln_quant_entry *entries;
    int n_entries;
} kiln_quant_family;

/* Every registered family, so tests can compare each SIMD kernel with its scalar reference directly. */
const kiln_quant_family *const *kiln_quant_families(int *count);

/* Whether this CPU (and OS) can run code of a level; ignores the KILN_ISA override. */
bool kiln_quant_level_supported(kiln_quant_level level);

/* The best ISA this CPU runs (KILN_ISA env var "scalar"/"avx2"/"avx512" lowers it, for tests and benches). */
kiln_isa kiln_cpu_isa(void);
const char *kiln_isa_name(kiln_isa isa);

/* Operations of a type at a given ISA (functions an ISA lacks fall back to the next lower one; an ISA above what
 * the CPU has is lowered to it, KILN_ISA notwithstanding); NULL if the type has no operations.
 * kiln_quant_ops_best() uses kiln_cpu_isa(), so it honours KILN_ISA. */
const kiln_quant_ops *kiln_quant_ops_get(kiln_type type, kiln_isa isa);
const kiln_quant_ops *kiln_quant_ops_best(kiln_type type);

#endif

/* Tensor element types with their GGUF (ggml) type ids, and the size of one block of each. */
#ifndef KILN_QUANT_TYPES_H
#define KILN_QUANT_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum kiln_type {
    KILN_TYPE_F32 = 0,
    KILN_TYPE_F16 = 1,
    KILN_TYPE_Q4_0 = 2,
    KILN_TYPE_Q4_1 = 3,
    KILN_TYPE_Q5_0 = 6,
    KILN_TYPE_Q5_1 = 7,
    KILN_TYPE_Q8_0 = 8,
    KILN_TYPE_Q8_1 = 9,
    KILN_TYPE_Q2_K = 10,
    KILN_TYPE_Q3_K = 11,
    KILN_TYPE_Q4_K = 12,
    KILN_TYPE_Q5_K = 13,
    KILN_TYPE_Q6_K = 14,
    KILN_TYPE_Q8_K = 15,
    KILN_TYPE_I8 = 24,
    KILN_TYPE_I16 = 25,
    KILN_TYPE_I32 = 26,
    KILN_TYPE_I64 = 27,
    KILN_TYPE_F64 = 28,
    KILN_TYPE_BF16 = 30,
    KILN_TYPE_COUNT = 40 /* upper bound of ids kiln knows the name of */
} kiln_type;

typedef struct kiln_type_traits {
    const char *name;   /* as llama.cpp prints it: "q4_K", "f16", ... */
    int block_size;     /* elements per block (1 for plain types) */
    size_t type_size;   /* bytes per block */
    bool supported;     /* kiln can decode it */
} kiln_type_traits;

/* Traits of a type id, or NULL for an id kiln does not know (e.g. IQ formats). */
const kiln_type_traits *kiln_type_get(uint32_t type);

/* Name of a type id; "unknown" for ids without traits. */
const char *kiln_type_name(uint32_t type);

/* Bytes of a row of n elements; n must be a multiple of the block size. */
size_t kiln_row_size(kiln_type type, int64_t n);

/* Looks a type up by its name (case-insensitive, "q4_k" == "Q4_K"); returns -1 if unknown. */
int kiln_type_from_name(const char *name);

#endif

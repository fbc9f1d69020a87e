/* The GGUF quantized block layouts, byte for byte as llama.cpp/ggml stores them. */
#ifndef KILN_QUANT_BLOCKS_H
#define KILN_QUANT_BLOCKS_H

#include <stdint.h>

#include "util/half.h"

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef struct { kiln_half d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
typedef struct { kiln_half d, m; uint8_t qs[QK4_1 / 2]; } block_q4_1;
typedef struct { kiln_half d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;
typedef struct { kiln_half d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
typedef struct { kiln_half d; int8_t qs[QK8_0]; } block_q8_0;
/* s = d * sum(qs), kept so dot products with offset formats need no extra pass */
typedef struct { kiln_half d, s; int8_t qs[QK8_1]; } block_q8_1;

/* 16 sub-blocks of 16; scales: low nibble scale, high nibble min */
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; kiln_half d, dmin; } block_q2_K;
/* 16 sub-blocks of 16; 6-bit scales packed into 12 bytes; hmask holds the third bit */
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; kiln_half d; } block_q3_K;
/* 8 sub-blocks of 32; 6-bit scales and mins packed into 12 bytes */
typedef struct { kiln_half d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { kiln_half d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
/* 16 sub-blocks of 16; 8-bit signed scales */
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; kiln_half d; } block_q6_K;
/* activation format for k-quant dot products; bsums = sums of each 16 quants */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;

_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 layout");
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 layout");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 layout");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 layout");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 layout");
_Static_assert(sizeof(block_q8_1) == 36, "block_q8_1 layout");
_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K layout");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K layout");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K layout");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K layout");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K layout");
_Static_assert(sizeof(block_q8_K) == 292, "block_q8_K layout");

#endif

/* The half mode's activation layout (kiln_cuda_batch_to_half, read by gemv_batch.cu's mma_range_h): part-major (part
 * u, values 32u..32u+31, of every row, then part u + 1), a part's 32 values as four 16-byte chunks, chunk c holding
 * the pairs (2c, 2c+1), (2c+8, 2c+9), (2c+16, 2c+17), (2c+24, 2c+25): one lane's B registers of the part's two mmas. */
#ifndef KILN_CUDA_HALF_PARTS_CUH
#define KILN_CUDA_HALF_PARTS_CUH

#include <stdint.h>

/* The half2 index of values e and e + 1 (e even) of row `row` among n_rows. */
__device__ __forceinline__ int64_t half_parts_pair(int64_t row, int e, int n_rows) {
    int r = e & 31;
    return (((int64_t)(e >> 5) * n_rows + row) * 4 + ((r & 7) >> 1)) * 4 + (r >> 3);
}

/* The half index of value e of row `row` among n_rows. */
__device__ __forceinline__ int64_t half_parts_at(int64_t row, int e, int n_rows) {
    return 2 * half_parts_pair(row, e & ~1, n_rows) + (e & 1);
}

#endif

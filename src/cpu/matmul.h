/* Quantized matrix-vector and matrix-matrix products on the thread pool. The input rows are quantized once to the
 * weights' vec_dot_type and shared by every weight of the call (Q/K/V, or gate/up); the output rows are split into
 * tiles that threads take in turn, and each tile's weight rows are dotted with every input row while they are in
 * cache, so a prompt batch reads each weight row once per tile instead of once per token. */
#ifndef KILN_CPU_MATMUL_H
#define KILN_CPU_MATMUL_H

#include <stddef.h>

#include "cpu/threadpool.h"
#include "model/model.h"

#define KILN_MATMUL_MAX_WEIGHTS 3

/* Bytes of scratch kiln_matmul needs to quantize n_tok input rows for weight w. */
size_t kiln_matmul_scratch_size(const kiln_weight *w, int n_tok);

/* For each weight ws[i] (at most KILN_MATMUL_MAX_WEIGHTS, all with the same row length ne[0] and vec_dot_type):
 *   outs[i][t * ws[i]->ne[1] + r] = dot(row r of ws[i], in[t * ne[0] ...])  for t < n_tok.
 * scratch holds the quantized input (kiln_matmul_scratch_size bytes). */
void kiln_matmul(kiln_pool *pool, const kiln_weight *const *ws, float *const *outs, int n_w, const float *in,
                 int n_tok, void *scratch);

/* kiln_matmul where only the first n_multi rows may go through the multi-token kernels of cpu/gemm.h (Q4_0, Q4_1;
 * in whole groups of KILN_GEMM_TOKENS), the rest token by token. Those kernels sum in another order than the
 * single-token one, so a batch that mixes sequences gives each row the same kernel whatever else is in it. Types
 * whose quant ops have vec_dot_rows (the same bits as vec_dot) take it for any tokens, in groups of KILN_DOT_ROWS. */
void kiln_matmul_split(kiln_pool *pool, const kiln_weight *const *ws, float *const *outs, int n_w, const float *in,
                       int n_tok, int n_multi, void *scratch);

#endif

/* The fast CPU forward pass: quantized weights used in place, activations quantized once per matmul input, prompt
 * batches through matrix-matrix products, a persistent thread pool, an F16 (or F32) KV cache, and every buffer
 * allocated once when the state is made. */
#ifndef KILN_CPU_FORWARD_H
#define KILN_CPU_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "cpu/threadpool.h"
#include "model/model.h"

typedef struct kiln_cpu_params {
    int n_ctx;         /* most positions of one sequence */
    int n_batch;       /* most tokens one matmul processes (prompts are cut into chunks of this many) */
    int n_kv_rows;     /* KV-cache rows (positions) shared by all sequences; 0: n_ctx, for one sequence */
    int n_threads;     /* 0: physical cores */
    kiln_type kv_type; /* KILN_TYPE_F16 or KILN_TYPE_F32 */
} kiln_cpu_params;

typedef struct kiln_cpu_state kiln_cpu_state;

int kiln_cpu_new(const kiln_config *cfg, const kiln_weights *w, const kiln_cpu_params *params, kiln_cpu_state **out,
                 kiln_error *err);
void kiln_cpu_free(kiln_cpu_state *s);
int kiln_cpu_n_threads(const kiln_cpu_state *s);
/* Bytes the state allocated: its KV cache, and its activations and scratch. */
void kiln_cpu_memory(const kiln_cpu_state *s, uint64_t *kv_cache, uint64_t *workspace);

/* Runs tokens[0..n) at positions pos..pos+n-1 (earlier positions must be in the cache; later ones are
 * overwritten). Writes the logits of the last token (n_vocab floats), or of every token (n * n_vocab) when
 * all_logits. Fails, changing nothing, if pos + n exceeds the context. */
int kiln_cpu_forward(kiln_cpu_state *s, const int32_t *tokens, int n, int pos, float *logits, bool all_logits,
                     kiln_error *err);

/* One sequence's part of a batched step. Its KV rows are paged: position p is cache row
 * blocks[p / block_size] * block_size + p % block_size. Rows its tokens write must be its own (not shared). */
typedef struct kiln_cpu_seq {
    const int32_t *tokens;
    int n, pos;            /* tokens at positions pos..pos+n-1; earlier positions are in its rows */
    const int32_t *blocks; /* block table, covering positions 0..pos+n-1 */
    bool logits;           /* wants its last token's logits */
} kiln_cpu_seq;

/* One forward step over several sequences: all their tokens (n_batch at most) go through each matmul together, so
 * weights are read once per step; attention is per sequence over its own blocks. Only seqs[0]'s tokens go through
 * the multi-token kernels (a prompt chunk), so every other token gets the single-token kernel whatever the batch
 * holds. Logits of the sequences that want them go to logits[k * n_vocab] in order. The cache is the state's
 * (n_kv_rows rows). */
int kiln_cpu_forward_batch(kiln_cpu_state *s, const kiln_cpu_seq *seqs, int n_seq, int block_size, float *logits,
                           kiln_error *err);

#endif

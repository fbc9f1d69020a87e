/* The CUDA executor as the engine sees it: a second executor over the same model description (model/model.h).
 * Every entry point exists in every build; a build without CUDA (or a machine without a GPU) answers -1 with a
 * message saying so, so callers choose the device at run time with one code path.
 *
 * Life cycle: kiln_cuda_model_load uploads the weights once, in their file types. kiln_cuda_context_new allocates
 * everything a sequence needs (KV cache in F16, activations, attention partials, the prefill staging buffer) once;
 * nothing is allocated and nothing waits on the host per token afterwards. */
#ifndef KILN_CUDA_CUDA_BACKEND_H
#define KILN_CUDA_CUDA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model/model.h"
#include "sample/draw.h"
#include "util/error.h"

typedef struct kiln_cuda_model kiln_cuda_model;
typedef struct kiln_cuda_context kiln_cuda_context;

/* 0 when a usable GPU is present, filling desc (name, memory, compute capability); -1 with the reason otherwise
 * ("built without CUDA", "no CUDA device: ..."). desc may be NULL. */
int kiln_cuda_probe(char *desc, size_t desc_size, kiln_error *err);

/* Uploads every weight to the current GPU (one allocation; the tied head shares the embedding). cfg is copied;
 * w is only read during the call, except with KILN_GPU_DEBUG=1 in the environment: then w must outlive the model,
 * and every decode step of its contexts is checked op by op against the CPU (see docs/cuda.md).
 * A model that does not fit says how many bytes it needs and how many are free. */
int kiln_cuda_model_load(const kiln_config *cfg, const kiln_weights *w, kiln_cuda_model **out, kiln_error *err);
void kiln_cuda_model_free(kiln_cuda_model *cm);

/* Device bytes the weights take. */
uint64_t kiln_cuda_model_bytes(const kiln_cuda_model *cm);

/* A sequence of at most n_ctx positions, evaluated in batches of at most n_batch tokens. */
int kiln_cuda_context_new(kiln_cuda_model *cm, int n_ctx, int n_batch, kiln_cuda_context **out, kiln_error *err);
void kiln_cuda_context_free(kiln_cuda_context *ctx);
/* Device bytes the context took: its F16 KV cache, and its activations and scratch. */
void kiln_cuda_context_memory(const kiln_cuda_context *ctx, uint64_t *kv_cache, uint64_t *workspace);

/* Runs tokens[0..n) at positions pos..pos+n-1 (n of any size: split into batches inside). When logits is non-NULL
 * it receives the last token's n_vocab logits. */
int kiln_cuda_eval(kiln_cuda_context *ctx, const int32_t *tokens, int n, int pos, float *logits, kiln_error *err);

/* The most best logits kiln_cuda_eval_best hands back. */
#define KILN_CUDA_TOP_K_MAX 256

/* For a sampler that needs only the best logits of the last token (kiln_sampler_candidates_wanted): runs tokens as
 * kiln_cuda_eval does, ranks the logits on the device and copies back the k best (ids and logits, best first,
 * ranked by logit then lower id, as the host sampler ranks) and the logits of window[0..n_window) (the tokens the
 * penalties see), k and n_window at most KILN_CUDA_TOP_K_MAX: a few hundred bytes across PCIe instead of n_vocab
 * floats, and no pass over the vocabulary on the host. */
int kiln_cuda_eval_best(kiln_cuda_context *ctx, const int32_t *tokens, int n, int pos, int k, int32_t *ids,
                        float *logits, const int32_t *window, int n_window, float *window_logits, kiln_error *err);

/* Greedy decoding on the device: feeds `token` at position pos, then each argmax back in, n_gen times; out receives
 * the n_gen generated ids. One replay of the captured decode step per token; only the id crosses to the host. */
int kiln_cuda_generate_greedy(kiln_cuda_context *ctx, int32_t token, int pos, int n_gen, int32_t *out,
                              kiln_error *err);

/* One greedy step for a loop that looks at each token before going on (stop conditions, streaming): feeds token
 * at pos and writes the argmax of its logits to *next; only the id crosses to the host. The step after (feeding the
 * same argmax at pos + 1, on the device) is queued before waiting, so a following call with exactly (*next, pos + 1)
 * finds it running and the GPU does not idle between calls; any other call or kiln_cuda_eval discards it (its KV
 * row is rewritten before it is read). The context's logits are not copied: a caller that needs them uses
 * kiln_cuda_eval. */
int kiln_cuda_decode_greedy(kiln_cuda_context *ctx, int32_t token, int pos, int32_t *next, kiln_error *err);

/* kiln_cuda_decode_greedy for a sampler that draws on the device (kiln_sampler_device_draw gave k and p): the step's
 * k best logits are ranked there and drawn from as the host sampler draws, from PRNG state rng, which is left as the
 * host's would be after the draw (rng in and out: 4 words). The step after it, fed the drawn token and drawing on
 * from the state after, is queued before waiting, so a following call with (*next, pos + 1, the same k, p and the
 * rng it left) finds it running; only 40 bytes cross to the host a step. */
int kiln_cuda_decode_sampled(kiln_cuda_context *ctx, int32_t token, int pos, int k, const kiln_draw_params *p,
                             uint64_t rng[4], int32_t *next, kiln_error *err);

/* Under KILN_GPU_DEBUG=1: how many decode steps so far had an op diverge from the CPU; -1 when debugging is off. */
int kiln_cuda_context_debug_diverged(const kiln_cuda_context *ctx);

/* Whether decode steps replay a captured CUDA graph (false after a capture failure: eager launches). */
bool kiln_cuda_context_uses_graph(const kiln_cuda_context *ctx);
/* Whether a decode step runs the layers as one persistent launch (kiln_cuda_decode_layers; KILN_CUDA_PERSISTENT=0
 * at context creation turns it off) rather than kernels op by op. */
bool kiln_cuda_context_uses_persistent(const kiln_cuda_context *ctx);

/* Per-op profile of eager forward passes: while on, decode runs without the graph and every op is timed with
 * events. kiln_cuda_profile_print writes time, weight bytes and share of copy_bw (bytes per second) per op, summed
 * over the steps since profiling was turned on, divided by n_steps. */
int kiln_cuda_context_set_profile(kiln_cuda_context *ctx, bool on, kiln_error *err);
void kiln_cuda_profile_print(kiln_cuda_context *ctx, int n_steps, double copy_bw, FILE *out);

/* Device-to-device copy bandwidth in bytes per second (bytes read plus written), measured on a large buffer: the
 * roofline that decode speed is compared with. */
int kiln_cuda_measure_copy_bandwidth(double *bytes_per_s, kiln_error *err);

/* ---- one step over many sequences, for continuous batching (forward_batch.c) ----
 * The KV cache is paged: blocks of block_size positions, shared by every sequence through its block table (which
 * the caller keeps: engine/kv_pool.c). Each step takes any number of tokens per sequence (a decode token, or a
 * prompt chunk), all through the same batched kernels, so a sequence's logits do not depend on the rest of the
 * step. */
typedef struct kiln_cuda_batch kiln_cuda_batch;

typedef struct kiln_cuda_batch_params {
    int block_size;             /* positions per KV block */
    int n_ctx;                  /* positions per sequence at most */
    int max_tokens;             /* tokens per step at most */
    int max_seqs;               /* sequences per step at most */
    int max_blocks, min_blocks; /* KV blocks: as many as fit in free memory up to max_blocks; fails under min_blocks */
    bool half;                  /* turns on half mode for the process (kiln_cuda_batch_half: F16 activations and
                                 * tensor-core products for quantized weights; more tokens a second from about 16
                                 * sequences and for prompts, fewer for one to four) */
} kiln_cuda_batch_params;

typedef struct kiln_cuda_seq {
    const int32_t *tokens;
    int n, pos;                 /* tokens[0..n) at positions pos..pos+n-1 */
    const int32_t *blocks;      /* the block table: at least (pos + n) / block_size rounded up entries */
    bool logits;                /* the last token's logits wanted */
    int best;                   /* with logits: only their best (kiln_cuda_batch_best), at most KILN_CUDA_TOP_K_MAX */
    const int32_t *window;      /* ... and the logits of window[0..n_window) (at most KILN_CUDA_TOP_K_MAX) */
    int n_window;
} kiln_cuda_seq;

int kiln_cuda_batch_new(kiln_cuda_model *cm, const kiln_cuda_batch_params *p, kiln_cuda_batch **out,
                        kiln_error *err);
void kiln_cuda_batch_free(kiln_cuda_batch *b);
/* KV blocks the cache holds. */
int kiln_cuda_batch_blocks(const kiln_cuda_batch *b);
/* Device bytes of the paged KV cache and of the step's activations and scratch. */
void kiln_cuda_batch_memory(const kiln_cuda_batch *b, uint64_t *kv_cache, uint64_t *workspace);
/* Runs one step; *logits (when non-NULL) points at n_vocab floats per sequence that wanted them, in order, valid
 * until the next step: filled for those that asked for the whole row (best 0). */
int kiln_cuda_forward_batch(kiln_cuda_batch *b, const kiln_cuda_seq *seqs, int n_seqs, const float **logits,
                            kiln_error *err);
/* After a step, for the row-th sequence that wanted logits and asked for its best: its best ids and logits (best
 * first, as kiln_cuda_eval_best ranks) and its window's logits, valid until the next step. */
void kiln_cuda_batch_best(const kiln_cuda_batch *b, int row, const int32_t **ids, const float **logits,
                          const float **window_logits);
/* Per-op profile of the steps, as kiln_cuda_context_set_profile's: while on, every op of a step is timed with
 * events (the "argmax" row holds the ranking and the copies back); kiln_cuda_batch_profile_print writes the sums
 * since profiling was turned on, divided by n_steps. */
int kiln_cuda_batch_set_profile(kiln_cuda_batch *b, bool on, kiln_error *err);
/* Steps of decode tokens alone replay CUDA graphs (on by default; KILN_CUDA_BATCH_GRAPH=0 turns them off when a batch
 * is made); off: every step launches its kernels one by one (for comparisons and tests). */
void kiln_cuda_batch_set_graphs(kiln_cuda_batch *b, bool on);
void kiln_cuda_batch_profile_print(const kiln_cuda_batch *b, int n_steps, double copy_bw, FILE *out);

#endif

/* The continuous-batching scheduler: many generation requests over one model at once. A scheduler thread runs
 * steps; each step is one batched forward over every running sequence (a decode token each, plus a chunk of some
 * admitted prompt), so weights are read once per step for all of them. Requests are admitted between steps up to
 * `parallel` running sequences (the rest wait in a FIFO queue) and leave as soon as they finish or are cancelled.
 * The KV cache is one pool of fixed-size blocks shared by all sequences through per-sequence block tables; full
 * blocks of an identical prompt prefix are shared between requests.
 *
 * Callbacks run on the scheduler thread: they must not block (hand the event to another thread and return). */
#ifndef KILN_ENGINE_SCHEDULER_H
#define KILN_ENGINE_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"
#include "util/error.h"

typedef struct kiln_sched kiln_sched;

/* The GPU's batched step in half mode (kiln_cuda_batch_params.half): AUTO turns it on for models whose feed-forward
 * weights are all F16 or BF16 (outside half mode those take F32 FMA; on the tensor cores 7-9x the tokens a second at
 * 64 sequences, H100), off for quantized ones (fewer tokens a second for one to a few sequences). */
typedef enum kiln_gpu_f16 { KILN_GPU_F16_AUTO, KILN_GPU_F16_OFF, KILN_GPU_F16_ON } kiln_gpu_f16;

typedef struct kiln_sched_params {
    int parallel;      /* most sequences running at once; 0: 4 */
    int n_ctx;         /* most positions (prompt + generated) one request may use; 0: the model's, at most 4096 */
    int n_kv_blocks;   /* blocks in the shared KV pool; 0: enough for `parallel` full contexts (on a GPU: at most
                        * what fits beside the weights) */
    int max_queue;     /* requests waiting beyond `parallel`; submit fails past it; 0: 256 */
    int n_threads;     /* CPU threads; 0: physical cores */
    int n_chunk;       /* most prompt tokens one step carries (a multiple of 16); 0: 64 */
    kiln_device device; /* where the batched forward runs; AUTO: the GPU when one answers */
    kiln_gpu_f16 gpu_f16; /* on the GPU, the batched GEMVs in half mode or not; AUTO (0) by the weights' types */
} kiln_sched_params;

kiln_sched_params kiln_sched_default_params(void);

/* Whether the GPU's batched step runs in half mode for weights w under mode: as asked, or for AUTO whether every
 * layer's feed-forward matrices are F16 or BF16. */
struct kiln_weights;
bool kiln_sched_half_mode(const struct kiln_weights *w, kiln_gpu_f16 mode);

/* One request. The scheduler copies prompt, stop strings and params; user stays the caller's. */
typedef struct kiln_sched_request {
    const int32_t *prompt;
    int n_prompt;
    kiln_generate_params params;
    /* Each generated token, as kiln_generate reports them (text released only when complete and not a possible stop
     * string start; a last event with token -1 flushes). Return nonzero to cancel the request. */
    kiln_token_callback on_token;
    /* Called exactly once when the request ends (finished, cancelled, or failed: err non-NULL then); after it the
     * scheduler no longer touches user. */
    void (*on_done)(const kiln_generate_result *result, const char *err, void *user);
    void *user;
} kiln_sched_request;

/* Starts the scheduler thread over m (which must outlive the scheduler). */
kiln_sched *kiln_sched_new(kiln_model *m, const kiln_sched_params *p, kiln_error *err);
/* Cancels what is queued or running (each gets on_done with KILN_FINISH_CALLBACK), stops the thread, frees all. */
void kiln_sched_free(kiln_sched *s);

/* Queues a request; returns its id (> 0), or -1 when it can never run (prompt plus max_tokens over n_ctx, empty
 * prompt) or the queue is full. on_done is not called when submit fails. Thread-safe. */
int64_t kiln_sched_submit(kiln_sched *s, const kiln_sched_request *r, kiln_error *err);
/* Asks a queued or running request to stop; it ends at the next step with KILN_FINISH_CALLBACK. Thread-safe; an
 * unknown or finished id is ignored. */
void kiln_sched_cancel(kiln_sched *s, int64_t id);

typedef struct kiln_sched_stats {
    int queued;            /* waiting to be admitted */
    int running;           /* sequences in the batch */
    int kv_blocks_used;
    int kv_blocks_total;
    int kv_block_size;     /* positions per block */
    uint64_t prefix_tokens_reused; /* prompt tokens served from shared prefix blocks, since start */
    uint64_t steps;        /* batched forward steps run, since start */
} kiln_sched_stats;

/* A consistent snapshot. Thread-safe. */
void kiln_sched_get_stats(kiln_sched *s, kiln_sched_stats *out);

/* Where the scheduler's steps run and the memory they hold there (the KV cache is the shared pool of blocks). */
typedef struct kiln_sched_info {
    kiln_device device; /* KILN_DEVICE_CPU or KILN_DEVICE_CUDA */
    bool gpu_f16;       /* on the GPU: the batched step in half mode */
    kiln_memory memory;
    int kv_blocks, kv_block_size;
} kiln_sched_info;

void kiln_sched_get_info(const kiln_sched *s, kiln_sched_info *out);

#endif

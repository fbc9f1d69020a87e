/* Engine internals behind kiln.h: the context (an executor, its KV cache and the tokens it holds) and the helpers
 * the generation loop is made of, for front ends that need more than the public API (the server's scheduler). */
#ifndef KILN_ENGINE_ENGINE_H
#define KILN_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu/forward.h"
#include "cpu/forward_ref.h"
#include "cuda/cuda_backend.h"
#include "kiln.h"
#include "model/model.h"
#include "util/error.h"

struct kiln_context {
    kiln_model *model;
    kiln_context_params params;
    kiln_cpu_state *cpu;   /* the fast path, or */
    kiln_ref_state ref;    /* the reference pass when params.reference */
    kiln_cuda_model *cuda_model; /* the GPU executor when the device is CUDA: weights on the GPU, and */
    kiln_cuda_context *cuda;     /* its KV cache and workspace */
    int32_t *tokens;       /* tokens[0..n_past) are in the KV cache */
    int n_past;
    float *logits;         /* the last evaluated token's logits, n_vocab */
};

/* Evaluates ids at pos.. (kiln_eval with a kiln_error). */
int kiln_ctx_eval(kiln_context *c, const int32_t *ids, int n, int pos, float *logits, bool all_logits,
                  kiln_error *err);

/* Copies an internal error into the caller's buffer of a public function. */
void kiln_error_export(const kiln_error *e, char *err, size_t err_size);

/* Text released while generating: complete UTF-8 characters that cannot be the start of a stop string. */
typedef struct kiln_stop_scan {
    const char *const *stop;
    int n_stop;
    char *buf;   /* decoded text not yet released */
    size_t len, cap;
} kiln_stop_scan;

int kiln_stop_scan_init(kiln_stop_scan *s, const char *const *stop, int n_stop, kiln_error *err);
void kiln_stop_scan_free(kiln_stop_scan *s);
/* Appends text. Returns the number of bytes at the front of buf that may be released now; sets *hit when a stop
 * string was found (the releasable bytes then end where it begins, and the rest is to be dropped). */
int kiln_stop_scan_push(kiln_stop_scan *s, const char *text, size_t len, size_t *release, bool *hit, kiln_error *err);
/* Drops the first n bytes of buf (after they were released). */
void kiln_stop_scan_consume(kiln_stop_scan *s, size_t n);

#endif

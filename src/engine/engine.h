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
#include "sample/sample.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

struct kiln_context {
    kiln_model *model;
    kiln_context_params params;
    kiln_cpu_state *cpu;   /* the fast path, or */
    kiln_ref_state ref;    /* the reference pass when params.reference */
    kiln_cuda_model *cuda_model; /* the GPU executor when the device is CUDA: the model's shared weights, and */
    kiln_cuda_context *cuda;     /* its KV cache and workspace */
    int32_t *tokens;       /* tokens[0..n_past) are in the KV cache */
    int n_past;
    float *logits;         /* the last evaluated token's logits, n_vocab */
};

/* A reference to the model for a context or scheduler (kiln_model_open gives the first); the last release frees it. */
void kiln_model_retain(kiln_model *m);
void kiln_model_release(kiln_model *m);

/* The model's weights on the GPU, uploaded by the first caller and shared with later ones (*out); each successful
 * acquire is paired with a release, and the last release frees them. */
int kiln_model_gpu_acquire(kiln_model *m, kiln_cuda_model **out, kiln_error *err);
void kiln_model_gpu_release(kiln_model *m);

/* Evaluates ids at pos.. (kiln_eval with a kiln_error). */
int kiln_ctx_eval(kiln_context *c, const int32_t *ids, int n, int pos, float *logits, bool all_logits,
                  kiln_error *err);

/* Prompt tokens already in c's KV cache, keeping at least the last one to evaluate (its logits start generation). */
int kiln_ctx_reusable_prefix(const kiln_context *c, const int32_t *prompt, int n_prompt);

/* Whether greedy decoding with these parameters can run its argmax on the GPU (kiln_ctx_decode_greedy): a CUDA
 * context, temperature <= 0, no penalties and no logprobs. */
bool kiln_ctx_greedy_on_device(const kiln_context *c, const kiln_sampling_params *p);

/* Evaluates token at n_past and puts the argmax of its logits in *next, on the device (c->logits is not updated). */
int kiln_ctx_decode_greedy(kiln_context *c, int32_t token, int32_t *next, kiln_error *err);
/* Whether sampling with s can draw on the GPU (kiln_ctx_decode_sampled): a CUDA context and a sampler that needs
 * only the best k logits and its PRNG (kiln_sampler_device_draw). Returns that k and fills p; 0: it cannot. */
int kiln_ctx_sampled_on_device(const kiln_context *c, const kiln_sampler *s, kiln_draw_params *p);
/* Evaluates token at n_past and draws the next token into *next on the device, as s would draw from the logits
 * (k and p from kiln_ctx_sampled_on_device), advancing s's PRNG as that draw would (c->logits is not updated). */
int kiln_ctx_decode_sampled(kiln_context *c, int32_t token, kiln_sampler *s, int k, const kiln_draw_params *p,
                            int32_t *next, kiln_error *err);
/* Evaluates token at n_past on the GPU and fetches only the k best of its logits (ids, best first) and those of the
 * window's tokens (kiln_cuda_eval_best; c->logits is not updated). */
int kiln_ctx_eval_best(kiln_context *c, int32_t token, int k, int32_t *ids, float *logits, const int32_t *window,
                       int n_window, float *window_logits, kiln_error *err);

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

/* One request's output side, shared by kiln_generate and the scheduler: sampling with the request's own sampler,
 * streaming through the stop scan and the detokenizer, and the finish rules (max_tokens, end of generation, stop
 * strings, the callback, a full context). */
typedef struct kiln_gen {
    const kiln_model *model;
    const kiln_generate_params *params; /* the caller keeps it (and its stop strings) alive */
    int n_ctx;
    kiln_sampler *sampler;
    kiln_stop_scan scan;
    kiln_detok detok;
    kiln_token_callback cb;
    void *user;
    bool stop_hit;
    kiln_generate_result res;
} kiln_gen;

/* Fails when a prompt of n_prompt tokens (plus max_tokens, when >= 0) does not fit n_ctx positions. */
int kiln_gen_check_fit(int n_ctx, int n_prompt, int max_tokens, kiln_error *err);
/* Checks that the prompt fits n_ctx (with max_tokens), makes the sampler and feeds it the prompt. */
int kiln_gen_init(kiln_gen *g, const kiln_model *m, const kiln_generate_params *p, int n_ctx, const int32_t *prompt,
                  int n_prompt, kiln_token_callback cb, void *user, kiln_error *err);
void kiln_gen_free(kiln_gen *g);
/* Given the logits after n_past evaluated positions: samples, streams and decides. Returns 0 with *next, the token
 * to evaluate at position n_past; 1 when the request is finished (res.finish set, remaining text flushed); -1 on
 * error. */
int kiln_gen_next(kiln_gen *g, const float *logits, int n_past, int32_t *next, kiln_error *err);
/* kiln_gen_next for a token chosen elsewhere (greedy on the GPU); info may be NULL. */
int kiln_gen_take(kiln_gen *g, int32_t tok, const kiln_sample_info *info, int n_past, int32_t *next, kiln_error *err);

#endif

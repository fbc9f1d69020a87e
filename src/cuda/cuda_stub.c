/* The CUDA entry points in a build without CUDA: each says so, so the CLI can fall back or report it. */
#include "cuda/cuda_backend.h"

static int no_cuda(kiln_error *err) { return kiln_fail(err, "kiln was built without CUDA (rebuild with nvcc present)"); }

int kiln_cuda_probe(char *desc, size_t desc_size, kiln_error *err) {
    if (desc && desc_size) desc[0] = '\0';
    return no_cuda(err);
}

int kiln_cuda_model_load(const kiln_config *cfg, const kiln_weights *w, kiln_cuda_model **out, kiln_error *err) {
    *out = NULL;
    return no_cuda(err);
}

void kiln_cuda_model_free(kiln_cuda_model *cm) {}

uint64_t kiln_cuda_model_bytes(const kiln_cuda_model *cm) { return 0; }

int kiln_cuda_context_new(kiln_cuda_model *cm, int n_ctx, int n_batch, kiln_cuda_context **out, kiln_error *err) {
    *out = NULL;
    return no_cuda(err);
}

void kiln_cuda_context_free(kiln_cuda_context *ctx) {}

void kiln_cuda_context_memory(const kiln_cuda_context *ctx, uint64_t *kv_cache, uint64_t *workspace) {
    *kv_cache = *workspace = 0;
}

int kiln_cuda_eval(kiln_cuda_context *ctx, const int32_t *tokens, int n, int pos, float *logits, kiln_error *err) {
    return no_cuda(err);
}

int kiln_cuda_eval_best(kiln_cuda_context *ctx, const int32_t *tokens, int n, int pos, int k, int32_t *ids,
                        float *logits, const int32_t *window, int n_window, float *window_logits, kiln_error *err) {
    return no_cuda(err);
}

int kiln_cuda_generate_greedy(kiln_cuda_context *ctx, int32_t token, int pos, int n_gen, int32_t *out,
                              kiln_error *err) {
    return no_cuda(err);
}

int kiln_cuda_decode_greedy(kiln_cuda_context *ctx, int32_t token, int pos, int32_t *next, kiln_error *err) {
    return no_cuda(err);
}

int kiln_cuda_decode_sampled(kiln_cuda_context *ctx, int32_t token, int pos, int k, const kiln_draw_params *p,
                             uint64_t rng[4], int32_t *next, kiln_error *err) {
    return no_cuda(err);
}

int kiln_cuda_context_debug_diverged(const kiln_cuda_context *ctx) { return -1; }

bool kiln_cuda_context_uses_graph(const kiln_cuda_context *ctx) { return false; }
bool kiln_cuda_context_uses_persistent(const kiln_cuda_context *ctx) { return false; }

int kiln_cuda_context_set_profile(kiln_cuda_context *ctx, bool on, kiln_error *err) { return no_cuda(err); }

void kiln_cuda_profile_print(kiln_cuda_context *ctx, int n_steps, double copy_bw, FILE *out) {}

int kiln_cuda_measure_copy_bandwidth(double *bytes_per_s, kiln_error *err) {
    *bytes_per_s = 0;
    return no_cuda(err);
}

int kiln_cuda_batch_new(kiln_cuda_model *cm, const kiln_cuda_batch_params *p, kiln_cuda_batch **out,
                        kiln_error *err) {
    *out = NULL;
    return no_cuda(err);
}

void kiln_cuda_batch_free(kiln_cuda_batch *b) {}

int kiln_cuda_batch_blocks(const kiln_cuda_batch *b) { return 0; }

void kiln_cuda_batch_memory(const kiln_cuda_batch *b, uint64_t *kv_cache, uint64_t *workspace) {
    *kv_cache = *workspace = 0;
}

int kiln_cuda_forward_batch(kiln_cuda_batch *b, const kiln_cuda_seq *seqs, int n_seqs, const float **logits,
                            kiln_error *err) {
    return no_cuda(err);
}

void kiln_cuda_batch_best(const kiln_cuda_batch *b, int row, const int32_t **ids, const float **logits,
                          const float **window_logits) {
    *ids = NULL, *logits = NULL, *window_logits = NULL;
}

int kiln_cuda_batch_set_profile(kiln_cuda_batch *b, bool on, kiln_error *err) { return no_cuda(err); }

void kiln_cuda_batch_set_graphs(kiln_cuda_batch *b, bool on) {}

void kiln_cuda_batch_profile_print(const kiln_cuda_batch *b, int n_steps, double copy_bw, FILE *out) {}

/* Logits → next token. The chain, in the reference engines' order: repetition/presence/frequency penalties over
 * the recent tokens, top-k, top-p, min-p, temperature, then a draw from the remaining distribution with the
 * sampler's own PRNG (same seed, same logits → same token). Temperature <= 0 means greedy. */
#ifndef KILN_SAMPLE_SAMPLE_H
#define KILN_SAMPLE_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"
#include "util/error.h"

/* The parameters are the public kiln_sampling_params. */
typedef kiln_sampling_params kiln_sampler_params;

/* Defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no penalties (repeat_last_n 64), random seed. */
kiln_sampler_params kiln_sampler_default_params(void);

/* What was chosen. Log-probabilities are of the distribution after penalties, before truncation and temperature. */
typedef struct kiln_sample_info {
    int32_t token;
    float logprob;
    int n_top;
    int32_t top_tokens[KILN_MAX_TOP_LOGPROBS];
    float top_logprobs[KILN_MAX_TOP_LOGPROBS];
} kiln_sample_info;

typedef struct kiln_sampler kiln_sampler;

int kiln_sampler_new(const kiln_sampler_params *p, int n_vocab, kiln_sampler **out, kiln_error *err);
void kiln_sampler_free(kiln_sampler *s);
/* Forgets the history and restarts the PRNG from the seed. */
void kiln_sampler_reset(kiln_sampler *s);
/* Adds a token to the history the penalties see (prompt tokens too, as the reference engines do). */
void kiln_sampler_accept(kiln_sampler *s, int32_t token);
/* Chooses the next token from n_vocab logits (not modified); fills info when non-NULL. Does not accept it. */
int32_t kiln_sampler_sample(kiln_sampler *s, const float *logits, kiln_sample_info *info);

#endif

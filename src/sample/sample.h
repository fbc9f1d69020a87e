/* Logits → next token. The chain, in the reference engines' order: repetition/presence/frequency penalties over
 * the recent tokens, top-k, top-p, min-p, temperature, then a draw from the remaining distribution with the
 * sampler's own PRNG (same seed, same logits → same token). Temperature <= 0 means greedy. */
#ifndef KILN_SAMPLE_SAMPLE_H
#define KILN_SAMPLE_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"
#include "sample/draw.h"
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

/* Sampling from a few candidates instead of the whole vocabulary, for an engine that ranks the logits where they are
 * (the GPU) and moves only the best: the same token as kiln_sampler_sample on the whole row, the same PRNG draw.
 * candidates_wanted says how many of the row's best logits that takes (0: the whole row is needed: log-probabilities
 * asked for, or top-k off with a temperature), at most max_k: the top-k (1 when greedy), and with penalties as many
 * more as there are distinct tokens in their window, whose ids it puts in window (max_k of room) for the caller to
 * fetch their logits too. A token the penalties lower can leave the k best, so the next ones must be there. */
int kiln_sampler_candidates_wanted(const kiln_sampler *s, int max_k, int32_t *window, int *n_window);
/* ids[0..n_best) and their logits: the row's n_best best (ranked by logit, then lower id); window and its logits as
 * candidates_wanted gave them. */
int32_t kiln_sampler_sample_candidates(kiln_sampler *s, const int32_t *ids, const float *logits, int n_best,
                                       const int32_t *window, const float *window_logits, int n_window);

/* Sampling on a GPU that ranks the logits and draws by itself (draw.h's steps, the sampler's PRNG state handed over
 * and back): the k best logits are all it needs when there is a temperature, top-k from 1 to max_k (below the
 * vocabulary), no penalties and no log-probabilities. Returns that k and fills p; 0: the sampler needs the host. */
int kiln_sampler_device_draw(const kiln_sampler *s, int max_k, kiln_draw_params *p);
/* The PRNG's state, to draw elsewhere and to continue from where that left it. */
void kiln_sampler_get_rng(const kiln_sampler *s, uint64_t state[4]);
void kiln_sampler_set_rng(kiln_sampler *s, const uint64_t state[4]);

#endif

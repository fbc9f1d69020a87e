/* The sampling chain over a candidate array allocated once per sampler. */
#include "sample/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sample/rng.h"

typedef struct candidate {
    int32_t id;
    float logit;
} candidate;

struct kiln_sampler {
    kiln_sampler_params p;
    int n_vocab;
    kiln_rng rng;
    candidate *cand;  /* n_vocab */
    float *logits;    /* penalized logits, n_vocab */
    int32_t *history; /* ring of the last history_cap tokens */
    int history_cap, history_len, history_head;
    int32_t *counts;  /* appearances of each token in the history window, n_vocab */
    int32_t *cand_ids; /* the ids of kiln_sampler_sample_candidates' logits (those in logits), n_vocab */
    float *ranked;     /* the logits of cand in its order, for draw.h, n_vocab */
    float *weights;    /* their weights (draw.h), n_vocab */
    kiln_draw_params draw; /* from p */
};

kiln_sampler_params kiln_sampler_default_params(void) {
    return (kiln_sampler_params){.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                                 .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = KILN_SEED_RANDOM};
}

int kiln_sampler_new(const kiln_sampler_params *p, int n_vocab, kiln_sampler **out, kiln_error *err) {
    *out = NULL;
    if (n_vocab < 1) return kiln_fail(err, "sampler: vocabulary size %d", n_vocab);
    if (p->n_top_logprobs < 0 || p->n_top_logprobs > KILN_MAX_TOP_LOGPROBS)
        return kiln_fail(err, "top logprobs %d is out of range (0..%d)", p->n_top_logprobs, KILN_MAX_TOP_LOGPROBS);
    if (p->top_k < 0) return kiln_fail(err, "top-k %d must not be negative", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) return kiln_fail(err, "top-p %g must be in (0, 1]", p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) return kiln_fail(err, "min-p %g must be in [0, 1]", p->min_p);
    if (!(p->repeat_penalty > 0.0f)) return kiln_fail(err, "repeat penalty %g must be positive", p->repeat_penalty);
    kiln_sampler *s = calloc(1, sizeof *s);
    if (!s) return kiln_fail(err, "out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->history_cap = p->repeat_last_n < 0 ? 1 << 20 : (p->repeat_last_n > 0 ? p->repeat_last_n : 1);
    s->cand = malloc(sizeof *s->cand * (size_t)n_vocab);
    s->logits = malloc(sizeof *s->logits * (size_t)n_vocab);
    s->history = malloc(sizeof *s->history * (size_t)s->history_cap);
    s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
    s->cand_ids = malloc(sizeof *s->cand_ids * (size_t)n_vocab);
    s->ranked = malloc(sizeof *s->ranked * (size_t)n_vocab);
    s->weights = malloc(sizeof *s->weights * (size_t)n_vocab);
    if (!s->cand || !s->logits || !s->history || !s->counts || !s->cand_ids || !s->ranked || !s->weights) {
        kiln_sampler_free(s);
        return kiln_fail(err, "out of memory for the sampler");
    }
    if (s->p.seed == KILN_SEED_RANDOM) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s->p.seed = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec;
    }
    s->draw = (kiln_draw_params){p->temperature > 0.0f ? 1.0f / p->temperature : 0.0f, p->top_p,
                                 p->min_p > 0.0f ? logf(p->min_p) : -INFINITY};
    kiln_sampler_reset(s);
    *out = s;
    return 0;
}

void kiln_sampler_free(kiln_sampler *s) {
    if (!s) return;
    free(s->cand);
    free(s->logits);
    free(s->history);
    free(s->counts);
    free(s->cand_ids);
    free(s->ranked);
    free(s->weights);
    free(s);
}

void kiln_sampler_reset(kiln_sampler *s) {
    kiln_rng_seed(&s->rng, s->p.seed);
    s->history_len = s->history_head = 0;
    memset(s->counts, 0, sizeof *s->counts * (size_t)s->n_vocab);
}

void kiln_sampler_accept(kiln_sampler *s, int32_t token) {
    if (token < 0 || token >= s->n_vocab || s->p.repeat_last_n == 0) return;
    if (s->history_len == s->history_cap) {
        s->counts[s->history[s->history_head]]--; /* the oldest leaves the window */
    } else {
        s->history_len++;
    }
    s->history[s->history_head] = token;
    s->history_head = (s->history_head + 1) % s->history_cap;
    s->counts[token]++;
}

static bool has_penalties(const kiln_sampler_params *p) {
    return p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

/* A logit of a token that appears count times in the window. */
static float penalized(const kiln_sampler_params *p, float l, int count) {
    l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
    return l - ((float)count * p->frequency_penalty + p->presence_penalty);
}

static void apply_penalties(kiln_sampler *s) {
    const kiln_sampler_params *p = &s->p;
    if (!has_penalties(p)) return;
    for (int i = 0; i < s->history_len; i++) {
        int32_t t = s->history[i];
        if (s->counts[t] <= 0) continue;
        s->logits[t] = penalized(p, s->logits[t], s->counts[t]);
        s->counts[t] = -s->counts[t]; /* mark as done: a token repeated in the window is penalized once */
    }
    for (int i = 0; i < s->history_len; i++)
        if (s->counts[s->history[i]] < 0) s->counts[s->history[i]] = -s->counts[s->history[i]];
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int by_logit_desc(const void *a, const void *b) {
    float x = ((const candidate *)a)->logit, y = ((const candidate *)b)->logit;
    if (x != y) return x < y ? 1 : -1;
    return ((const candidate *)a)->id - ((const candidate *)b)->id; /* ties: lower id first, for determinism */
}

/* Moves the k largest candidates to the front, sorted (quickselect, then a sort of the k). */
static void partial_sort(candidate *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        candidate pivot = c[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (by_logit_desc(&c[i], &pivot) < 0) i++;
            while (by_logit_desc(&c[j], &pivot) > 0) j--;
            if (i <= j) {
                candidate t = c[i];
                c[i++] = c[j];
                c[j--] = t;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
    qsort(c, (size_t)k, sizeof *c, by_logit_desc);
}

static void sift_down(candidate *heap, int k, int i) {
    for (;;) {
        int worst = i, l = 2 * i + 1, r = l + 1;
        if (l < k && by_logit_desc(&heap[l], &heap[worst]) > 0) worst = l;
        if (r < k && by_logit_desc(&heap[r], &heap[worst]) > 0) worst = r;
        if (worst == i) return;
        candidate t = heap[i];
        heap[i] = heap[worst];
        heap[worst] = t;
        i = worst;
    }
}

/* The k best of n logits (k <= n; token ids[i], or i where ids is NULL) into c[0..k), sorted, in one pass that keeps
 * them in a heap whose root is the worst kept: for a vocabulary of 150k and k = 40 nearly every logit costs one
 * comparison, against partitioning all n candidates. Same set and order as partial_sort (the same total order, ties
 * by id). */
static void top_k_select(const float *logits, const int32_t *ids, int n, int k, candidate *c) {
    for (int i = 0; i < k; i++) c[i] = (candidate){ids ? ids[i] : i, logits[i]};
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(c, k, i);
    for (int i = k; i < n; i++) {
        candidate x = {ids ? ids[i] : i, logits[i]};
        if (by_logit_desc(&x, &c[0]) >= 0) continue;
        c[0] = x;
        sift_down(c, k, 0);
    }
    qsort(c, (size_t)k, sizeof *c, by_logit_desc);
}

/* Fills the top-N alternatives and the chosen token's log-probability from the penalized logits. */
static void fill_info(kiln_sampler *s, int32_t token, kiln_sample_info *info) {
    int n = s->n_vocab;
    float max = s->logits[argmax(s->logits, n)];
    double sum = 0;
    for (int i = 0; i < n; i++) sum += expf(s->logits[i] - max);
    float log_z = max + (float)log(sum);
    info->token = token;
    info->logprob = s->logits[token] - log_z;
    info->n_top = s->p.n_top_logprobs;
    if (!info->n_top) return;
    for (int i = 0; i < n; i++) s->cand[i] = (candidate){i, s->logits[i]};
    partial_sort(s->cand, n, info->n_top);
    for (int i = 0; i < info->n_top; i++) {
        info->top_tokens[i] = s->cand[i].id;
        info->top_logprobs[i] = s->cand[i].logit - log_z;
    }
}

/* Candidates top-k keeps of a vocabulary of n (all of them when it is off). */
static int top_k_keeps(const kiln_sampler_params *p, int n) { return p->top_k > 0 && p->top_k < n ? p->top_k : n; }

/* top-p and min-p over the whole vocabulary (top-k off), in s->cand: the total mass in the vocabulary's order, then
 * a growing prefix sorted until it holds the top-p mass (or everything). As in the reference chain, temperature 1. */
static int truncate_vocabulary(kiln_sampler *s, const float *logits) {
    const kiln_draw_params *p = &s->draw;
    int n = s->n_vocab;
    for (int i = 0; i < n; i++) s->cand[i] = (candidate){i, logits[i]};
    float max = logits[argmax(logits, n)];
    double total = 0;
    for (int i = 0; i < n; i++) total += (double)kiln_draw_expf(logits[i] - max);
    int keep = n, sorted = 64 < n ? 64 : n;
    for (;;) {
        partial_sort(s->cand, n, sorted);
        double mass = 0;
        int cut = sorted;
        for (int i = 0; i < sorted; i++) {
            mass += (double)kiln_draw_expf(s->cand[i].logit - max);
            if (p->top_p < 1.0f && mass >= (double)p->top_p * total) {
                cut = i + 1;
                break;
            }
        }
        if (cut < sorted || sorted == n) {
            keep = cut;
            break;
        }
        sorted = sorted * 4 < n ? sorted * 4 : n;
    }
    float floor_logit = max + p->log_min_p;
    int m = 1;
    while (m < keep && s->cand[m].logit >= floor_logit) m++;
    return m;
}

/* top-k, top-p, min-p (probabilities at temperature 1, as the reference chain has temperature last); returns how
 * many of the ranked candidates in s->cand survive. As in the reference chain, top-p takes its share of the mass of
 * what top-k kept (renormalized), not of the whole vocabulary. The logits are the whole vocabulary's (ids NULL) or,
 * with top-k on, n_logits of them that hold its top_k best (ids). With top-k on, the steps are draw.h's, which a
 * GPU sampling on its own takes too (kiln_sampler_device_draw). */
static int truncate_candidates(kiln_sampler *s, const float *logits, const int32_t *ids, int n_logits) {
    int keep = top_k_keeps(&s->p, s->n_vocab);
    if (keep == s->n_vocab) return truncate_vocabulary(s, logits);
    top_k_select(logits, ids, n_logits, keep, s->cand);
    for (int i = 0; i < keep; i++) s->ranked[i] = s->cand[i].logit;
    for (int i = 0; i < keep; i++) s->weights[i] = kiln_draw_weight(s->ranked, i);
    return kiln_draw_keep(s->ranked, s->weights, keep, &s->draw);
}

/* The draw at the temperature from the keep candidates truncate_candidates left. */
static int32_t draw(kiln_sampler *s, int keep) {
    for (int i = 0; i < keep; i++) s->ranked[i] = s->cand[i].logit;
    for (int i = 0; i < keep; i++) s->weights[i] = kiln_draw_tempered(s->ranked, i, &s->draw);
    return s->cand[kiln_draw_index(s->weights, keep, kiln_rng_uniform(&s->rng))].id;
}

int32_t kiln_sampler_sample(kiln_sampler *s, const float *logits, kiln_sample_info *info) {
    memcpy(s->logits, logits, sizeof *logits * (size_t)s->n_vocab);
    apply_penalties(s);
    int32_t token;
    if (s->p.temperature <= 0.0f) {
        token = argmax(s->logits, s->n_vocab);
    } else {
        token = draw(s, truncate_candidates(s, s->logits, NULL, s->n_vocab));
    }
    if (info) fill_info(s, token, info);
    return token;
}

int kiln_sampler_candidates_wanted(const kiln_sampler *s, int max_k, int32_t *window, int *n_window) {
    const kiln_sampler_params *p = &s->p;
    *n_window = 0;
    int k = p->temperature <= 0.0f ? 1 : top_k_keeps(p, s->n_vocab);
    if (p->n_top_logprobs > 0 || k >= s->n_vocab) return 0;
    bool room = true;
    if (has_penalties(p))
        for (int i = 0; i < s->history_len && room; i++) {
            int32_t t = s->history[i];
            bool seen = false;
            for (int j = 0; j < *n_window && !seen; j++) seen = window[j] == t;
            if (seen) continue;
            room = k + *n_window < max_k;
            if (room) window[(*n_window)++] = t;
        }
    k += *n_window;
    if (room && k <= max_k && k <= s->n_vocab) return k;
    *n_window = 0;
    return 0;
}

int32_t kiln_sampler_sample_candidates(kiln_sampler *s, const int32_t *ids, const float *logits, int n_best,
                                       const int32_t *window, const float *window_logits, int n_window) {
    /* the union, penalized: ids first, then the window's tokens not among them */
    int32_t *uid = s->cand_ids;
    float *ul = s->logits;
    int n = 0;
    for (int i = 0; i < n_best; i++) uid[n] = ids[i], ul[n++] = logits[i];
    for (int i = 0; i < n_window; i++) {
        bool seen = false;
        for (int j = 0; j < n_best && !seen; j++) seen = ids[j] == window[i];
        if (!seen) uid[n] = window[i], ul[n++] = window_logits[i];
    }
    if (has_penalties(&s->p))
        for (int i = 0; i < n; i++)
            if (s->counts[uid[i]] > 0) ul[i] = penalized(&s->p, ul[i], s->counts[uid[i]]);
    if (s->p.temperature <= 0.0f) {
        top_k_select(ul, uid, n, 1, s->cand);
        return s->cand[0].id;
    }
    return draw(s, truncate_candidates(s, ul, uid, n));
}

int kiln_sampler_device_draw(const kiln_sampler *s, int max_k, kiln_draw_params *p) {
    const kiln_sampler_params *sp = &s->p;
    if (sp->temperature <= 0.0f || sp->n_top_logprobs > 0 || has_penalties(sp)) return 0;
    int k = top_k_keeps(sp, s->n_vocab);
    if (k >= s->n_vocab || k > max_k) return 0;
    *p = s->draw;
    return k;
}

void kiln_sampler_get_rng(const kiln_sampler *s, uint64_t state[4]) { memcpy(state, s->rng.s, sizeof s->rng.s); }

void kiln_sampler_set_rng(kiln_sampler *s, const uint64_t state[4]) { memcpy(s->rng.s, state, sizeof s->rng.s); }

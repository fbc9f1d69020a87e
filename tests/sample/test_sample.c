/* The sampling chain: greedy, truncations, penalties, seeded reproducibility, the drawn distribution, logprobs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "sample/rng.h"
#include "sample/sample.h"

enum { V = 1000 };

static void ramp(float *logits) {
    for (int i = 0; i < V; i++) logits[i] = (float)((i * 37) % V) / 100.0f; /* max at id 27: 37*27 = 999 */
}

static kiln_sampler *make(kiln_sampler_params p) {
    kiln_sampler *s;
    kiln_error err;
    assert_int_equal(kiln_sampler_new(&p, V, &s, &err), 0);
    return s;
}

static void test_greedy_and_degenerate_truncations_pick_argmax(void **state) {
    (void)state;
    float logits[V];
    ramp(logits);
    kiln_sampler_params p = kiln_sampler_default_params();
    p.temperature = 0;
    kiln_sampler *s = make(p);
    assert_int_equal(kiln_sampler_sample(s, logits, NULL), 27);
    kiln_sampler_free(s);
    p = kiln_sampler_default_params();
    p.temperature = 5.0f;
    p.top_k = 1;
    s = make(p);
    for (int i = 0; i < 50; i++) assert_int_equal(kiln_sampler_sample(s, logits, NULL), 27);
    kiln_sampler_free(s);
    p.top_k = 0;
    p.top_p = 1e-6f;
    s = make(p);
    for (int i = 0; i < 50; i++) assert_int_equal(kiln_sampler_sample(s, logits, NULL), 27);
    kiln_sampler_free(s);
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    s = make(p);
    for (int i = 0; i < 50; i++) assert_int_equal(kiln_sampler_sample(s, logits, NULL), 27);
    kiln_sampler_free(s);
}

static void test_same_seed_same_tokens(void **state) {
    (void)state;
    float logits[V];
    ramp(logits);
    kiln_sampler_params p = kiln_sampler_default_params();
    p.temperature = 1.5f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 1234;
    kiln_sampler *a = make(p), *b = make(p);
    int32_t first[64];
    int differ = 0;
    for (int i = 0; i < 64; i++) {
        first[i] = kiln_sampler_sample(a, logits, NULL);
        assert_int_equal(first[i], kiln_sampler_sample(b, logits, NULL));
        differ += first[i] != first[0];
    }
    assert_true(differ > 0); /* it does sample */
    kiln_sampler_reset(a);
    for (int i = 0; i < 64; i++) assert_int_equal(kiln_sampler_sample(a, logits, NULL), first[i]);
    kiln_sampler_free(a);
    kiln_sampler_free(b);
}

static void test_draws_follow_the_distribution(void **state) {
    (void)state;
    float logits[V];
    for (int i = 0; i < V; i++) logits[i] = -INFINITY;
    logits[3] = logf(0.5f);
    logits[7] = logf(0.3f);
    logits[9] = logf(0.2f);
    kiln_sampler_params p = kiln_sampler_default_params();
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 7;
    kiln_sampler *s = make(p);
    int counts[V] = {0};
    enum { N = 20000 };
    for (int i = 0; i < N; i++) counts[kiln_sampler_sample(s, logits, NULL)]++;
    assert_true(fabs(counts[3] / (double)N - 0.5) < 0.02);
    assert_true(fabs(counts[7] / (double)N - 0.3) < 0.02);
    assert_true(fabs(counts[9] / (double)N - 0.2) < 0.02);
    kiln_sampler_free(s);

    /* top-p 0.7 keeps {3, 7}: 0.5 alone is short of 0.7 */
    p.top_p = 0.7f;
    s = make(p);
    for (int i = 0; i < 2000; i++) assert_int_not_equal(kiln_sampler_sample(s, logits, NULL), 9);
    kiln_sampler_free(s);
    /* min-p 0.5 drops 9 (0.2 < 0.5 * 0.5) */
    p.top_p = 1.0f;
    p.min_p = 0.5f;
    s = make(p);
    for (int i = 0; i < 2000; i++) assert_int_not_equal(kiln_sampler_sample(s, logits, NULL), 9);
    kiln_sampler_free(s);
    /* top-p after top-k takes its share of what top-k kept, renormalized (the reference chain's order): top-k 2
     * keeps {3, 7} as 0.625 and 0.375, so top-p 0.6 keeps 3 alone (of the whole vocabulary, 0.5 would fall short) */
    p.min_p = 0.0f;
    p.top_k = 2;
    p.top_p = 0.6f;
    s = make(p);
    for (int i = 0; i < 2000; i++) assert_int_equal(kiln_sampler_sample(s, logits, NULL), 3);
    kiln_sampler_free(s);
}

static void test_penalties_push_away_from_recent_tokens(void **state) {
    (void)state;
    float logits[V] = {0};
    logits[5] = 2.0f;
    logits[6] = 1.5f;
    kiln_sampler_params p = kiln_sampler_default_params();
    p.temperature = 0;
    p.repeat_penalty = 1.5f; /* 2.0 / 1.5 < 1.5 */
    kiln_sampler *s = make(p);
    assert_int_equal(kiln_sampler_sample(s, logits, NULL), 5);
    kiln_sampler_accept(s, 5);
    assert_int_equal(kiln_sampler_sample(s, logits, NULL), 6);
    kiln_sampler_free(s);

    p.repeat_penalty = 1.0f;
    p.frequency_penalty = 0.3f;
    p.repeat_last_n = 2;
    s = make(p);
    kiln_sampler_accept(s, 5); /* 2.0 - 0.3 > 1.5 */
    assert_int_equal(kiln_sampler_sample(s, logits, NULL), 5);
    kiln_sampler_accept(s, 5); /* 2.0 - 0.6 < 1.5 */
    assert_int_equal(kiln_sampler_sample(s, logits, NULL), 6);
    kiln_sampler_accept(s, 1);
    kiln_sampler_accept(s, 2); /* both 5s left the window of 2 */
    assert_int_equal(kiln_sampler_sample(s, logits, NULL), 5);
    kiln_sampler_free(s);

    p.frequency_penalty = 0;
    p.presence_penalty = 1.0f;
    p.repeat_last_n = -1;
    s = make(p);
    kiln_sampler_accept(s, 5);
    assert_int_equal(kiln_sampler_sample(s, logits, NULL), 6);
    kiln_sampler_free(s);
}

static void test_logprobs_and_top_alternatives(void **state) {
    (void)state;
    float logits[V] = {0};
    logits[10] = 3.0f;
    logits[20] = 2.0f;
    logits[30] = 1.0f;
    double z = exp(3.0) + exp(2.0) + exp(1.0) + (V - 3);
    kiln_sampler_params p = kiln_sampler_default_params();
    p.temperature = 0;
    p.n_top_logprobs = 3;
    kiln_sampler *s = make(p);
    kiln_sample_info info;
    assert_int_equal(kiln_sampler_sample(s, logits, &info), 10);
    assert_true(fabs(info.logprob - (3.0 - log(z))) < 1e-4);
    assert_int_equal(info.n_top, 3);
    int32_t want[3] = {10, 20, 30};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(info.top_tokens[i], want[i]);
        assert_true(fabs(info.top_logprobs[i] - (3.0 - i - log(z))) < 1e-4);
    }
    kiln_sampler_free(s);
    kiln_error err;
    p.n_top_logprobs = KILN_MAX_TOP_LOGPROBS + 1;
    assert_int_equal(kiln_sampler_new(&p, V, &s, &err), -1);
    p.n_top_logprobs = 0;
    p.top_p = 0;
    assert_int_equal(kiln_sampler_new(&p, V, &s, &err), -1);
}

/* The row's k best by (logit desc, id asc): what the GPU's top-k hands the sampler. */
static int by_rank(const void *a, const void *b, const float *logits) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (logits[x] != logits[y]) return logits[x] < logits[y] ? 1 : -1;
    return x - y;
}

static const float *rank_logits;
static int by_rank_qsort(const void *a, const void *b) { return by_rank(a, b, rank_logits); }

static void best_k(const float *logits, int k, int32_t *ids, float *vals) {
    static int32_t order[V];
    for (int i = 0; i < V; i++) order[i] = i;
    rank_logits = logits;
    qsort(order, V, sizeof *order, by_rank_qsort);
    for (int i = 0; i < k; i++) ids[i] = order[i], vals[i] = logits[order[i]];
}

/* Sampling from the candidates the sampler asks for gives the token sampling from the whole row gives, draw for
 * draw, through every truncation, greedy, and penalties that push tokens out of (or into) the best k. Logits on a
 * coarse grid, so ties at the cut are common. */
static void test_candidates_match_the_whole_row(void **state) {
    (void)state;
    kiln_sampler_params cases[8];
    for (int c = 0; c < 8; c++) cases[c] = kiln_sampler_default_params(), cases[c].seed = 1234 + (uint64_t)c;
    cases[1].temperature = 0, cases[1].repeat_penalty = 1.3f;
    cases[2].top_k = 5, cases[2].top_p = 0.5f;
    cases[3].top_k = 200, cases[3].min_p = 0, cases[3].top_p = 1.0f, cases[3].temperature = 2.0f;
    cases[4].repeat_penalty = 1.5f, cases[4].repeat_last_n = 16;
    cases[5].repeat_penalty = 0.7f, cases[5].presence_penalty = -0.5f; /* penalties that raise logits */
    cases[6].frequency_penalty = 0.4f, cases[6].presence_penalty = 0.3f, cases[6].top_k = 1;
    cases[7].temperature = 0;
    float logits[V], vals[V], wvals[V];
    int32_t ids[V], window[V];
    srand(7);
    for (int c = 0; c < 8; c++) {
        kiln_sampler *whole = make(cases[c]), *cand = make(cases[c]);
        int used = 0;
        for (int step = 0; step < 300; step++) {
            for (int i = 0; i < V; i++) logits[i] = (float)(rand() % 40) / 8.0f;
            int n_window, k = kiln_sampler_candidates_wanted(cand, 256, window, &n_window);
            assert_true(k > 0);
            best_k(logits, k, ids, vals);
            for (int i = 0; i < n_window; i++) wvals[i] = logits[window[i]];
            int32_t a = kiln_sampler_sample(whole, logits, NULL);
            int32_t b = kiln_sampler_sample_candidates(cand, ids, vals, k, window, wvals, n_window);
            assert_int_equal(a, b);
            used += n_window > 0;
            kiln_sampler_accept(whole, a), kiln_sampler_accept(cand, b);
        }
        bool penalties = cases[c].repeat_penalty != 1.0f || cases[c].presence_penalty || cases[c].frequency_penalty;
        assert_true(penalties ? used > 0 : used == 0);
        kiln_sampler_free(whole), kiln_sampler_free(cand);
    }
    /* the whole row is needed for log-probabilities and for a temperature without top-k; a window past max_k */
    kiln_sampler_params p = kiln_sampler_default_params();
    int n_window;
    p.n_top_logprobs = 2;
    kiln_sampler *s = make(p);
    assert_int_equal(kiln_sampler_candidates_wanted(s, 256, window, &n_window), 0);
    kiln_sampler_free(s);
    p = kiln_sampler_default_params(), p.top_k = 0;
    s = make(p);
    assert_int_equal(kiln_sampler_candidates_wanted(s, 256, window, &n_window), 0);
    kiln_sampler_free(s);
    p = kiln_sampler_default_params(), p.repeat_penalty = 1.1f;
    s = make(p);
    for (int i = 0; i < 64; i++) kiln_sampler_accept(s, i);
    assert_int_equal(kiln_sampler_candidates_wanted(s, 100, window, &n_window), 0);
    assert_int_equal(kiln_sampler_candidates_wanted(s, 104, window, &n_window), 104);
    assert_int_equal(n_window, 64);
    kiln_sampler_free(s);
}

/* draw.h's exp, the same bits on the host and the GPU, against the C library's in double: within 2 ulp over the
 * range the sampler uses (x <= 0), 0 below it, NaN kept. */
static void test_draw_exp_is_accurate(void **state) {
    (void)state;
    double worst = 0;
    for (int i = 0; i <= 1000000; i++) {
        float x = -103.9f * (float)i / 1000000.0f;
        double want = exp((double)x), got = (double)kiln_draw_expf(x);
        if (want < 1.1754944e-38) { /* subnormal results: within 2 of the least step */
            assert_true(fabs(got - want) <= 2 * 1.4012985e-45);
            continue;
        }
        double ulps = fabs(got - want) / (double)(nextafterf((float)want, INFINITY) - (float)want);
        if (ulps > worst) worst = ulps;
    }
    assert_true(worst <= 2.0);
    assert_true(kiln_draw_expf(0.0f) == 1.0f);
    assert_true(kiln_draw_expf(-200.0f) == 0.0f && kiln_draw_expf(-INFINITY) == 0.0f);
    assert_true(isnan(kiln_draw_expf(NAN)));
}

/* What a GPU that draws by itself does (draw.h's steps on the k best, the PRNG state handed over and back) gives
 * the host sampler's token and leaves its PRNG where the host's would be; the configurations that need the host are
 * refused. */
static void test_device_draw_matches_the_host(void **state) {
    (void)state;
    kiln_sampler_params p = kiln_sampler_default_params();
    p.seed = 99, p.top_k = 50, p.top_p = 0.9f, p.min_p = 0.02f, p.temperature = 0.7f;
    kiln_sampler *host = make(p), *dev = make(p);
    kiln_draw_params dp;
    int k = kiln_sampler_device_draw(dev, 256, &dp);
    assert_int_equal(k, 50);
    float logits[V], vals[V], w[V];
    int32_t ids[V];
    srand(11);
    for (int step = 0; step < 500; step++) {
        for (int i = 0; i < V; i++) logits[i] = (float)(rand() % 64) / 9.0f;
        best_k(logits, k, ids, vals);
        kiln_rng rng;
        kiln_sampler_get_rng(dev, rng.s);
        for (int i = 0; i < k; i++) w[i] = kiln_draw_weight(vals, i);
        int keep = kiln_draw_keep(vals, w, k, &dp);
        for (int i = 0; i < keep; i++) w[i] = kiln_draw_tempered(vals, i, &dp);
        int32_t drawn = ids[kiln_draw_index(w, keep, kiln_rng_uniform(&rng))];
        kiln_sampler_set_rng(dev, rng.s);
        assert_int_equal(drawn, kiln_sampler_sample(host, logits, NULL));
    }
    uint64_t a[4], b[4];
    kiln_sampler_get_rng(host, a), kiln_sampler_get_rng(dev, b);
    assert_memory_equal(a, b, sizeof a);
    kiln_sampler_free(host), kiln_sampler_free(dev);
    kiln_sampler_params refused[5];
    for (int i = 0; i < 5; i++) refused[i] = kiln_sampler_default_params();
    refused[0].temperature = 0, refused[1].top_k = 0, refused[2].top_k = 300, refused[3].repeat_penalty = 1.1f;
    refused[4].n_top_logprobs = 1;
    for (int i = 0; i < 5; i++) {
        kiln_sampler *s = make(refused[i]);
        assert_int_equal(kiln_sampler_device_draw(s, 256, &dp), 0);
        kiln_sampler_free(s);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_degenerate_truncations_pick_argmax),
        cmocka_unit_test(test_same_seed_same_tokens),
        cmocka_unit_test(test_draws_follow_the_distribution),
        cmocka_unit_test(test_penalties_push_away_from_recent_tokens),
        cmocka_unit_test(test_logprobs_and_top_alternatives),
        cmocka_unit_test(test_candidates_match_the_whole_row),
        cmocka_unit_test(test_draw_exp_is_accurate),
        cmocka_unit_test(test_device_draw_matches_the_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

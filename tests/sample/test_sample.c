/* The sampling chain: greedy, truncations, penalties, seeded reproducibility, the drawn distribution, logprobs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_degenerate_truncations_pick_argmax),
        cmocka_unit_test(test_same_seed_same_tokens),
        cmocka_unit_test(test_draws_follow_the_distribution),
        cmocka_unit_test(test_penalties_push_away_from_recent_tokens),
        cmocka_unit_test(test_logprobs_and_top_alternatives),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

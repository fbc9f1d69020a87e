/* The ops table: every float and 32-element block type has complete scalar ops at every ISA, SIMD levels fall
 * back function by function, and KILN_ISA lowers the ISA (read once, at the first call). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "quant/quant.h"

static const kiln_type TYPES[] = {KILN_TYPE_F32,  KILN_TYPE_F16,  KILN_TYPE_BF16, KILN_TYPE_Q4_0, KILN_TYPE_Q4_1,
                                  KILN_TYPE_Q5_0, KILN_TYPE_Q5_1, KILN_TYPE_Q8_0, KILN_TYPE_Q8_1};
#define N_TYPES ((int)(sizeof TYPES / sizeof TYPES[0]))

static void test_ops_complete_at_every_isa(void **state) {
    (void)state;
    for (int isa = KILN_ISA_SCALAR; isa <= KILN_ISA_AVX512; isa++) {
        for (int i = 0; i < N_TYPES; i++) {
            const kiln_quant_ops *ops = kiln_quant_ops_get(TYPES[i], (kiln_isa)isa);
            assert_non_null(ops);
            assert_non_null(ops->dequantize);
            assert_non_null(ops->quantize);
            if (TYPES[i] == KILN_TYPE_Q8_1) {
                assert_null(ops->vec_dot); /* an activation format only */
            } else {
                assert_non_null(ops->vec_dot);
            }
            assert_int_equal(ops->vec_dot_type, kiln_quant_ops_get(TYPES[i], KILN_ISA_SCALAR)->vec_dot_type);
        }
    }
}

static void test_vec_dot_types(void **state) {
    (void)state;
    assert_int_equal(kiln_quant_ops_best(KILN_TYPE_Q4_0)->vec_dot_type, KILN_TYPE_Q8_0);
    assert_int_equal(kiln_quant_ops_best(KILN_TYPE_Q5_0)->vec_dot_type, KILN_TYPE_Q8_0);
    assert_int_equal(kiln_quant_ops_best(KILN_TYPE_Q8_0)->vec_dot_type, KILN_TYPE_Q8_0);
    assert_int_equal(kiln_quant_ops_best(KILN_TYPE_Q4_1)->vec_dot_type, KILN_TYPE_Q8_1);
    assert_int_equal(kiln_quant_ops_best(KILN_TYPE_Q5_1)->vec_dot_type, KILN_TYPE_Q8_1);
    assert_int_equal(kiln_quant_ops_best(KILN_TYPE_F16)->vec_dot_type, KILN_TYPE_F32);
    assert_int_equal(kiln_quant_ops_best(KILN_TYPE_BF16)->vec_dot_type, KILN_TYPE_F32);
}

/* Functions a level leaves out come from the level below: no SIMD family quantizes, so all share the scalar one. */
static void test_fallback_per_function(void **state) {
    (void)state;
    const kiln_quant_ops *scalar = kiln_quant_ops_get(KILN_TYPE_Q4_0, KILN_ISA_SCALAR);
    const kiln_quant_ops *best = kiln_quant_ops_get(KILN_TYPE_Q4_0, KILN_ISA_AVX512);
    assert_ptr_equal(best->quantize, scalar->quantize);
    assert_ptr_equal(kiln_quant_ops_get(KILN_TYPE_F32, KILN_ISA_AVX512)->dequantize,
                     kiln_quant_ops_get(KILN_TYPE_F32, KILN_ISA_SCALAR)->dequantize);
}

static void test_unknown_types_and_isas(void **state) {
    (void)state;
    assert_null(kiln_quant_ops_get(KILN_TYPE_I32, KILN_ISA_SCALAR));
    assert_null(kiln_quant_ops_get((kiln_type)39, KILN_ISA_SCALAR));
    assert_null(kiln_quant_ops_get((kiln_type)1000, KILN_ISA_SCALAR));
    assert_null(kiln_quant_ops_get(KILN_TYPE_Q4_0, (kiln_isa)7));
    assert_string_equal(kiln_isa_name(KILN_ISA_AVX2), "avx2");
}

/* KILN_ISA=scalar makes the best ops the scalar ones; explicit ISAs stay reachable for tests and benchmarks. */
static void test_env_override_lowers_isa(void **state) {
    (void)state;
    assert_int_equal(kiln_cpu_isa(), KILN_ISA_SCALAR);
    for (int i = 0; i < N_TYPES; i++)
        assert_ptr_equal(kiln_quant_ops_best(TYPES[i]), kiln_quant_ops_get(TYPES[i], KILN_ISA_SCALAR));
}

int main(void) {
    setenv("KILN_ISA", "scalar", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_complete_at_every_isa), cmocka_unit_test(test_vec_dot_types),
        cmocka_unit_test(test_fallback_per_function),     cmocka_unit_test(test_unknown_types_and_isas),
        cmocka_unit_test(test_env_override_lowers_isa),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

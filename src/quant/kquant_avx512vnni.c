/* k-quant dot products with AVX512-VNNI (vpdpbusd, vpdpwssd): the kernels of kquant_avx512_dot.h built with
 * KQUANT_AVX512_VNNI. quant.c uses them only where cpuid reports VNNI; dequantize comes from kquant_avx512.c. */
#define KQUANT_AVX512_VNNI 1
#include "quant/kquant_avx512_dot.h"

static const kiln_quant_entry VNNI_ENTRIES[] = {
    {KILN_TYPE_Q2_K, {NULL, NULL, vec_dot_q2_K, KILN_TYPE_Q8_K, vec_dot_rows_q2_K}},
    {KILN_TYPE_Q3_K, {NULL, NULL, vec_dot_q3_K, KILN_TYPE_Q8_K, vec_dot_rows_q3_K}},
    {KILN_TYPE_Q4_K, {NULL, NULL, vec_dot_q4_K, KILN_TYPE_Q8_K, vec_dot_rows_q4_K}},
    {KILN_TYPE_Q5_K, {NULL, NULL, vec_dot_q5_K, KILN_TYPE_Q8_K, vec_dot_rows_q5_K}},
    {KILN_TYPE_Q6_K, {NULL, NULL, vec_dot_q6_K, KILN_TYPE_Q8_K, vec_dot_rows_q6_K}},
};

const kiln_quant_family kiln_kquant_avx512_vnni_family = {
    "kquant_avx512_vnni", KILN_LEVEL_AVX512_VNNI, VNNI_ENTRIES, (int)(sizeof VNNI_ENTRIES / sizeof VNNI_ENTRIES[0])};

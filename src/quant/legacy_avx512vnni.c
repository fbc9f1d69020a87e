/* Dot products of the 32-element block formats with AVX512-VNNI (vpdpbusd): the kernels of legacy_avx512_dot.h
 * built with LEGACY_AVX512_VNNI. quant.c uses them only where cpuid reports VNNI; dequantize and quantize come from
 * legacy_avx512.c. */
#define LEGACY_AVX512_VNNI 1
#include "quant/legacy_avx512_dot.h"

static const kiln_quant_entry VNNI_ENTRIES[] = {
    {KILN_TYPE_Q4_0, {NULL, NULL, vec_dot_q4_0_q8_0, KILN_TYPE_Q8_0, vec_dot_q4_0_q8_0_rows}},
    {KILN_TYPE_Q4_1, {NULL, NULL, vec_dot_q4_1_q8_1, KILN_TYPE_Q8_1, vec_dot_q4_1_q8_1_rows}},
    {KILN_TYPE_Q5_0, {NULL, NULL, vec_dot_q5_0_q8_0, KILN_TYPE_Q8_0, vec_dot_q5_0_q8_0_rows}},
    {KILN_TYPE_Q5_1, {NULL, NULL, vec_dot_q5_1_q8_1, KILN_TYPE_Q8_1, vec_dot_q5_1_q8_1_rows}},
    {KILN_TYPE_Q8_0, {NULL, NULL, vec_dot_q8_0_q8_0, KILN_TYPE_Q8_0, vec_dot_q8_0_q8_0_rows}},
};

const kiln_quant_family kiln_legacy_avx512_vnni_family = {
    "legacy_avx512_vnni", KILN_LEVEL_AVX512_VNNI, VNNI_ENTRIES, (int)(sizeof VNNI_ENTRIES / sizeof VNNI_ENTRIES[0])};

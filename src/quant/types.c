#include "quant/types.h"

#include <strings.h>

#include "quant/blocks.h"

static const kiln_type_traits TRAITS[KILN_TYPE_COUNT] = {
    [KILN_TYPE_F32] = {"f32", 1, 4, true},
    [KILN_TYPE_F16] = {"f16", 1, 2, true},
    [KILN_TYPE_Q4_0] = {"q4_0", QK4_0, sizeof(block_q4_0), true},
    [KILN_TYPE_Q4_1] = {"q4_1", QK4_1, sizeof(block_q4_1), true},
    [KILN_TYPE_Q5_0] = {"q5_0", QK5_0, sizeof(block_q5_0), true},
    [KILN_TYPE_Q5_1] = {"q5_1", QK5_1, sizeof(block_q5_1), true},
    [KILN_TYPE_Q8_0] = {"q8_0", QK8_0, sizeof(block_q8_0), true},
    [KILN_TYPE_Q8_1] = {"q8_1", QK8_1, sizeof(block_q8_1), true},
    [KILN_TYPE_Q2_K] = {"q2_K", QK_K, sizeof(block_q2_K), true},
    [KILN_TYPE_Q3_K] = {"q3_K", QK_K, sizeof(block_q3_K), true},
    [KILN_TYPE_Q4_K] = {"q4_K", QK_K, sizeof(block_q4_K), true},
    [KILN_TYPE_Q5_K] = {"q5_K", QK_K, sizeof(block_q5_K), true},
    [KILN_TYPE_Q6_K] = {"q6_K", QK_K, sizeof(block_q6_K), true},
    [KILN_TYPE_Q8_K] = {"q8_K", QK_K, sizeof(block_q8_K), true},
    [KILN_TYPE_I8] = {"i8", 1, 1, false},
    [KILN_TYPE_I16] = {"i16", 1, 2, false},
    [KILN_TYPE_I32] = {"i32", 1, 4, false},
    [KILN_TYPE_I64] = {"i64", 1, 8, false},
    [KILN_TYPE_F64] = {"f64", 1, 8, false},
    [KILN_TYPE_BF16] = {"bf16", 1, 2, true},
};

const kiln_type_traits *kiln_type_get(uint32_t type) {
    if (type >= KILN_TYPE_COUNT || TRAITS[type].name == NULL) return NULL;
    return &TRAITS[type];
}

const char *kiln_type_name(uint32_t type) {
    const kiln_type_traits *t = kiln_type_get(type);
    return t ? t->name : "unknown";
}

size_t kiln_row_size(kiln_type type, int64_t n) {
    const kiln_type_traits *t = kiln_type_get(type);
    return (size_t)(n / t->block_size) * t->type_size;
}

int kiln_type_from_name(const char *name) {
    for (int i = 0; i < KILN_TYPE_COUNT; i++)
        if (TRAITS[i].name && strcasecmp(TRAITS[i].name, name) == 0) return i;
    return -1;
}

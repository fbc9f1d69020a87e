/* Which type each tensor gets, after llama.cpp's llama_tensor_get_type for the presets kiln offers:
 *  - 1-D tensors (norms, biases, rope_freqs) are F32;
 *  - the output tensor (token_embd when there is no output.weight) is Q6_K for every quantized preset except q8_0,
 *    or Q8_0 when its row length is not a multiple of the base type's block size;
 *  - q4_k_m / q5_k_m: attn_v.weight and ffn_down.weight of the layers use_more_bits() picks are Q6_K;
 *  - a row length that is not a multiple of the chosen type's block size falls back: Q2_K/Q3_K → Q4_0
 *    (llama.cpp uses IQ4_NL, which kiln does not write), Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, and anything
 *    still not fitting → F16. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "format/quantize.h"

/* LLAMA_FTYPE_* values llama.cpp stores in general.file_type */
static const kiln_quant_preset PRESETS[] = {
    {"f32", KILN_TYPE_F32, 0, false},     {"f16", KILN_TYPE_F16, 1, false},     {"bf16", KILN_TYPE_BF16, 32, false},
    {"q8_0", KILN_TYPE_Q8_0, 7, false},   {"q4_0", KILN_TYPE_Q4_0, 2, false},   {"q4_1", KILN_TYPE_Q4_1, 3, false},
    {"q5_0", KILN_TYPE_Q5_0, 8, false},   {"q5_1", KILN_TYPE_Q5_1, 9, false},   {"q2_k", KILN_TYPE_Q2_K, 10, false},
    {"q3_k", KILN_TYPE_Q3_K, 11, false},  {"q4_k", KILN_TYPE_Q4_K, 14, false},  {"q5_k", KILN_TYPE_Q5_K, 16, false},
    {"q6_k", KILN_TYPE_Q6_K, 18, false},  {"q4_k_m", KILN_TYPE_Q4_K, 15, true}, {"q5_k_m", KILN_TYPE_Q5_K, 17, true},
};
#define N_PRESETS (sizeof PRESETS / sizeof PRESETS[0])

const kiln_quant_preset *kiln_quant_preset_find(const char *name) {
    for (size_t i = 0; i < N_PRESETS; i++)
        if (!strcasecmp(PRESETS[i].name, name)) return &PRESETS[i];
    return NULL;
}

const char *kiln_quant_preset_names(void) {
    return "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, q4_k_m, q5_k_m";
}

static bool is_quantized(kiln_type t) { return t != KILN_TYPE_F32 && t != KILN_TYPE_F16 && t != KILN_TYPE_BF16; }

static int64_t block_size(kiln_type t) { return kiln_type_get(t)->block_size; }

/* llama.cpp's choice of layers that get more bits: the first and last eighth, and every third one between. */
static bool use_more_bits(int64_t i_layer, int64_t n_layer) {
    return i_layer < n_layer / 8 || i_layer >= 7 * n_layer / 8 || (i_layer - n_layer / 8) % 3 == 2;
}

static bool has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static kiln_type fallback(kiln_type t, int64_t row) {
    if (row % block_size(t) == 0) return t;
    switch (t) {
    case KILN_TYPE_Q2_K: case KILN_TYPE_Q3_K: t = KILN_TYPE_Q4_0; break;
    case KILN_TYPE_Q4_K: t = KILN_TYPE_Q5_0; break;
    case KILN_TYPE_Q5_K: t = KILN_TYPE_Q5_1; break;
    case KILN_TYPE_Q6_K: t = KILN_TYPE_Q8_0; break;
    default: t = KILN_TYPE_F16; break;
    }
    return row % block_size(t) == 0 ? t : KILN_TYPE_F16;
}

static uint32_t effective_dims(uint32_t n_dims, const int64_t *ne) {
    while (n_dims > 1 && ne[n_dims - 1] == 1) n_dims--;
    return n_dims;
}

kiln_type kiln_quant_tensor_type(const kiln_quant_preset *p, const kiln_quant_model_info *info, const char *name,
                                 uint32_t n_dims, const int64_t *ne) {
    if (effective_dims(n_dims, ne) < 2 || !has_suffix(name, ".weight")) return KILN_TYPE_F32;
    kiln_type t = p->base;
    if (!is_quantized(t)) return t;
    bool is_output = !strcmp(name, "output.weight") || (!info->has_output && !strcmp(name, "token_embd.weight"));
    if (is_output) {
        if (ne[0] % block_size(t)) t = KILN_TYPE_Q8_0;
        else if (t != KILN_TYPE_Q8_0) t = KILN_TYPE_Q6_K;
    } else if (p->mixed && (has_suffix(name, ".attn_v.weight") || has_suffix(name, ".ffn_down.weight"))) {
        long long layer;
        if (sscanf(name, "blk.%lld.", &layer) == 1 && use_more_bits(layer, info->n_layer)) t = KILN_TYPE_Q6_K;
    }
    return fallback(t, ne[0]);
}

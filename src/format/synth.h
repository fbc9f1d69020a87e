/* Synthetic models: a GGUF at a real model's exact shape with seeded random weights, llama.cpp-style metadata and a
 * working tokenizer copied from another GGUF (padded to the shape's vocabulary). Speed is measured on these files,
 * by kiln and by llama.cpp, so they carry everything llama.cpp's loader needs. Weights are normal(0, 0.02) (norm
 * weights 1), generated row by row from (seed, tensor, row), so a file does not depend on the thread count and an
 * 8B model streams to disk without being held in memory. */
#ifndef KILN_FORMAT_SYNTH_H
#define KILN_FORMAT_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "format/quantize.h"
#include "util/error.h"

typedef struct kiln_synth_shape {
    const char *name;         /* "qwen2-1.5b", "llama3-8b", "smollm2-135m" */
    const char *arch;         /* GGUF architecture */
    const char *general_name; /* general.name */
    const char *size_label;   /* general.size_label */
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    float rope_base, norm_eps;
    bool qkv_bias, tied_embeddings;
    bool llama3_rope; /* Llama 3.1 rope scaling: factor 8, low 1, high 4, original context 8192 */
} kiln_synth_shape;

const kiln_synth_shape *kiln_synth_shape_find(const char *name);
const char *kiln_synth_shape_names(void);

typedef struct kiln_synth_params {
    const kiln_synth_shape *shape;
    const kiln_quant_preset *preset;
    const char *out;
    const char *vocab_from; /* GGUF whose tokenizer.* keys are copied */
    uint64_t seed;
    int n_threads; /* 0: all online CPUs */
    bool progress;
} kiln_synth_params;

int kiln_synth(const kiln_synth_params *p, kiln_error *err);

#endif

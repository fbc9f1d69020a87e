/* Quantizing whole models: the per-tensor type policy (llama.cpp's, for files that behave like its own), a
 * multi-threaded row converter, and the `kiln quantize` driver (GGUF or safetensors folder in, GGUF out).
 * docs/quantize.md lists which tensor gets which type. */
#ifndef KILN_FORMAT_QUANTIZE_H
#define KILN_FORMAT_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "format/gguf.h"
#include "quant/types.h"
#include "util/error.h"

/* A target the user names: one base type, the general.file_type llama.cpp writes for it (LLAMA_FTYPE_*), and whether
 * the _M mix applies (attn_v and ffn_down of some layers get Q6_K). */
typedef struct kiln_quant_preset {
    const char *name; /* "q4_k_m", "f16", ... */
    kiln_type base;
    uint32_t file_type;
    bool mixed;
} kiln_quant_preset;

/* The preset of a name (case-insensitive), or NULL. */
const kiln_quant_preset *kiln_quant_preset_find(const char *name);
/* Comma-separated list of preset names, for usage messages. */
const char *kiln_quant_preset_names(void);

/* What the policy needs to know about the model as a whole. */
typedef struct kiln_quant_model_info {
    int64_t n_layer;  /* <arch>.block_count */
    bool has_output;  /* an output.weight exists (else token_embd doubles as the output) */
} kiln_quant_model_info;

/* Type a tensor gets under preset p: 1-D tensors F32, 2-D weights the base type with llama.cpp's adjustments
 * (output tensor Q6_K, _M layer mix, fallback when the row length is not a multiple of the block size). */
kiln_type kiln_quant_tensor_type(const kiln_quant_preset *p, const kiln_quant_model_info *info, const char *name,
                                 uint32_t n_dims, const int64_t *ne);

/* Produces row `row` (n floats) of some source tensor: dequantized input, generated weights, ... Must be safe to
 * call from several threads at once for different rows. */
typedef void (*kiln_row_source_fn)(void *ctx, int64_t row, float *out, int64_t n);

/* Fills dst with n_rows rows of type `type` (row length n, a multiple of its block size) from src, rows split over
 * n_threads threads. */
int kiln_quant_rows(kiln_type type, int64_t first_row, int64_t n_rows, int64_t n, kiln_row_source_fn src, void *ctx,
                    void *dst, int n_threads, kiln_error *err);

/* A progress line on stderr: tensor i of n, its name and type, overall MB written and MB/s. Rewrites one line on a
 * terminal, prints one line per tensor otherwise. */
typedef struct kiln_progress {
    bool enabled, tty;
    double t0;
    uint64_t bytes;
} kiln_progress;

void kiln_progress_start(kiln_progress *p, bool enabled);
void kiln_progress_tensor(kiln_progress *p, uint64_t i, uint64_t n, const char *name, kiln_type type,
                          uint64_t bytes);
void kiln_progress_end(kiln_progress *p);

typedef struct kiln_quantize_params {
    int n_threads; /* 0: all online CPUs */
    bool progress;
} kiln_quantize_params;

/* Reads `in` (GGUF file or safetensors folder), writes `out` (GGUF v3) with every tensor converted as the preset
 * says and the metadata copied, general.file_type and general.quantization_version set. */
int kiln_quantize_model(const char *in, const char *out, const kiln_quant_preset *preset,
                        const kiln_quantize_params *params, kiln_error *err);

#endif

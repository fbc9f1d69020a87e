/* Options shared by the commands that run a model (run, chat, perplexity, bench): the model, the context, and the
 * sampling chain. */
#ifndef KILN_CLI_GEN_OPTS_H
#define KILN_CLI_GEN_OPTS_H

#include <stdio.h>

#include "kiln.h"

#define GEN_MAX_STOP 16

typedef struct gen_opts {
    const char *model;
    kiln_context_params ctx;
    kiln_sampling_params sampling;
    const char *stop[GEN_MAX_STOP];
    int n_stop;
} gen_opts;

void gen_opts_init(gen_opts *o);

/* Consumes argv[*i] (and its value) when it is a shared option: returns 1 if consumed, 0 if not one of them,
 * -1 after printing an error (missing or bad value). */
int gen_opts_parse(gen_opts *o, int argc, char **argv, int *i);

/* Help lines for the shared options; sampling ones only when with_sampling. */
void gen_opts_usage(FILE *out, int with_sampling);

/* 0 when the model has a tokenizer, else -1 after an error naming path. */
int gen_require_tokenizer(const kiln_model *m, const char *path);

/* Opens the model and a context from the options, printing errors; returns 0 or -1. With needs_text, a model
 * without a tokenizer is refused before its context is made. */
int gen_opts_open(const gen_opts *o, bool needs_text, kiln_model **m, kiln_context **c);

/* Where a context runs ("the GPU (name)" or "the CPU, N threads") into buf. */
const char *gen_opts_where(const kiln_context *c, char *buf, size_t size);

double gen_mib(uint64_t bytes);

/* "weights W MiB, KV cache K MiB (kv_extent), workspace S MiB" into buf. */
const char *gen_memory_phrase(const kiln_memory *mem, const char *kv_extent, char *buf, size_t size);

/* What a context holds on its device ("weights W MiB, KV cache K MiB (N positions), workspace S MiB") into buf. */
const char *gen_opts_memory(const kiln_context *c, char *buf, size_t size);

/* One line on stderr: the model, where it runs, and the memory its context holds there. */
void gen_opts_describe(const gen_opts *o, const kiln_context *c);

/* Parses a whole decimal number within [lo, hi] (for commands' own options); -1 after printing an error. */
int gen_parse_int(const char *opt, const char *s, long lo, long hi, long *out);

#endif

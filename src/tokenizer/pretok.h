/* BPE pre-tokenizers: which regexes split the text before merging, chosen by tokenizer.ggml.pre.
 * The table (pretok.c) is data: every pre name llama.cpp knows, mapped to its list of regexes and flags. */
#ifndef KILN_TOKENIZER_PRETOK_H
#define KILN_TOKENIZER_PRETOK_H

#include <stdbool.h>
#include <stddef.h>

#include "util/error.h"

typedef struct kiln_pretok {
    const char *const *names;   /* NULL-terminated; names[0] is the one reported */
    const char *const *regexes; /* NULL-terminated; applied in sequence */
    bool ignore_merges;         /* a word that is itself a token is taken whole */
    bool add_bos;               /* default for add_bos when the file does not say */
    bool no_bos;                /* the model has no BOS token unless the file names one */
} kiln_pretok;

/* The entry for a pre name, or NULL if unknown. */
const kiln_pretok *kiln_pretok_find(const char *name);
const kiln_pretok *kiln_pretok_default(void);

/* Every entry, for tests: *n gets the count. */
const kiln_pretok *kiln_pretok_table(size_t *n);

typedef struct kiln_pretok_compiled kiln_pretok_compiled;

/* Compiles the regexes with PCRE2 (UTF, UCP, JIT where available). */
int kiln_pretok_compile(const kiln_pretok *p, kiln_pretok_compiled **out, kiln_error *err);
void kiln_pretok_free(kiln_pretok_compiled *c);

typedef struct kiln_span {
    size_t start, len;
} kiln_span;

/* Splits text into words as llama.cpp does: each regex splits every piece left by the one before into its matches
 * and the gaps between them (gaps are kept as pieces too). The spans cover text exactly, in order. *spans is
 * malloc'ed (free it); returns 0 or -1. */
int kiln_pretok_split(const kiln_pretok_compiled *c, const char *text, size_t len, kiln_span **spans, size_t *n_spans,
                      kiln_error *err);

#endif

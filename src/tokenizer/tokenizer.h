/* Tokenizers built from GGUF metadata (tokenizer.ggml.*): SentencePiece-style ("llama") and byte-level BPE ("gpt2").
 * A safetensors folder's tokenizer.json reaches here already translated into the same metadata keys. */
#ifndef KILN_TOKENIZER_TOKENIZER_H
#define KILN_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "util/error.h"

typedef struct kiln_tokenizer kiln_tokenizer;

int kiln_tokenizer_load(const kiln_gguf *g, kiln_tokenizer **out, kiln_error *err);
void kiln_tokenizer_free(kiln_tokenizer *t);

/* Encodes text into ids. add_special: BOS/EOS as the model's add_bos/add_eos flags say. parse_special: text of
 * special tokens (e.g. "<|im_start|>") becomes those tokens; otherwise it is plain text.
 * Writes at most max_ids ids and returns how many the text needs (call again with a larger buffer if more), or -1
 * on error. */
int kiln_tokenize(const kiln_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                  int32_t *ids, int max_ids, kiln_error *err);

/* The bytes a token stands for when decoding (byte-fallback and byte-level pieces already turned into raw bytes,
 * SentencePiece's U+2581 into a space). Special/control tokens give their text only if render_special. */
const char *kiln_token_bytes(const kiln_tokenizer *t, int32_t id, bool render_special, size_t *len);
/* The vocabulary entry itself, as stored (for --pieces). */
const char *kiln_token_piece(const kiln_tokenizer *t, int32_t id);

int kiln_tokenizer_n_vocab(const kiln_tokenizer *t);
int32_t kiln_token_bos(const kiln_tokenizer *t); /* -1 if none */
int32_t kiln_token_eos(const kiln_tokenizer *t);
bool kiln_token_is_eog(const kiln_tokenizer *t, int32_t id); /* EOS, EOT, or another end-of-generation token */
int32_t kiln_token_by_text(const kiln_tokenizer *t, const char *text); /* exact vocab lookup, -1 if absent */

/* Streaming detokenizer: feeds token bytes and releases only complete UTF-8 characters, so a character split over
 * several tokens is printed once, whole. */
typedef struct kiln_detok {
    char pending[8];
    int n_pending;
    bool first; /* SentencePiece: drop the leading space of the very first piece */
} kiln_detok;

void kiln_detok_init(kiln_detok *d);
/* Appends the printable bytes of token id to out (capacity cap); returns bytes written. */
size_t kiln_detok_push(kiln_detok *d, const kiln_tokenizer *t, int32_t id, char *out, size_t cap);
/* Flushes what is left (an incomplete tail becomes U+FFFD). */
size_t kiln_detok_flush(kiln_detok *d, char *out, size_t cap);

#endif

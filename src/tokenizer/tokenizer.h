/* Tokenizers built from GGUF metadata (tokenizer.ggml.*): SentencePiece-style ("llama") and byte-level BPE ("gpt2").
 * A safetensors folder's tokenizer.json reaches here already translated into the same metadata keys.
 *
 * Behaviour follows llama.cpp's tokenizer, so ids match the reference vectors exactly:
 * - "llama" (SPM): spaces become U+2581, a space is prefixed to the text (and to every text run that follows a
 *   special token) when add_space_prefix, pieces merge by highest score, leftovers fall back to <0xXX> byte tokens.
 * - "gpt2" (BPE): the text is split by the pre-tokenizer regexes of tokenizer.ggml.pre (applied in sequence, each
 *   one splitting every piece the previous left), each piece is mapped through the GPT-2 byte->unicode table and
 *   merged by merge rank.
 * - User-defined tokens are always matched in the text (as llama.cpp and HF tokenizers do); control and unknown
 *   tokens only when parse_special.
 * A loaded tokenizer is read-only: several threads may tokenize with it at once. */
#ifndef KILN_TOKENIZER_TOKENIZER_H
#define KILN_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "util/error.h"

typedef struct kiln_tokenizer kiln_tokenizer;

/* Reads tokenizer.ggml.* from g. The tokenizer copies what it needs: g may be closed afterwards. An unknown
 * tokenizer.ggml.pre prints one warning on stderr naming it and falls back to the default regexes. */
int kiln_tokenizer_load(const kiln_gguf *g, kiln_tokenizer **out, kiln_error *err);
void kiln_tokenizer_free(kiln_tokenizer *t);

/* The same metadata as plain arrays, for building a tokenizer without a container (tests, converters).
 * Tri-state flags: -1 = absent (the model type's default applies), 0 = false, 1 = true. Ids: -1 = absent. */
typedef struct kiln_vocab_spec {
    const char *model; /* "llama" or "gpt2" */
    const char *pre;   /* tokenizer.ggml.pre; NULL = absent */
    const char *name;  /* general.name; NULL = absent */
    int64_t n_tokens;
    const kiln_str *tokens;
    const float *scores;        /* NULL = all 0 */
    const int32_t *token_types; /* NULL = all normal; 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte */
    int64_t n_merges;
    const kiln_str *merges; /* "left right" */
    int64_t bos, eos, eot, eom, unk, pad, fim_pad, fim_rep, fim_sep;
    int add_bos, add_eos, add_space_prefix;
} kiln_vocab_spec;

void kiln_vocab_spec_init(kiln_vocab_spec *s); /* every id and flag absent, everything else zero */
int kiln_tokenizer_build(const kiln_vocab_spec *s, kiln_tokenizer **out, kiln_error *err);

/* Encodes text into ids. add_special: BOS/EOS as the model's add_bos/add_eos flags say. parse_special: text of
 * special tokens (e.g. "<|im_start|>") becomes those tokens; otherwise it is plain text.
 * Writes at most max_ids ids and returns how many the text needs (call again with a larger buffer if more), or -1
 * on error. Invalid UTF-8 bytes are read as U+FFFD, as llama.cpp does. */
int kiln_tokenize(const kiln_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                  int32_t *ids, int max_ids, kiln_error *err);

/* The bytes a token stands for when decoding (byte-fallback and byte-level pieces already turned into raw bytes,
 * SentencePiece's U+2581 into a space). Special/control tokens give their text only if render_special.
 * Never NULL for a valid id (may be empty); NULL for an id out of range. */
const char *kiln_token_bytes(const kiln_tokenizer *t, int32_t id, bool render_special, size_t *len);
/* The vocabulary entry itself, as stored (for --pieces). NULL for an id out of range. */
const char *kiln_token_piece(const kiln_tokenizer *t, int32_t id);

int kiln_tokenizer_n_vocab(const kiln_tokenizer *t);
size_t kiln_tokenizer_max_token_bytes(const kiln_tokenizer *t); /* longest kiln_token_bytes of any token */
int32_t kiln_token_bos(const kiln_tokenizer *t); /* -1 if none */
int32_t kiln_token_eos(const kiln_tokenizer *t);
int32_t kiln_token_eot(const kiln_tokenizer *t); /* -1 if none */
bool kiln_tokenizer_add_bos(const kiln_tokenizer *t);
bool kiln_tokenizer_add_eos(const kiln_tokenizer *t);
bool kiln_token_is_eog(const kiln_tokenizer *t, int32_t id); /* EOS, EOT, or another end-of-generation token */
bool kiln_token_is_control(const kiln_tokenizer *t, int32_t id); /* control or unknown: not printed by default */
int32_t kiln_token_by_text(const kiln_tokenizer *t, const char *text); /* exact vocab lookup, -1 if absent */
/* "spm" or "bpe", and the pre-tokenizer name actually used ("default" when unknown or absent). */
const char *kiln_tokenizer_kind(const kiln_tokenizer *t);
const char *kiln_tokenizer_pre(const kiln_tokenizer *t);

/* Streaming detokenizer: feeds token bytes and releases only complete UTF-8 characters, so a character split over
 * several tokens is printed once, whole. Control tokens print nothing. */
typedef struct kiln_detok {
    char pending[8];
    int n_pending;
    bool first; /* SentencePiece: drop the leading space of the very first piece */
} kiln_detok;

/* Starts a stream at the beginning of a text: with a SentencePiece vocabulary (add_space_prefix) the space that
 * encoding put in front is dropped again. To continue text mid-stream (the reply after a prompt) set first = false
 * after init if that space must be kept. */
void kiln_detok_init(kiln_detok *d);
/* Appends the printable bytes of token id to out (capacity cap); returns bytes written. Bytes that do not fit are
 * dropped, so give cap >= kiln_tokenizer_max_token_bytes(t) + 16. Invalid UTF-8 in the token stream comes out as
 * U+FFFD. */
size_t kiln_detok_push(kiln_detok *d, const kiln_tokenizer *t, int32_t id, char *out, size_t cap);
/* Flushes what is left (an incomplete tail becomes U+FFFD). */
size_t kiln_detok_flush(kiln_detok *d, char *out, size_t cap);

#endif

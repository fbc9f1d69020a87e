/* The tokenizer's insides, shared by the files of src/tokenizer/ only. */
#ifndef KILN_TOKENIZER_TOK_IMPL_H
#define KILN_TOKENIZER_TOK_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/pretok.h"
#include "tokenizer/strmap.h"
#include "tokenizer/tokenizer.h"

enum {
    KILN_ATTR_NORMAL = 1 << 0,
    KILN_ATTR_UNKNOWN = 1 << 1,
    KILN_ATTR_CONTROL = 1 << 2,
    KILN_ATTR_USER_DEFINED = 1 << 3,
    KILN_ATTR_UNUSED = 1 << 4,
    KILN_ATTR_BYTE = 1 << 5,
    KILN_ATTR_RSTRIP = 1 << 6, /* eat whitespace after the token when matched as special (phi-3) */
};

typedef enum kiln_vocab_kind { KILN_VOCAB_SPM, KILN_VOCAB_BPE } kiln_vocab_kind;

typedef struct kiln_token_info {
    uint32_t text_off, text_len;   /* the piece as stored, in t->arena */
    uint32_t bytes_off, bytes_len; /* what it decodes to, in t->arena */
    float score;
    uint8_t attr;
} kiln_token_info;

/* A trie over the texts of the special tokens (first child / next sibling), for finding them in text in one pass. */
typedef struct kiln_trie_node {
    int32_t child, sibling; /* node indices, -1 = none */
    int32_t token;          /* token ending here, -1 = none */
    uint8_t byte;
} kiln_trie_node;

struct kiln_tokenizer {
    kiln_vocab_kind kind;
    int32_t n_vocab;
    kiln_token_info *tokens;
    char *arena; /* every piece and decoded piece, back to back */
    kiln_strmap by_text;

    int32_t bos, eos, eot, eom, unk, pad;
    bool add_bos, add_eos, add_space_prefix;
    uint8_t *is_eog; /* n_vocab flags */

    /* special tokens (control, user-defined, unknown), longest text first, and their trie */
    int32_t *specials;
    int32_t n_specials;
    int32_t *special_rank; /* n_vocab: position in specials, or -1 */
    kiln_trie_node *trie;
    int32_t n_trie;
    int32_t trie_root[256];

    /* SPM byte fallback: the <0xXX> token of each byte (or -1) */
    int32_t byte_token[256];
    /* SPM: no piece has U+2581 after another character, so no merge crosses the start of a word and each word can
     * be merged on its own (same result, much smaller queues) */
    bool spm_words;

    /* BPE: every string that is a vocab entry or a merge part gets a symbol id; merges map a symbol pair to its
     * rank and the merged symbol */
    kiln_strmap sym_by_text;
    char *sym_arena;
    int32_t *sym_token; /* symbol id -> token id or -1 */
    int32_t n_syms;
    kiln_pairmap merges;
    int32_t byte_sym[256];    /* symbol of the byte-level character of each byte, or -1 */
    char byte_enc[256][3];    /* byte-level character of each byte, UTF-8 */
    uint8_t byte_enc_len[256];
    bool ignore_merges; /* a pre-split word that is itself a token is taken whole (llama3 and kin) */
    const kiln_pretok *pretok;
    const char *pre_name; /* the name it was chosen by ("default" when unknown); static storage */
    kiln_pretok_compiled *pre_re;
};

/* Growable id list used while encoding. */
typedef struct kiln_idbuf {
    int32_t *ids;
    size_t n, cap;
} kiln_idbuf;

int kiln_idbuf_push(kiln_idbuf *b, int32_t id);

/* Encoders of one run of plain text (no special tokens in it), appending to out. Return 0 or -1 (out of memory). */
int kiln_spm_encode(const kiln_tokenizer *t, const char *text, size_t len, kiln_idbuf *out);
void kiln_spm_init(kiln_tokenizer *t);
int kiln_bpe_encode(const kiln_tokenizer *t, const char *text, size_t len, kiln_idbuf *out, kiln_error *err);

/* Builds the BPE symbol tables from the merges; called by kiln_tokenizer_build. */
int kiln_bpe_init(kiln_tokenizer *t, const kiln_vocab_spec *s, kiln_error *err);

/* Splits text into runs of plain text and special tokens, the way llama.cpp does: each special token, longest first,
 * claims its leftmost non-overlapping occurrences in what earlier ones left. parts gets (start, len, token) triples
 * in text order, token -1 for plain text. */
typedef struct kiln_part {
    size_t start, len;
    int32_t token;
} kiln_part;
int kiln_special_split(const kiln_tokenizer *t, const char *text, size_t len, bool parse_special, kiln_part **parts,
                       size_t *n_parts);
int kiln_special_init(kiln_tokenizer *t);

#endif

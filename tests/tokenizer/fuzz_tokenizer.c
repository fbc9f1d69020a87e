/* libFuzzer target for the tokenizer: the input describes a vocabulary and a text. Any vocabulary either builds or
 * fails with a message; a built one encodes and decodes any text without a crash, a leak or undefined behaviour, and
 * every id it gives is in range.
 *
 * Input: byte 0 = flags (bit 0: BPE instead of SPM, bit 1: add the 256 byte tokens, bit 2: parse_special, bit 3:
 * add_special), byte 1 = pre-tokenizer (index into the table), then lines up to a line "~~": each line is a token
 * (first byte: its type, 0..7) or, starting with '=', a merge "left right"; the rest of the input is the text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/pretok.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ENTRIES 512

typedef struct fuzz_vocab {
    kiln_str tokens[MAX_ENTRIES + 256];
    int32_t types[MAX_ENTRIES + 256];
    float scores[MAX_ENTRIES + 256];
    kiln_str merges[MAX_ENTRIES];
    char bytes[256][8];
    int n, n_merges;
} fuzz_vocab;

static void add_byte_tokens(fuzz_vocab *v, bool bpe) {
    for (int b = 0; b < 256 && v->n < MAX_ENTRIES + 256; b++) {
        memset(v->bytes[b], 0, sizeof v->bytes[b]);
        size_t len = 6;
        if (bpe)
            len = kiln_utf8_encode(kiln_byte_to_cp((uint8_t)b), v->bytes[b]);
        else
            memcpy(v->bytes[b], "<0x", 3), v->bytes[b][3] = "0123456789ABCDEF"[b >> 4],
                v->bytes[b][4] = "0123456789ABCDEF"[b & 15], v->bytes[b][5] = '>';
        v->tokens[v->n] = (kiln_str){v->bytes[b], len};
        v->types[v->n] = bpe ? 1 : 6;
        v->scores[v->n++] = 0;
    }
}

/* Parses the vocabulary lines; returns where the text starts. */
static size_t parse_lines(fuzz_vocab *v, const char *p, size_t size) {
    size_t i = 0;
    while (i < size && v->n < MAX_ENTRIES && v->n_merges < MAX_ENTRIES) {
        const char *nl = memchr(p + i, '\n', size - i);
        size_t len = nl ? (size_t)(nl - (p + i)) : size - i;
        if (len == 2 && !memcmp(p + i, "~~", 2)) return i + 3;
        if (len > 1 && p[i] == '=') {
            v->merges[v->n_merges++] = (kiln_str){p + i + 1, len - 1};
        } else if (len > 1) {
            v->types[v->n] = (uint8_t)p[i] % 8;
            v->scores[v->n] = -(float)v->n;
            v->tokens[v->n++] = (kiln_str){p + i + 1, len - 1};
        }
        i += len + 1;
    }
    return size;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static fuzz_vocab v;
    if (size < 2) return 0;
    uint8_t flags = data[0];
    size_t n_pre;
    const kiln_pretok *table = kiln_pretok_table(&n_pre);
    memset(&v, 0, sizeof v);
    if (flags & 2) add_byte_tokens(&v, flags & 1);
    size_t text_at = 2 + parse_lines(&v, (const char *)data + 2, size - 2);
    if (text_at > size) text_at = size;
    kiln_vocab_spec s;
    kiln_vocab_spec_init(&s);
    s.model = (flags & 1) ? "gpt2" : "llama";
    s.pre = table[data[1] % n_pre].names[0];
    s.n_tokens = v.n;
    s.tokens = v.tokens;
    s.token_types = v.types;
    s.scores = v.scores;
    s.n_merges = v.n_merges;
    s.merges = v.merges;
    kiln_tokenizer *t = NULL;
    kiln_error err;
    if (kiln_tokenizer_build(&s, &t, &err)) return 0;
    const char *text = (const char *)data + text_at;
    size_t len = size - text_at;
    int32_t ids[1024];
    int n = kiln_tokenize(t, text, len, flags & 8, flags & 4, ids, 1024, &err);
    if (n < 0) abort();
    kiln_detok d;
    kiln_detok_init(&d);
    char out[1 << 16];
    size_t used = 0;
    for (int i = 0; i < n && i < 1024; i++) {
        if (ids[i] < 0 || ids[i] >= kiln_tokenizer_n_vocab(t)) abort();
        used += kiln_detok_push(&d, t, ids[i], out + used, sizeof out - used);
        if (used > sizeof out - 4096) used = 0;
    }
    kiln_detok_flush(&d, out, sizeof out);
    kiln_tokenizer_free(t);
    return 0;
}

/* SentencePiece-style encoding as llama.cpp does it: start from single UTF-8 characters, repeatedly merge the adjacent
 * pair whose concatenation is the vocabulary entry with the highest score, and spell what never became a token in
 * <0xXX> byte tokens. The text arrives already escaped (spaces as U+2581).
 * llama.cpp also keeps a table to split a final symbol that is not a token back into its merge parts; kiln has none
 * because a merge only ever makes a vocabulary entry, so every final symbol is a token or a single character. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/merge_heap.h"
#include "tokenizer/tok_impl.h"
#include "tokenizer/utf8.h"

typedef struct spm_symbol {
    size_t start, n; /* n == 0: merged into its left neighbour */
    int32_t prev, next;
} spm_symbol;

static int try_pair(const kiln_tokenizer *t, const char *text, const spm_symbol *sym, int32_t left, int32_t right,
                    kiln_merge_heap *heap) {
    if (left < 0 || right < 0) return 0;
    size_t len = sym[left].n + sym[right].n;
    int32_t id = kiln_strmap_get(&t->by_text, text + sym[left].start, len);
    if (id < 0) return 0;
    kiln_merge m = {.key = (uint64_t)kiln_score_key(t->tokens[id].score) << 32 | (uint32_t)left,
                    .left = left,
                    .right = right,
                    .a = (int32_t)len};
    return kiln_heap_push(heap, m);
}

static int emit_symbol(const kiln_tokenizer *t, const char *text, const spm_symbol *s, kiln_idbuf *out) {
    int32_t id = kiln_strmap_get(&t->by_text, text + s->start, s->n);
    if (id >= 0) return kiln_idbuf_push(out, id);
    for (size_t i = 0; i < s->n; i++) {
        int32_t b = t->byte_token[(uint8_t)text[s->start + i]];
        if (b < 0) b = t->unk;
        if (b >= 0 && kiln_idbuf_push(out, b)) return -1;
    }
    return 0;
}

#define SPACE "\xE2\x96\x81"

static bool is_space_at(const char *p, size_t at, size_t len) { return at + 3 <= len && !memcmp(p + at, SPACE, 3); }

void kiln_spm_init(kiln_tokenizer *t) {
    t->spm_words = true;
    for (int32_t i = 0; i < t->n_vocab && t->spm_words; i++) {
        const char *p = t->arena + t->tokens[i].text_off;
        size_t len = t->tokens[i].text_len;
        for (size_t k = 1; k + 3 <= len; k++)
            if (is_space_at(p, k, len) && !(k >= 3 && is_space_at(p, k - 3, len))) t->spm_words = false;
    }
}

static int encode_piece(const kiln_tokenizer *t, const char *text, size_t len, spm_symbol *sym, kiln_merge_heap *heap,
                        kiln_idbuf *out) {
    int32_t n = 0;
    int rc = 0;
    for (size_t off = 0; off < len; n++) {
        size_t cl = kiln_utf8_lead_len((uint8_t)text[off]);
        if (cl > len - off) cl = len - off;
        sym[n] = (spm_symbol){off, cl, n - 1, off + cl == len ? -1 : n + 1};
        off += cl;
    }
    heap->n = 0;
    for (int32_t i = 1; i < n && !rc; i++) rc = try_pair(t, text, sym, i - 1, i, heap);
    while (heap->n && !rc) {
        kiln_merge m = kiln_heap_pop(heap);
        spm_symbol *l = &sym[m.left], *r = &sym[m.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != (size_t)m.a) continue; /* stale: a side was merged since */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = m.left;
        rc = try_pair(t, text, sym, l->prev, m.left, heap);
        if (!rc) rc = try_pair(t, text, sym, m.left, l->next, heap);
    }
    for (int32_t i = 0; i != -1 && !rc && n > 0; i = sym[i].next) rc = emit_symbol(t, text, &sym[i], out);
    return rc;
}

/* End of the word starting at start: just before the next U+2581 that follows another character. */
static size_t word_end(const char *text, size_t start, size_t len) {
    size_t i = start;
    while (i < len && is_space_at(text, i, len)) i += 3;
    while (i < len && !is_space_at(text, i, len)) i++;
    return i;
}

int kiln_spm_encode(const kiln_tokenizer *t, const char *text, size_t len, kiln_idbuf *out) {
    spm_symbol *sym = NULL;
    size_t cap = 0;
    kiln_merge_heap heap = {0};
    int rc = 0;
    for (size_t start = 0; start < len && !rc;) {
        size_t end = t->spm_words ? word_end(text, start, len) : len;
        if (end - start > cap) { /* symbols for the longest word so far, not for the whole text */
            spm_symbol *s = realloc(sym, (end - start) * sizeof *s);
            if (!s) {
                rc = -1;
                break;
            }
            sym = s;
            cap = end - start;
        }
        rc = encode_piece(t, text + start, end - start, sym, &heap, out);
        start = end;
    }
    free(heap.v);
    free(sym);
    return rc;
}

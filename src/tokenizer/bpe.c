/* Byte-level BPE as llama.cpp does it: the pre-tokenizer splits the text into words, each word's bytes become
 * GPT-2 byte-level characters, and the adjacent pair with the lowest merge rank is merged until none is left.
 *
 * Strings are interned once at load: every vocabulary entry, merge part and merge result gets a symbol id (a
 * vocabulary entry's symbol id is its token id), and the merges become a map (left symbol, right symbol) -> (rank,
 * merged symbol). Encoding then compares integers, never strings. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/merge_heap.h"
#include "tokenizer/tok_impl.h"
#include "tokenizer/utf8.h"

typedef struct sym_builder {
    char *arena;
    size_t used, cap;
    int32_t n;
} sym_builder;

/* Symbol id of s, interning it (copied into the symbol arena) if new; -1 when out of room. */
static int32_t intern(kiln_tokenizer *t, sym_builder *b, const char *s, size_t len) {
    int32_t id = kiln_strmap_get(&t->sym_by_text, s, len);
    if (id >= 0) return id;
    if (b->used + len + 1 > b->cap) return -1;
    char *copy = b->arena + b->used;
    memcpy(copy, s, len);
    copy[len] = 0;
    b->used += len + 1;
    return kiln_strmap_put(&t->sym_by_text, copy, len, b->n++);
}

static int add_merge(kiln_tokenizer *t, sym_builder *b, const kiln_str *m, int32_t rank, char *scratch) {
    if (!m->ptr || m->len < 3) return 0;
    const char *sp = memchr(m->ptr + 1, ' ', m->len - 1);
    if (!sp) return 0; /* not "left right": llama.cpp keys it as an empty pair, which never matches */
    size_t ll = (size_t)(sp - m->ptr), rl = m->len - ll - 1;
    int32_t l = intern(t, b, m->ptr, ll);
    int32_t r = intern(t, b, sp + 1, rl);
    memcpy(scratch, m->ptr, ll);
    memcpy(scratch + ll, sp + 1, rl);
    int32_t both = intern(t, b, scratch, ll + rl);
    if (l < 0 || r < 0 || both < 0) return -1;
    return kiln_pairmap_put(&t->merges, (uint32_t)l, (uint32_t)r, rank, both);
}

int kiln_bpe_init(kiln_tokenizer *t, const kiln_vocab_spec *s, kiln_error *err) {
    if (s->n_merges < 0 || s->n_merges > (1 << 24) || (s->n_merges && !s->merges))
        return kiln_fail(err, "tokenizer.ggml.merges: bad size (%lld)", (long long)s->n_merges);
    size_t bytes = 0, longest = 0;
    for (int64_t i = 0; i < s->n_merges; i++) {
        if (s->merges[i].len > (1u << 20)) return kiln_fail(err, "tokenizer.ggml.merges[%lld]: too long", (long long)i);
        bytes += 2 * (s->merges[i].len + 1);
        if (s->merges[i].len > longest) longest = s->merges[i].len;
    }
    size_t max_syms = (size_t)t->n_vocab + 3 * (size_t)s->n_merges + 256;
    sym_builder b = {.arena = malloc(bytes + 256 * 4), .cap = bytes + 256 * 4};
    char *scratch = malloc(longest + 1);
    t->sym_arena = b.arena;
    if (!b.arena || !scratch || kiln_strmap_init(&t->sym_by_text, max_syms) ||
        kiln_pairmap_init(&t->merges, (size_t)s->n_merges)) {
        free(scratch);
        return kiln_fail(err, "tokenizer: out of memory for %lld merges", (long long)s->n_merges);
    }
    /* vocabulary entries first, so that their symbol ids are their token ids */
    for (int32_t i = 0; i < t->n_vocab; i++) {
        const kiln_token_info *ti = &t->tokens[i];
        if (ti->text_len) kiln_strmap_put(&t->sym_by_text, t->arena + ti->text_off, ti->text_len, i);
    }
    b.n = t->n_vocab;
    int rc = 0;
    for (int64_t i = 0; i < s->n_merges && !rc; i++) rc = add_merge(t, &b, &s->merges[i], (int32_t)i, scratch);
    for (int c = 0; c < 256 && !rc; c++) {
        t->byte_enc_len[c] = (uint8_t)kiln_utf8_encode(kiln_byte_to_cp((uint8_t)c), t->byte_enc[c]);
        t->byte_sym[c] = intern(t, &b, t->byte_enc[c], t->byte_enc_len[c]);
        t->byte_token[c] = kiln_strmap_get(&t->by_text, t->byte_enc[c], t->byte_enc_len[c]);
        rc = t->byte_sym[c] < 0;
    }
    free(scratch);
    if (rc) return kiln_fail(err, "tokenizer: out of memory interning merges");
    t->n_syms = b.n;
    t->sym_token = malloc((size_t)b.n * sizeof *t->sym_token);
    if (!t->sym_token) return kiln_fail(err, "tokenizer: out of memory");
    for (int32_t i = 0; i < b.n; i++) t->sym_token[i] = i < t->n_vocab && t->tokens[i].text_len ? i : -1;
    return 0;
}

typedef struct bpe_symbol {
    int32_t sym; /* -1: a byte no merge mentions */
    int32_t prev, next;
    uint32_t start, n; /* bytes of the word it covers; n == 0: merged away */
} bpe_symbol;

/* Scratch reused across the words of one encode call. */
typedef struct bpe_work {
    bpe_symbol *sym;
    size_t cap;
    kiln_merge_heap heap;
    char *enc; /* the word in byte-level characters */
    size_t enc_cap;
} bpe_work;

static int try_pair(const kiln_tokenizer *t, bpe_work *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return 0;
    int32_t a = w->sym[left].sym, b = w->sym[right].sym;
    if (a < 0 || b < 0) return 0;
    const kiln_pairmap_slot *m = kiln_pairmap_get(&t->merges, (uint32_t)a, (uint32_t)b);
    if (!m) return 0;
    kiln_merge e = {.key = (uint64_t)(uint32_t)m->v0 << 32 | (uint32_t)left,
                    .left = left, .right = right, .a = a, .b = b, .c = m->v1};
    return kiln_heap_push(&w->heap, e);
}

static int emit_word(const kiln_tokenizer *t, bpe_work *w, const uint8_t *word, int32_t n, kiln_idbuf *out) {
    for (int32_t i = 0; i != -1 && n > 0; i = w->sym[i].next) {
        const bpe_symbol *s = &w->sym[i];
        int32_t id = s->sym >= 0 ? t->sym_token[s->sym] : -1;
        if (id >= 0) {
            if (kiln_idbuf_push(out, id)) return -1;
            continue;
        }
        /* not a token: its bytes one by one, skipping any the vocabulary lacks (as llama.cpp does) */
        for (uint32_t k = 0; k < s->n; k++) {
            int32_t b = t->byte_token[word[s->start + k]];
            if (b >= 0 && kiln_idbuf_push(out, b)) return -1;
        }
    }
    return 0;
}

/* The word spelled in byte-level characters, for the whole-word lookup of ignore_merges. */
static int32_t whole_word_token(const kiln_tokenizer *t, bpe_work *w, const uint8_t *word, size_t len) {
    if (w->enc_cap < 2 * len) {
        char *e = realloc(w->enc, 2 * len);
        if (!e) return -2;
        w->enc = e;
        w->enc_cap = 2 * len;
    }
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        memcpy(w->enc + o, t->byte_enc[word[i]], t->byte_enc_len[word[i]]);
        o += t->byte_enc_len[word[i]];
    }
    return kiln_strmap_get(&t->by_text, w->enc, o);
}

static int encode_word(const kiln_tokenizer *t, bpe_work *w, const uint8_t *word, size_t len, kiln_idbuf *out) {
    if (t->ignore_merges) {
        int32_t id = whole_word_token(t, w, word, len);
        if (id == -2) return -1;
        if (id >= 0) return kiln_idbuf_push(out, id);
    }
    if (w->cap < len) {
        bpe_symbol *s = realloc(w->sym, len * sizeof *s);
        if (!s) return -1;
        w->sym = s;
        w->cap = len;
    }
    int32_t n = (int32_t)len;
    for (int32_t i = 0; i < n; i++)
        w->sym[i] = (bpe_symbol){t->byte_sym[word[i]], i - 1, i + 1 == n ? -1 : i + 1, (uint32_t)i, 1};
    w->heap.n = 0;
    int rc = 0;
    for (int32_t i = 1; i < n && !rc; i++) rc = try_pair(t, w, i - 1, i);
    while (w->heap.n && !rc) {
        kiln_merge m = kiln_heap_pop(&w->heap);
        bpe_symbol *l = &w->sym[m.left], *r = &w->sym[m.right];
        if (l->n == 0 || r->n == 0 || l->sym != m.a || r->sym != m.b) continue; /* stale */
        l->sym = m.c;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->sym[r->next].prev = m.left;
        rc = try_pair(t, w, l->prev, m.left);
        if (!rc) rc = try_pair(t, w, m.left, l->next);
    }
    return rc ? rc : emit_word(t, w, word, n, out);
}

int kiln_bpe_encode(const kiln_tokenizer *t, const char *text, size_t len, kiln_idbuf *out, kiln_error *err) {
    if (len == 0) return 0;
    if (len > SIZE_MAX / 3) return kiln_fail(err, "tokenize: text too long");
    char *clean = malloc(3 * len);
    if (!clean) return kiln_fail(err, "tokenize: out of memory for %zu bytes", len);
    size_t n = kiln_utf8_sanitize(text, len, clean);
    kiln_span *words = NULL;
    size_t n_words = 0;
    if (kiln_pretok_split(t->pre_re, clean, n, &words, &n_words, err)) {
        free(clean);
        return -1;
    }
    bpe_work w = {0};
    int rc = 0;
    for (size_t i = 0; i < n_words && !rc; i++)
        rc = encode_word(t, &w, (const uint8_t *)clean + words[i].start, words[i].len, out);
    free(w.sym);
    free(w.heap.v);
    free(w.enc);
    free(words);
    free(clean);
    return rc ? kiln_fail(err, "tokenize: out of memory") : 0;
}

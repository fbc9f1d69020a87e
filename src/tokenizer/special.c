/* Finding special tokens in text. llama.cpp takes the special tokens longest first and lets each claim its leftmost
 * non-overlapping occurrences in the text the earlier ones left. Doing that token by token costs a pass over the text
 * per special token (thousands of them in some vocabularies), so kiln finds every occurrence of every special token
 * in one pass with a trie, then lets the tokens claim them in the same order: the result is the same. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

typedef struct by_len {
    uint32_t len;
    int32_t id;
} by_len;

static int longest_first(const void *a, const void *b) {
    const by_len *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* The special tokens, longest text first (ties by id). */
static int sort_specials(kiln_tokenizer *t) {
    by_len *v = malloc((size_t)(t->n_specials ? t->n_specials : 1) * sizeof *v);
    if (!v) return -1;
    for (int32_t i = 0; i < t->n_specials; i++) v[i] = (by_len){t->tokens[t->specials[i]].text_len, t->specials[i]};
    qsort(v, (size_t)t->n_specials, sizeof *v, longest_first);
    for (int32_t i = 0; i < t->n_specials; i++) t->specials[i] = v[i].id;
    free(v);
    return 0;
}

static int32_t *trie_head(kiln_tokenizer *t, int32_t parent, uint8_t byte) {
    return parent < 0 ? &t->trie_root[byte] : &t->trie[parent].child;
}

static int trie_add(kiln_tokenizer *t, int32_t id, int32_t *cap) {
    const uint8_t *p = (const uint8_t *)t->arena + t->tokens[id].text_off;
    uint32_t len = t->tokens[id].text_len;
    int32_t parent = -1;
    for (uint32_t i = 0; i < len; i++) {
        int32_t node = *trie_head(t, parent, p[i]);
        while (node >= 0 && t->trie[node].byte != p[i]) node = t->trie[node].sibling;
        if (node < 0) {
            if (t->n_trie == *cap) {
                int32_t ncap = *cap ? *cap * 2 : 256;
                kiln_trie_node *v = realloc(t->trie, (size_t)ncap * sizeof *v);
                if (!v) return -1;
                t->trie = v;
                *cap = ncap;
            }
            node = t->n_trie++;
            int32_t *head = trie_head(t, parent, p[i]);
            t->trie[node] = (kiln_trie_node){.child = -1, .sibling = *head, .token = -1, .byte = p[i]};
            *head = node;
        }
        parent = node;
    }
    if (t->trie[parent].token < 0) t->trie[parent].token = id;
    return 0;
}

int kiln_special_init(kiln_tokenizer *t) {
    const uint8_t special = KILN_ATTR_CONTROL | KILN_ATTR_USER_DEFINED | KILN_ATTR_UNKNOWN;
    int32_t n = 0, cap = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) n += (t->tokens[i].attr & special) && t->tokens[i].text_len;
    t->specials = malloc((size_t)(n ? n : 1) * sizeof *t->specials);
    t->special_rank = malloc((size_t)t->n_vocab * sizeof *t->special_rank);
    if (!t->specials || !t->special_rank) return -1;
    n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        t->special_rank[i] = -1;
        if ((t->tokens[i].attr & special) && t->tokens[i].text_len) t->specials[n++] = i;
    }
    t->n_specials = n;
    if (sort_specials(t)) return -1;
    for (int32_t i = 0; i < 256; i++) t->trie_root[i] = -1;
    for (int32_t r = 0; r < n; r++) {
        t->special_rank[t->specials[r]] = r;
        if (trie_add(t, t->specials[r], &cap)) return -1;
    }
    return 0;
}

typedef struct occurrence {
    size_t pos;
    int32_t rank; /* position of the token in t->specials */
} occurrence;

static int by_rank_then_pos(const void *a, const void *b) {
    const occurrence *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static bool wanted(const kiln_tokenizer *t, int32_t id, bool parse_special) {
    return parse_special || !(t->tokens[id].attr & (KILN_ATTR_CONTROL | KILN_ATTR_UNKNOWN));
}

typedef struct occ_list {
    occurrence *v;
    size_t n, cap;
} occ_list;

static int occ_push(occ_list *l, size_t pos, int32_t rank) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        occurrence *v = realloc(l->v, cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (occurrence){pos, rank};
    return 0;
}

/* Every occurrence of every wanted special token, in any order: from each byte, walk the trie as far as the text
 * follows it. */
static int find_all(const kiln_tokenizer *t, const char *text, size_t len, bool parse_special, occ_list *out) {
    for (size_t i = 0; i < len; i++) {
        int32_t node = t->trie_root[(uint8_t)text[i]];
        for (size_t j = i + 1; node >= 0; j++) {
            int32_t id = t->trie[node].token;
            if (id >= 0 && wanted(t, id, parse_special) && occ_push(out, i, t->special_rank[id])) return -1;
            if (j >= len) break;
            node = t->trie[node].child;
            while (node >= 0 && t->trie[node].byte != (uint8_t)text[j]) node = t->trie[node].sibling;
        }
    }
    return 0;
}

static int push_part(kiln_part **v, size_t *n, size_t *cap, size_t start, size_t len, int32_t token) {
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 16;
        kiln_part *nv = realloc(*v, *cap * sizeof *nv);
        if (!nv) return -1;
        *v = nv;
    }
    (*v)[(*n)++] = (kiln_part){start, len, token};
    return 0;
}

/* claimed[i]: the token (+1) whose match starts at byte i, with the covered bytes marked by -1 */
static void claim(const kiln_tokenizer *t, int32_t *claimed, const occurrence *occ, size_t n_occ) {
    size_t i = 0;
    while (i < n_occ) {
        int32_t id = t->specials[occ[i].rank];
        uint32_t tl = t->tokens[id].text_len;
        size_t free_from = 0; /* the search for this token resumes after its last match */
        for (; i < n_occ && t->specials[occ[i].rank] == id; i++) {
            size_t p = occ[i].pos;
            if (p < free_from) continue;
            bool clear = true;
            for (size_t k = p; k < p + tl && clear; k++) clear = claimed[k] == 0;
            if (!clear) continue;
            claimed[p] = id + 1;
            for (size_t k = p + 1; k < p + tl; k++) claimed[k] = -1;
            free_from = p + tl;
        }
    }
}

/* Phi-3: whitespace after an rstrip token is dropped */
static size_t skip_rstrip(const kiln_tokenizer *t, int32_t id, const char *text, size_t at, size_t end) {
    if (!(t->tokens[id].attr & KILN_ATTR_RSTRIP)) return at;
    while (at < end && isspace((unsigned char)text[at])) at++;
    return at;
}

int kiln_special_split(const kiln_tokenizer *t, const char *text, size_t len, bool parse_special, kiln_part **parts,
                       size_t *n_parts) {
    occ_list occ = {0};
    size_t n = 0, cap = 0;
    kiln_part *v = NULL;
    *parts = NULL;
    *n_parts = 0;
    if (find_all(t, text, len, parse_special, &occ)) {
        free(occ.v);
        return -1;
    }
    if (occ.n == 0) {
        free(occ.v);
        if (len && push_part(&v, &n, &cap, 0, len, -1)) return -1;
        *parts = v;
        *n_parts = n;
        return 0;
    }
    int32_t *claimed = calloc(len, sizeof *claimed);
    if (!claimed) {
        free(occ.v);
        return -1;
    }
    qsort(occ.v, occ.n, sizeof *occ.v, by_rank_then_pos);
    claim(t, claimed, occ.v, occ.n);
    free(occ.v);
    size_t run = 0;
    int rc = 0;
    for (size_t i = 0; i < len && !rc;) {
        if (claimed[i] <= 0) {
            i++;
            continue;
        }
        int32_t id = claimed[i] - 1;
        if (i > run) rc = push_part(&v, &n, &cap, run, i - run, -1);
        if (!rc) rc = push_part(&v, &n, &cap, i, t->tokens[id].text_len, id);
        i += t->tokens[id].text_len;
        size_t next_claim = i;
        while (next_claim < len && claimed[next_claim] == 0) next_claim++;
        run = i = skip_rstrip(t, id, text, i, next_claim);
    }
    if (!rc && run < len) rc = push_part(&v, &n, &cap, run, len - run, -1);
    free(claimed);
    if (rc) {
        free(v);
        return -1;
    }
    *parts = v;
    *n_parts = n;
    return 0;
}

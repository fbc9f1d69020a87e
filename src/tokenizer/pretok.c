#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretok.h"

#include <pcre2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct kiln_pretok_compiled {
    size_t n;
    pcre2_code **codes;
};

void kiln_pretok_free(kiln_pretok_compiled *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n; i++) pcre2_code_free(c->codes[i]);
    free(c->codes);
    free(c);
}

int kiln_pretok_compile(const kiln_pretok *p, kiln_pretok_compiled **out, kiln_error *err) {
    size_t n = 0;
    while (p->regexes[n]) n++;
    kiln_pretok_compiled *c = calloc(1, sizeof *c);
    if (!c || !(c->codes = calloc(n ? n : 1, sizeof *c->codes))) {
        free(c);
        return kiln_fail(err, "pre-tokenizer '%s': out of memory", p->names[0]);
    }
    for (size_t i = 0; i < n; i++) {
        int code;
        PCRE2_SIZE at;
        /* DOLLAR_ENDONLY: '$' means end of the piece, as in the ECMAScript regexes llama.cpp runs */
        c->codes[i] = pcre2_compile((PCRE2_SPTR)p->regexes[i], PCRE2_ZERO_TERMINATED,
                                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY, &code,
                                    &at, NULL);
        if (!c->codes[i]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(code, msg, sizeof msg);
            kiln_pretok_free(c);
            return kiln_fail(err, "pre-tokenizer '%s': regex %zu does not compile at offset %zu: %s", p->names[0], i,
                             (size_t)at, (const char *)msg);
        }
        c->n = i + 1;
        pcre2_jit_compile(c->codes[i], PCRE2_JIT_COMPLETE); /* the interpreter runs it if JIT is unavailable */
    }
    c->n = n;
    *out = c;
    return 0;
}

typedef struct span_list {
    kiln_span *v;
    size_t n, cap;
} span_list;

static int span_push(span_list *l, size_t start, size_t len) {
    if (len == 0) return 0;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        kiln_span *v = realloc(l->v, cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (kiln_span){start, len};
    return 0;
}

/* Matching state shared by all pieces of one split: match data, and a larger JIT stack made only if a long piece
 * needs it. */
typedef struct matcher {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *stack;
} matcher;

static int run_match(matcher *m, const pcre2_code *code, const char *s, size_t len, size_t at, uint32_t opts) {
    int rc = pcre2_match(code, (PCRE2_SPTR)s, len, at, opts, m->md, m->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !m->stack) {
        m->mctx = pcre2_match_context_create(NULL);
        m->stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
        if (!m->mctx || !m->stack) return PCRE2_ERROR_NOMEMORY;
        pcre2_jit_stack_assign(m->mctx, NULL, m->stack);
        rc = pcre2_match(code, (PCRE2_SPTR)s, len, at, opts, m->md, m->mctx);
    }
    return rc;
}

static size_t next_char(const char *s, size_t len, size_t at) {
    at++;
    while (at < len && ((uint8_t)s[at] & 0xC0) == 0x80) at++;
    return at;
}

/* Splits the piece [start, start + len) of text into matches and gaps, appending them to out. The piece is the whole
 * subject, so lookarounds and '$' see its ends as the text's ends. */
static int split_piece(matcher *m, const pcre2_code *code, const char *text, size_t start, size_t len, span_list *out) {
    const char *s = text + start;
    size_t at = 0, last = 0;
    uint32_t opts = 0;
    while (at <= len) {
        int rc = run_match(m, code, s, len, at, opts);
        if (rc == PCRE2_ERROR_NOMATCH) {
            if (!opts || at >= len) break;
            /* an empty match here cannot grow: move on one character */
            at = next_char(s, len, at);
            opts = 0;
            continue;
        }
        if (rc < 0) return rc; /* 0 only says the ovector holds just the whole match */
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
        if (ov[0] > last && span_push(out, start + last, ov[0] - last)) return PCRE2_ERROR_NOMEMORY;
        if (span_push(out, start + ov[0], ov[1] - ov[0])) return PCRE2_ERROR_NOMEMORY;
        last = ov[1];
        at = ov[1];
        opts = ov[0] == ov[1] ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0;
        if (!opts && at >= len) break;
    }
    if (last < len && span_push(out, start + last, len - last)) return PCRE2_ERROR_NOMEMORY;
    return 0;
}

int kiln_pretok_split(const kiln_pretok_compiled *c, const char *text, size_t len, kiln_span **spans, size_t *n_spans,
                      kiln_error *err) {
    span_list cur = {0}, next = {0};
    matcher m = {0};
    int rc = 0;
    *spans = NULL;
    *n_spans = 0;
    if (span_push(&cur, 0, len)) return kiln_fail(err, "tokenize: out of memory");
    m.md = pcre2_match_data_create(1, NULL);
    if (!m.md) rc = PCRE2_ERROR_NOMEMORY;
    for (size_t r = 0; r < c->n && !rc; r++) {
        next.n = 0;
        for (size_t i = 0; i < cur.n && !rc; i++) rc = split_piece(&m, c->codes[r], text, cur.v[i].start, cur.v[i].len, &next);
        span_list tmp = cur;
        cur = next;
        next = tmp;
    }
    free(next.v);
    pcre2_match_data_free(m.md);
    pcre2_match_context_free(m.mctx);
    pcre2_jit_stack_free(m.stack);
    if (rc) {
        free(cur.v);
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return kiln_fail(err, "tokenize: pre-tokenizer regex failed: %s", (const char *)msg);
    }
    *spans = cur.v;
    *n_spans = cur.n;
    return 0;
}

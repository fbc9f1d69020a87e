/* Streaming detokenizer: token bytes go through a small pending buffer so that a character split across tokens
 * comes out once, whole; bytes that can never form a character come out as U+FFFD. */
#include <string.h>

#include "tokenizer/tok_impl.h"
#include "tokenizer/utf8.h"

typedef struct sink {
    char *out;
    size_t cap, n;
} sink;

static void put(sink *s, const char *p, size_t len) {
    if (s->n + len > s->cap) return; /* documented: what does not fit is dropped, whole characters only */
    memcpy(s->out + s->n, p, len);
    s->n += len;
}

/* Emits every complete character at the front of pending; keeps an incomplete tail. */
static void drain(kiln_detok *d, sink *s, bool final) {
    int i = 0;
    while (i < d->n_pending) {
        uint32_t cp;
        size_t n = kiln_utf8_strict_len(d->pending + i, (size_t)(d->n_pending - i), &cp);
        if (n == KILN_UTF8_INCOMPLETE && !final) break;
        if (n == 0 || n == KILN_UTF8_INCOMPLETE) {
            put(s, "\xEF\xBF\xBD", 3);
            i += 1;
        } else {
            put(s, d->pending + i, n);
            i += (int)n;
        }
    }
    memmove(d->pending, d->pending + i, (size_t)(d->n_pending - i));
    d->n_pending -= i;
}

void kiln_detok_init(kiln_detok *d) {
    memset(d, 0, sizeof *d);
    d->first = true;
}

size_t kiln_detok_push(kiln_detok *d, const kiln_tokenizer *t, int32_t id, char *out, size_t cap) {
    size_t len;
    const char *p = kiln_token_bytes(t, id, false, &len);
    sink s = {out, cap, 0};
    if (!p || !len) return 0;
    if (d->first) {
        if (t->kind == KILN_VOCAB_SPM && t->add_space_prefix && p[0] == ' ') p++, len--;
        d->first = false;
    }
    for (size_t i = 0; i < len; i++) {
        if (d->n_pending == 0 && (uint8_t)p[i] < 0x80) { /* ASCII needs no buffering */
            put(&s, p + i, 1);
            continue;
        }
        d->pending[d->n_pending++] = p[i];
        drain(d, &s, false);
    }
    return s.n;
}

size_t kiln_detok_flush(kiln_detok *d, char *out, size_t cap) {
    sink s = {out, cap, 0};
    drain(d, &s, true);
    return s.n;
}

/* Stop strings over streamed text: a stop string can arrive split across tokens, so any tail of the text that is a
 * prefix of one is held back until the next token decides. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

int kiln_stop_scan_init(kiln_stop_scan *s, const char *const *stop, int n_stop, kiln_error *err) {
    memset(s, 0, sizeof *s);
    for (int i = 0; i < n_stop; i++)
        if (!stop[i] || !stop[i][0]) return kiln_fail(err, "stop string %d is empty", i);
    s->stop = stop;
    s->n_stop = n_stop;
    return 0;
}

void kiln_stop_scan_free(kiln_stop_scan *s) {
    free(s->buf);
    memset(s, 0, sizeof *s);
}

/* Length of the longest tail of buf that is a proper prefix of some stop string. */
static size_t held_tail(const kiln_stop_scan *s) {
    size_t best = 0;
    for (int i = 0; i < s->n_stop; i++) {
        size_t n = strlen(s->stop[i]);
        for (size_t k = n - 1 < s->len ? n - 1 : s->len; k > best; k--)
            if (!memcmp(s->buf + s->len - k, s->stop[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

int kiln_stop_scan_push(kiln_stop_scan *s, const char *text, size_t len, size_t *release, bool *hit, kiln_error *err) {
    *hit = false;
    if (s->len + len + 1 > s->cap) {
        size_t cap = (s->len + len + 1) * 2;
        char *b = realloc(s->buf, cap);
        if (!b) return kiln_fail(err, "out of memory for generated text");
        s->buf = b;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, text, len);
    s->len += len;
    s->buf[s->len] = 0;
    size_t first = s->len;
    for (int i = 0; i < s->n_stop; i++) {
        size_t n = strlen(s->stop[i]);
        for (size_t at = 0; at + n <= s->len && at < first; at++)
            if (!memcmp(s->buf + at, s->stop[i], n)) {
                first = at;
                break;
            }
    }
    if (first < s->len) {
        *hit = true;
        *release = first;
        return 0;
    }
    *release = s->len - held_tail(s);
    return 0;
}

void kiln_stop_scan_consume(kiln_stop_scan *s, size_t n) {
    memmove(s->buf, s->buf + n, s->len - n);
    s->len -= n;
    if (s->buf) s->buf[s->len] = 0;
}

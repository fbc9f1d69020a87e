#include "tokenizer/utf8.h"

#include <string.h>

size_t kiln_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static bool is_cont(uint8_t c) { return (c & 0xC0) == 0x80; }

size_t kiln_utf8_loose_len(const char *s, size_t n) {
    const uint8_t *u = (const uint8_t *)s;
    size_t len;
    if (u[0] < 0x80) return 1;
    if (u[0] < 0xC0) return 0;
    if (u[0] < 0xE0) len = 2;
    else if (u[0] < 0xF0) len = 3;
    else if (u[0] < 0xF8) len = 4;
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if (!is_cont(u[i])) return 0;
    return len;
}

size_t kiln_utf8_strict_len(const char *s, size_t n, uint32_t *cp) {
    const uint8_t *u = (const uint8_t *)s;
    size_t len;
    uint32_t c, min;
    if (u[0] < 0x80) {
        *cp = u[0];
        return 1;
    }
    if (u[0] < 0xC2) return 0;
    if (u[0] < 0xE0) len = 2, c = u[0] & 0x1F, min = 0x80;
    else if (u[0] < 0xF0) len = 3, c = u[0] & 0x0F, min = 0x800;
    else if (u[0] < 0xF5) len = 4, c = u[0] & 0x07, min = 0x10000;
    else return 0;
    for (size_t i = 1; i < len; i++) {
        if (i >= n) return KILN_UTF8_INCOMPLETE;
        if (!is_cont(u[i])) return 0;
        c = c << 6 | (u[i] & 0x3F);
        /* reject overlong, surrogate and too-large prefixes as soon as the second byte shows them */
        if (i == 1 && len == 3 && ((u[0] == 0xE0 && u[1] < 0xA0) || (u[0] == 0xED && u[1] >= 0xA0))) return 0;
        if (i == 1 && len == 4 && ((u[0] == 0xF0 && u[1] < 0x90) || (u[0] == 0xF4 && u[1] >= 0x90))) return 0;
    }
    if (c < min) return 0;
    *cp = c;
    return len;
}

size_t kiln_utf8_sanitize(const char *text, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t len = kiln_utf8_loose_len(text + i, n - i);
        if (len == 0) {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += 1;
        } else {
            memcpy(out + o, text + i, len);
            o += len;
            i += len;
        }
    }
    return o;
}

/* Printable Latin-1 bytes stand for themselves; the other 68 bytes take code points 256.. in byte order: 0x00-0x20
 * are 256-288, 0x7F-0xA0 are 289-322, 0xAD is 323. */
uint32_t kiln_byte_to_cp(uint8_t b) {
    if (b <= 0x20) return 256u + b;
    if (b >= 0x7F && b <= 0xA0) return 289u + (b - 0x7Fu);
    if (b == 0xAD) return 323;
    return b;
}

int kiln_cp_to_byte(uint32_t cp) {
    if (cp < 256) return (cp > 0x20 && !(cp >= 0x7F && cp <= 0xA0) && cp != 0xAD) ? (int)cp : -1;
    if (cp <= 288) return (int)(cp - 256);
    if (cp <= 322) return (int)(cp - 289 + 0x7F);
    return cp == 323 ? 0xAD : -1;
}

/* Jinja2's lexer for the default delimiters, with HF's settings: trim_blocks (a block or comment tag eats the one
 * newline after it), lstrip_blocks (spaces and tabs from the start of a line up to a block or comment tag are
 * dropped), and the '-'/'+' markers that strip or keep whitespace beside a tag. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "template/ast.h"

typedef struct lexer {
    tpl_ctx *c;
    const char *s;
    size_t n, p;
    bool line_starting; /* the previous tag's match ended with a newline */
    tpl_tokens *out;
} lexer;

static void emit(lexer *L, tpl_token t) {
    tpl_tokens *o = L->out;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        tpl_token *v = tpl_alloc(L->c, cap * sizeof *v);
        if (o->n) memcpy(v, o->v, o->n * sizeof *v);
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = t;
}

static void emit_simple(lexer *L, tpl_tok_kind kind, size_t pos, const char *text, size_t len) {
    emit(L, (tpl_token){.kind = kind, .pos = (long)pos, .text = {text, len}});
}

/* Length of the Unicode whitespace run (Python's \s) starting at p. */
static size_t space_run(const char *s, size_t n, size_t p) {
    size_t q = p;
    while (q < n) {
        uint32_t cp;
        size_t k = tpl_utf8_decode(s + q, n - q, &cp);
        if (!tpl_py_isspace(cp)) break;
        q += k;
    }
    return q - p;
}

/* Length of text once trailing Unicode whitespace is removed (Python's str.rstrip()). */
static size_t rstrip_len(const char *s, size_t len) {
    size_t keep = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = tpl_utf8_decode(s + i, len - i, &cp);
        i += k;
        if (!tpl_py_isspace(cp)) keep = i;
    }
    return keep;
}

/* Emits the data before a tag, applying that tag's left whitespace control. */
static void emit_text(lexer *L, size_t start, size_t end, char sign, bool is_var) {
    size_t len = end - start;
    const char *t = L->s + start;
    if (sign == '-') {
        len = rstrip_len(t, len);
    } else if (sign != '+' && !is_var) {
        size_t line = len;
        while (line > 0 && t[line - 1] != '\n') line--;
        /* Jinja 3.1.6 tests the rest of the line with \s, so any Unicode whitespace goes, not only spaces and tabs */
        bool blank = space_run(t, len, line) == len - line;
        if ((line > 0 || L->line_starting) && blank) len = line;
    }
    if (len) emit_simple(L, TOK_TEXT, start, t, len);
}

static bool starts(const lexer *L, size_t p, const char *lit) {
    size_t k = strlen(lit);
    return p + k <= L->n && !memcmp(L->s + p, lit, k);
}

static size_t skip_ascii_space(const lexer *L, size_t p) {
    while (p < L->n && isspace((unsigned char)L->s[p])) p++;
    return p;
}

/* After a block end "%}": '-' strips all whitespace, '+' keeps it, plain trims one newline (trim_blocks). */
static size_t after_block_end(const lexer *L, size_t p, char sign) {
    if (sign == '-') return p + space_run(L->s, L->n, p);
    if (sign != '+' && p < L->n && L->s[p] == '\n') return p + 1;
    return p;
}

/* Matches "{%[-+]? raw [-]%}" at p; returns the end of the match or 0. */
static size_t match_raw_begin(const lexer *L, size_t p) {
    size_t q = p + 2;
    if (q < L->n && (L->s[q] == '-' || L->s[q] == '+')) q++;
    q = skip_ascii_space(L, q);
    if (!starts(L, q, "raw")) return 0;
    q = skip_ascii_space(L, q + 3);
    if (starts(L, q, "-%}")) return q + 3 + space_run(L->s, L->n, q + 3);
    if (starts(L, q, "%}")) return q + 2;
    return 0;
}

/* Finds "{%[-+]? endraw [-+]?%}" from p; sets its start, sign and end. */
static bool find_raw_end(const lexer *L, size_t p, size_t *start, char *sign, size_t *end) {
    for (size_t q = p; q + 1 < L->n; q++) {
        if (L->s[q] != '{' || L->s[q + 1] != '%') continue;
        size_t r = q + 2;
        char sg = 0;
        if (r < L->n && (L->s[r] == '-' || L->s[r] == '+')) sg = L->s[r++];
        r = skip_ascii_space(L, r);
        if (!starts(L, r, "endraw")) continue;
        r = skip_ascii_space(L, r + 6);
        char esg = 0;
        if (r < L->n && (L->s[r] == '-' || L->s[r] == '+')) esg = L->s[r++];
        if (!starts(L, r, "%}")) continue;
        *start = q;
        *sign = sg;
        *end = after_block_end(L, r + 2, esg);
        return true;
    }
    return false;
}

static size_t lex_string(lexer *L, size_t p) {
    char quote = L->s[p];
    tpl_sb b;
    tpl_sb_init(&b, L->c);
    size_t q = p + 1;
    for (;;) {
        if (q >= L->n) tpl_fail(L->c, (long)p, "unterminated string literal");
        char ch = L->s[q];
        if (ch == quote) break;
        if (ch != '\\' || q + 1 >= L->n) {
            tpl_sb_putc(&b, ch);
            q++;
            continue;
        }
        char e = L->s[q + 1];
        q += 2;
        switch (e) {
        case 'n': tpl_sb_putc(&b, '\n'); break;
        case 't': tpl_sb_putc(&b, '\t'); break;
        case 'r': tpl_sb_putc(&b, '\r'); break;
        case 'a': tpl_sb_putc(&b, '\a'); break;
        case 'b': tpl_sb_putc(&b, '\b'); break;
        case 'f': tpl_sb_putc(&b, '\f'); break;
        case 'v': tpl_sb_putc(&b, '\v'); break;
        case '\\': case '\'': case '"': tpl_sb_putc(&b, e); break;
        case '\n': break; /* line continuation */
        case 'x': case 'u': case 'U': {
            int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int i = 0; i < digits; i++, q++) {
                if (q >= L->n || !isxdigit((unsigned char)L->s[q]))
                    tpl_fail(L->c, (long)q, "truncated \\%c escape in string literal", e);
                char h = L->s[q];
                cp = cp * 16 + (uint32_t)(isdigit((unsigned char)h) ? h - '0' : (tolower((unsigned char)h) - 'a' + 10));
            }
            if (cp > 0x10FFFF) tpl_fail(L->c, (long)q, "escape out of Unicode range in string literal");
            tpl_utf8_put(&b, cp);
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = (uint32_t)(e - '0');
                for (int i = 0; i < 2 && q < L->n && L->s[q] >= '0' && L->s[q] <= '7'; i++, q++)
                    cp = cp * 8 + (uint32_t)(L->s[q] - '0');
                tpl_utf8_put(&b, cp);
            } else {
                tpl_sb_putc(&b, '\\');
                tpl_sb_putc(&b, e);
            }
        }
    }
    emit(L, (tpl_token){.kind = TOK_STRING, .pos = (long)p, .text = tpl_sb_str(&b)});
    return q + 1;
}

static size_t digits_run(const lexer *L, size_t p) {
    while (p < L->n && (isdigit((unsigned char)L->s[p]) || (L->s[p] == '_' && p + 1 < L->n && isdigit((unsigned char)L->s[p + 1])))) p++;
    return p;
}

static size_t lex_number(lexer *L, size_t p) {
    size_t q = digits_run(L, p);
    bool after_dot = L->out->n && L->out->v[L->out->n - 1].kind == TOK_OP && L->out->v[L->out->n - 1].text.p[0] == '.';
    bool is_float = false;
    if (!after_dot && q + 1 < L->n && L->s[q] == '.' && isdigit((unsigned char)L->s[q + 1])) {
        q = digits_run(L, q + 1);
        is_float = true;
    }
    if (!after_dot && q < L->n && (L->s[q] == 'e' || L->s[q] == 'E')) {
        size_t r = q + 1;
        if (r < L->n && (L->s[r] == '+' || L->s[r] == '-')) r++;
        if (r < L->n && isdigit((unsigned char)L->s[r])) {
            q = digits_run(L, r);
            is_float = true;
        }
    }
    char buf[64];
    size_t k = 0;
    for (size_t i = p; i < q && k + 1 < sizeof buf; i++)
        if (L->s[i] != '_') buf[k++] = L->s[i];
    buf[k] = '\0';
    tpl_token t = {.kind = is_float ? TOK_FLOAT : TOK_INT, .pos = (long)p, .text = {L->s + p, q - p}};
    if (is_float) {
        t.f = strtod(buf, NULL);
    } else {
        errno = 0;
        t.i = strtoll(buf, NULL, 10);
        if (errno == ERANGE || k + 1 >= sizeof buf) tpl_fail(L->c, (long)p, "integer literal too large");
    }
    emit(L, t);
    return q;
}

static const char *const OPERATORS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                        ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|", ";"};

/* Lexes the inside of a {{ }} or {% %} tag from p; returns the position after the closing delimiter. */
static size_t lex_tag(lexer *L, size_t p, bool is_block, size_t open_pos) {
    int depth = 0;
    for (;;) {
        p = skip_ascii_space(L, p);
        if (p >= L->n) tpl_fail(L->c, (long)open_pos, "unexpected end of template: tag opened here is never closed");
        if (depth == 0) {
            const char *close = is_block ? "%}" : "}}";
            char sign = 0;
            size_t q = p;
            if ((L->s[q] == '-' || (is_block && L->s[q] == '+')) && starts(L, q + 1, close)) sign = L->s[q++];
            if (starts(L, q, close)) {
                emit_simple(L, is_block ? TOK_BLOCK_END : TOK_VAR_END, p, L->s + p, 2);
                q += 2;
                if (is_block) q = after_block_end(L, q, sign);
                else if (sign == '-') q += space_run(L->s, L->n, q);
                return q;
            }
        }
        unsigned char ch = (unsigned char)L->s[p];
        if (isalpha(ch) || ch == '_') {
            size_t q = p;
            while (q < L->n && (isalnum((unsigned char)L->s[q]) || L->s[q] == '_')) q++;
            emit_simple(L, TOK_NAME, p, L->s + p, q - p);
            p = q;
        } else if (isdigit(ch)) {
            p = lex_number(L, p);
        } else if (ch == '\'' || ch == '"') {
            p = lex_string(L, p);
        } else {
            size_t i = 0, n_ops = sizeof OPERATORS / sizeof *OPERATORS;
            while (i < n_ops && !starts(L, p, OPERATORS[i])) i++;
            if (i == n_ops) tpl_fail(L->c, (long)p, "unexpected character '%c'", ch);
            size_t k = strlen(OPERATORS[i]);
            if (k == 1 && strchr("([{", ch)) depth++;
            if (k == 1 && strchr(")]}", ch)) {
                if (depth == 0) tpl_fail(L->c, (long)p, "unexpected '%c'", ch);
                depth--;
            }
            emit_simple(L, TOK_OP, p, OPERATORS[i], k);
            p += k;
        }
    }
}

static size_t lex_comment(lexer *L, size_t open, size_t body) {
    for (size_t q = body; q + 1 < L->n; q++) {
        if (L->s[q] != '#' || L->s[q + 1] != '}') continue;
        char sign = q > body && (L->s[q - 1] == '-' || L->s[q - 1] == '+') ? L->s[q - 1] : 0;
        return after_block_end(L, q + 2, sign);
    }
    tpl_fail(L->c, (long)open, "missing end of comment tag");
}

void tpl_lex(tpl_ctx *c, const char *src, size_t len, tpl_tokens *out) {
    lexer L = {.c = c, .s = src, .n = len, .line_starting = true, .out = out};
    while (L.p < L.n) {
        size_t tag = L.p;
        while (tag + 1 < L.n && !(L.s[tag] == '{' && strchr("{%#", L.s[tag + 1]))) tag++;
        if (tag + 1 >= L.n) {
            emit_simple(&L, TOK_TEXT, L.p, L.s + L.p, L.n - L.p);
            break;
        }
        char kind = L.s[tag + 1];
        char sign = tag + 2 < L.n && (L.s[tag + 2] == '-' || L.s[tag + 2] == '+') ? L.s[tag + 2] : 0;
        emit_text(&L, L.p, tag, sign, kind == '{');
        size_t end;
        if (kind == '#') {
            end = lex_comment(&L, tag, tag + 2 + (sign ? 1 : 0));
        } else if (kind == '%' && (end = match_raw_begin(&L, tag))) {
            size_t raw_end_start, raw_end;
            char raw_sign;
            if (!find_raw_end(&L, end, &raw_end_start, &raw_sign, &raw_end))
                tpl_fail(c, (long)tag, "missing end of raw directive");
            L.line_starting = L.s[end - 1] == '\n';
            emit_text(&L, end, raw_end_start, raw_sign, false);
            end = raw_end;
        } else {
            emit_simple(&L, kind == '%' ? TOK_BLOCK_BEGIN : TOK_VAR_BEGIN, tag, L.s + tag, 2);
            end = lex_tag(&L, tag + 2 + (sign ? 1 : 0), kind == '%', tag);
        }
        L.line_starting = L.s[end - 1] == '\n';
        L.p = end;
    }
    emit_simple(&L, TOK_EOF, L.n, L.s + L.n, 0);
}
